"""A controller job that outlives its SLURM job: it requeues itself and the next incarnation resumes.

`tau2_rl.sh slurm --submit` (and `smoke --submit`) submit the controller with `--requeue`,
`--open-mode=append` (one log for every incarnation) and `--signal=B:<SIG>@<grace>`: SLURM sends the signal
`grace` seconds before the time limit (up to a minute early), and on preemption when the cluster sets
`SlurmctldParameters=preempt_send_user_signal`. What ends an incarnation, and what follows:

- the warning signal: the run saves at the end of the step in progress and stops (`CONTROL`,
  `lifecycle/watchdog.py`); if no step ends within `max(grace - 60 s, grace / 2)` it is interrupted and
  the steps since the last save run again. The controller stops its workers, cancels their jobs and
  requeues its own job (`scontrol requeue`);
- a worker job lost, an inference server dead, any other failure after the checks passed: the same
  requeue, within the bound;
- SIGTERM from SLURM (`scontrol requeue` by someone, preemption without a signal, `scancel`): the run stops
  its workers and leaves; SLURM decides whether the job comes back (it keeps the arguments file for it).

Each incarnation appends its end to the journal beside the arguments file (`controller-*.requeues.jsonl`).
It is not requeued again after `--max-requeues` requeues, when the two incarnations before it and itself
saved no new step (a bad image, a node that cannot start a server: two requeues without progress), or when
a worker's job could not start (`Cause.UNSCHEDULABLE`). A worker job that pends on a busy queue is no
failure: the scheduler waits for it (slurm/scheduler.py).
SLURM holds a requeued job for `AuthInfo=cred_expire` (120 s by default) before it may start again.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import time
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from examples.tau2.lifecycle.watchdog import CONTROL, Watchdog
from examples.tau2.slurm import queue

logger = logging.getLogger("tau2_areal.slurm")

MAX_REQUEUES = 10
"""submitit's bound is 3 time-outs; a run of days meets more."""
DEFAULT_WARNING = "USR1@600"
"""Ten minutes: a step of a large model plus its save."""
STOP_MARGIN_S = 60.0
"""Of the grace, what the controller keeps after the stop: stopping the workers, cancelling their jobs,
requeueing."""
SIGNAL_EARLY_S = 60.0
"""SLURM may send the warning up to this much earlier than asked (its event loop's resolution)."""


class Cause(StrEnum):
    """Why an incarnation of the controller ended."""

    TIME_LIMIT = "time limit"
    """SLURM's warning signal with the time limit at most the grace (and its minute of slack) away."""
    PREEMPTED = "preempted"
    """SLURM's warning signal earlier than the time limit: preemption (`preempt_send_user_signal`)."""
    WORKER_LOST = "worker lost"
    """A worker or its SLURM job ended (node failure, preemption, `scancel`, a crash, at start too):
    `WorkerJobEnded` from the job watchdog, or AReaL's `WorkerFailedError` when a call reached it first."""
    UNSCHEDULABLE = "worker job cannot start"
    """A worker's job pends for a reason no wait clears (a down partition, a request past its limits) or
    past the pending limit (`WorkerJobCannotStart`): a requeued run would pend the same way."""
    SERVER_DIED = "inference server died"
    """`InferenceServerDied`."""
    TERMINATED = "terminated by SLURM"
    """SIGTERM to the controller: `scontrol requeue`, preemption without a signal, or `scancel`."""
    FAILED = "failed"
    """Any other exception after the checks passed (a failure at start included)."""


@dataclass(frozen=True)
class WarningSignal:
    """SLURM's warning before the time limit: `--signal=B:<name>@<grace_s>`."""

    name: str
    grace_s: int

    @classmethod
    def parse(cls, text: str) -> WarningSignal:
        """`USR1@600` (or `SIGUSR1@600`); ValueError in one sentence for anything else."""
        name, at, grace = text.partition("@")
        name = name.upper().removeprefix("SIG")
        if not at or not grace.isdigit() or int(grace) < 1 or not hasattr(signal, f"SIG{name}") \
                or name in ("KILL", "STOP", "TERM", "INT"):
            raise ValueError(f"--signal {text} is not SIGNAL@SECONDS with a signal the controller can catch "
                             f"other than TERM and INT, e.g. {DEFAULT_WARNING}")
        return cls(name, int(grace))

    @property
    def signum(self) -> int:
        return int(getattr(signal, f"SIG{self.name}"))

    @property
    def sbatch(self) -> str:
        return f"--signal=B:{self.name}@{self.grace_s}"

    @property
    def stop_within_s(self) -> float:
        """How long the run may take to reach a step's end after the signal."""
        return max(self.grace_s - STOP_MARGIN_S, self.grace_s / 2)


