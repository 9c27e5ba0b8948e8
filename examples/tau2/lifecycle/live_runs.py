"""The training runs alive on this machine, so that a second run that would collide with one is refused.

AReaL 1.0.4 seeds Python's `random` with the config's `seed` in the controller and in every worker and
proxy (`areal.utils.seeding.set_random_seed`, with a per-role key) and then picks its ports with it
(`areal.utils.network.find_free_ports`: a random port, checked free, bound later). Two runs of one seed on
one machine therefore pick the same ports in the same order, and one of them dies on `EADDRINUSE` once the
other binds a port between its check and its bind. Ports checked free are safe only across seeds; so each
controller with the local scheduler records itself here while it runs, and a run with the seed of a live
one is refused before anything starts, naming that run.

The records are one JSON file per controller in `TAU2_LIVE_RUNS_DIR` (default
`<tmp>/tau2-areal/live-runs`), each checked against the process it names (pid and start time), so a killed
run's record is ignored and removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

LIVE_RUNS_DIR_ENV = "TAU2_LIVE_RUNS_DIR"


@dataclass(frozen=True)
class LiveRun:
    """A controller of a training run with AReaL's local scheduler, alive on this machine."""

    pid: int
    create_time: float
    seed: int
    experiment_name: str
    trial_name: str
    fileroot: str

    def describe(self) -> str:
        return f"{self.experiment_name}/{self.trial_name} (pid {self.pid}, files in {self.fileroot})"


def live_runs_dir() -> Path:
    return Path(os.environ.get(LIVE_RUNS_DIR_ENV) or Path(tempfile.gettempdir()) / "tau2-areal" / "live-runs")


def _alive(run: LiveRun) -> bool:
    try:
        p = psutil.Process(run.pid)
        return abs(p.create_time() - run.create_time) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def live_runs() -> list[LiveRun]:
    """The recorded runs whose controller still runs (other records are removed)."""
    runs = []
    for path in sorted(live_runs_dir().glob("*.json")):
        try:
            run = LiveRun(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # being written, or not ours
        if _alive(run):
            runs.append(run)
        else:
            path.unlink(missing_ok=True)
    return runs


def this_run(config: Any) -> LiveRun:
    return LiveRun(pid=os.getpid(), create_time=psutil.Process().create_time(), seed=int(config.seed),
                   experiment_name=config.experiment_name, trial_name=config.trial_name,
                   fileroot=config.cluster.fileroot)


def seed_collision(config: Any) -> str:
    """One sentence if a live run on this machine has this config's seed (local scheduler), else ""."""
    if config.scheduler.type != "local":
        return ""
    others = [run for run in live_runs() if run.seed == int(config.seed) and run.pid != os.getpid()]
    if not others:
        return ""
    return (f"seed={config.seed}: the run {others[0].describe()} on this machine has the same seed, and "
            "AReaL 1.0.4 picks its ports from Python's random seeded with it, so the two runs would take "
            f"the same ports; give this one another seed (e.g. seed={int(config.seed) + 1}) or wait for it")


@contextlib.contextmanager
def registered(config: Any) -> Iterator[None]:
    """Record this controller as a live run (local scheduler) for the duration of the block."""
    if config.scheduler.type != "local":
        yield
        return
    folder = live_runs_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(this_run(config))))
    tmp.replace(path)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
