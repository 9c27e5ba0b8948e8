"""Cached against stock tau2: trajectories and the comparison, shared by the equivalence tests on every
mirrored release (`test_tau2_cache.py` on the installed one, `tests/releases/on_upstream.py` on 1.0.1).

A trajectory is built by executing actions on a real tau2 environment: the ground truth, nothing, the
ground truth with one action dropped, with one argument altered, with one action repeated, and cut short
by tau2's step limit. Each is scored twice, with tau2's own `evaluate_simulation` (inside
`tau2_cache.enabled(False)`) and with the cached path; the `RewardInfo`s (reward, breakdown, every check
and note) must be identical (the whole-split tests take stock's side from results committed per release,
`stock_references.py`, and score a fresh sample live). An exception counts as a result only where both
sides raise the same one of tau2's on-purpose errors (`ON_PURPOSE_ERRORS`); any other exception, or one
side raising alone, fails.
Equal results are not enough either: `assert_meaningful` checks the outcomes tau2 fixes on its own (its
ground truth passes, a run cut short by the step limit fails), so that an evaluator that always raised,
always passed or always failed on both sides cannot look equivalent.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping

from tau2.data_model.message import AssistantMessage, Message, ToolCall, UserMessage
from tau2.data_model.simulation import RewardInfo, SimulationRun, TerminationReason
from tau2.data_model.tasks import Action, Task

from examples.tau2.compat import tau2_cache, tau2_judge
from examples.tau2.cpu.scripted_endpoint import judge_reply
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


def agreeing_judge(messages: list[dict], args: dict) -> str:
    """tau2 1.0.x's NL-assertion judge, scripted to find every expected outcome met (the judge's verdicts
    are an input of the evaluator, not what the equivalence tests check)."""
    return judge_reply(messages, True)


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


ON_PURPOSE_ERRORS: tuple[tuple[type[Exception], re.Pattern[str]], ...] = (
    # tau2's `Environment.set_state`: a replayed tool call returned other than the recorded tool message.
    (ValueError, re.compile(r"Tool call:\n")),
    # An env assertion about a record the trajectory never created: mock's `assert_task_status` raises
    # rather than answering False (a mock task's noop, drop_last and alter_last variants).
    (ValueError, re.compile(r"(Task|User) \S+ not found$")),
    # A task graded by tau2 1.0.x's LLM judge scored with no judge set: refused rather than guessed.
    (tau2_judge.NoJudge, re.compile(r"tau2 asked its NL-assertion judge ")),
)
"""The errors tau2 raises on purpose while scoring the trajectories built here, by exact type and message
start. Anything else raised by the evaluator is a defect, even when cached and stock both raise it."""


def outcome_text(error: Exception) -> str:
    """`Type: message`, with the tool messages' timestamps masked (they differ between two replays of the
    same trajectory), so that the cached and the stock error can be compared as text."""
    return re.sub(r"timestamp: \S+", "timestamp: ...", f"{type(error).__name__}: {error}")


def is_on_purpose(error: Exception) -> bool:
    return any(type(error) is kind and pattern.match(str(error)) for kind, pattern in ON_PURPOSE_ERRORS)


def _describe(result: RewardInfo | Exception) -> str:
    if isinstance(result, Exception):
        return f"raised {outcome_text(result)}"
    return f"returned reward {result.reward} (breakdown {result.reward_breakdown})"


def compare(cached: RewardInfo | Exception, stock: RewardInfo | Exception) -> RewardInfo | str:
    """The common result of the two scorings: the `RewardInfo`, or the text of the on-purpose tau2 error
    both raised. Fails when only one side raised, when the errors differ, or when both raised an error
    tau2 does not raise on purpose."""
    both = f"cached {_describe(cached)}; stock {_describe(stock)}"
    if isinstance(cached, Exception) or isinstance(stock, Exception):
        assert isinstance(cached, Exception) and isinstance(stock, Exception), f"only one side raised: {both}"
        assert outcome_text(cached) == outcome_text(stock), f"the two sides raised differently: {both}"
        assert is_on_purpose(stock), f"both raised an error tau2 does not raise on purpose: {both}"
        return outcome_text(cached)
    assert cached.reward == stock.reward, both
    assert cached.reward_breakdown == stock.reward_breakdown, both
    assert cached.model_dump() == stock.model_dump(), both
    return cached


def _score(domain: str, task: Task, sim: SimulationRun, solo: bool,
           judge: tau2_judge.Judge | None) -> RewardInfo | Exception:
    try:
        return tau2_domain.evaluate(sim, task, domain, solo, judge=judge)
    except Exception as e:  # judged by `compare`: only tau2's on-purpose errors are results
        return e


def assert_same_as_stock(domain: str, task: Task, sim: SimulationRun, solo: bool = False,
                         judge: tau2_judge.Judge | None = None) -> RewardInfo | str:
    """The trajectory scored cached and stock: see `compare`."""
    cached = _score(domain, task, sim, solo, judge)
    with tau2_cache.enabled(False):
        stock = _score(domain, task, sim, solo, judge)
    return compare(cached, stock)


def assert_meaningful(rewards: Mapping[str, float | str]) -> None:
    """What tau2 decides regardless of the evaluator's internals, over `task/variant` outcomes: every
    variant was scored (none raised: the trajectories are consistent by construction), each of tau2's own
    ground truths scores 1.0 (true of every test task on both mirrored releases), a run cut short by the
    step limit scores 0.0, and both rewards occur."""
    raised = {k: v for k, v in rewards.items() if isinstance(v, str)}
    assert not raised, f"variants that raised instead of being scored: {raised}"
    ground_truth = {k: v for k, v in rewards.items() if k.endswith("/ground_truth")}
    assert ground_truth, "no ground-truth variant was scored"
    assert {k: v for k, v in ground_truth.items() if v != 1.0} == {}, "ground truths that did not pass"
    cut_short = {k: v for k, v in rewards.items() if k.endswith("/max_steps")}
    assert {k: v for k, v in cut_short.items() if v != 0.0} == {}, "runs cut short at max steps that passed"
    assert {1.0, 0.0} <= set(rewards.values()), f"not both outcomes: {sorted(set(rewards.values()))}"


def check_domain_sample(domain: str, ids: list[str], solo: bool = False, kinds: set[str] | None = None,
                        judge: tau2_judge.Judge | None = None) -> dict[str, float | str]:
    """Every variant of every task scored cached and stock (see the module docstring); the snapshots
    must come out intact. Returns the rewards by `task/variant` (the error's text where both raised the
    same on-purpose tau2 error)."""
    rewards = {}
    for task_id in ids:
        task = tau2_domain.get_task(domain, task_id)
        for name, (actions, termination) in variants(task, solo).items():
            if kinds is not None and name not in kinds:
                continue
            sim = simulate(domain, task, actions, solo=solo, termination=termination)
            result = assert_same_as_stock(domain, task, sim, solo, judge)
            rewards[f"{task_id}/{name}"] = result.reward if isinstance(result, RewardInfo) else result
    for snapshot in tau2_cache.domain_cache(domain).snapshots():
        assert snapshot is None or snapshot.intact()
    return rewards


def sample(domain: str, split: str, n: int) -> list[str]:
    return sorted(random.Random(0).sample(tau2_domain.task_ids(domain, split), n))


