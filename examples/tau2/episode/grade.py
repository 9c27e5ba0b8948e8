"""τ²'s grade of an episode in words, with what its database check compared: the criteria that failed and,
where the database differs from the ground truth's, the rows and fields that differ (table, key, field,
got, expected). τ² itself keeps only `db_match`, so a reader of a failed episode could not tell what the
agent changed wrongly or left undone.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

DB_DIFF_LIMIT = 50
"""Field differences kept per episode; the rest are counted (a large database stays a bounded record)."""
VALUE_CHARS = 200


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


def where_met(task: Any, messages: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """Where each ground-truth action and each `communicate_info` was met, by τ²'s own rules (the action
    check's `compare_with_tool_call`, the communicate check's text match): the turn of the first tool call
    or agent message that meets it, None where none does."""
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator

    def turn(i: int) -> int:
        t = getattr(messages[i], "turn_idx", None)
        return i if t is None else t

    criteria = task.evaluation_criteria
    calls = [(i, c) for i, m in enumerate(messages) for c in getattr(m, "tool_calls", None) or []]
    actions = [{"action_id": a.action_id, "name": a.name,
                "turn": next((turn(i) for i, c in calls if a.compare_with_tool_call(c)), None)}
               for a in (criteria.actions or [] if criteria else [])]
    said = [{"info": str(info), "turn": next(
        (turn(i) for i, m in enumerate(messages)
         if CommunicateEvaluator.evaluate_communicate_info([m], [str(info)])[0].met), None)}
        for info in (criteria.communicate_info or [] if criteria else [])]
    return {"actions": actions, "communicate": said}


def db_difference(domain: str, task: Any, messages: list[Any], solo_mode: bool = False) -> dict[str, Any]:
    """How the database an episode's tool calls leave (τ²'s replay of `messages`) differs from the one the
    task's ground truth leaves: `{"rows": [{"db", "table", "key", "field", "got", "expected"}], "more": n}`,
    at most `DB_DIFF_LIMIT` rows (`field` None: the whole row is missing on one side)."""
    from examples.tau2.compat.tau2_cache import InitialState
    from examples.tau2.episode import domain as tau2_domain

    start = InitialState.of(task)
    predicted = tau2_domain.make_environment(domain, solo_mode=solo_mode)
    predicted.set_state(initialization_data=start.data, initialization_actions=start.actions,
                        message_history=messages)
    gold = tau2_domain.make_environment(domain, solo_mode=solo_mode)
    gold.set_state(initialization_data=start.data, initialization_actions=start.actions,
                   message_history=start.history)
    for action in (task.evaluation_criteria.actions or []) if task.evaluation_criteria else []:
        with contextlib.suppress(Exception):  # as τ²'s gold replay: a failing call changes nothing
            gold.make_tool_call(tool_name=action.name, requestor=action.requestor, **action.arguments)
    rows: list[dict[str, Any]] = []
    for db, ours, theirs in (("agent", predicted.tools, gold.tools), ("user", predicted.user_tools,
                                                                      gold.user_tools)):
        if ours is not None and theirs is not None:
            rows += _differences(db, ours.db.model_dump(mode="json"), theirs.db.model_dump(mode="json"))
    return {"rows": rows[:DB_DIFF_LIMIT], "more": max(0, len(rows) - DB_DIFF_LIMIT)}


def _differences(db: str, got: dict[str, Any], expected: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for table in sorted(set(got) | set(expected)):
        a, b = got.get(table), expected.get(table)
        if a == b:
            continue
        if not (isinstance(a, dict) and isinstance(b, dict)):
            out.append(_row(db, table, None, None, a, b))
            continue
        for key in sorted(set(a) | set(b), key=str):
            ra, rb = a.get(key), b.get(key)
            if ra == rb:
                continue
            if not (isinstance(ra, dict) and isinstance(rb, dict)):
                out.append(_row(db, table, key, None, ra, rb))
                continue
            out += [_row(db, table, key, field, ra.get(field), rb.get(field))
                    for field in sorted(set(ra) | set(rb)) if ra.get(field) != rb.get(field)]
    return out


def _row(db: str, table: str, key: Any, field: str | None, got: Any, expected: Any) -> dict[str, Any]:
    return {"db": db, "table": table, "key": key, "field": field, "got": _short(got),
            "expected": _short(expected)}


def _short(value: Any) -> Any:
    """Scalars as they are; anything longer than `VALUE_CHARS` as JSON, cut."""
    if value is None or isinstance(value, bool | int | float):
        return value
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS] + f"... ({len(text)} chars)"
