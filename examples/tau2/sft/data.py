"""SFT data from tau2 episodes: export the policy's good trajectories as chat data, and tokenize it.

    python -m examples.tau2.sft.data --from runs/eval-oracle [more dirs...] --out data/sft.jsonl \
        [--min-reward 1.0] [--min-partial 0.5 --partial-per-task 1] [--domains airline retail] \
        [--tokenizer Qwen/Qwen3-1.7B]

`--from` takes evaluation output dirs (`eval.evaluate`: `trials.jsonl` names one dump per scored trial) and
episode dump dirs (`econfig.dump_dir` of a training run: `<domain>/<task>/<time>-<id>.json`, searched
recursively). Each exported row is one episode as the policy saw it, in OpenAI chat format:

    {"messages": [system, user, assistant (+ tool_calls), tool, ...], "tools": [the schemas it was sent],
     "metadata": {"domain", "task_id", "kind": "success" | "partial", "tau2_reward", "partial_credit",
                  "episodes": [every source episode with this exact conversation], ...}}

* **Exactly the policy's requests.** Dumps hold tau2's trajectory, not the prompt. The system prompt and
  tool schemas are rebuilt from tau2 as `Tau2AgentWorkflow` builds its agent, and checked against the
  fingerprints the workflow writes into every dump (`agent_view`); a mismatch (another tau2 release or
  prompt) is an error. Messages the policy never received are left out (the user simulator's own tool
  calls and their results), as tau2's orchestrator leaves them out of the agent's state.
* **Only the policy's turns are trained.** Assistant messages it did not generate (tau2's opening
  greeting, a task's scripted message history) carry OpenAI's `"weight": 0`.
* Tool-call ids are renumbered `call_0, call_1, ...` (servers make them up at random; the Qwen chat
  templates do not render them) so that equal conversations are equal rows. Solo mode's final `done()`
  call, which tau2 rewrites into the text `###STOP###`, is written back as the tool call it was. Calls of
  the optional `think` tool stay inside the agent and are not in dumps, so they are not in the rows.
* Filters: tau2 reward >= `--min-reward` (default 1: tau2's success); optionally, for tasks with no such
  episode, the `--partial-per-task` best failures whose partial credit (mean of tau2's reward breakdown)
  is >= `--min-partial`; episodes with an invalid tool call are left out unless `--keep-invalid`.
  Identical rows are written once (the row lists every episode it came from).

Next to the output, `<name>.manifest.json` records the sources (with an evaluation's settings), the
filters, why each left-out episode was left out, and counts per domain and per task.

`encode_conversation` renders a row with the tokenizer's chat template and marks the tokens of every
trained assistant turn (its text and tool calls through `<|im_end|>`, never the `<|im_start|>assistant`
header, the system prompt, user or tool turns): the `input_ids` / `loss_mask` rows that AReaL's
`SFTTrainer` trains on (`sft/train.py`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import logging
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from examples.tau2.runtime.files import fingerprint, write_atomic
from examples.tau2.runtime.process import setup_runtime

logger = logging.getLogger("tau2_areal.sft_data")

TRIALS_FILE, RUN_FILE, DUMPS_DIR = "trials.jsonl", "run.json", "dumps"
MANIFEST_SUFFIX = ".manifest.json"
REWARD_TOLERANCE = 1e-6
"""tau2's reward is a product of 0/1 checks: >= min_reward - this counts (as `eval.metrics.is_success`)."""
THINK_TOOL = "think"
TURN_END = "<|im_end|>"
"""End of a turn in ChatML templates (Qwen2, Qwen2.5, Qwen3): the last trained token of a turn."""


class ExportError(ValueError):
    """The sources cannot become SFT data; the message says why in one sentence."""


# ---------------------------------------------------------------------------------------------
# Reading episodes


@dataclass
class Episode:
    """One scored episode as its dump records it."""

    path: Path
    source: str
    """The `--from` directory it was found in."""
    domain: str
    task_id: str
    trial: int | None
    """The evaluation trial (None for training dumps)."""
    tau2_reward: float
    breakdown: dict[str, float]
    termination: str
    num_invalid_tool_calls: int
    agent_view: dict[str, Any]
    settings: dict[str, Any]
    """Episode settings of its evaluation run (`run.json`), empty for training dumps."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """tau2's trajectory, read again from the dump: only exported episodes need it, and a training
        run's dumps are too many to hold in memory at once."""
        return list(json.loads(self.path.read_text(encoding="utf-8"))["messages"])

    @property
    def partial_credit(self) -> float:
        """Mean of tau2's reward breakdown (the partial credit `shape_reward` blends in)."""
        return sum(self.breakdown.values()) / len(self.breakdown) if self.breakdown else self.tau2_reward

    @property
    def key(self) -> str:
        return f"{self.domain}/{self.task_id}"


