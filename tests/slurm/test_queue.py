"""SLURM's own words, typed (slurm/queue.py): job states and reasons, GPUs of a GRES string, cancelling."""

from __future__ import annotations

import pytest

from examples.tau2.slurm import queue
from examples.tau2.slurm.queue import _gpus, _parse_jobs
from tests.slurm.support import slurm


def test_job_lines_parse_with_every_state_slurm_reports():
    jobs = _parse_jobs("12|RUNNING|None|n1|e_t:actor\n13|PENDING|PartitionConfig||e_t:rollout\n"
                       "14|NODE_FAIL|NodeDown|n[1-2]|x\n15|COMPLETING|None|n1|e_t:rollout\nnot a job line\n")
    assert [j.job_id for j in jobs] == [12, 13, 14, 15]
    running, never, lost, ending = jobs
    assert ending.active and not ending.running  # scancel-ed: still holds its node, its workers are gone
    assert running.running and running.active and not running.never_starts
    assert never.never_starts and never.active and not never.running
    assert not lost.active  # AReaL's STATUS_MAPPING has no NODE_FAIL (KeyError); here it is a final state
    assert running.describe() == "SLURM job 12 (e_t:actor) is RUNNING on n1"
    assert never.describe() == "SLURM job 13 (e_t:rollout) is PENDING (PartitionConfig)"
    (down,) = _parse_jobs("16|PENDING|ReqNodeNotAvail, UnavailableNodes:n1||e_t:actor\n")  # as squeue says it
    assert down.never_starts and not _parse_jobs("17|PENDING|Resources||x\n")[0].never_starts


@pytest.mark.parametrize(("gres", "gpus"), [("(null)", 0), ("gpu:8", 8), ("gpu:h100:8(S:0-1)", 8),
                                            ("gpu:a100:4,gpu:h100:4", 8), ("mps:100", 0)])
def test_gpus_of_a_gres_string(gres, gpus):
    assert _gpus(gres) == gpus


def test_a_missing_client_is_a_slurm_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert not queue.available()
    with pytest.raises(queue.SlurmError, match="`squeue` is not installed"):
        queue.query_jobs([1])


def test_an_unreachable_slurm_is_named_with_what_to_do(monkeypatch):
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    problem = queue.unreachable()
    assert problem.startswith("scheduler.type=slurm but ") and "tau2_rl.sh slurm-local up" in problem


@pytest.mark.slow
def test_nodes_jobs_and_cancel_against_a_real_slurm():
    with slurm(nodes=2, cpus=3, mem_mb=3000) as cluster:
        nodes = queue.nodes()
        assert [(n.name, n.cpus, n.memory_mb, n.gpus, n.partition) for n in nodes] == \
            [("n1", 3, 3000, 0, "cpu"), ("n2", 3, 3000, 0, "cpu")]
        running = int(cluster.run("sbatch", "--parsable", "-J", "e_t:actor", "-o", "/dev/null", "--wrap",
                                  "sleep 600").strip())
        pending = int(cluster.run("sbatch", "--parsable", "-J", "e_t:rollout", "-o", "/dev/null",
                                  "--begin=now+1hour", "--wrap", "true").strip())
        named = {j.job_id: j for j in queue.jobs_named("e_t:")}
        assert set(named) == {running, pending} and named[pending].state == "PENDING"
        assert queue.cancel([running, pending], wait_s=30) == []
        states = {j: s.state for j, s in queue.query_jobs([running, pending]).items()}
        assert states == {running: "CANCELLED", pending: "CANCELLED"}
        assert queue.cancel([]) == [] and queue.cancel([running]) == []  # already over: nothing to do