@dataclass(frozen=True)
class Ending:
    """How one incarnation of the controller ended: a line of the journal."""

    restart: int
    """SLURM_RESTART_COUNT of the incarnation: 0 for the first, n after n requeues."""
    cause: Cause
    detail: str
    stopped_at: float
    """When it stopped (Unix time); with `signal_at`, when SLURM's warning came (else None)."""
    signal_at: float | None
    saved_step: int | None
    """The last step saved when it stopped (1-based, as the logs count; None: none)."""
    last_step: int | None
    """The last step it trained (1-based; None: none)."""
    progress: bool
    """Whether it saved a step beyond the one it resumed from."""
    requeued: bool
    """Whether it requeued its job (False: it stopped for good, or SLURM decides)."""

    @property
    def steps_lost(self) -> int:
        """Steps trained but not saved: they run again."""
        if self.last_step is None:
            return 0
        return self.last_step - (self.saved_step or 0)

    @classmethod
    def from_json(cls, line: str) -> Ending:
        data: dict[str, Any] = json.loads(line)
        return cls(**{**data, "cause": Cause(data["cause"])})


class Journal:
    """The ends of a controller job's incarnations, one JSON line each, beside its arguments file."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def beside(cls, argfile: Path) -> Journal:
        return cls(argfile.with_name(argfile.name.removesuffix(".args") + ".requeues.jsonl"))

    def endings(self) -> list[Ending]:
        if not self.path.is_file():
            return []
        return [Ending.from_json(line) for line in self.path.read_text().splitlines() if line.strip()]

    def append(self, ending: Ending) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({**asdict(ending), "cause": ending.cause.value}) + "\n")


def ending(restart: int, cause: Cause, detail: str, signal_at: float | None,
           requeued: bool = False) -> Ending:
    """This incarnation's end as `CONTROL` saw the run; its saved step read once (a save may be under way)."""
    step = CONTROL.last_saved()
    saved, last = (None if s is None else s + 1 for s in (step, CONTROL.last_step))
    return Ending(restart, cause, detail, time.time(), signal_at, saved, last, made_progress(step), requeued)


def made_progress(saved: int | None) -> bool:
    """Whether `saved` (0-based, `CONTROL.last_saved()`) is beyond the step this process resumed from."""
    resumed = -1 if CONTROL.resumed_from is None else CONTROL.resumed_from
    return saved is not None and saved > resumed


def ending_before(earlier: list[Ending], restart: int) -> Ending | None:
    """How the incarnation before `restart` ended, if it said (a SIGKILL leaves no word)."""
    return next((e for e in reversed(earlier) if e.restart == restart - 1), None)


def why_not_requeue(earlier: list[Ending], now: Ending, max_requeues: int) -> str:
    """'' when the job may be requeued after `now`; else why not, one sentence."""
    if now.cause is Cause.UNSCHEDULABLE:
        return "its worker job could not start, and a requeued run would pend the same way"
    if now.restart >= max_requeues:
        return f"it was requeued {now.restart} time(s) already (--max-requeues {max_requeues})"
    before = ending_before(earlier, now.restart)
    if now.restart >= 2 and not now.progress and before is not None and not before.progress:
        return ("the last 2 requeues saved no new step (a failure that repeats at start: a bad image, a node "
                "that cannot start a server)")
    return ""


def time_left_s(job_id: int) -> float | None:
    """Seconds to the job's time limit; None when it has none or SLURM cannot say."""
    try:
        return queue.time_left_s(job_id)
    except queue.SlurmError:
        return None


def cause_of_warning(job_id: int, warning: WarningSignal) -> tuple[Cause, str]:
    """A warning signal with the time limit near is the time limit; earlier, a preemption."""
    left = time_left_s(job_id)
    if left is None:
        return Cause.PREEMPTED, "SLURM's warning signal, with no time limit in sight"
    if left <= warning.grace_s + SIGNAL_EARLY_S + 30:
        return Cause.TIME_LIMIT, f"SLURM's warning signal, {left:.0f} s before the time limit"
    return Cause.PREEMPTED, f"SLURM's warning signal, {left:.0f} s before the time limit (preemption)"


