"""The CI-sized smoke run through a real SLURM, its controller a job that outlives its job
(`tau2_rl.sh smoke --submit scheduler.type=slurm`, slurm/requeue.py), on a domain a user brings, of
another shape than the project's example: five tasks and no splits (tests/domain_shapes.py, a copy of
docs/own_domain.md's `library` from a module on PYTHONPATH), so two steps an epoch and three steps in
two epochs. Every worker imports the module on its node, and the domain trains and passes as a built-in
one does. Its tasks are the example's, so its policy is the example's, which scripts/test.sh builds.

The controller, the actor and the rollout roles go out as `sbatch` jobs on two nodes of 2 CPUs; the
workers run under `srun`, natively. One run of 3 steps meets, one after the other: a short `--time` limit
(SLURM's warning comes at the start; the run saves after the step in progress and requeues itself),
`scontrol requeue` of the controller job as the next incarnation's trainer job runs (SIGTERM, no warning,
nothing new saved), and `scancel` of the rollout job in the next incarnation's step after the one it saved;
each time the next incarnation resumes from the saved step (the last one at the end of the first epoch).
The last one passes every check a smoke run promises (`smoke_support.check_passing_run`), with no job of the
run left. A run whose worker cannot start is requeued twice, then stops with the cause and leaves nothing
queued. One whole run costs minutes on 2 cores, so the rest of the SLURM path (a worker job that pends past
the start-up timeout among them) is tested where it is cheap, against the same real SLURM
(tests/slurm/test_scheduler.py).

Each test runs with a seed of its own, in an xdist group of its own (tests/conftest.py), on a cluster of its
own: AReaL draws its ports from `random` seeded with it, so neither picks the ports of the other or of the
local smoke runs beside them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from examples.tau2.cpu.smoke import SUMMARY_FILE
from examples.tau2.slurm import queue
from examples.tau2.slurm.registry import JobRegistry, job_name_prefix
from examples.tau2.slurm.requeue import Cause, Journal
from tests.cpu.smoke_support import (
    REPO,
    check_passing_run,
    format_result_for_log,
    smoke_command,
    stats_steps,
)
from tests.domain_shapes import write_domain
from tests.slurm.support import slurm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.memory(gib=10)]  # a whole run

EXPERIMENT = "tau2-smoke-cpu"
SEED, FAILED_START_SEED = "seed=7", "seed=8"
"""Not the other smoke runs' seed, nor each other's: AReaL draws its free ports from `random` seeded
with it."""
OWN_DOMAIN = REPO / "examples" / "tau2" / "docs" / "own_domain"
LIBRARY = ("econfig.domain=library", "econfig.domain_modules=[library_desk]", "econfig.train_split=train")
"""docs/own_domain.md's smoke command."""
ODD = ("econfig.domain=odddesk", "econfig.domain_modules=[odd_desk]", "econfig.train_split=all",
       "smoke.tiny_model.warmup_domain=library", "smoke.tiny_model.warmup_domain_modules=[library_desk]")
"""The guide's smoke command on the requeue run's five-task domain without splits, its policy warmed up on
the example's tasks (the one scripts/test.sh builds)."""
SCRIPT = REPO / "examples" / "tau2" / "tau2_rl.sh"
INCARNATION_TIMEOUT_S = 600


def submit_env(tmp_path: Path, sbatch: str, **more: str) -> dict[str, str]:
    """This process's environment (the local SLURM's SLURM_CONF included), the example domain's folder and
    `tmp_path/domains` on PYTHONPATH, this interpreter, the controller's log and arguments under `tmp_path`,
    and `more`."""
    env = {k: v for k, v in os.environ.items() if k not in ("TAU2_CONFIG",)}
    folders = (str(OWN_DOMAIN), str(tmp_path / "domains"), env.get("PYTHONPATH", ""))
    path = os.pathsep.join(p for p in folders if p)
    return {**env, "PYTHONPATH": path,
            "TAU2_PYTHON": sys.executable, "TAU2_RUN_DIR": str(tmp_path / "run"),
            "TAU2_CONTROLLER_SBATCH": sbatch, **more}


def submit_smoke(tmp_path: Path, sbatch: str, flags: tuple[str, ...], *overrides: str, seed: str = SEED,
                 domain: tuple[str, ...] = LIBRARY, **env: str) -> tuple[int, Path]:
    """`tau2_rl.sh smoke --submit FLAGS` with the CI-sized run on `domain` under `tmp_path` and `overrides`,
    `env` set: (job id, log)."""
    smoke = smoke_command(tmp_path, "scheduler.type=slurm", seed, *domain, *overrides)[3:]  # the overrides
    done = subprocess.run(["bash", str(SCRIPT), "smoke", "--submit", *flags, *smoke], cwd=REPO, text=True,
                          capture_output=True, env=submit_env(tmp_path, sbatch, **env), timeout=300)
    assert done.returncode == 0, done.stderr[-5000:]
    m = re.search(r"^controller: SLURM job (\d+), log (\S+)$", done.stdout, re.MULTILINE)
    assert m, done.stdout
    return int(m.group(1)), Path(m.group(2))


