"""The CI-sized smoke run through a real SLURM (`tau2_rl.sh smoke scheduler.type=slurm`), with a fault, on
the example domain of docs/own_domain.md (`library`, from the module `library_desk` on PYTHONPATH): every
worker imports the module on its node, and the domain trains and passes as a built-in one does (the local
smoke runs of tests/cpu/test_smoke_faults.py train on mock).

The actor and rollout roles go out as `sbatch` jobs and their workers run under `srun`, natively. On one
node, `scancel` of the rollout job after step 1 was saved stops the run and leaves nothing of it; on two
nodes (the trainer on one, the vLLM server and proxies on the other) the same command resumes at step 2
and passes every check a smoke run promises (`smoke_support.check_passing_run`), the served prompt at
every step included. One whole run costs minutes on 2 cores, so the rest of the SLURM path is tested
where it is cheap, against the same real SLURM (tests/slurm/test_scheduler.py): workers and a forked
proxy through the apptainer command line (a stand-in `singularity` that checks it and runs it), `kill -9`
of a controller that submitted real jobs (its reaper cancels them), a worker that dies at start, pending
jobs, jobs no node can run.

It runs with its own seed, in its own xdist group (tests/conftest.py): AReaL draws its ports from
`random` seeded with it, so it never picks the ports of the local smoke runs beside it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from examples.tau2.cpu.smoke import SUMMARY_FILE
from examples.tau2.slurm import queue
from examples.tau2.slurm.registry import JobRegistry, job_name_prefix
from tests.cpu.smoke_support import (
    REPO,
    RUN_TIMEOUT_S,
    check_passing_run,
    check_trained_step,
    finish,
    format_result_for_log,
    kill_all,
    processes_of,
    saved_step_1,
    smoke_command,
    start,
    stats_rows,
    stats_steps,
    wait_for,
)
from tests.slurm.support import slurm, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * RUN_TIMEOUT_S + 300)]

EXPERIMENT = "tau2-smoke-cpu"
SEED = "seed=7"
"""Not the other smoke runs' seed: AReaL draws its free ports from `random` seeded with it."""
OWN_DOMAIN = REPO / "examples" / "tau2" / "docs" / "own_domain"
LIBRARY = ("econfig.domain=library", "econfig.domain_modules=[library_desk]", "econfig.train_split=train")
"""docs/own_domain.md's smoke command."""


def own_domain_env() -> dict[str, str]:
    """This process's environment as it is now (the local SLURM's SLURM_CONF included), with the example
    domain's folder on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(OWN_DOMAIN), os.environ.get(
        "PYTHONPATH", "")) if p)}


def run_jobs(root: Path) -> list[queue.JobStatus]:
    """The run's jobs SLURM still holds or waits to start."""
    return [j for j in queue.jobs_named(job_name_prefix(EXPERIMENT, "run")) if j.active]


def registry(root: Path) -> JobRegistry:
    return JobRegistry.of_trial(str(root), EXPERIMENT, "run")


def resume_and_pass(cmd: list[str], root: Path, env: dict[str, str] | None = None) -> tuple[dict, str]:
    """The rerun of `cmd`: it resumes at step 2 and passes every smoke check; (summary, output)."""
    log = root / "second.log"
    started = time.monotonic()
    out = finish(start(cmd, log, env), log, root)
    assert "tau2 CPU smoke run: PASSED" in out, out[-8000:]
    assert re.search(r"resuming: the state saved after step 1 is in .*; training continues at step 2", out)
    assert stats_steps(root) == [0, 1]  # each step once: step 1 from the first run, step 2 resumed
    assert "eval-rollout" not in out  # no validation set: no evaluation workers or proxies
    summary = json.loads(next(root.glob(f"logs/**/{SUMMARY_FILE}")).read_text())
    print(format_result_for_log(summary, time.monotonic() - started))
    check_passing_run(summary, root)
    assert not run_jobs(root)
    return summary, out


def test_scancel_of_the_rollout_job_stops_the_run_and_the_rerun_resumes_on_two_nodes_and_passes(tmp_path):
    """The documented command (`tau2_rl.sh smoke scheduler.type=slurm`: workers natively, as
    `configs/smoke_cpu.yaml` says). On one node, step 1 trains and passes its checks; after its save,
    `scancel` of the rollout job stops the controller within seconds, naming the job and its state, and no
    job or process of the run is left. The cluster then comes back with two nodes of 2 CPUs (as after a
    maintenance): the trainer's job (2 CPUs) fills n1, the rollout job runs on n2, and the same command
    resumes at step 2 and passes every check."""
    cmd = smoke_command(tmp_path, "scheduler.type=slurm", SEED, *LIBRARY)
    with slurm(nodes=1, cpus=4):  # sets SLURM_CONF: the run's environment is taken inside
        log = tmp_path / "first.log"
        first = start(cmd, log, own_domain_env())
        try:
            waited = wait_for(lambda: saved_step_1(tmp_path), first, log, RUN_TIMEOUT_S,
                              "saved state of step 1")
            check_trained_step(stats_rows(tmp_path)[0])
            rollout = registry(tmp_path).entries()["rollout"]["job_id"]
            queue.run("scancel", str(rollout))
            cancelled = time.monotonic()
            try:
                first.wait(timeout=180)
            except subprocess.TimeoutExpired:
                pytest.fail("the run did not stop after its rollout job was cancelled:\n"
                            + log.read_text()[-5000:])
            stopped_s = time.monotonic() - cancelled
            out = log.read_text()
            assert first.returncode != 0
            assert re.search(rf"SLURM job {rollout} \({EXPERIMENT}_run:rollout\) is CANCELLED.* on n1: the "
                             r"rollout workers are gone \(log .*rollout\.log\)", out), out[-5000:]
            gone_s = wait_until(lambda: not run_jobs(tmp_path) and not processes_of(tmp_path), 60,
                                "the run's leftovers gone")
            print(f"scancel of the rollout job {waited:.0f} s into the run: the controller exited with "
                  f"{first.returncode} {stopped_s:.1f} s later; no job or process of the run left "
                  f"{stopped_s + gone_s:.1f} s after the scancel")
        finally:
            kill_all(first, tmp_path)
    with slurm(nodes=2, cpus=2, mem_mb=12288):
        summary, _ = resume_and_pass(cmd, tmp_path, own_domain_env())
    dumped = {json.loads(p.read_text())["domain"] for p in (tmp_path / "tau2_dumps").rglob("*.json")}
    assert dumped == {"library"}, dumped
    placement = " | ".join(summary["placement"])
    assert re.search(r"role actor: SLURM job \d+ on n1 \(RUNNING\)", placement), placement
    assert re.search(r"role rollout: SLURM job \d+ on n2 \(RUNNING\)", placement), placement
