"""AReaL 1.0.4's recover checkpoints made safe against `kill -9` (mirrors `PPOTrainer.train`'s step order).

`resumable_trainer_class(PPOTrainer)` (or any subclass) changes how the same state is written (1, 2) and
stops a run that can no longer train (3, 4):

1. **Atomic saves.** AReaL's `RecoverHandler.dump` overwrites `default/recover_checkpoint` (DCP) and
   the files of `recover_info/` in place. A kill during a save leaves a checkpoint of one step with the
   info of another, or a torn info file, and then `RecoverHandler.load` logs a warning and trains from
   step 1 over the old run. Here the checkpoint and the info go to `<dir>.next`, and
   `training.recover.commit` swaps them in behind a journal; a rerun finishes or undoes an interrupted swap
   (`training.recover.repair`) before AReaL looks.
2. **Stats first.** `PPOTrainer.train` saves the recover state before it commits the step's stats, so a
   kill between the two loses that step's stats for good. Here the save runs right after the commit
   (still before `rollout.resume()`); a rerun drops the stats lines of steps after the saved one, which
   run again (`training.recover.trim_stats`), so each step is logged exactly once.
3. **A dead inference server stops the run.** AReaL 1.0.4 does not watch its SGLang/vLLM servers: when
   one dies, every episode is rejected (`policy_endpoint`), the rollout draws new groups forever and the
   run stalls while its log grows by megabytes a minute (measured on CPU: bench/RESULTS.md, "Failures
   during the smoke run").
   `ServerWatchdog` connects to each server every few seconds during `train`; after
   `server_dead_after_s` of refused connections it stops the run with `InferenceServerDied`, naming the
   server, so the rerun (which resumes) can start a fresh one. If that interrupt does not end the run
   within a minute (SIGINT is ignored in jobs started with `&` by a non-interactive shell), the watchdog
   stops the child processes and exits with status 1.
4. **A SLURM job that ends stops the run.** Under `scheduler.type=slurm` (`slurm.scheduler`) a second
   `Watchdog` asks SLURM every `job_poll_s` whether each job of the workers still runs; a cancelled,
   failed or node-lost job stops the run with `WorkerJobEnded`, naming the job, its role, state and node.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from areal.api import SaveLoadMeta
from areal.utils.recover import RecoverHandler
from areal.utils.saver import Saver

from examples.tau2.compat import require
from examples.tau2.training.recover import RecoverPaths, commit, recover_paths, staged

logger = logging.getLogger("tau2_areal.recover")


class AtomicRecoverHandler(RecoverHandler):
    """AReaL's recover handler writing each save to `.next` directories and swapping them in at once."""

    def __init__(self, config: Any, ft_spec: Any, paths: RecoverPaths):
        super().__init__(config, ft_spec)
        self.paths = paths

    @classmethod
    def adopt(cls, handler: RecoverHandler, paths: RecoverPaths) -> AtomicRecoverHandler:
        """The same handler state (frequency timers, last step) with atomic saves."""
        new = cls(handler.config, handler.ft_spec, paths)
        new.freq_ctl, new.last_step_info = handler.freq_ctl, handler.last_step_info
        return new

    def recover_info_path(self, *_: Any) -> str:  # type: ignore[override]
        """Where `dump` writes the info files: the staging directory (`load` ran before adoption)."""
        return str(staged(self.paths.info))

    def _save_checkpoint(self, engine: Any, name: str = "default", tokenizer: Any = None,
                         processor: Any = None, base_model_path: str | None = None) -> None:
        live = Saver.get_recover_checkpoint_path(self.config.experiment_name, self.config.trial_name,
                                                 self.config.fileroot, name=name)
        path = staged(Path(live))
        shutil.rmtree(path, ignore_errors=True)
        engine.save(SaveLoadMeta(path=str(path), weight_format="dcp",
                                 with_optim=not self.config.no_save_optim, tokenizer=tokenizer,
                                 processor=processor, base_model_path=base_model_path))

    def dump(self, engine: Any, step_info: Any, *args: Any, **kwargs: Any) -> None:
        shutil.rmtree(staged(self.paths.info), ignore_errors=True)
        start = time.perf_counter()
        super().dump(engine, step_info, *args, **kwargs)
        if self.last_step_info is not step_info:  # not due at this step
            return
        commit(self.paths, step_info.global_step)
        logger.info("saved the recover state of step %d in %.1f s (%s)", step_info.global_step + 1,
                    time.perf_counter() - start, self.paths.save_root)


class InferenceServerDied(RuntimeError):
    """An inference server stopped accepting connections during training."""


class WorkerJobEnded(RuntimeError):
    """A SLURM job of the run's workers ended (cancelled, failed, node lost) during training."""


def interrupt_main_thread() -> None:
    """SIGINT to the main thread: wakes it from a blocking wait (`_thread.interrupt_main` would not)."""
    ident = threading.main_thread().ident
    if ident is not None:
        signal.pthread_kill(ident, signal.SIGINT)


