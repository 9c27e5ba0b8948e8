"""Which tasks a reward can be trusted on: each task graded by τ²'s own evaluator (the training's grading)
for three scripted agents, plus static checks, with no LLM.

- `oracle` plays the ground truth (its actions, then one message saying every `communicate_info`): a sound
  task scores 1.0.
- `nothing` answers once and calls no tool: a task it passes pays an agent for doing nothing.
- `partial` plays the ground truth without its last state-changing action: a task it passes pays for part
  of the job.

A task passed by `nothing` or `partial` teaches a policy to skip the work, so training leaves such tasks out
unless `econfig.train_on_flagged` (`flagged_task_ids`); evaluation keeps them and reports them apart.
The command that reports all this is `tau2_rl.sh check-tasks` (eval/check_tasks.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from examples.tau2.episode.grade import failed_checks
from examples.tau2.runtime.files import fingerprint, write_atomic

SUCCESS_THRESHOLD = 1.0 - 1e-6
"""A reward at or above it is a success (τ²'s rewards are products of 0/1 criteria)."""


TABLE = Path(__file__).parents[1] / "compat" / "flagged_tasks.json"
"""The built-in domains' flags per τ² release (written by `check-tasks --table`; `flagged_task_ids`)."""
NOTHING_REPLY = "I am sorry, I cannot help with that."


class Flag(StrEnum):
    """What a task's check found. Flags are warnings: only a failing oracle makes the check exit 1."""

    REWARDS_NOTHING = "rewards_nothing"
    """An agent that answers once and calls no tool scores 1.0 (e.g. a task graded on the database alone
    whose right answer changes nothing)."""
    REWARDS_PARTIAL = "rewards_partial"
    """The ground truth without its last state-changing action scores 1.0."""
    UNMATCHABLE_INFO = "unmatchable_info"
    """A `communicate_info` that τ²'s matching rule cannot find even in a message that says it verbatim
    (τ² drops commas from the message, not from the info)."""
    WRITE_TAGGED_READ = "write_tagged_read"
    """A tool tagged READ changed the database in the ground truth (τ² 1.0.x does not replay READ tools)."""
    FAILING_WRITE = "failing_write"
    """A ground-truth call of a tool not tagged READ returns an error: τ² only logs it, and its gold state
    lacks the change the task's author meant."""
    IN_TWO_SPLITS = "in_two_splits"
    """The task is in two splits neither of which contains the other (e.g. train and test)."""
    DUPLICATE_TASK = "duplicate_task"
    """Another task has the same start state, ground truth and user instructions (the persona may differ)."""
    NEEDS_JUDGE = "needs_judge"
    """τ² grades NL assertions with an LLM judge; counted, not a defect (here they count as met)."""


TRAINING_SKIPS = (Flag.REWARDS_NOTHING, Flag.REWARDS_PARTIAL)
"""The flags whose tasks training leaves out unless `econfig.train_on_flagged`."""


@dataclasses.dataclass(frozen=True)
class TaskCheck:
    domain: str
    task_id: str
    split: str
    """The task's splits, joined by '+' (the one asked for with `--split`)."""
    oracle_reward: float
    nothing_reward: float
    partial_reward: float | None
    """None for a task without a state-changing ground-truth action."""
    flags: list[str]
    oracle_problems: list[str]
    """The criteria the ground truth fails (empty when it scores 1.0)."""


@dataclasses.dataclass
class _Replay:
    messages: list[Any]
    changed: list[bool]
    """Per ground-truth call: whether it changed the agent's or the user's database."""
    failed_writes: list[str]
    """Ground-truth calls of a tool not tagged READ that returned an error."""
    tagged_read: list[str]


def check_domain_tasks(domain: str, split: str | None = None) -> list[TaskCheck]:
    """Every task of `split` (every split when None) of a registered domain, in the splits' order."""
    from examples.tau2.episode import domain as tau2_domain

    available = tau2_domain.splits(domain)
    chosen = {split: tau2_domain.task_ids(domain, split)} if split else available
    ids = list(dict.fromkeys(t for s in chosen.values() for t in s))
    tasks = {t: tau2_domain.get_task(domain, t) for t in ids}
    two_splits = _in_two_splits(available)
    duplicates = _duplicates(tasks)
    out = []
    for task_id, task in tasks.items():
        flags: list[Flag] = []
        oracle = _replay(domain, task, _gold_calls(task))
        info = _communicate_info(task)
        oracle_reward, failed = _grade(domain, task, [*oracle.messages, _say(" ".join(info) or "Done.")])
        problems = [] if _passed(oracle_reward) else failed
        nothing_reward, _ = _grade(domain, task, [*_opening(task), _say(NOTHING_REPLY)])
        partial_reward = None
        if any(oracle.changed):
            last = max(i for i, c in enumerate(oracle.changed) if c)
            calls = [c for i, c in enumerate(_gold_calls(task)) if i != last]
            partial = _replay(domain, task, calls)
            partial_reward, _ = _grade(domain, task, [*partial.messages, _say(" ".join(info) or "Done.")])
        if _passed(nothing_reward):
            flags.append(Flag.REWARDS_NOTHING)
        if partial_reward is not None and _passed(partial_reward):
            flags.append(Flag.REWARDS_PARTIAL)
        if _unmatchable(info):
            flags.append(Flag.UNMATCHABLE_INFO)
        if oracle.tagged_read:
            flags.append(Flag.WRITE_TAGGED_READ)
        if oracle.failed_writes:
            flags.append(Flag.FAILING_WRITE)
        if task_id in two_splits:
            flags.append(Flag.IN_TWO_SPLITS)
        if task_id in duplicates:
            flags.append(Flag.DUPLICATE_TASK)
        if _needs_judge(task):
            flags.append(Flag.NEEDS_JUDGE)
        where = split or "+".join(s for s, members in available.items() if task_id in members)
        out.append(TaskCheck(domain, task_id, where, oracle_reward, nothing_reward, partial_reward,
                             [f.value for f in flags], problems))
    return out


def _gold_calls(task: Any) -> list[Any]:
    """The ground-truth actions (those of the task's scripted history are not among them)."""
    return list(task.evaluation_criteria.actions or []) if task.evaluation_criteria else []


def _communicate_info(task: Any) -> list[str]:
    criteria = task.evaluation_criteria
    return [str(s) for s in (criteria.communicate_info or [])] if criteria else []


def _opening(task: Any) -> list[Any]:
    """The task's scripted history, or a greeting and the user's request."""
    from tau2.data_model.message import AssistantMessage, UserMessage

    from examples.tau2.compat.tau2_cache import InitialState

    history = list(InitialState.of(task).history)
    return history or [AssistantMessage(role="assistant", content="Hi! How can I help you today?"),
                       UserMessage(role="user", content="I need help with my request.")]


def _say(text: str) -> Any:
    from tau2.data_model.message import AssistantMessage

    return AssistantMessage(role="assistant", content=text)


def _replay(domain: str, task: Any, calls: Sequence[Any]) -> _Replay:
    """The conversation of an agent (or, for the user's actions, a user) making exactly `calls` from the
    task's start state, with the tool results of the domain's own environment."""
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage
    from tau2.environment.toolkit import ToolType

    from examples.tau2.compat.tau2_cache import InitialState
    from examples.tau2.episode import domain as tau2_domain

    start = InitialState.of(task)
    env = tau2_domain.make_environment(domain)
    env.set_state(initialization_data=start.data, initialization_actions=start.actions,
                  message_history=start.history)
    replay = _Replay(_opening(task), [], [], [])
    for i, call in enumerate(calls):
        before = tau2_domain.state(domain, env)
        tool_call = ToolCall(id=f"call_{i}", name=call.name, arguments=call.arguments,
                             requestor=call.requestor)
        speaker = AssistantMessage if call.requestor == "assistant" else UserMessage
        result = env.get_response(tool_call)
        replay.messages += [speaker(role=call.requestor, tool_calls=[tool_call]), result]
        changed = tau2_domain.state(domain, env) != before
        replay.changed.append(changed)
        toolkit = env.tools if call.requestor == "assistant" else env.user_tools
        read = toolkit is not None and toolkit.tool_type(call.name) == ToolType.READ
        if getattr(result, "error", False) and not read:
            replay.failed_writes.append(f"{getattr(call, 'action_id', i)} {call.name}: "
                                        f"{str(result.content)[:120]}")
        if changed and read:
            replay.tagged_read.append(call.name)
    return replay


def _grade(domain: str, task: Any, messages: list[Any]) -> tuple[float, list[str]]:
    """τ²'s reward for a conversation (the training's grading: the evaluator cache serves the built-in
    domains), and the criteria it failed. NL assertions count as met: there is no LLM here."""
    from tau2.data_model.simulation import SimulationRun, TerminationReason

    from examples.tau2.episode import domain as tau2_domain

    simulation = SimulationRun(id=f"check-{task.id}", task_id=task.id, start_time="", end_time="",
                               duration=0.0, termination_reason=TerminationReason.AGENT_STOP,
                               messages=messages)
    try:
        info = tau2_domain.evaluate(simulation, task, domain, solo_mode=False, judge=_all_met)
    except Exception as e:  # the domain's own evaluator code failing is a verdict on the task
        return 0.0, [f"the evaluator fails: {type(e).__name__}: {e}"]
    reward = float(info.reward)
    return reward, failed_checks(info.model_dump(mode="json"))


def _all_met(messages: list[dict[str, Any]], _args: dict[str, Any]) -> str:
    """A judge that finds every expected outcome met: there is no LLM here."""
    from examples.tau2.compat.tau2_judge import uniform_verdicts

    return uniform_verdicts(messages, True, "no judge: counted as met")


def _unmatchable(info: list[str]) -> bool:
    """Whether τ²'s own matching rule misses some item even in a message that says each verbatim."""
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator

    return any(not check.met for item in info
               for check in CommunicateEvaluator.evaluate_communicate_info([_say(item)], [item]))


def _needs_judge(task: Any) -> bool:
    from examples.tau2.compat.tau2_judge import needs_judge

    return needs_judge(task)


def _in_two_splits(splits: dict[str, list[str]]) -> set[str]:
    """Tasks in two splits neither of which contains the other (`base` holds `train` and `test`)."""
    sets = {name: set(ids) for name, ids in splits.items()}
    found: set[str] = set()
    for a, ids_a in sets.items():
        for b, ids_b in sets.items():
            if a < b and not ids_a <= ids_b and not ids_b <= ids_a:
                found |= ids_a & ids_b
    return found


def _duplicates(tasks: dict[str, Any]) -> set[str]:
    """Tasks whose start state, ground truth and user instructions equal another task's (telecom has tasks
    with one ground truth and one set of instructions but different broken devices: not duplicates)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for task_id, task in tasks.items():
        criteria = task.evaluation_criteria.model_dump(mode="json") if task.evaluation_criteria else None
        if criteria is not None:  # what is graded, not how its parts are named
            criteria.pop("reward_basis", None)
            for action in criteria.get("actions") or []:
                action.pop("action_id", None)
        scenario = task.user_scenario.model_dump(mode="json").get("instructions") if task.user_scenario \
            else None
        start = task.initial_state.model_dump(mode="json") if task.initial_state else None
        groups[fingerprint({"criteria": criteria, "instructions": scenario, "start": start})].append(task_id)
    return {t for ids in groups.values() if len(ids) > 1 for t in ids}


def _passed(reward: float) -> bool:
    return reward >= SUCCESS_THRESHOLD


@functools.cache
def _table() -> dict[str, Any]:
    """The committed table, read once per process (it changes only with a commit)."""
    return json.loads(TABLE.read_text())


def flagged_task_ids(domain: str, cache_dir: Path | None = None) -> frozenset[str]:
    """The tasks of `domain` that pay for nothing or for a partial job, under the installed τ² release:
    from the committed table for a built-in domain, else checked once and cached on disk, keyed by the
    domain's code and data (`domain_fingerprint`) and every task."""
    from examples.tau2.compat.tau2_release import installed_release
    from examples.tau2.episode import domain as tau2_domain

    release = installed_release().label
    skip = {f.value for f in TRAINING_SKIPS}
    if tau2_domain.is_builtin(domain) and TABLE.is_file():
        known = _table().get("releases", {}).get(release, {}).get(domain)
        if known is not None:
            return frozenset(t for flag in skip for t in known.get(flag, []))
    tasks = {t: tau2_domain.get_task(domain, t).model_dump(mode="json")
             for ids in tau2_domain.splits(domain).values() for t in ids}
    key = fingerprint({"release": release, "domain": domain_fingerprint(domain), "tasks": tasks})
    root = cache_dir or Path.home() / ".cache" / "tau2-areal" / "check-tasks"
    path = root / f"{domain}-{key[:16]}.json"
    if path.is_file():
        flags = json.loads(path.read_text())
    else:
        flags = {c.task_id: c.flags for c in check_domain_tasks(domain)}
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(flags, sort_keys=True))
    return frozenset(t for t, f in flags.items() if skip & set(f))