def run_jobs() -> list[queue.JobStatus]:
    """The run's worker jobs SLURM still holds or waits to start."""
    return [j for j in queue.jobs_named(job_name_prefix(EXPERIMENT, "run")) if j.active]


def running_job(root: Path, role: str) -> int | None:
    """The run's SLURM job for `role` as the controller registered it last, while it runs (else None)."""
    job = JobRegistry.of_trial(str(root), EXPERIMENT, "run").entries().get(role, {}).get("job_id")
    status = queue.query_jobs([job]).get(job) if job is not None else None
    return job if status is not None and status.running else None


def saved_step(root: Path) -> int:
    """The last saved step (1-based; 0: none)."""
    info = list((root / "checkpoints").glob("*/*/*/recover_info/step_info.json"))
    return json.loads(info[0].read_text())["global_step"] + 1 if info else 0


def wait_on(job: int, log: Path, predicate, what: str, timeout_s: float = INCARNATION_TIMEOUT_S) -> float:
    """Seconds until `predicate()`; fails with the log's tail if the controller job ends first (a final
    state for 30 s: while SLURM requeues a job, `squeue` may show one for a moment)."""
    start = time.monotonic()
    final_since: float | None = None
    while not predicate():
        status = queue.query_jobs([job]).get(job)
        if status is None or status.active:
            final_since = None
        elif final_since is None:
            final_since = time.monotonic()
        elif time.monotonic() - final_since > 30:
            pytest.fail(f"the controller job ended ({status.state}) before {what}:\n"
                        f"{log.read_text()[-6000:]}")
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"no {what} within {timeout_s:.0f} s:\n{log.read_text()[-6000:]}")
        time.sleep(0.5)
    return time.monotonic() - start


def ended_for_good(job: int, said: Callable[[], bool]) -> bool:
    """The controller has said it ends for good (`said`: its last words are in the log or the journal) and
    its job is in a final state, so no requeue follows. The state alone is not enough: SLURM shows a final
    one for a moment while it requeues a job."""
    if not said():
        return False
    status = queue.query_jobs([job]).get(job)
    return status is None or not status.active


