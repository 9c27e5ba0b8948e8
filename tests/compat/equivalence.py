"""Cached against stock tau2: trajectories and the comparison, shared by the equivalence tests on every
mirrored release (`test_tau2_cache.py` on the installed one, `tests/releases/on_upstream.py` on 1.0.1).

A trajectory is built by executing actions on a real tau2 environment: the ground truth, nothing, the
ground truth with one action dropped, with one argument altered, with one action repeated, and cut short
by tau2's step limit. Each is scored twice, with tau2's own `evaluate_simulation` (inside
`tau2_cache.enabled(False)`) and with the cached path; the `RewardInfo`s (reward, breakdown, every check
and note) or the exceptions must be identical.
"""

from __future__ import annotations

import random
import re

from tau2.data_model.message import AssistantMessage, Message, ToolCall, UserMessage
from tau2.data_model.simulation import RewardInfo, SimulationRun, TerminationReason
from tau2.data_model.tasks import Action, Task

from examples.tau2.compat import tau2_cache, tau2_judge
from examples.tau2.episode import domain as tau2_domain


def simulate(domain: str, task: Task, actions: list[Action], *, solo: bool = False,
             termination: TerminationReason = TerminationReason.USER_STOP) -> SimulationRun:
    """A consistent trajectory: `actions` executed in order on a fresh environment of the task."""
    env = tau2_domain.make_environment(domain, solo_mode=solo)
    init = task.initial_state
    history: list[Message] = list(init.message_history or []) if init else []
    if init is not None:
        env.set_state(init.initialization_data, init.initialization_actions, history)
    messages = list(history)
    if not solo:
        messages += [AssistantMessage(role="assistant", content="Hi! How can I help you today?"),
                     UserMessage(role="user", content="I need help with my request.")]
    for i, action in enumerate(actions):
        requestor = "assistant" if solo else action.requestor
        call = ToolCall(id=f"call_{i}", name=action.name, arguments=action.arguments, requestor=requestor)
        role_cls = UserMessage if requestor == "user" else AssistantMessage
        messages.append(role_cls(role=requestor, content=None, tool_calls=[call]))
        messages.append(env.get_response(call))
    criteria = task.evaluation_criteria
    info = (criteria.communicate_info or []) if criteria else []
    messages.append(AssistantMessage(role="assistant", content=" ".join(["All done.", *info])))
    if not solo:
        messages.append(UserMessage(role="user", content="Thanks. ###STOP###"))
    return SimulationRun(id=f"sim-{task.id}", task_id=task.id, start_time="", end_time="", duration=0.0,
                         termination_reason=termination, messages=messages)


def _altered(action: Action) -> Action:
    """The action with its first string argument changed (or an argument added)."""
    args = dict(action.arguments)
    key = next((k for k, v in args.items() if isinstance(v, str)), None)
    if key is None:
        args["unexpected"] = "x"
    else:
        args[key] = args[key] + "9"
    return action.model_copy(update={"arguments": args})


def variants(task: Task, solo: bool = False) -> dict[str, tuple[list[Action], TerminationReason]]:
    """Passing and failing action lists for one task."""
    gt = list(task.evaluation_criteria.actions or []) if task.evaluation_criteria else []
    stop = TerminationReason.AGENT_STOP if solo else TerminationReason.USER_STOP
    out = {"ground_truth": (gt, stop), "noop": ([], stop),
           "max_steps": (gt, TerminationReason.MAX_STEPS)}
    if gt:
        out["drop_last"] = (gt[:-1], stop)
        out["alter_last"] = (gt[:-1] + [_altered(gt[-1])], stop)
        out["repeat_last"] = (gt + [gt[-1]], stop)
    if len(gt) > 2:
        out["drop_middle"] = (gt[: len(gt) // 2] + gt[len(gt) // 2 + 1:], stop)
    return out


def _score(domain: str, task: Task, sim: SimulationRun, solo: bool,
           judge: tau2_judge.Judge | None) -> RewardInfo | str:
    try:
        return tau2_domain.evaluate(sim, task, domain, solo, judge=judge)
    except Exception as e:  # tau2 raises e.g. when a replayed tool result differs from the recorded one
        return re.sub(r"timestamp: \S+", "timestamp: ...", f"{type(e).__name__}: {e}")


def assert_same_as_stock(domain: str, task: Task, sim: SimulationRun, solo: bool = False,
                         judge: tau2_judge.Judge | None = None) -> RewardInfo | str:
    cached = _score(domain, task, sim, solo, judge)
    with tau2_cache.enabled(False):
        stock = _score(domain, task, sim, solo, judge)
    if isinstance(stock, str) or isinstance(cached, str):
        assert cached == stock
        return cached
    assert cached.reward == stock.reward
    assert cached.reward_breakdown == stock.reward_breakdown
    assert cached.model_dump() == stock.model_dump()
    return cached


def check_domain_sample(domain: str, ids: list[str], solo: bool = False, kinds: set[str] | None = None,
                        judge: tau2_judge.Judge | None = None) -> dict[str, float]:
    """Every variant of every task scored cached and stock (see the module docstring); the snapshots
    must come out intact. Returns the rewards by `task/variant` (-1.0 where both raised)."""
    rewards = {}
    for task_id in ids:
        task = tau2_domain.get_task(domain, task_id)
        for name, (actions, termination) in variants(task, solo).items():
            if kinds is not None and name not in kinds:
                continue
            sim = simulate(domain, task, actions, solo=solo, termination=termination)
            result = assert_same_as_stock(domain, task, sim, solo, judge)
            rewards[f"{task_id}/{name}"] = result.reward if isinstance(result, RewardInfo) else -1.0
    for snapshot in tau2_cache.domain_cache(domain).snapshots():
        assert snapshot is None or snapshot.intact()
    return rewards


def sample(domain: str, split: str, n: int) -> list[str]:
    return sorted(random.Random(0).sample(tau2_domain.task_ids(domain, split), n))


