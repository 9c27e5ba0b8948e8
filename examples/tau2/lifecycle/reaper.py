"""What a run leaves behind, or collides with, on this machine.

- A dead controller's workers and jobs live on, holding ports and GPUs: a rerun stops them, and so does
  the reaper the controller starts (`reaper_running`), the moment it dies, `kill -9` included.
- AReaL 1.0.4 seeds its port choice with `seed`: each controller records itself (`registered`) and
  `seed_collision` refuses a second local run of one seed.
- Libraries leave temporary files when killed: the commands run inside `own_temp_dir`.

Nothing here imports AReaL: the reaper runs this module alone, at once.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from examples.tau2.runtime.files import write_atomic
from examples.tau2.settings import addons

logger = logging.getLogger("tau2_areal.reaper")

STOP_REAPER = signal.SIGUSR1
"""What the controller sends its reaper on its way out, once it has stopped its workers itself."""
WORKER_MODULE = "areal.infra.rpc.rpc_server"
LIVE_RUNS_DIR_ENV = "TAU2_LIVE_RUNS_DIR"
_discarded: list[Path] = []


def alive(pid: int, create_time: float) -> bool:
    """Whether process `pid`, started at `create_time`, still runs (not a later process with its pid)."""
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - create_time) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def worker_processes(experiment: str, trial: str, fileroot: str,
                     started_before: float = float("inf")) -> list[psutil.Process]:
    """AReaL rpc workers of this trial on this machine (their shell wrappers included)."""
    own = {p.pid for p in [psutil.Process(), *psutil.Process().parents()]}
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
        tokens = " ".join(p.info["cmdline"] or []).split()
        if p.info["pid"] in own or WORKER_MODULE not in tokens or p.info["create_time"] > started_before:
            continue
        flags = dict(zip(tokens, tokens[1:], strict=False))  # each token and the one after it
        root = flags.get("--fileroot")
        if ((flags.get("--experiment-name"), flags.get("--trial-name")) == (experiment, trial)
                and root is not None and os.path.abspath(root) == os.path.abspath(fileroot)):
            found.append(p)
    return found


def stop_process_trees(procs: list[psutil.Process], timeout_s: float = 5.0) -> list[int]:
    """SIGTERM each process and its descendants, SIGKILL what is left after `timeout_s`; their pids."""
    everything: dict[int, psutil.Process] = {}
    for p in procs:
        with contextlib.suppress(psutil.Error):
            everything.update((q.pid, q) for q in [p, *p.children(recursive=True)])
    for q in everything.values():
        with contextlib.suppress(psutil.Error):
            q.terminate()
    _, left = psutil.wait_procs(list(everything.values()), timeout=timeout_s)
    for q in left:
        with contextlib.suppress(psutil.Error):
            q.kill()
    psutil.wait_procs(left, timeout=timeout_s)
    return sorted(everything)


def cancel_jobs(config: Any, log: logging.Logger | None = None) -> list[str]:
    """Cancel every job of this trial that the scheduler's add-on started (pending ones too; AReaL's local
    scheduler: none), as a controller that fails half-way or dies leaves them; a description of each."""
    return _cancel_jobs(config.scheduler.type, config.experiment_name, config.trial_name,
                        config.cluster.fileroot, log)


def _cancel_jobs(scheduler: str, experiment: str, trial: str, fileroot: str, log: logging.Logger | None,
                 why: str = "") -> list[str]:
    """A service that does not answer is logged, not raised: the caller is on its way out."""
    addon = addons.scheduler_addon(scheduler)
    if addon is None:
        return []
    try:
        cancelled = [j.describe() for j in addon.cancel_jobs(fileroot, experiment, trial)]
    except addons.Unreachable as e:
        (log or logger).error("%scannot cancel the %s jobs of %s/%s: %s", why, addon.service, experiment,
                              trial, e)
        return []
    if cancelled and log is not None:
        log.warning("%scancelled %d %s job(s) of %s/%s: %s", why, len(cancelled), addon.service, experiment,
                    trial, "; ".join(cancelled))
    return cancelled


@contextlib.contextmanager
def reaper_running(config: Any) -> Iterator[subprocess.Popen | None]:
    """A reaper, in its own session, for the duration of the block; it logs to `reaper.log` in AReaL's log
    directory of the trial. AReaL stops its workers when the controller exits or raises; after `kill -9`
    (or the OOM killer) they would live on (on a cluster: holding whole nodes)."""
    if config.scheduler.type not in addons.SCHEDULERS:
        yield None
        return
    experiment, trial, fileroot = config.experiment_name, config.trial_name, config.cluster.fileroot
    cmd = [sys.executable, "-m", "examples.tau2.lifecycle.reaper", "reap", "--pid", str(os.getpid()),
           "--create-time", repr(psutil.Process().create_time()), "--experiment-name", experiment,
           "--trial-name", trial, "--fileroot", fileroot, "--scheduler", config.scheduler.type]
    log_file = Path(fileroot) / "logs" / getpass.getuser() / experiment / trial / "reaper.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("a", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                cwd=Path(__file__).resolve().parents[3])
    try:
        yield proc
    finally:
        proc.send_signal(STOP_REAPER)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def reap(pid: int, create_time: float, experiment: str, trial: str, fileroot: str,
         poll_s: float = 0.5, scheduler: str = "local") -> None:
    """Wait for the controller `pid` to end, then stop its workers' processes or cancel their jobs. SIGTERM
    is ignored: `kill` of a process group, or SLURM cancelling a controller's job, sends it to the controller
    and the reaper at once; the controller stops it (`STOP_REAPER`) once the workers are stopped."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(STOP_REAPER, lambda *_: sys.exit(0))
    while alive(pid, create_time):
        time.sleep(poll_s)
    died = time.time()
    time.sleep(poll_s)  # a normal exit stops the workers itself; give stragglers a moment
    if addons.scheduler_addon(scheduler) is not None:
        _cancel_jobs(scheduler, experiment, trial, fileroot, logger, f"controller {pid} is gone; ")
        return
    if stopped := stop_process_trees(worker_processes(experiment, trial, fileroot, started_before=died)):
        logger.warning("controller %d is gone; stopped %d process(es) of %s/%s: %s", pid, len(stopped),
                       experiment, trial, stopped)


