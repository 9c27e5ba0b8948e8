"""Stopping what a dead controller leaves behind: its AReaL workers on this machine, its jobs under a
scheduler add-on (SLURM's), and the reaper, a small watcher that does both as soon as the controller dies.

    python -m examples.tau2.lifecycle.reaper reap --pid PID --create-time T --experiment-name E \
        --trial-name T --fileroot DIR [--scheduler local|slurm]          (started by `start_reaper`)

Nothing here imports AReaL: the reaper runs this module alone.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from examples.tau2.settings import addons

logger = logging.getLogger("tau2_areal.reaper")

STOP_REAPER = signal.SIGUSR1
"""What the controller sends its reaper on its way out, once it has stopped its workers itself."""
WORKER_MODULE = "areal.infra.rpc.rpc_server"


def _arg(tokens: list[str], flag: str) -> str | None:
    with contextlib.suppress(ValueError, IndexError):
        return tokens[tokens.index(flag) + 1]
    return None


def worker_processes(experiment: str, trial: str, fileroot: str, started_before: float | None = None) -> list:
    """AReaL rpc workers of this experiment, trial and fileroot on this machine (their shell wrappers
    included), optionally only those started before `started_before`."""
    import psutil

    found = []
    own = {p.pid for p in [psutil.Process(), *psutil.Process().parents()]}
    for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
        tokens = " ".join(p.info["cmdline"] or []).split()
        if p.info["pid"] in own or WORKER_MODULE not in tokens:
            continue
        if (_arg(tokens, "--experiment-name"), _arg(tokens, "--trial-name")) != (experiment, trial):
            continue
        root = _arg(tokens, "--fileroot")
        if root is None or os.path.abspath(root) != os.path.abspath(fileroot):
            continue
        if started_before is not None and p.info["create_time"] > started_before:
            continue
        found.append(p)
    return found


def stop_process_trees(procs: list, timeout_s: float = 5.0) -> list[int]:
    """SIGTERM each process and its descendants, SIGKILL what is left after `timeout_s`; their pids."""
    import psutil

    everything: dict[int, Any] = {}
    for p in procs:
        with contextlib.suppress(psutil.Error):
            for q in [p, *p.children(recursive=True)]:
                everything[q.pid] = q
    for q in everything.values():
        with contextlib.suppress(psutil.Error):
            q.terminate()
    _, alive = psutil.wait_procs(list(everything.values()), timeout=timeout_s)
    for q in alive:
        with contextlib.suppress(psutil.Error):
            q.kill()
    psutil.wait_procs(alive, timeout=timeout_s)
    return sorted(everything)


def _trial_key(config: Any) -> tuple[str, str, str]:
    return config.experiment_name, config.trial_name, config.cluster.fileroot


def stop_leftover_workers(config: Any) -> list[int]:
    """Stop the workers a dead controller of this trial left behind on this machine (local scheduler)."""
    if config.scheduler.type != "local":
        return []
    return stop_process_trees(worker_processes(*_trial_key(config)))


def cancel_jobs(config: Any, log: logging.Logger | None = None) -> list[str]:
    """Cancel every job of this trial that the scheduler's add-on started (SLURM's, pending ones too;
    AReaL's local scheduler: nothing): what a controller leaves when it fails half-way, or dies. Returns a
    description of each job cancelled. A service that does not answer is logged, not raised: the caller is
    already on its way out."""
    addon = addons.scheduler_addon(config.scheduler.type)
    if addon is None:
        return []
    experiment, trial, fileroot = _trial_key(config)
    try:
        cancelled = [j.describe() for j in addon.cancel_jobs(fileroot, experiment, trial)]
    except addons.Unreachable as e:
        (log or logger).error("cannot cancel the %s jobs of %s/%s: %s", addon.service, experiment, trial, e)
        return []
    if cancelled and log is not None:
        log.warning("cancelled %d %s job(s) of this trial: %s", len(cancelled), addon.service,
                    "; ".join(cancelled))
    return cancelled


def start_reaper(config: Any) -> subprocess.Popen | None:
    """A watcher, in its own session, that stops this trial's workers once this process dies (however):
    their processes on this machine (local scheduler) or their SLURM jobs, pending ones too (slurm). It
    logs to `reaper.log` in AReaL's log directory of the trial.

    AReaL stops its workers when the controller exits normally or raises; after `kill -9` (or the OOM
    killer) they would live on, holding ports, memory and GPUs (on a cluster: whole nodes)."""
    if config.scheduler.type not in addons.SCHEDULERS:
        return None
    import psutil

    experiment, trial, fileroot = _trial_key(config)
    cmd = [sys.executable, "-m", "examples.tau2.lifecycle.reaper", "reap", "--pid", str(os.getpid()),
           "--create-time", repr(psutil.Process().create_time()), "--experiment-name", experiment,
           "--trial-name", trial, "--fileroot", fileroot, "--scheduler", config.scheduler.type]
    log_file = Path(fileroot) / "logs" / getpass.getuser() / experiment / trial / "reaper.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("a", encoding="utf-8") as out:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                cwd=Path(__file__).resolve().parents[2])


@contextlib.contextmanager
def reaper_running(config: Any) -> Iterator[subprocess.Popen | None]:
    """`start_reaper` for the duration of the block (after a normal exit AReaL has stopped the workers)."""
    proc = start_reaper(config)
    try:
        yield proc
    finally:
        if proc is not None:
            proc.send_signal(STOP_REAPER)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def reap(pid: int, create_time: float, experiment: str, trial: str, fileroot: str,
         poll_s: float = 0.5, scheduler: str = "local") -> list[int]:
    """Wait for the controller `pid` to end, then stop the trial's workers it started: their processes
    (returns their pids) or, under SLURM, their jobs (returns the job ids).

    SIGTERM is ignored: `kill` of a whole process group, or SLURM cancelling a controller's job, sends it to
    the controller and the reaper at once, and the reaper is what must outlive the controller. The
    controller stops it with `STOP_REAPER` once its workers are stopped."""
    import psutil

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(STOP_REAPER, lambda *_: sys.exit(0))

    while True:
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - create_time) > 1e-3 or p.status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.Error:
            break
        time.sleep(poll_s)
    died = time.time()
    time.sleep(poll_s)  # a normal exit stops the workers itself; give stragglers a moment
    addon = addons.scheduler_addon(scheduler)
    if addon is not None:
        return _reap_jobs(pid, experiment, trial, fileroot, addon)
    stopped = stop_process_trees(worker_processes(experiment, trial, fileroot, started_before=died))
    if stopped:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} reaper: controller {pid} is gone; stopped "
              f"{len(stopped)} process(es) of {experiment}/{trial}: {stopped}", flush=True)
    return stopped


def _reap_jobs(pid: int, experiment: str, trial: str, fileroot: str, addon: addons.Addon) -> list[int]:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        cancelled = addon.cancel_jobs(fileroot, experiment, trial)
    except addons.Unreachable as e:
        print(f"{stamp} reaper: controller {pid} is gone; could not cancel the {addon.service} jobs of "
              f"{experiment}/{trial}: {e}", flush=True)
        return []
    if cancelled:
        print(f"{stamp} reaper: controller {pid} is gone; cancelled {len(cancelled)} {addon.service} job(s) "
              f"of {experiment}/{trial}: " + "; ".join(j.describe() for j in cancelled), flush=True)
    return [j.job_id for j in cancelled]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Stop a controller's workers once it dies (start_reaper).")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("reap")
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--create-time", type=float, required=True)
    p.add_argument("--experiment-name", required=True)
    p.add_argument("--trial-name", required=True)
    p.add_argument("--fileroot", required=True)
    p.add_argument("--scheduler", choices=addons.SCHEDULERS, default="local")
    args = parser.parse_args(argv)
    reap(args.pid, args.create_time, args.experiment_name, args.trial_name, args.fileroot,
         scheduler=args.scheduler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
