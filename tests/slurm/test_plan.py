"""The jobs a run submits (slurm/plan.py), as AReaL 1.0.4's SlurmScheduler sizes them, and when no node
can ever run one."""

from __future__ import annotations

from types import SimpleNamespace

from examples.tau2.slurm.plan import JobRequest, run_requests, unschedulable
from examples.tau2.slurm.queue import NodeInfo
from tests.tau2_train_support import load


def spec(cpu=4, mem=32, gpu=1):
    return SimpleNamespace(cpu=cpu, mem=mem, gpu=gpu)


def node(name="n1", cpus=64, mem=512000, gpus=8, state="idle"):
    return NodeInfo(name, "gpu", True, cpus, mem, gpus, state)


def test_requests_follow_areals_whole_node_arithmetic():
    # 8 ranks of 1 GPU on 8-GPU nodes: one node, 8 tasks, 8 x 32 GB
    assert JobRequest.for_role("actor", spec(), 8, 8) == JobRequest("actor", 1, 8, 4, 8 * 32 * 1024, 8)
    # 16 ranks: two nodes of 8 tasks
    assert JobRequest.for_role("actor", spec(), 16, 8).nodes == 2
    # a CPU-only cluster (n_gpus_per_node=0): one node, no GRES, no division by zero
    cpu = JobRequest.for_role("actor", spec(cpu=2, mem=8, gpu=0), 2, 0)
    assert (cpu.nodes, cpu.tasks_per_node, cpu.cpus_per_node, cpu.gpus_per_node) == (1, 2, 4, 0)


def test_a_request_no_node_fits_is_named_with_the_largest_node():
    request = JobRequest.for_role("rollout", spec(cpu=8, mem=64, gpu=2), 4, 8)
    assert unschedulable(request, [node(), node("n2")]) == ""
    small = unschedulable(request, [node(cpus=16)])
    assert small.startswith("SLURM can never start the rollout job (1 node(s) x 4 task(s) of 8 CPUs = 32 "
                            "CPUs")
    assert ("0 of the 1 node(s) of partition gpu fit it, 1 needed (largest: 16 CPUs, 512000 MB, 8 GPUs)"
            in small)
    no_gpus = unschedulable(request, [node(gpus=0)])
    assert "this partition declares no GPUs: set cluster.n_gpus_per_node=0" in no_gpus
    assert "1 needed" in unschedulable(request, [node(state="down*")])
    two = JobRequest.for_role("actor", spec(), 16, 8)
    assert "1 of the 2 node(s)" in unschedulable(two, [node(), node("n2", mem=1000)])


def test_the_shipped_configs_submit_one_job_per_role(tmp_path):
    one_node = run_requests(load(f"cluster.fileroot={tmp_path}").config)
    assert [(r.role, r.nodes, r.tasks_per_node, r.gpus_per_node) for r in one_node] == \
        [("rollout", 1, 4, 8), ("actor", 1, 2, 8)]
    two = run_requests(load("+configs=slurm_2node").config)
    # 4 SGLang servers of tp2 (8 CPUs and 64 GB per GPU, scaled by the server's 2 GPUs), 8 trainer ranks
    assert [(r.role, r.nodes, r.tasks_per_node, r.cpus_per_task, r.mem_mb_per_node) for r in two] == \
        [("rollout", 1, 4, 16, 4 * 128 * 1024), ("actor", 1, 8, 8, 8 * 64 * 1024)]
