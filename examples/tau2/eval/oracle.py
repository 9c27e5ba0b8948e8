"""Which of τ²'s criteria a scored episode failed, in words, and the oracle check's verdict over a run.

The oracle (`evaluate --oracle`) plays each task's ground truth, so every task of a sound domain scores 1.0;
one that does not has a task τ²'s own grading cannot pass, and the check names the criterion that broke.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from examples.tau2.eval.metrics import TrialRecord, final_trials, is_success


def failed_checks(reward_info: Mapping[str, Any]) -> list[str]:
    """The criteria of the task's reward basis that τ²'s `RewardInfo` (as JSON) records as failed, one
    phrase each; the evaluator's note when none is (an episode ended early, an evaluator error)."""
    basis = set(reward_info.get("reward_basis") or [])
    found = []
    if "DB" in basis and (reward_info.get("db_check") or {}).get("db_match") is False:
        found.append("DB: db_match false (the end state differs from the ground truth's)")
    if "ENV_ASSERTION" in basis:
        found += [f"ENV_ASSERTION: {_call(c['env_assertion'], 'func_name')} is not "
                  f"{c['env_assertion'].get('assert_value', True)}"
                  for c in reward_info.get("env_assertions") or [] if not c.get("met")]
    if "ACTION" in basis:
        found += [f"ACTION: {_call(c['action'], 'name')} missing"
                  for c in reward_info.get("action_checks") or [] if not c.get("action_match")]
    if "COMMUNICATE" in basis:
        found += [f"COMMUNICATE: communicate_info {c['info']!r} not found in an agent message"
                  + (" (τ² drops commas from the messages before it looks: write it without one)"
                     if "," in c["info"] else "")
                  for c in reward_info.get("communicate_checks") or [] if not c.get("met")]
    if "NL_ASSERTION" in basis:
        found += [f"NL_ASSERTION: {c['nl_assertion']!r} not met"
                  for c in reward_info.get("nl_assertions") or [] if not c.get("met")]
    note = (reward_info.get("info") or {}).get("note")
    return found or ([str(note)] if note else [])


def _call(spec: Mapping[str, Any], name_key: str) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in (spec.get("arguments") or {}).items())
    return f"{spec.get(name_key)}({args})"


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
