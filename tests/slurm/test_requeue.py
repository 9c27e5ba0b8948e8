"""The controller job's requeue rules (slurm/requeue.py) without a cluster: the warning signal's option, the
journal, the bound, and the cause a warning is given. The real thing, on the local SLURM:
tests/slurm/test_smoke_on_slurm.py."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal

import pytest

from examples.tau2.lifecycle import watchdog
from examples.tau2.slurm import queue, requeue
from examples.tau2.slurm.requeue import Cause, Ending, Journal, WarningSignal, why_not_requeue


def end(restart: int, progress: bool, cause: Cause = Cause.FAILED, saved: int | None = None,
        last: int | None = None) -> Ending:
    return Ending(restart, cause, "detail", 1000.0 + restart, None, saved, last, progress, True)


@pytest.mark.parametrize(("text", "name", "grace"), [("USR1@600", "USR1", 600), ("SIGUSR2@90", "USR2", 90),
                                                     ("usr1@5", "USR1", 5)])
def test_the_warning_signal_is_read_as_sbatch_writes_it(text, name, grace):
    w = WarningSignal.parse(text)
    assert (w.name, w.grace_s) == (name, grace) and w.sbatch == f"--signal=B:{name}@{grace}"
    assert w.signum == getattr(signal, f"SIG{name}")
    assert w.stop_within_s == max(grace - requeue.STOP_MARGIN_S, grace / 2)


@pytest.mark.parametrize("text", ["USR1", "USR1@", "USR1@-5", "USR1@0", "NOPE@60", "TERM@60", "KILL@60",
                                  "@60"])
def test_a_warning_the_controller_cannot_catch_is_refused_in_one_sentence(text):
    with pytest.raises(ValueError, match=r"is not SIGNAL@SECONDS .*e\.g\. USR1@600$"):
        WarningSignal.parse(text)


def test_the_journal_lives_beside_the_arguments_and_keeps_every_ending(tmp_path):
    journal = Journal.beside(tmp_path / "controller-20261127-1200-7.args")
    assert journal.path.name == "controller-20261127-1200-7.requeues.jsonl" and journal.endings() == []
    first, second = end(0, True, Cause.TIME_LIMIT, saved=3, last=3), end(1, False, Cause.WORKER_LOST, 3, 4)
    journal.append(first)
    journal.append(second)
    assert journal.endings() == [first, second]
    assert (first.steps_lost, second.steps_lost, end(0, False).steps_lost) == (0, 1, 0)


def test_requeues_stop_at_the_bound():
    assert why_not_requeue([], end(0, True), max_requeues=10) == ""
    assert why_not_requeue([end(i, True) for i in range(9)], end(9, True), max_requeues=10) == ""
    assert why_not_requeue([end(i, True) for i in range(10)], end(10, True), 10) == (
        "it was requeued 10 time(s) already (--max-requeues 10)")
    assert "--max-requeues 0" in why_not_requeue([], end(0, True), max_requeues=0)


def test_a_worker_job_that_cannot_start_is_not_requeued():
    """It pends for a reason no wait clears, or past the pending limit: a requeued run pends the same way."""
    assert why_not_requeue([], end(0, True, Cause.UNSCHEDULABLE), 10) == (
        "its worker job could not start, and a requeued run would pend the same way")


def test_two_requeues_without_a_new_saved_step_stop_the_run():
    """A failure at start repeats: requeue 1 and requeue 2 saved nothing, so the third failure stops it.
    One requeue without progress, or progress in between, goes on."""
    no_progress = "the last 2 requeues saved no new step"
    assert why_not_requeue([], end(0, False), 10) == ""
    assert why_not_requeue([end(0, False)], end(1, False), 10) == ""
    assert why_not_requeue([end(0, False), end(1, False)], end(2, False), 10).startswith(no_progress)
    assert why_not_requeue([end(0, True), end(1, False)], end(2, False), 10).startswith(no_progress)
    assert why_not_requeue([end(0, False), end(1, True)], end(2, False), 10) == ""
    assert why_not_requeue([end(0, False), end(1, False)], end(2, True), 10) == ""
    # the incarnation before left no word (killed without a signal): not counted against the run
    assert why_not_requeue([end(0, False)], end(2, False), 10) == ""


def test_a_warning_near_the_time_limit_is_the_time_limit_else_a_preemption(monkeypatch):
    warning = WarningSignal.parse("USR1@300")
    for left, cause in ((300.0, Cause.TIME_LIMIT), (389.0, Cause.TIME_LIMIT), (3600.0, Cause.PREEMPTED),
                        (None, Cause.PREEMPTED)):
        monkeypatch.setattr(queue, "time_left_s", lambda job_id, left=left: left)
        assert requeue.cause_of_warning(7, warning)[0] is cause

    def unreachable(job_id: int) -> float:
        raise queue.SlurmError("`squeue` failed")

    monkeypatch.setattr(queue, "time_left_s", unreachable)
    assert requeue.cause_of_warning(7, warning)[0] is Cause.PREEMPTED


@pytest.mark.parametrize(("text", "seconds"), [
    ("4:05", 245.0), ("1:00:00", 3600.0), ("2-01:00:10", 176410.0), ("0:00", 0.0), ("UNLIMITED", None),
    ("INVALID", None), ("", None)])
def test_squeue_time_left_is_read_in_seconds(text, seconds):
    assert queue.duration_s(text) == seconds


def test_the_warning_asks_the_run_to_stop_and_interrupts_it_when_overdue(monkeypatch):
    """SIGUSR1 to this process: a stop request with the grace's deadline; once it has passed, the main
    thread is interrupted (here: a recorded call) as the watchdogs do."""
    control = watchdog.RunControl()
    monkeypatch.setattr(requeue, "CONTROL", control)
    monkeypatch.setattr(queue, "time_left_s", lambda job_id: 3600.0)
    interrupts: list[str] = []
    monkeypatch.setattr(watchdog, "interrupt_main_thread", lambda: interrupts.append(control.stop_reason))
    monkeypatch.setattr(requeue.WarningSignal, "stop_within_s", property(lambda self: 0.2))
    previous = signal.getsignal(signal.SIGUSR1)
    handler = requeue.WarningHandler(7, WarningSignal.parse("USR1@60"))
    try:
        handler.install()
        assert handler.signal_at is None  # an hour left: no warning missed
        monkeypatch.setattr(queue, "time_left_s", lambda job_id: 30.0)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert handler.cause is Cause.TIME_LIMIT and handler.signal_at is not None
        assert control.stop_reason == "SLURM's warning signal, 30 s before the time limit"
        watchdog_thread = handler._overdue
        assert watchdog_thread is not None
        watchdog_thread._thread.join(timeout=10)
        assert interrupts == [control.stop_reason]
        watchdog_thread.__exit__()
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_progress_and_an_overdue_stop(monkeypatch):
    control = watchdog.RunControl(resumed_from=1, saved_step=1, saving=True)
    monkeypatch.setattr(requeue, "CONTROL", control)
    handler = requeue.WarningHandler(7, WarningSignal.parse("USR1@60"))
    assert not requeue.made_progress(control.last_saved()) and handler.overdue() == ""
    control.saved_step, control.stop_reason, handler.stop_by = 4, "preempted", 0.0  # its deadline passed
    # a save under way: the stop waits for it
    assert requeue.made_progress(control.last_saved()) and handler.overdue() == ""
    control.saving = False
    assert handler.overdue() == "preempted: the run did not reach the end of a step in time; stopping it now"


@pytest.mark.parametrize(("left", "warned"), [(100.0, True), (120.0, True), (121.0, False), (None, False)])
def test_a_warning_sent_before_the_controller_caught_it_is_found_by_the_time_left(monkeypatch, left, warned):
    """The batch script ignores the warning until Python catches it: a time limit within the grace (and
    SLURM's minute early) at start is the warning, without a signal; none in sight, or later, is not."""
    control = watchdog.RunControl()
    monkeypatch.setattr(requeue, "CONTROL", control)
    monkeypatch.setattr(queue, "time_left_s", lambda job_id: left)
    monkeypatch.setattr(requeue, "Watchdog", lambda *a, **k: contextlib.nullcontext())
    previous = signal.getsignal(signal.SIGUSR1)
    handler = requeue.WarningHandler(7, WarningSignal.parse("USR1@60"))
    try:
        handler.install()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert (handler.signal_at is not None) is warned and bool(control.stop_reason) is warned
    if warned:
        assert handler.cause is Cause.TIME_LIMIT
        assert control.stop_reason == (f"{left:.0f} s before the time limit as the controller starts, within "
                                       "the warning's 60 s")


def test_a_warning_outside_slurm_is_not_looked_for(monkeypatch):
    monkeypatch.setattr(queue, "time_left_s", lambda job_id: pytest.fail("asked SLURM outside a job"))
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        requeue.WarningHandler(0, WarningSignal.parse("USR1@60")).install()
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_finished_run_ignores_the_warning(monkeypatch):
    control = watchdog.RunControl(finished=True)
    monkeypatch.setattr(requeue, "CONTROL", control)
    monkeypatch.setattr(queue, "time_left_s", lambda job_id: 30.0)
    handler = requeue.WarningHandler(7, WarningSignal.parse("USR1@60"))
    handler._on_signal(signal.SIGUSR1, None)
    assert control.stop_reason == "" and handler._overdue is None and handler.cause is Cause.TIME_LIMIT


def test_a_requeued_incarnation_says_what_ended_the_one_before():
    earlier = [dataclasses.replace(end(0, True, Cause.TIME_LIMIT, saved=2, last=2), signal_at=990.0)]
    assert requeue.describe_resume(earlier, 1, 10) == (
        "requeue 1 of at most 10: after time limit (detail); step 2 saved, 0 step(s) lost; resuming")
    assert "without a word from the incarnation before" in requeue.describe_resume(earlier, 2, 10)


def test_a_failure_is_summed_up_by_what_names_its_cause():
    from areal.infra.scheduler.exceptions import WorkerFailedError

    from examples.tau2.slurm.controller_job import summary

    story = ("SLURM job 2 (e_t:actor) is FAILED (NonZeroExitCode) on n1: the actor workers are gone "
             "(log a.log)")
    failed = WorkerFailedError("actor/*", -1, f"{story}; the worker log ends:\n...")
    assert summary(failed) == f"WorkerFailedError: {story}; the worker log ends:"
    assert summary(RuntimeError("\n  boom\nmore")) == "RuntimeError: boom"
    assert len(summary(ValueError("x" * 900))) == 500
