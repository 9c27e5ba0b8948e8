"""Pre-flight checks of a SLURM run (slurm/checks.py): the container mode's own, and the jobs against the
nodes `sinfo` reports, in `--dry-run` too."""

from __future__ import annotations

import subprocess
import sys

import pytest

from examples.tau2.slurm import checks, queue
from examples.tau2.slurm.plan import JobRequest
from examples.tau2.slurm.scheduler import duration_setting_s, pending_limit_s
from examples.tau2.tau2_train import main
from tests.slurm.support import REPO, slurm
from tests.tau2_train_support import CONFIG, load

CPU_ONLY = ("+configs=slurm_native", "cluster.n_gpus_per_node=0", "actor.scheduling_spec.0.gpu=0",
            "actor.scheduling_spec.0.cpu=2", "actor.scheduling_spec.0.mem=2", "rollout.backend=sglang:d1",
            "actor.backend=archon:d1")


def test_bind_mounts_and_what_a_container_sees(tmp_path):
    spec = load("++actor.scheduling_spec.0.mount='/a:/a,/b:/c:ro'").config.actor.scheduling_spec[0]
    assert [(str(s), str(d)) for s, d in checks.bind_mounts(spec)] == [("/a", "/a"), ("/b", "/c")]
    assert checks.visible_in_container(spec, tmp_path.parent / "x") is False
    assert checks.visible_in_container(spec, __import__("pathlib").Path("/a/x/y"))
    assert not checks.visible_in_container(spec, __import__("pathlib").Path("/b/x"))  # elsewhere inside


def test_an_unreachable_slurm_has_no_capacity_to_compare(monkeypatch):
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    assert checks.check_capacity(load(*CPU_ONLY).config) == []  # not reachable: nothing to compare


def test_the_pending_limit_and_start_timeout_are_durations_checked_before_start(monkeypatch):
    assert [duration_setting_s(v, "X") for v in ("90", "90s", "30m", "24h", "2d", "1.5h")] == \
        [90, 90, 1800, 86400, 172800, 5400]
    assert pending_limit_s() == 86400  # a day by default
    monkeypatch.setenv("TAU2_PENDING_LIMIT", "forever")
    monkeypatch.setenv("TAU2_WORKER_START_TIMEOUT", "0")
    problems = checks.check_slurm(load(*CPU_ONLY).config, {}, ask_cluster=False)
    fix = "is not a positive duration; set it like 90s, 30m, 24h or 2d"
    assert problems == [f"TAU2_PENDING_LIMIT=forever {fix}", f"TAU2_WORKER_START_TIMEOUT=0 {fix}"]


@pytest.mark.slow
def test_dry_run_compares_the_jobs_with_the_nodes(tmp_path, capsys):
    with slurm(nodes=1, cpus=4, mem_mb=8192):
        assert queue.unreachable() == ""
        root = (f"cluster.fileroot={tmp_path}", f"cluster.name_resolve.nfs_record_root={tmp_path}/nr")
        fits = load(*CPU_ONLY, *root).config
        assert checks.check_capacity(fits) == []
        # with `--submit`'s controller job beside them (1 CPU), the rollout and actor jobs (2 CPUs each)
        # no longer fit the node at once: the last would pend for good
        controller = JobRequest("controller", 1, 1, 1, 1024, 0)
        (at_once,) = checks.check_capacity(fits, controller)
        assert at_once.startswith("SLURM can never run the jobs of this run at once (rollout job"), at_once
        lines = checks.describe_cluster(fits)
        assert lines[0] == "job: rollout job (1 node(s) x 1 task(s) of 2 CPUs = 2 CPUs, 2048 MB per node)"
        assert lines[2] == "rollout and actor workers: natively, the controller's interpreter"
        assert lines[-1] == "SLURM nodes of partition cpu: n1 (4 CPUs, 8192 MB, 0 GPUs, idle)"
        too_big = load(*CPU_ONLY, *root, "actor.scheduling_spec.0.mem=64").config
        rollout, actor = checks.check_capacity(too_big)  # one spec, shared
        assert rollout.startswith("SLURM can never start the rollout job (1 node(s) x 1 task(s) of 2 CPUs")
        assert actor.startswith("SLURM can never start the actor job")
        assert "(largest: 4 CPUs, 8192 MB, no GPU (GRES))" in actor

        assert main(["--config", str(CONFIG), *CPU_ONLY, *root, "actor.scheduling_spec.0.mem=64",
                     "--dry-run"]) == 1
        out = capsys.readouterr().out
        assert "  slurm           SLURM nodes of partition cpu: n1 (4 CPUs, 8192 MB, 0 GPUs, idle)" in out
        assert "  - SLURM can never start the actor job (1 node(s) x 1 task(s) of 2 CPUs" in out


def test_the_slurm_add_on_imports_no_areal():
    """The reaper loads the add-on to cancel a dead controller's jobs: it must start at once."""
    code = ("import sys, examples.tau2.slurm.addon, examples.tau2.lifecycle.reaper; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('areal', 'torch')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