_DUMP_KEYS = ("domain", "task_id", "tau2_reward", "messages", "termination")


def _read_dump(path: Path, source: str, trial: int | None, settings: dict[str, Any]) -> Episode | None:
    """The episode in one dump file; None if the JSON is not an episode dump."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ExportError(f"cannot read episode dump {path}: {e}") from None
    if not isinstance(d, dict) or any(k not in d for k in _DUMP_KEYS):
        return None
    return Episode(
        path=path, source=source, domain=str(d["domain"]), task_id=str(d["task_id"]), trial=trial,
        tau2_reward=float(d["tau2_reward"]),
        breakdown={str(k): float(v) for k, v in (d.get("reward_breakdown") or {}).items()},
        termination=str(d["termination"]), num_invalid_tool_calls=int(d.get("num_invalid_tool_calls", 0)),
        agent_view=dict(d.get("agent_view") or {}), settings=settings,
    )


@dataclass
class SourceSummary:
    """One `--from` directory, for the manifest."""

    path: str
    kind: str
    """"eval" (a eval.evaluate output dir) or "dumps" (an episode dump dir)."""
    episodes: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    """Files or trials that gave no episode, by reason."""


def read_source(path: Path) -> tuple[list[Episode], SourceSummary]:
    """Every scored episode of an evaluation dir or a dump dir."""
    if not path.exists():
        raise ExportError(f"{path} does not exist")
    if not path.is_dir():
        raise ExportError(f"{path} is not a directory (give an evaluation output dir or a dump dir)")
    if (path / TRIALS_FILE).is_file():
        return _read_eval_dir(path)
    summary = SourceSummary(path=str(path), kind="dumps")
    episodes = []
    for f in sorted(path.rglob("*.json")):
        episode = _read_dump(f, str(path), None, {})
        if episode is None:
            summary.skipped["not_a_dump"] = summary.skipped.get("not_a_dump", 0) + 1
        else:
            episodes.append(episode)
    if not episodes:
        raise ExportError(f"{path} holds no episode dumps (<domain>/<task>/<time>-<id>.json) and no "
                          f"{TRIALS_FILE}; is it an evaluation output dir or an econfig.dump_dir?")
    summary.episodes = len(episodes)
    return episodes, summary


def _read_eval_dir(path: Path) -> tuple[list[Episode], SourceSummary]:
    from examples.tau2.eval.metrics import TrialRecord, final_trials

    settings: dict[str, Any] = {}
    if (path / RUN_FILE).is_file():
        settings = json.loads((path / RUN_FILE).read_text(encoding="utf-8")).get("settings", {})
    summary = SourceSummary(path=str(path), kind="eval", settings=settings)
    records = []
    for n, line in enumerate((path / TRIALS_FILE).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(TrialRecord.from_json(json.loads(line)))
        except (ValueError, TypeError) as e:
            raise ExportError(f"line {n} of {path / TRIALS_FILE} is not a trial record ({e})") from None
    episodes = []
    for r in final_trials(records).values():
        reason = None
        if not r.scored:
            reason = "rejected_trial"
        elif not r.dump_path:
            reason = "no_dump"
        else:
            dump = Path(r.dump_path)
            if not dump.is_file():  # the output dir was moved: the same file under its dumps/
                dump = path / DUMPS_DIR / dump.parent.parent.name / dump.parent.name / dump.name
            episode = _read_dump(dump, str(path), r.trial, settings.get("episode", {})) \
                if dump.is_file() else None
            if episode is None:
                reason = "dump_missing"
            else:
                episodes.append(episode)
        if reason:
            summary.skipped[reason] = summary.skipped.get(reason, 0) + 1
    if not episodes:
        raise ExportError(f"{path / TRIALS_FILE} names no scored trial with a readable dump "
                          f"({', '.join(f'{k}: {v}' for k, v in summary.skipped.items()) or 'empty'})")
    summary.episodes = len(episodes)
    return episodes, summary


# ---------------------------------------------------------------------------------------------
# The policy's view of an episode


@dataclass(frozen=True)
class PolicyPrompt:
    """The system prompt and tool schemas `Tau2AgentWorkflow` sends the policy."""

    system_prompt: str
    tools: tuple[dict[str, Any], ...]

    def matches(self, view: dict[str, Any]) -> bool:
        return (view.get("system_prompt_sha256") == fingerprint(self.system_prompt)
                and view.get("tools_sha256") == fingerprint(list(self.tools)))


@functools.cache
def policy_prompt(domain: str, task_id: str, solo_mode: bool, think_tool: bool) -> PolicyPrompt:
    """As `tau2_agent._build_episode` builds the agent: tau2's `LLMAgent` (solo: `LLMSoloAgent`, whose
    prompt holds the task's ticket) with the domain's agent tools (+ user tools in solo mode, + the
    think tool, + solo's `done`)."""
    from tau2.agent.llm_agent import LLMAgent, LLMSoloAgent

    from examples.tau2.episode import domain as tau2_domain
    from examples.tau2.tau2_agent import agent_tools

    env = tau2_domain.make_environment(domain, solo_mode=solo_mode)
    offered = agent_tools(domain, solo_mode, think_tool)
    tools, schemas = offered.tools, list(offered.schemas)
    if solo_mode:
        agent: LLMAgent = LLMSoloAgent(tools=tools, domain_policy=env.get_policy(),
                                       task=tau2_domain.get_task(domain, task_id), llm="policy")
        schemas.append(agent.tools[-1].openai_schema)
    else:
        agent = LLMAgent(tools=tools, domain_policy=env.get_policy(), llm="policy")
    return PolicyPrompt(agent.system_prompt, tuple(schemas))


@dataclass(frozen=True)
class PromptModes:
    """Episode settings that change the prompt; used for dumps without an `agent_view`."""

    solo_mode: bool = False
    think_tool: bool = False


def episode_modes(episode: Episode, default: PromptModes) -> PromptModes:
    """Solo mode and the think tool: from the dump's tool names, else its evaluation's settings, else
    `default` (the command line)."""
    names = episode.agent_view.get("tool_names")
    if names is not None:
        from examples.tau2.episode.domain import SOLO_DOMAINS, is_builtin

        # solo mode's closing tool, always last; a built-in domain without tickets has no solo mode
        solo_domain = episode.domain in SOLO_DOMAINS or not is_builtin(episode.domain)
        return PromptModes(solo_mode=solo_domain and names[-1:] == ["done"],
                           think_tool=THINK_TOOL in names)
    if episode.settings:
        return PromptModes(solo_mode=bool(episode.settings.get("solo_mode")),
                           think_tool=bool(episode.settings.get("enable_think_tool")))
    return default


def _policy_indices(episode: Episode, solo_mode: bool, trajectory: list[dict[str, Any]]) -> set[int]:
    """Indices of the messages the policy generated: from the dump, or (older dumps) every assistant
    message after the task's message history and tau2's opening greeting."""
    if "policy_messages" in episode.agent_view:
        return {int(i) for i in episode.agent_view["policy_messages"]}
    from examples.tau2.episode import domain as tau2_domain

    task = tau2_domain.get_task(episode.domain, episode.task_id)
    state = task.initial_state
    history = len(state.message_history or []) if state is not None else 0
    first = history if history or solo_mode else 1
    return {i for i, m in enumerate(trajectory) if i >= first and m.get("role") == "assistant"}


def policy_messages(episode: Episode, solo_mode: bool) -> list[dict[str, Any]]:
    """The episode's messages as the policy received them (OpenAI format, after the system prompt);
    assistant messages it did not generate get `"weight": 0`."""
    from tau2.agent.llm_agent import LLMSoloAgent
    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage

    from examples.tau2.episode.llm import to_openai_messages

    trajectory = episode.messages
    generated = _policy_indices(episode, solo_mode, trajectory)
    kinds = {"assistant": AssistantMessage, "user": UserMessage, "tool": ToolMessage}
    parsed, weights = [], []
    for i, d in enumerate(trajectory):
        role = d.get("role")
        if role not in kinds:
            raise ValueError(f"message {i} has role {role!r}")
        m = kinds[role].model_validate(d)
        # The user simulator's tool calls go to the environment and their results back to the user:
        # tau2's orchestrator never shows either to the agent.
        if (isinstance(m, UserMessage) and m.tool_calls) or (
                isinstance(m, ToolMessage) and m.requestor == "user"):
            continue
        if (solo_mode and isinstance(m, AssistantMessage) and i in generated and not m.tool_calls
                and m.content == LLMSoloAgent.STOP_TOKEN):
            # tau2 rewrote the policy's `done()` call into this text (`_check_if_stop_toolcall`).
            m = AssistantMessage(role="assistant", content="", cost=0.0, tool_calls=[
                ToolCall(id="done", name=LLMSoloAgent.STOP_FUNCTION_NAME, arguments={})])
        parsed.append(m)
        weights.append(isinstance(m, AssistantMessage) and i in generated)
    messages = to_openai_messages(parsed)
    for m, trained in zip(messages, weights, strict=True):
        if m["role"] == "assistant" and not trained:
            m["weight"] = 0
    return renumber_tool_calls(messages)


def renumber_tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool-call ids `call_0, call_1, ...` in order, each tool result pointing at its call's new id."""
    n = 0
    pending: dict[str, collections.deque[str]] = {}
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            pending = collections.defaultdict(collections.deque)
            for tc in m["tool_calls"]:
                pending[tc["id"]].append(f"call_{n}")
                tc["id"] = f"call_{n}"
                n += 1
        elif m["role"] == "tool":
            ids = pending.get(m["tool_call_id"])
            if not ids:
                raise ValueError(f"tool result for {m['tool_call_id']!r} follows no call with that id")
            m["tool_call_id"] = ids.popleft()
    return messages


# ---------------------------------------------------------------------------------------------
# Filtering, deduplication, output


@dataclass(frozen=True)
class ExportFilters:
    """Which episodes become rows."""

    min_reward: float = 1.0
    """tau2 reward an episode needs (1.0: tau2's success)."""
    min_partial: float | None = None
    """With it: for tasks without such an episode, also failures with partial credit >= this."""
    partial_per_task: int = 1
    """How many of those failures per task at most (the highest partial credit first)."""
    domains: tuple[str, ...] = ()
    """Only these domains; empty: all."""
    keep_invalid: bool = False
    """Keep episodes in which the policy made an invalid tool call (unknown tool, ...)."""

    def validate(self) -> list[str]:
        errors = []
        if not 0.0 <= self.min_reward <= 1.0:
            errors.append(f"--min-reward must be in [0, 1], got {self.min_reward}")
        if self.min_partial is not None and not 0.0 <= self.min_partial <= 1.0:
            errors.append(f"--min-partial must be in [0, 1], got {self.min_partial}")
        if self.partial_per_task < 1:
            errors.append(f"--partial-per-task must be >= 1, got {self.partial_per_task}")
        return errors


@dataclass
class TaskCount:
    """Per task, for the manifest."""

    episodes: int = 0
    successes: int = 0
    kept_success: int = 0
    kept_partial: int = 0
    rows: int = 0
    """Rows first contributed by this task (an identical later episode adds no row)."""
    duplicates: int = 0


@dataclass
class ExportResult:
    rows: list[dict[str, Any]]
    manifest: dict[str, Any]


def select(episodes: Sequence[Episode], filters: ExportFilters
           ) -> tuple[list[tuple[Episode, str]], collections.Counter[str]]:
    """(episode, "success" | "partial") to export, and the count of left-out episodes by reason."""
    dropped: collections.Counter[str] = collections.Counter()
    candidates = []
    for e in episodes:
        if filters.domains and e.domain not in filters.domains:
            dropped["other_domain"] += 1
        elif e.num_invalid_tool_calls and not filters.keep_invalid:
            dropped["invalid_tool_calls"] += 1
        else:
            candidates.append(e)
    kept = [(e, "success") for e in candidates if e.tau2_reward >= filters.min_reward - REWARD_TOLERANCE]
    solved = {e.key for e, _ in kept}
    by_task: dict[str, list[Episode]] = collections.defaultdict(list)
    for e in candidates:
        if e.tau2_reward >= filters.min_reward - REWARD_TOLERANCE:
            continue
        partial_ok = filters.min_partial is not None and e.partial_credit >= filters.min_partial
        if partial_ok and e.key not in solved:
            by_task[e.key].append(e)
        else:
            dropped["below_min_reward"] += 1
    for group in by_task.values():
        group.sort(key=lambda e: (-e.partial_credit, str(e.path)))
        kept += [(e, "partial") for e in group[: filters.partial_per_task]]
        dropped["partial_not_best"] += len(group[filters.partial_per_task:])
    return kept, dropped


def to_row(episode: Episode, kind: str, modes: PromptModes) -> tuple[dict[str, Any], bool]:
    """The row for one episode, and whether its prompt was checked against the dump's fingerprints."""
    prompt = policy_prompt(episode.domain, episode.task_id, modes.solo_mode, modes.think_tool)
    verified = bool(episode.agent_view.get("system_prompt_sha256"))
    if verified and not prompt.matches(episode.agent_view):
        raise ExportError(
            f"{episode.path}: the system prompt or tools rebuilt from tau2 (solo_mode={modes.solo_mode}, "
            f"think tool={modes.think_tool}) differ from the ones the policy was sent; was it recorded with "
            "another tau2 release or prompt?")
    messages = [{"role": "system", "content": prompt.system_prompt},
                *policy_messages(episode, modes.solo_mode)]
    if not any(m["role"] == "assistant" and m.get("weight", 1) for m in messages):
        raise ExportError(f"{episode.path}: the policy generated no turn in this episode")
    meta = {
        "domain": episode.domain, "task_id": episode.task_id, "kind": kind,
        "tau2_reward": episode.tau2_reward, "partial_credit": episode.partial_credit,
        "reward_breakdown": episode.breakdown, "termination": episode.termination,
        "solo_mode": modes.solo_mode, "prompt_verified": verified,
    }
    return {"messages": messages, "tools": list(prompt.tools), "metadata": meta}, verified


def _episode_ref(e: Episode) -> dict[str, Any]:
    return {"path": str(e.path), "domain": e.domain, "task_id": e.task_id, "trial": e.trial,
            "tau2_reward": e.tau2_reward}


def build_rows(sources: Sequence[Path], filters: ExportFilters, default_modes: PromptModes = PromptModes(),
               domain_modules: Sequence[str] = ()) -> ExportResult:
    """Read, filter, convert and deduplicate; raises ExportError when no row results. The domain modules
    given, and those an evaluation's settings name, are imported before any domain is looked up."""
    errors = filters.validate()
    if not sources:
        raise ExportError("give at least one --from directory")
    episodes: list[Episode] = []
    summaries = []
    for src in sources:
        found, summary = read_source(src)
        episodes += found
        summaries.append(summary)
    from examples.tau2.episode import domain as tau2_domain

    recorded = [m for e in episodes for m in e.settings.get("domain_modules") or []]
    errors += tau2_domain.problems(list(dict.fromkeys([*domain_modules, *recorded])), filters.domains, [])
    if errors:
        raise ExportError("; ".join(errors))
    tasks: dict[str, TaskCount] = collections.defaultdict(TaskCount)
    for e in episodes:
        tasks[e.key].episodes += 1
        tasks[e.key].successes += e.tau2_reward >= 1.0 - REWARD_TOLERANCE
    kept, dropped = select(episodes, filters)
    if not kept:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(dropped.items()))
        raise ExportError(
            f"no episode passes the filters among {len(episodes)} ({reasons}); no successful trajectory "
            f"(tau2 reward >= {filters.min_reward}): lower --min-reward or add --min-partial")
    kept.sort(key=lambda ek: (ek[1] != "success", ek[0].domain, ek[0].task_id, str(ek[0].path)))
    rows: dict[str, dict[str, Any]] = {}
    verified = 0
    for e, kind in kept:
        row, ok = to_row(e, kind, episode_modes(e, default_modes))
        verified += ok
        tasks[e.key].kept_success += kind == "success"
        tasks[e.key].kept_partial += kind == "partial"
        key = fingerprint({"messages": row["messages"], "tools": row["tools"]})
        if key in rows:
            rows[key]["metadata"]["episodes"].append(_episode_ref(e))
            tasks[e.key].duplicates += 1
            continue
        row["metadata"]["episodes"] = [_episode_ref(e)]
        rows[key] = row
        tasks[e.key].rows += 1
    out = sorted(rows.values(), key=lambda r: (r["metadata"]["domain"], r["metadata"]["task_id"],
                                               r["metadata"]["episodes"][0]["path"]))
    per_domain: dict[str, dict[str, int]] = {}
    for key, c in sorted(tasks.items()):
        d = per_domain.setdefault(key.split("/", 1)[0], collections.Counter())
        d.update(episodes=c.episodes, successes=c.successes, kept_success=c.kept_success,
                 kept_partial=c.kept_partial, rows=c.rows, duplicates=c.duplicates,
                 tasks=1, tasks_with_rows=int(c.rows > 0))
    manifest = {
        "sources": [dataclasses.asdict(s) for s in summaries],
        "filters": dataclasses.asdict(filters),
        "counts": {
            "episodes": len(episodes),
            "kept_success": sum(k == "success" for _, k in kept),
            "kept_partial": sum(k == "partial" for _, k in kept),
            "dropped": dict(sorted(dropped.items())),
            "duplicates": len(kept) - len(out),
            "rows": len(out),
            "prompt_verified": verified,
            "prompt_unverified": len(kept) - verified,
        },
        "per_domain": {d: dict(c) for d, c in per_domain.items()},
        "per_task": {k: dataclasses.asdict(c) for k, c in sorted(tasks.items())},
    }
    return ExportResult(out, manifest)


