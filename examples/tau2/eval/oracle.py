"""Which of τ²'s criteria a scored episode failed, in words, and the oracle check's verdict over a run.

The oracle (`evaluate --oracle`) plays each task's ground truth, so every task of a sound domain scores 1.0;
one that does not has a task τ²'s own grading cannot pass, and the check names the criterion that broke.
"""

from __future__ import annotations

from collections.abc import Iterable

from examples.tau2.eval.metrics import TrialRecord, final_trials, is_success


def oracle_failures(records: Iterable[TrialRecord]) -> list[str]:
    """One line per task that some trial did not score 1.0 on (its first such trial): the domain, the task
    id and what failed. Empty when every trial of every task scored 1.0."""
    failing: dict[tuple[str, str], str] = {}
    for r in sorted(final_trials(records).values(), key=lambda r: (r.domain, r.task_id, r.trial)):
        if (r.domain, r.task_id) in failing or (r.scored and is_success(r.tau2_reward)):  # type: ignore[arg-type]
            continue
        why = (f"rejected ({r.rejection}: {r.rejection_detail})" if not r.scored else
               "; ".join(r.failed_checks or [r.note or r.termination]))
        score = f"{r.tau2_reward:.3f}" if r.scored else "no score"
        failing[(r.domain, r.task_id)] = f"{r.domain} task {r.task_id!r} ({score}, trial {r.trial}): {why}"
    return list(failing.values())
