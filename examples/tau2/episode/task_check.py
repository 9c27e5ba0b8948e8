"""Which tasks a reward can be trusted on: each task graded by τ²'s own evaluator for three scripted agents
(`oracle` plays the ground truth and must score 1.0; `nothing` calls no tool; `partial` skips the last
state-changing action), plus static checks, with no LLM. A task that `nothing` or `partial` passes is
left out of training unless `econfig.train_on_flagged` (`flagged_task_ids`).
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

from examples.tau2.compat.tau2_judge import needs_judge, uniform_verdicts
from examples.tau2.compat.tau2_release import installed_release
from examples.tau2.episode.record import communicate_info, failed_checks, gold_calls
from examples.tau2.runtime.files import fingerprint, write_atomic

SUCCESS_THRESHOLD = 1.0 - 1e-6
"""A reward at or above it is a success (τ²'s rewards are products of 0/1 criteria)."""
TABLE = Path(__file__).parents[1] / "compat" / "flagged_tasks.json"
"""The built-in domains' flags per τ² release (written by `check-tasks --table`; `flagged_task_ids`)."""


class Flag(StrEnum):
    """What a task's check found. Flags are warnings: only a failing oracle makes the check exit 1."""

    REWARDS_NOTHING = "rewards_nothing"
    """`nothing` scores 1.0 (e.g. a task graded on the database alone whose right answer changes nothing)."""
    REWARDS_PARTIAL = "rewards_partial"
    """`partial` scores 1.0."""
    UNMATCHABLE_INFO = "unmatchable_info"
    """A `communicate_info` τ²'s matching rule misses even said verbatim (it drops the message's commas)."""
    WRITE_TAGGED_READ = "write_tagged_read"
    """A tool tagged READ changed the database in the ground truth (τ² 1.0.x does not replay READ tools)."""
    FAILING_WRITE = "failing_write"
    """A ground-truth call of a tool not tagged READ fails: τ² logs it; its gold state lacks the change."""
    IN_TWO_SPLITS = "in_two_splits"
    """The task is in two splits neither of which contains the other (e.g. train and test)."""
    DUPLICATE_TASK = "duplicate_task"
    """Another task has the same start state, ground truth and user instructions (the persona may differ)."""
    NEEDS_JUDGE = "needs_judge"
    """τ² grades NL assertions with an LLM judge; counted, not a defect (here they count as met)."""


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
class Replay:
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
    tasks = {t: tau2_domain.get_task(domain, t) for ids in chosen.values() for t in ids}
    two_splits, duplicates = _in_two_splits(available), _duplicates(tasks)
    out = []
    for task_id, task in tasks.items():
        calls, info = gold_calls(task), communicate_info(task)
        oracle = replay(domain, task, calls)
        oracle_reward, failed = _grade(domain, task, [*oracle.messages, say(" ".join(info) or "Done.")])
        nothing = [*_opening(task), say("I am sorry, I cannot help with that.")]
        nothing_reward, _ = _grade(domain, task, nothing)
        partial_reward = None
        if any(oracle.changed):
            last = max(i for i, c in enumerate(oracle.changed) if c)
            partial = replay(domain, task, [c for i, c in enumerate(calls) if i != last])
            partial_reward, _ = _grade(domain, task, [*partial.messages, say(" ".join(info) or "Done.")])
        flags = [flag.value for flag, found in (
            (Flag.REWARDS_NOTHING, _passed(nothing_reward)),
            (Flag.REWARDS_PARTIAL, partial_reward is not None and _passed(partial_reward)),
            (Flag.UNMATCHABLE_INFO, _unmatchable(info)), (Flag.WRITE_TAGGED_READ, oracle.tagged_read),
            (Flag.FAILING_WRITE, oracle.failed_writes), (Flag.IN_TWO_SPLITS, task_id in two_splits),
            (Flag.DUPLICATE_TASK, task_id in duplicates), (Flag.NEEDS_JUDGE, needs_judge(task))) if found]
        where = split or "+".join(s for s, members in available.items() if task_id in members)
        out.append(TaskCheck(domain, task_id, where, oracle_reward, nothing_reward, partial_reward, flags,
                             [] if _passed(oracle_reward) else failed))
    return out


def _opening(task: Any) -> list[Any]:
    """The task's scripted history, or a greeting and the user's request."""
    from tau2.data_model.message import UserMessage

    from examples.tau2.compat.tau2_cache import InitialState

    request = UserMessage(role="user", content="I need help with my request.")
    return list(InitialState.of(task).history) or [say("Hi! How can I help you today?"), request]


def say(text: str) -> Any:
    from tau2.data_model.message import AssistantMessage

    return AssistantMessage(role="assistant", content=text)


def replay(domain: str, task: Any, calls: Sequence[Any]) -> Replay:
    """The conversation of an agent (or a user, for its actions) making exactly `calls` from the task's
    start state, with the tool results of the domain's own environment."""
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage
    from tau2.environment.toolkit import ToolType

    from examples.tau2.compat.tau2_cache import InitialState
    from examples.tau2.episode import domain as tau2_domain

    env = InitialState.of(task).apply(tau2_domain.make_environment(domain))
    out = Replay(_opening(task), [], [], [])
    for i, call in enumerate(calls):
        before = tau2_domain.state(domain, env)
        tool_call = ToolCall(id=f"call_{i}", name=call.name, arguments=call.arguments,
                             requestor=call.requestor)
        speaker = AssistantMessage if call.requestor == "assistant" else UserMessage
        result = env.get_response(tool_call)
        out.messages += [speaker(role=call.requestor, tool_calls=[tool_call]), result]
        changed = tau2_domain.state(domain, env) != before
        out.changed.append(changed)
        toolkit = env.tools if call.requestor == "assistant" else env.user_tools
        read = toolkit is not None and toolkit.tool_type(call.name) == ToolType.READ
        if getattr(result, "error", False) and not read:
            out.failed_writes.append(f"{getattr(call, 'action_id', i)} {call.name}: "
                                     f"{str(result.content)[:120]}")
        if changed and read:
            out.tagged_read.append(call.name)
    return out


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
    return float(info.reward), failed_checks(info.model_dump(mode="json"))


def _all_met(messages: list[dict[str, Any]], _args: dict[str, Any]) -> str:
    """A judge that finds every expected outcome met: there is no LLM here."""
    return uniform_verdicts(messages, True, "no judge: counted as met")


def _unmatchable(info: list[str]) -> bool:
    """Whether τ²'s own matching rule misses some item even in a message that says each verbatim."""
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator

    return any(not check.met for item in info
               for check in CommunicateEvaluator.evaluate_communicate_info([say(item)], [item]))


def _in_two_splits(splits: dict[str, list[str]]) -> set[str]:
    """Tasks in two splits neither of which contains the other (`base` holds `train` and `test`)."""
    sets = {name: set(ids) for name, ids in splits.items()}
    return {t for a, x in sets.items() for b, y in sets.items() if a < b and not x <= y and not y <= x
            for t in x & y}


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


PAYING_FLAGS = (Flag.REWARDS_NOTHING, Flag.REWARDS_PARTIAL)
"""The flags that say a reward pays for less than the job: training leaves these tasks out, evaluation
reports pass^k without them."""


def paying_flags(domain: str, cache_dir: Path | None = None) -> dict[Flag, frozenset[str]]:
    """Each of `PAYING_FLAGS` -> the tasks of `domain` it marks under the installed τ² release: from the
    committed table for a built-in domain, else checked once and cached on disk, keyed by the domain's code
    and data (`domain_fingerprint`) and every task."""
    from examples.tau2.episode import domain as tau2_domain

    release = installed_release().label
    if tau2_domain.is_builtin(domain) and TABLE.is_file():
        known = _table().get("releases", {}).get(release, {}).get(domain)
        if known is not None:
            return {flag: frozenset(known.get(flag.value, [])) for flag in PAYING_FLAGS}
    tasks = {t: tau2_domain.get_task(domain, t).model_dump(mode="json")
             for ids in tau2_domain.splits(domain).values() for t in ids}
    key = fingerprint({"release": release, "domain": domain_fingerprint(domain), "tasks": tasks})
    path = (cache_dir or Path.home() / ".cache" / "tau2-areal" / "check-tasks") / f"{domain}-{key[:16]}.json"
    if path.is_file():
        flags = json.loads(path.read_text())
    else:
        flags = {c.task_id: c.flags for c in check_domain_tasks(domain)}
        write_atomic(path, json.dumps(flags, sort_keys=True))
    return {flag: frozenset(t for t, f in flags.items() if flag.value in f) for flag in PAYING_FLAGS}


def flagged_task_ids(domain: str, cache_dir: Path | None = None) -> frozenset[str]:
    """The tasks of `domain` that pay for nothing or for a partial job (`paying_flags`): left out of
    training unless `econfig.train_on_flagged`."""
    return frozenset().union(*paying_flags(domain, cache_dir).values())


def domain_fingerprint(domain: str) -> dict[str, str]:
    """Hashes of the domain as a fresh episode meets it: its policy, databases and tools, and the Python
    files of the module that registered it (the file itself, or every `.py` file of its package; '' for a
    built-in domain, which the τ² release in the settings pins). Data files count through what τ² builds
    from them, so editing one task's JSON changes that task's key only."""
    from examples.tau2.episode import domain as tau2_domain

    env = tau2_domain.make_environment(domain)
    toolset = tau2_domain.tools(domain)
    owner = next((m.name for m in tau2_domain.loaded_modules() if domain in m.domains), None)
    file = getattr(sys.modules.get(owner or ""), "__file__", None)
    code = ""
    if file:
        path = Path(file).resolve()
        files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
        code = fingerprint({str(f.relative_to(path.parent)): fingerprint(f.read_bytes().hex())
                            for f in files})
    return {"policy": fingerprint(env.get_policy()), "db": env.get_db_hash() or "",
            "user_db": env.get_user_db_hash() or "", "code": code,
            "tools": fingerprint([toolset.agent_schemas, toolset.user_schemas])}