def domain_fingerprint(domain: str) -> dict[str, str]:
    """Hashes of the domain as a fresh episode meets it: its policy, databases and tools, and the code of
    the module that registers it ('' for a built-in domain, which the τ² release in the settings pins)."""
    from examples.tau2.episode import domain as tau2_domain

    env = tau2_domain.make_environment(domain)
    toolset = tau2_domain.tools(domain)
    return {
        "policy": fingerprint(env.get_policy()),
        "db": env.get_db_hash() or "",
        "user_db": env.get_user_db_hash() or "",
        "tools": fingerprint([toolset.agent_schemas, toolset.user_schemas]),
        "code": module_code_digest(domain),
    }


def module_code_digest(domain: str) -> str:
    """Hash of the Python files of the module that registered `domain`: the file itself, or every `.py`
    file of its package (data files count through what τ² builds from them, so editing one task's JSON
    changes that task's key only). '' for a domain no loaded module registered."""
    from examples.tau2.episode import domain as tau2_domain

    owner = next((m.name for m in tau2_domain.loaded_modules() if domain in m.domains), None)
    file = getattr(sys.modules.get(owner or ""), "__file__", None)
    if not file:
        return ""
    path = Path(file).resolve()
    files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    return fingerprint({str(f.relative_to(path.parent)): fingerprint(f.read_bytes().hex()) for f in files})