def accepts_connections(host: str, port: int, timeout_s: float = 5.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


class Watchdog:
    """While active, calls `probe()` every `poll_s`; the first time it returns a sentence (the run cannot
    go on), logs it and interrupts the main thread (`failure` says why). If the run is still inside the
    watched block `exit_after_s` later (a process started in the background by a non-interactive shell
    inherits SIGINT ignored, and a wait may swallow the interrupt), it stops every child process and exits
    the process with status 1: a dead part of the run must end it, never stall it."""

    def __init__(self, probe: Callable[[], str], poll_s: float = 5.0, exit_after_s: float = 60.0,
                 name: str = "tau2-watchdog"):
        self.probe, self.poll_s, self.exit_after_s = probe, poll_s, exit_after_s
        self.failure = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name=name)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                failure = self.probe()
            except Exception as e:  # a probe that cannot look (e.g. SLURM busy) is not a failure of the run
                logger.warning("%s could not check the run: %s: %s", self._thread.name, type(e).__name__, e)
                continue
            if not failure or self._stop.is_set():
                continue
            self.failure = failure
            logger.error("%s", failure)
            interrupt_main_thread()
            if not self._stop.wait(self.exit_after_s):
                exit_now(f"the run did not stop within {self.exit_after_s:.0f} s of the interrupt; "
                         f"exiting: {failure}")
            return


class ServerWatchdog(Watchdog):
    """A `Watchdog` that connects to each `(host, port)` every `poll_s` and fails once one has refused
    connections for `dead_after_s`."""

    def __init__(self, addresses: list[tuple[str, int]], dead_after_s: float, poll_s: float = 5.0,
                 exit_after_s: float = 60.0):
        super().__init__(self._dead_server, poll_s, exit_after_s, name="tau2-server-watchdog")
        self.addresses, self.dead_after_s = addresses, dead_after_s
        self._down_since: dict[tuple[str, int], float] = {}

    def __enter__(self) -> ServerWatchdog:
        if self.addresses:
            super().__enter__()
        return self

    def _dead_server(self) -> str:
        for host, port in self.addresses:
            if accepts_connections(host, port):
                self._down_since.pop((host, port), None)
                continue
            since = self._down_since.setdefault((host, port), time.monotonic())
            if time.monotonic() - since >= self.dead_after_s:
                return (f"the inference server at {host}:{port} has refused connections for "
                        f"{time.monotonic() - since:.0f} s (it died); rerun the same command to resume from "
                        "the last saved step")
        return ""


def exit_now(message: str) -> None:
    """Log `message`, stop every child process, exit with status 1 (from any thread)."""
    from examples.tau2.runtime.process import hard_exit, stop_descendants

    logger.error("%s", message)
    stop_descendants()
    hard_exit(1)


class ResumableTrainerMixin:
    """Put before AReaL's `PPOTrainer` (or a subclass): atomic recover saves, made after the stats commit,
    and a run that stops when an inference server dies or (on SLURM) a worker job ends."""

    _deferred_recover_save: tuple[int, int, int] | None = None
    server_dead_after_s: float = 15.0
    """Refused connections for this long make an inference server dead: a refusal means nothing listens on
    the port (a busy server still accepts, and a full accept queue drops, not refuses), and AReaL never
    restarts a server; four refused polls in a row rule out a probe's own hiccup."""
    job_poll_s: float = 5.0
    """How often a SLURM run checks that every job of its workers still runs."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any):
        require("areal", "1.0.4", "ResumableTrainerMixin (examples/tau2/compat/areal_recover.py)")
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]
        self.recover_handler = AtomicRecoverHandler.adopt(self.recover_handler, recover_paths(config))

    def train(self, *args: Any, **kwargs: Any) -> Any:
        servers = getattr(getattr(self, "rollout", None), "server_infos", None) or []
        # A scheduler that can tell when one of its jobs ended (slurm.scheduler.Tau2SlurmScheduler).
        ended_job = getattr(getattr(self, "scheduler", None), "ended_job", None)
        with contextlib.ExitStack() as watching:
            jobs = watching.enter_context(Watchdog(ended_job, self.job_poll_s, name="tau2-job-watchdog")) \
                if ended_job is not None else None
            servers_watched = watching.enter_context(
                ServerWatchdog([(s.host, s.port) for s in servers], self.server_dead_after_s))
            try:
                return super().train(*args, **kwargs)  # type: ignore[misc]
            except KeyboardInterrupt:
                if jobs is not None and jobs.failure:
                    raise WorkerJobEnded(jobs.failure) from None
                if servers_watched.failure:
                    raise InferenceServerDied(servers_watched.failure) from None
                raise

    def _save_recover_checkpoint(self, epoch: int, epoch_step: int, global_step: int) -> None:
        self._deferred_recover_save = (epoch, epoch_step, global_step)

    def _export_and_commit_stats(self, epoch: int, epoch_step: int, global_step: int) -> None:
        super()._export_and_commit_stats(epoch, epoch_step, global_step)  # type: ignore[misc]
        deferred, self._deferred_recover_save = self._deferred_recover_save, None
        if deferred is not None:
            super()._save_recover_checkpoint(*deferred)  # type: ignore[misc]


@functools.cache
def resumable_trainer_class(base: type) -> type:
    """`base` (AReaL's `PPOTrainer` or a subclass) with `ResumableTrainerMixin`."""
    return type(f"Resumable{base.__name__}", (ResumableTrainerMixin, base),
                {"__doc__": f"{base.__name__} with atomic recover saves after the stats commit, stopped "
                            "when an inference server dies or a worker job ends."})
