"""The jobs a run submits (slurm/plan.py), as AReaL 1.0.4's SlurmScheduler sizes them, and when no node
can ever run one."""

from __future__ import annotations

from types import SimpleNamespace

from examples.tau2.slurm.plan import JobRequest, run_requests, unplaceable, unschedulable
from examples.tau2.slurm.queue import Allocation, NodeInfo
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


def test_jobs_that_each_fit_but_not_all_at_once_are_named():
    """The run holds every job until it ends: the smoke run's trainer (2 CPUs, 8 GiB), vLLM server (1, 8 GiB)
    and controller (1, 2 GiB) on one node of 4 CPUs pend for good there unless it has 18 GiB."""
    actor, rollout = (JobRequest.for_role(r, spec(cpu=c, mem=8, gpu=0), 1, 0) for r, c in (("actor", 2),
                                                                                        ("rollout", 1)))
    controller = JobRequest("controller", 1, 1, 1, 2048, 0)
    jobs, shared = [actor, rollout, controller], Allocation(whole_nodes=False, memory=True)
    assert unplaceable(jobs, [node(cpus=4, mem=18432, gpus=0)], shared) == ""
    short = unplaceable(jobs, [node(cpus=4, mem=16384, gpus=0)], shared)
    assert short.startswith("SLURM can never run the jobs of this run at once (actor job (1 node(s) x 1 "
                            "task(s) of 2 CPUs"), short
    assert short.endswith("on the 1 usable node(s) of partition gpu (CPUs, GPUs and memory shared), and the "
                          "run holds each job until it ends, so the last one would pend for good; lower the "
                          "roles' scheduling_spec (cpu, mem, gpu), or use a partition with more nodes"), short
    assert unplaceable(jobs, [node(cpus=4, mem=16384, gpus=0)], Allocation(False, memory=False)) == ""
    assert unplaceable(jobs, [node(cpus=3, mem=99999, gpus=0)], shared)  # 4 CPUs asked
    two = [node("n1", cpus=2, mem=12288, gpus=0), node("n2", cpus=2, mem=12288, gpus=0)]
    assert unplaceable(jobs, two, shared) == ""  # tests/slurm/test_smoke_on_slurm.py's two nodes
    assert unplaceable(jobs, [*two, node("n3", state="down")], Allocation(True, True))  # a job per node
    assert unplaceable(jobs, [*two, node("n3")], Allocation(True, True)) == ""
    # AReaL asks a whole node's GPUs (--gres=gpu:8) for each GPU role: two roles need two nodes
    gpu_jobs = [JobRequest.for_role("rollout", spec(), 4, 8), JobRequest.for_role("actor", spec(), 4, 8)]
    assert unplaceable(gpu_jobs, [node()], shared)
    assert unplaceable(gpu_jobs, [node(), node("n2")], shared) == ""
    many = [node(f"n{i}", cpus=4, mem=18432, gpus=0) for i in range(500)]
    assert unplaceable([*jobs] * 200, many[:1], shared) and unplaceable([*jobs] * 5, many, shared) == ""


def test_the_shipped_configs_submit_one_job_per_role(tmp_path):
    one_node = run_requests(load(f"cluster.fileroot={tmp_path}").config)
    assert [(r.role, r.nodes, r.tasks_per_node, r.gpus_per_node) for r in one_node] == \
        [("rollout", 1, 4, 8), ("actor", 1, 2, 8)]
    two = run_requests(load("+configs=slurm_2node").config)
    # 4 SGLang servers of tp2 (8 CPUs and 64 GB per GPU, scaled by the server's 2 GPUs), 8 trainer ranks
    assert [(r.role, r.nodes, r.tasks_per_node, r.cpus_per_task, r.mem_mb_per_node) for r in two] == \
        [("rollout", 1, 4, 16, 4 * 128 * 1024), ("actor", 1, 8, 8, 8 * 64 * 1024)]