def test_the_controller_job_outlives_a_time_limit_a_requeue_and_a_lost_worker(tmp_path):
    """Two nodes of 2 CPUs: the controller (1 CPU), the trainer (2) and the vLLM server (1) fill them.
    `--time=10` with the warning 539 s before it (the longest the pre-flight accepts: more than a minute
    between them): the time limit is within the warning's reach as the first incarnation starts, so it
    trains one step, saves it and requeues the job. Then the limit goes up to 30 minutes; once the second
    incarnation's trainer job runs, `scontrol requeue` ends it with SIGTERM before it trains (a requeue
    without progress goes on); once the third one has saved step 2 and dumped an episode of step 3,
    `scancel` takes its rollout job. The fourth incarnation trains step 3 and passes every smoke check; no
    step ran twice and none is lost."""
    write_domain(tmp_path / "domains", "odd_desk", "odddesk", 5, n_test=0, splits=False)
    with slurm(nodes=2, cpus=2, mem_mb=12288):
        job, log = submit_smoke(tmp_path, "--cpus-per-task=1 --mem=2G --time=10", ("--signal", "USR1@539"),
                                "total_train_steps=3",  # the epochs follow from the domain's tasks
                                # each incarnation trains one step, so none trains what a swap interrupted:
                                # synchronously (the asynchronous resume: tests/cpu/test_smoke_faults.py)
                                "rollout.max_head_offpolicyness=0", "smoke.serve_step_ms=0", domain=ODD)
        journal = Journal.beside(log.with_suffix(".args"))
        wait_on(job, log, lambda: len(journal.endings()) >= 1, "a requeue at the time limit")
        queue.run("scontrol", "update", f"JobId={job}", "TimeLimit=30")
        # the first incarnation's jobs had left RUNNING when it wrote its ending: this one is the second's
        wait_on(job, log, lambda: running_job(tmp_path, "actor"), "the second incarnation's trainer job")
        queue.run("scontrol", "requeue", str(job))
        wait_on(job, log, lambda: saved_step(tmp_path) >= 2, "step 2 saved")
        saved = time.time()
        wait_on(job, log, lambda: any(  # an episode of step 3 dumped
            p.stat().st_mtime > saved for p in (tmp_path / "tau2_dumps").rglob("*.json")), "step 3 under way")
        queue.run("scancel", str(rollout := running_job(tmp_path, "rollout")))
        wait_on(job, log, lambda: ended_for_good(job, lambda: "tau2 CPU smoke run:" in log.read_text()),
                "the run's end", 2 * INCARNATION_TIMEOUT_S)
        out = log.read_text()
        assert queue.query_jobs([job])[job].state == "COMPLETED", out[-6000:]
        assert "tau2 CPU smoke run: PASSED" in out, out[-6000:]
        assert not run_jobs()
    endings = journal.endings()
    assert [e.cause for e in endings] == [Cause.TIME_LIMIT, Cause.TERMINATED, Cause.WORKER_LOST], endings
    assert [e.saved_step for e in endings] == [1, 1, 2] and [e.steps_lost for e in endings] == [0, 0, 0]
    assert [e.progress for e in endings] == [True, False, True] and endings[0].signal_at is not None
    assert re.search(rf"SLURM job {rollout} \({EXPERIMENT}_run:rollout\) is (CANCELLED|COMPLETING)",
                     endings[2].detail), endings[2]  # COMPLETING: SLURM still kills its processes
    assert all(re.search(rf"controller_job: SLURM job {job} on \S+, incarnation {n}\n", out)
               for n in (2, 3, 4))
    for n, cause, step in ((2, "terminated by SLURM", 2), (3, "worker lost", 3)):  # the second trained none
        assert re.search(rf"controller_job: requeue {n} \({re.escape(cause)}\): step {step} trained "
                         r"[\d.]+ s after", out), out[-6000:]
    for line in re.findall(r"controller_job: requeue \d+ \(.*", out):
        print(line)
    assert stats_steps(tmp_path) == [0, 1, 2]  # each step once
    assert not list(log.parent.glob("*.args"))  # the run ended for good: its arguments go
    summary = json.loads(next(tmp_path.glob(f"logs/**/{SUMMARY_FILE}")).read_text())
    print(format_result_for_log(summary))
    check_passing_run(summary, tmp_path)
    assert summary["steps"] == 3 and "globalstep2" in summary["checkpoint"], summary["checkpoint"]
    dumped = {json.loads(p.read_text())["domain"] for p in (tmp_path / "tau2_dumps").rglob("*.json")}
    assert dumped == {"odddesk"}, dumped
    nodes = set(re.findall(r"role (?:actor|rollout): SLURM job \d+ on (n\d) \(RUNNING\)",
                           " | ".join(summary["placement"])))
    assert nodes == {"n1", "n2"}, summary["placement"]


def test_a_run_that_fails_at_start_is_requeued_twice_then_stops_with_the_cause(tmp_path):
    """The trainer's worker cannot start (no such module): each incarnation fails at start and saves
    nothing; after two requeues without a new saved step the controller stops for good, naming the cause,
    and nothing of the run is left queued."""
    with slurm(nodes=1, cpus=4, mem_mb=20480):  # the controller, trainer and vLLM server at once
        job, log = submit_smoke(tmp_path, "--cpus-per-task=1 --mem=2G", ("--max-requeues", "10"),
                                "actor.scheduling_spec.0.cmd=python3 -m no_such_module",
                                seed=FAILED_START_SEED)
        journal = Journal.beside(log.with_suffix(".args"))
        wait_on(job, log, lambda: ended_for_good(job, lambda: any(not e.requeued for e in journal.endings())),
                "the controller's end", 900)
        out = log.read_text()
        assert queue.query_jobs([job])[job].state == "FAILED", out[-6000:]
        assert not run_jobs() and not [j for j in queue.jobs_named("") if j.active]
    endings = journal.endings()
    assert [(e.restart, e.cause, e.progress, e.requeued) for e in endings] == [
        (0, Cause.WORKER_LOST, False, True), (1, Cause.WORKER_LOST, False, True),
        (2, Cause.WORKER_LOST, False, False)]
    assert "No module named no_such_module" in out
    assert re.search(r"controller_job: stopped for good after worker lost \(WorkerFailedError: SLURM job \d+ "
                     rf"\({EXPERIMENT}_run:actor\) is FAILED \(NonZeroExitCode\) on n1: the actor workers "
                     r"are gone .*\); no step saved; not requeued: the last 2 requeues saved no new step",
                     out), out[-6000:]
    assert not list(log.parent.glob("*.args"))
