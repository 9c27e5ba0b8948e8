"""The SLURM jobs of one run, on disk: so that whoever outlives the controller can cancel them.

The scheduler records each job id as soon as `sbatch` returns it, in `slurm_jobs.json` beside AReaL's
logs of the trial. Three readers cancel what it lists (and any job still named after the trial, for a
kill between `sbatch` and the record): the controller on any exit, the reaper after a `kill -9`
(`lifecycle.reaper`), and a rerun of the same trial before it submits its own jobs.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
from pathlib import Path

from examples.tau2.runtime.files import write_atomic
from examples.tau2.slurm import queue

logger = logging.getLogger("tau2_areal.slurm")

JOBS_FILE = "slurm_jobs.json"


def log_dir(fileroot: str, experiment: str, trial: str) -> Path:
    """AReaL's log folder of a trial (where its SlurmScheduler writes job scripts and worker logs)."""
    return Path(fileroot) / "logs" / getpass.getuser() / experiment / trial


def job_name_prefix(experiment: str, trial: str) -> str:
    """Every job AReaL submits for the trial is named `<prefix><role>` (`SlurmScheduler._slurm_name`)."""
    return f"{experiment}_{trial}:"


class JobRegistry:
    """`{role: {"job_id": int, "log": str}}` of a run, rewritten atomically on every change."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def of_trial(cls, fileroot: str, experiment: str, trial: str) -> JobRegistry:
        return cls(log_dir(fileroot, experiment, trial) / JOBS_FILE)

    def entries(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def job_ids(self) -> list[int]:
        return [int(e["job_id"]) for e in self.entries().values() if isinstance(e, dict) and "job_id" in e]

    def record(self, role: str, job_id: int, log: str) -> None:
        entries = self.entries()
        entries[role] = {"job_id": job_id, "log": log}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(entries, indent=2))

    def forget(self, role: str) -> None:
        entries = self.entries()
        if entries.pop(role, None) is not None:
            write_atomic(self.path, json.dumps(entries, indent=2))

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def run_jobs(fileroot: str, experiment: str, trial: str) -> list[queue.JobStatus]:
    """The trial's jobs SLURM still holds or waits to start: recorded ones and any named after it."""
    recorded = JobRegistry.of_trial(fileroot, experiment, trial).job_ids()
    found = {j.job_id: j for j in queue.query_jobs(recorded).values()}
    with contextlib.suppress(queue.SlurmError):
        found.update({j.job_id: j for j in queue.jobs_named(job_name_prefix(experiment, trial))})
    return [j for j in found.values() if j.active]


def cancel_run_jobs(fileroot: str, experiment: str, trial: str,
                    wait_s: float = 30.0) -> list[queue.JobStatus]:
    """Cancel every active job of the trial, pending ones too; returns those it cancelled. Raises
    `queue.SlurmError` when SLURM is unreachable or a job is still active `wait_s` later."""
    active = run_jobs(fileroot, experiment, trial)
    left = queue.cancel([j.job_id for j in active], wait_s=wait_s)
    if left:
        raise queue.SlurmError("still active after scancel: " + "; ".join(j.describe() for j in left))
    JobRegistry.of_trial(fileroot, experiment, trial).clear()
    return active