class WarningHandler:
    """On SLURM's warning signal: ask the run to stop at the end of the step in progress (after saving
    it), and interrupt it if no step ends in time. `cause`, `detail` and `signal_at` say what came."""

    def __init__(self, job_id: int, warning: WarningSignal):
        self.job_id, self.warning = job_id, warning
        self.cause: Cause | None = None
        self.detail = ""
        self.signal_at: float | None = None
        self.stop_by = math.inf
        """`time.monotonic()` by which the run should have stopped; past it, `overdue` says so."""
        self._overdue: Watchdog | None = None

    def install(self) -> None:
        """Catch the warning from now on. The batch script ignores it until then (`tau2_rl.sh`: its default
        action would end the job while Python starts), so one that came before is found by the time left."""
        signal.signal(self.warning.signum, self._on_signal)
        left = time_left_s(self.job_id) if self.job_id else None
        if left is not None and left <= self.warning.grace_s + SIGNAL_EARLY_S:
            self._warned(Cause.TIME_LIMIT, f"{left:.0f} s before the time limit as the controller starts, "
                         f"within the warning's {self.warning.grace_s} s")

    def _on_signal(self, signum: int, frame: object) -> None:
        self._warned(*cause_of_warning(self.job_id, self.warning))

    def _warned(self, cause: Cause, detail: str) -> None:
        if self.signal_at is not None:
            return
        self.signal_at = time.time()
        self.cause, self.detail = cause, detail
        if CONTROL.finished:
            logger.info("SIG%s: %s; the run has trained every step, it ends without a requeue",
                        self.warning.name, self.detail)
            return
        within = self.warning.stop_within_s
        CONTROL.stop_reason, self.stop_by = self.detail, time.monotonic() + within
        logger.warning("SIG%s: %s; the run saves at the end of the step in progress and stops (within "
                       "%.0f s), then the job requeues itself", self.warning.name, self.detail, within)
        self._overdue = Watchdog(self.overdue, poll_s=1.0, exit_after_s=STOP_MARGIN_S,
                                 name="tau2-requeue-deadline").__enter__()

    def overdue(self) -> str:
        """A sentence once a stop was requested and its deadline has passed, else ''."""
        if not CONTROL.finished and not CONTROL.saving and time.monotonic() > self.stop_by:
            return f"{CONTROL.stop_reason}: the run did not reach the end of a step in time; stopping it now"
        return ""


def requeue_job(job_id: int, wait_s: float = 300.0) -> None:
    """`scontrol requeue` of this process's own job, then wait for SLURM to end it (SIGTERM, default
    action), as a job requeued from outside ends, rather than exit while SLURM requeues it."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    queue.run("scontrol", "requeue", str(job_id))
    time.sleep(wait_s)


def describe_resume(earlier: list[Ending], restart: int, max_requeues: int) -> str:
    """The first line of a requeued incarnation: what ended the one before."""
    e = ending_before(earlier, restart)
    if e is None:
        return (f"requeue {restart} of at most {max_requeues}: SLURM requeued the job without a word from "
                "the incarnation before (killed without a signal: preemption or a node lost); resuming from "
                "the last saved step")
    saved = f"step {e.saved_step} saved" if e.saved_step else "no step saved"
    return (f"requeue {restart} of at most {max_requeues}: after {e.cause.value} ({e.detail}); {saved}, "
            f"{e.steps_lost} step(s) lost; resuming")


def describe_first_step(earlier: list[Ending], restart: int) -> str:
    """Logged at a requeued incarnation's first trained step: how long since the signal (or the stop)."""
    e = ending_before(earlier, restart)
    step = (CONTROL.first_step or 0) + 1
    if e is None or CONTROL.first_step_at is None:
        return f"requeue {restart}: step {step} trained"
    after = f"{CONTROL.first_step_at - e.stopped_at:.1f} s after the stop"
    if e.signal_at is not None:
        after = f"{CONTROL.first_step_at - e.signal_at:.1f} s after the signal, {after}"
    return f"requeue {restart} ({e.cause.value}): step {step} trained {after}; {e.steps_lost} step(s) lost"