def manifest_path(out: Path) -> Path:
    return out.with_name(out.stem + MANIFEST_SUFFIX)


def write_export(result: ExportResult, out: Path, tokenizer: Any = None) -> Path:
    """Write the JSONL and its manifest (with token counts when a tokenizer is given); returns the
    manifest's path."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in result.rows)
    write_atomic(out, text)
    manifest = {
        "output": str(out.resolve()),
        "sha256": fingerprint(text),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **result.manifest,
        "versions": _versions(),
    }
    if tokenizer is not None:
        manifest["tokens"] = token_stats(tokenizer, result.rows)
    path = manifest_path(out)
    write_atomic(path, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return path


def _versions() -> dict[str, str]:
    from examples.tau2.compat import installed_version
    from examples.tau2.compat.tau2_release import installed_release

    return {"tau2": installed_release().label,
            **{p: installed_version(p) for p in ("areal", "transformers")}}


# ---------------------------------------------------------------------------------------------
# Tokenization for training


@dataclass(frozen=True)
class EncodedConversation:
    """A row as the trainer sees it: token ids, and 1 on every token the loss covers."""

    input_ids: list[int]
    loss_mask: list[int]
    text: str
    """The chat template's rendering."""
    spans: tuple[tuple[int, int], ...]
    """Character spans of `text` that are trained (one per trained assistant turn)."""