@dataclass(frozen=True)
class LiveRun:
    """A controller of a training run with AReaL's local scheduler, alive on this machine."""

    pid: int
    create_time: float
    seed: int
    experiment_name: str
    trial_name: str
    fileroot: str


def live_runs_dir() -> Path:
    return Path(os.environ.get(LIVE_RUNS_DIR_ENV) or Path(tempfile.gettempdir()) / "tau2-areal" / "live-runs")


def live_runs() -> list[LiveRun]:
    """The recorded runs whose controller still runs (a dead one's record is removed)."""
    runs = []
    for path in sorted(live_runs_dir().glob("*.json")):
        try:
            run = LiveRun(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # being written, or not ours
        if alive(run.pid, run.create_time):
            runs.append(run)
        else:
            path.unlink(missing_ok=True)
    return runs


def seed_collision(config: Any) -> str:
    """One sentence if a live run on this machine has this config's seed (local scheduler), else ""."""
    if config.scheduler.type != "local":
        return ""
    others = [r for r in live_runs() if r.seed == int(config.seed) and r.pid != os.getpid()]
    if not others:
        return ""
    o = others[0]
    return (f"seed={config.seed}: the run {o.experiment_name}/{o.trial_name} (pid {o.pid}, files in "
            f"{o.fileroot}) on this machine has the same seed, and AReaL 1.0.4 picks its ports from Python's "
            "random seeded with it, so the two runs would take the same ports; give this one another seed "
            f"(e.g. seed={int(config.seed) + 1}) or wait for it")


@contextlib.contextmanager
def registered(config: Any) -> Iterator[None]:
    """Record this controller as a live run (local scheduler) for the duration of the block."""
    if config.scheduler.type != "local":
        yield
        return
    path = live_runs_dir() / f"{os.getpid()}.json"
    run = LiveRun(os.getpid(), psutil.Process().create_time(), int(config.seed), config.experiment_name,
                  config.trial_name, config.cluster.fileroot)
    write_atomic(path, json.dumps(asdict(run)))
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def own_temp_dir() -> Iterator[Path]:
    """This process's temporary files go to a folder of their own (after `share_temp_dir`, those of the
    processes it starts too), removed with what `discard_on_exit` named when the block ends. Enter it
    before the run's checks: they import W&B, which makes its folders then. The folder is short (a Unix
    socket's path must stay under 108 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="tau2-"))
    saved_env = {k: os.environ.get(k) for k in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR")}
    saved_tempdir, tempfile.tempdir = tempfile.tempdir, str(folder)  # this process has read TMPDIR already
    try:
        yield folder
    finally:
        tempfile.tempdir = saved_tempdir
        os.environ.update({k: v for k, v in saved_env.items() if v is not None})
        for key in [k for k, v in saved_env.items() if v is None]:
            os.environ.pop(key, None)
        for path in [folder, *_discarded]:
            shutil.rmtree(path, ignore_errors=True)
        _discarded.clear()


def share_temp_dir() -> None:
    """The processes this one starts from now on use its `own_temp_dir` folder too. Only for processes on
    this machine: SLURM's nodes do not have the folder. Torch's compile cache stays where it was."""
    folder = tempfile.gettempdir()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                          os.path.join(os.path.dirname(folder), f"torchinductor_{getpass.getuser()}"))
    os.environ["TMPDIR"] = folder


def discard_on_exit(path: str | Path) -> None:
    """Remove `path`, a folder a library makes whatever its settings say, when `own_temp_dir` ends."""
    _discarded.append(Path(path))


def discard_swanlab_run() -> None:
    """AReaL's stats logger starts a SwanLab run whatever the config says (disabled mode by default), which
    SwanLab keeps in `~/.cache/swanlab/run-*` for ever: this process's goes with its `own_temp_dir`."""
    swanlab = sys.modules.get("swanlab")  # imported by AReaL's stats logger
    run = swanlab.get_run() if swanlab is not None else None
    if run is None:
        return
    import platformdirs

    if Path(run.public.swanlog_dir) == Path(platformdirs.user_cache_dir("swanlab", "SwanHubX")):
        discard_on_exit(run.public.run_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Stop a controller's workers once it dies (reaper_running).")
    p = parser.add_subparsers(dest="command", required=True).add_parser("reap")
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--create-time", type=float, required=True)
    for flag in ("--experiment-name", "--trial-name", "--fileroot"):
        p.add_argument(flag, required=True)
    p.add_argument("--scheduler", choices=addons.SCHEDULERS, default="local")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(asctime)s reaper: %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S")
    reap(args.pid, args.create_time, args.experiment_name, args.trial_name, args.fileroot,
         scheduler=args.scheduler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
