"""The CI-sized smoke run through a real SLURM (`tau2_rl.sh smoke scheduler.type=slurm`), with its faults.

The actor and rollout roles go out as `sbatch` jobs and their workers run under `srun`. Natively on two
nodes (the trainer on one, the vLLM server and proxies on the other): `kill -9` of the controller after
step 1 was saved leaves no job of the run, and the same command resumes at step 2 and passes every check
a smoke run promises (`smoke_support.check_passing_run`), the served prompt at every step included. On
one node in apptainer mode, through a stand-in `singularity` that checks the container command line and
runs it: step 1 passes the same checks, then `scancel` of the rollout job stops the run, naming the job.

Both run with their own seed, in their own xdist group (tests/conftest.py): AReaL draws its ports from
`random` seeded with it, so they never pick the ports of the local smoke runs beside them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from examples.tau2.cpu.smoke import SUMMARY_FILE
from examples.tau2.slurm import queue
from examples.tau2.slurm.registry import JobRegistry, job_name_prefix
from tests.cpu.smoke_support import (
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
from tests.slurm.support import REPO, STAND_IN_LOG_ENV, install_stand_in, slurm, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * RUN_TIMEOUT_S + 300)]

EXPERIMENT = "tau2-smoke-cpu"
SEED = "seed=7"
"""Not the other smoke runs' seed: AReaL draws its free ports from `random` seeded with it."""


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
    summary = json.loads(next(root.glob(f"logs/**/{SUMMARY_FILE}")).read_text())
    print(format_result_for_log(summary, time.monotonic() - started))
    check_passing_run(summary, root)
    assert not run_jobs(root)
    return summary, out


def test_two_nodes_native_kill_of_the_controller_cancels_its_jobs_and_a_rerun_resumes(tmp_path):
    """Nodes of 2 CPUs: the trainer's job (2 CPUs) fills n1, the rollout job (1 CPU) runs on n2, natively
    (`configs/smoke_cpu.yaml`). After step 1 is saved the controller is SIGKILLed (alone): its reaper
    cancels every job of the run and nothing of it is left. The rerun resumes on two nodes and passes."""
    cmd = smoke_command(tmp_path, "scheduler.type=slurm", SEED)
    with slurm(nodes=2, cpus=2, mem_mb=12288):
        log = tmp_path / "first.log"
        first = start(cmd, log)
        try:
            wait_for(lambda: saved_step_1(tmp_path), first, log, RUN_TIMEOUT_S, "saved state of step 1")
            jobs = registry(tmp_path).job_ids()
            assert len(jobs) == 2 and all(j.running for j in queue.query_jobs(jobs).values())
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
            killed = time.monotonic()
            gone_s = wait_until(lambda: not run_jobs(tmp_path), 60, "the run's jobs cancelled")
            wait_until(lambda: not processes_of(tmp_path), 30, "the run's processes gone")
            reaper = next(tmp_path.glob(f"logs/*/{EXPERIMENT}/run/reaper.log")).read_text()
            assert "cancelled 2 SLURM job(s) of tau2-smoke-cpu/run" in reaper, reaper
            print(f"kill -9 of the controller: its {len(jobs)} jobs ended {gone_s:.1f} s later "
                  f"({time.monotonic() - killed:.1f} s with its processes)")
            assert stats_steps(tmp_path) == [0]
        finally:
            kill_all(first, tmp_path)
        summary, _ = resume_and_pass(cmd, tmp_path)
    placement = " | ".join(summary["placement"])
    assert re.search(r"role actor: SLURM job \d+ on n1 \(RUNNING\)", placement), placement
    assert re.search(r"role rollout: SLURM job \d+ on n2 \(RUNNING\)", placement), placement


def test_one_node_apptainer_scancel_of_the_rollout_job_stops_the_run(tmp_path):
    """Both roles in `singularity exec <image>` (a stand-in that checks the command line, then runs it). Step
    1 trains and passes the smoke run's checks; then `scancel` of the rollout job stops the controller
    within seconds, naming the job and its state, and nothing of the run is left."""
    image = tmp_path / "areal-tau2.sif"
    image.write_text("a stand-in image")
    bin_dir = install_stand_in(tmp_path / "bin")
    calls = tmp_path / "singularity.jsonl"
    container = [f"++{role}.scheduling_spec.0.{key}={value}" for role in ("actor", "rollout")
                 for key, value in (("container_type", "apptainer"), ("image", image),
                                    ("mount", f"'{tmp_path}:{tmp_path},{REPO}:{REPO}'"))]
    cmd = smoke_command(tmp_path, "scheduler.type=slurm", SEED, *container)
    with slurm(nodes=1, cpus=4):  # (sets SLURM_CONF: the environment is copied after it)
        env = {**os.environ, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
               STAND_IN_LOG_ENV: str(calls)}
        log = tmp_path / "run.log"
        run = start(cmd, log, env)
        try:
            waited = wait_for(lambda: stats_steps(tmp_path) == [0], run, log, RUN_TIMEOUT_S, "step 1")
            rollout = registry(tmp_path).entries()["rollout"]["job_id"]
            queue.run("scancel", str(rollout))
            cancelled = time.monotonic()
            try:
                run.wait(timeout=180)
            except subprocess.TimeoutExpired:
                pytest.fail("the run did not stop after its rollout job was cancelled:\n"
                            + log.read_text()[-5000:])
            stopped_s = time.monotonic() - cancelled
            out = log.read_text()
            assert run.returncode != 0
            assert re.search(rf"SLURM job {rollout} \({EXPERIMENT}_run:rollout\) is CANCELLED.* on n1: the "
                             r"rollout workers are gone \(log .*rollout\.log\)", out), out[-5000:]
            wait_until(lambda: not run_jobs(tmp_path) and not processes_of(tmp_path), 60,
                       "the run's leftovers gone")
            print(f"scancel of the rollout job {waited:.0f} s into the run: the controller exited with "
                  f"{run.returncode} {stopped_s:.1f} s later, no job or process of the run left")
        finally:
            kill_all(run, tmp_path)
    check_trained_step(stats_rows(tmp_path)[0])
    roles = {}
    for call in map(json.loads, calls.read_text().splitlines()):
        assert call["image"] == str(image) and call["binds"] == [f"{tmp_path}:{tmp_path}", f"{REPO}:{REPO}"]
        assert call["env"]["PYTHONPATH"] == str(REPO)  # the checkout, not the controller's sys.path
        assert call["cmd"][2].startswith("python3 -m areal.infra.rpc.rpc_server")
        roles[call["cmd"][2].split("--role ")[1].split()[0]] = call["env"]
    assert set(roles) == {"actor", "rollout"}
    assert roles["rollout"]["TAU2_SERVING_ENGINE"] == "vllm" and roles["actor"]["OMP_NUM_THREADS"] == "2"