def encode_conversation(tokenizer: Any, messages: list[dict[str, Any]],
                        tools: list[dict[str, Any]] | None) -> EncodedConversation:
    """Render with the tokenizer's chat template; the loss covers each trained assistant turn, from
    just after its `<|im_start|>assistant\\n` header through its `<|im_end|>`.

    A turn starts where the rendering of the conversation before it, with the generation prompt,
    ends (so it is exactly what the policy generated after that prompt); the full rendering must
    extend each of those prefixes. Assistant messages with `"weight": 0` are context only.
    """
    plain = [{k: v for k, v in m.items() if k != "weight"} for m in messages]

    def render(msgs: list[dict[str, Any]], generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(msgs, tools=tools or None, tokenize=False,
                                             add_generation_prompt=generation_prompt)

    text = render(plain, False)
    if TURN_END not in text:
        raise ValueError(f"the chat template does not end turns with {TURN_END} (ChatML); "
                         "only ChatML templates (Qwen2, Qwen2.5, Qwen3) are supported")
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or m.get("weight", 1) == 0:
            continue
        prefix = render(plain[:i], True)
        if not text.startswith(prefix):
            raise ValueError(f"chat template: the conversation does not extend its prefix before message {i}")
        end = text.find(TURN_END, len(prefix))
        if end < 0:
            raise ValueError(f"chat template: assistant message {i} has no {TURN_END}")
        spans.append((len(prefix), end + len(TURN_END)))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = []
    for start, stop in enc["offset_mapping"]:
        inside = any(a <= start and stop <= b for a, b in spans)
        if not inside and any(start < b and stop > a for a, b in spans):
            raise ValueError(f"a token ({start}..{stop}) straddles the edge of an assistant turn")
        mask.append(int(inside))
    return EncodedConversation(list(enc["input_ids"]), mask, text, tuple(spans))


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of an exported JSONL, checked for the fields training needs."""
    if not path.is_file():
        raise ExportError(f"SFT data file {path} does not exist "
                          "(make it with python -m examples.tau2.sft.data)")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ExportError(f"line {n} of {path} is not JSON ({e})") from None
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list) or not row["messages"]:
            raise ExportError(f"line {n} of {path} has no messages list")
        if not isinstance(row.get("tools", []), list):
            raise ExportError(f"line {n} of {path}: tools is not a list")
        rows.append(row)
    if not rows:
        raise ExportError(f"{path} holds no rows")
    return rows


def encode_rows(tokenizer: Any, rows: Iterable[dict[str, Any]], max_length: int | None = None
                ) -> tuple[list[dict[str, list[int]]], int]:
    """`{"input_ids", "loss_mask"}` per row for AReaL's SFT engines, and how many rows were dropped for
    being longer than `max_length` (as AReaL's own SFT datasets drop them)."""
    encoded, too_long = [], 0
    for row in rows:
        e = encode_conversation(tokenizer, row["messages"], row.get("tools"))
        if max_length is not None and len(e.input_ids) > max_length:
            too_long += 1
            continue
        if not any(e.loss_mask):
            raise ExportError(f"a row of {row.get('metadata', {}).get('task_id', '?')} trains no token")
        encoded.append({"input_ids": e.input_ids, "loss_mask": e.loss_mask})
    return encoded, too_long


def token_stats(tokenizer: Any, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    lengths, trained = [], []
    for row in rows:
        e = encode_conversation(tokenizer, row["messages"], row.get("tools"))
        lengths.append(len(e.input_ids))
        trained.append(sum(e.loss_mask))
    return {"tokenizer": str(getattr(tokenizer, "name_or_path", "")), "total": sum(lengths),
            "trained": sum(trained), "max_row": max(lengths), "mean_row": sum(lengths) / len(lengths)}


# ---------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m examples.tau2.sft.data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="sources", nargs="+", required=True, type=Path, metavar="DIR",
                   help="evaluation output dirs (with trials.jsonl) and/or episode dump dirs")
    p.add_argument("--out", required=True, type=Path, help="the JSONL to write; the manifest goes next to it")
    p.add_argument("--min-reward", type=float, default=ExportFilters.min_reward)
    p.add_argument("--min-partial", type=float, default=None,
                   help="also export, for tasks with no episode at --min-reward, failures whose partial "
                        "credit (mean of tau2's reward breakdown) is at least this")
    p.add_argument("--partial-per-task", type=int, default=ExportFilters.partial_per_task)
    p.add_argument("--domains", nargs="+", default=[], help="only these domains")
    p.add_argument("--domain-modules", nargs="+", default=[], metavar="MOD",
                   help="modules that register the dumps' own domains (an evaluation's run.json names them)")
    p.add_argument("--keep-invalid", action="store_true",
                   help="keep episodes in which the policy made an invalid tool call")
    p.add_argument("--solo-mode", action="store_true",
                   help="dumps without an agent_view and outside an evaluation dir were played in solo mode")
    p.add_argument("--think-tool", action="store_true",
                   help="dumps without an agent_view and outside an evaluation dir offered the think tool")
    p.add_argument("--tokenizer", default=None,
                   help="a tokenizer (path or hub id): adds token counts to the manifest")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    setup_runtime()
    filters = ExportFilters(min_reward=args.min_reward, min_partial=args.min_partial,
                            partial_per_task=args.partial_per_task, domains=tuple(args.domains),
                            keep_invalid=args.keep_invalid)
    try:
        modes = PromptModes(solo_mode=args.solo_mode, think_tool=args.think_tool)
        result = build_rows([Path(s) for s in args.sources], filters, modes, args.domain_modules)
    except ExportError as e:
        parser.error(str(e))
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    manifest = write_export(result, args.out, tokenizer)
    c = result.manifest["counts"]
    print(f"{c['rows']} rows ({c['kept_success']} successful and {c['kept_partial']} partial episodes, "
          f"{c['duplicates']} duplicates) from {c['episodes']} episodes -> {args.out}; manifest {manifest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
