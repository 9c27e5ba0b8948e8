"""The one door to tau2's domains: tasks, environments and the evaluator.

Everything the workflow, the training entry and the evaluation need from tau2's registry goes through
here. By default it is served by `tau2_cache` (tasks parsed once, environments forked from a database
snapshot, the gold end state of each task computed once), with rewards identical to tau2's
`evaluate_simulation(..., EvaluationType.ALL, ...)`. Inside `tau2_cache.enabled(False)` every call
goes to stock tau2 instead (for side-by-side comparisons).
"""

from __future__ import annotations

from tau2.data_model.simulation import RewardInfo, SimulationRun, TerminationReason
from tau2.data_model.tasks import RewardType, Task
from tau2.environment.environment import Environment
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.evaluator.evaluator_action import ActionEvaluator
from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
from tau2.registry import registry

from examples.tau2 import tau2_cache
from examples.tau2.tau2_utils import DOMAINS, SOLO_DOMAINS


def _check_domain(domain: str) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {domain!r}; known: {', '.join(DOMAINS)}")


def _tasks_by_id(domain: str) -> dict[str, Task]:
    if tau2_cache.is_enabled():
        return tau2_cache.domain_cache(domain).tasks()
    # split None = every task of the domain (telecom: all 2285, a superset of every split).
    return {t.id: t for t in registry.get_tasks_loader(domain)(None)}


def get_task(domain: str, task_id: str) -> Task:
    """The task object. Shared between episodes: treat it as read-only."""
    _check_domain(domain)
    tasks = _tasks_by_id(domain)
    try:
        return tasks[task_id]
    except KeyError:
        raise KeyError(f"tau2 domain {domain!r} has no task {task_id!r}") from None


def splits(domain: str) -> dict[str, list[str]]:
    """Split name -> task ids. `mock` has no splits file: its only split is `all`."""
    _check_domain(domain)
    if tau2_cache.is_enabled():
        return tau2_cache.domain_cache(domain).splits()
    loader = registry.get_task_splits_loader(domain)
    if loader is None:
        return {"all": list(_tasks_by_id(domain))}
    return dict(loader())


def task_ids(domain: str, split: str) -> list[str]:
    available = splits(domain)
    if split not in available:
        raise ValueError(
            f"tau2 domain {domain!r} has no split {split!r}; available: {', '.join(sorted(available))}"
        )
    return list(available[split])


def make_environment(domain: str, solo_mode: bool = False) -> Environment:
    """A fresh environment with its own database, as tau2's `run_task` builds it."""
    _check_domain(domain)
    if solo_mode and domain not in SOLO_DOMAINS:
        raise ValueError(f"tau2 domain {domain!r} does not support solo mode")
    if tau2_cache.is_enabled():
        return tau2_cache.domain_cache(domain).environment(solo_mode=solo_mode)
    constructor = registry.get_env_constructor(domain)
    return constructor(solo_mode=True) if solo_mode else constructor()


def tools(domain: str) -> tau2_cache.ToolSet:
    """The domain's agent and user tools with their OpenAI schemas (shared, read-only).

    The same for every episode and for solo mode; cached, this costs nothing per episode instead of
    listing `env.get_tools()` and deriving each schema (10-50 ms). tau2 executes tool calls through
    the episode's environment, never through these Tool objects.
    """
    _check_domain(domain)
    if tau2_cache.is_enabled():
        return tau2_cache.domain_cache(domain).tools()
    return tau2_cache.ToolSet.of(make_environment(domain))


def evaluate(simulation: SimulationRun, task: Task, domain: str, solo_mode: bool) -> RewardInfo:
    """tau2's `evaluate_simulation` with every criterion (DB/env, actions, communicate)."""
    _check_domain(domain)
    if tau2_cache.is_enabled():
        return _evaluate_all(simulation, task, domain, solo_mode)
    return evaluate_simulation(
        simulation=simulation,
        task=task,
        evaluation_type=EvaluationType.ALL,
        solo_mode=solo_mode,
        domain=domain,
    )


def _evaluate_all(simulation: SimulationRun, task: Task, domain: str, solo_mode: bool) -> RewardInfo:
    """tau2 26.3's `evaluate_simulation` for `EvaluationType.ALL`, line for line, with the
    environment part from `tau2_cache` (same result, without rebuilding and hashing two databases)."""
    if simulation.termination_reason not in {TerminationReason.AGENT_STOP, TerminationReason.USER_STOP}:
        return RewardInfo(
            reward=0.0,
            reward_basis=None,
            info={"note": "Simulation terminated prematurely. Termination reason: "
                          f"{simulation.termination_reason.value}"},
        )
    if task.evaluation_criteria is None:
        return RewardInfo(reward=1.0, reward_basis=None, info={"note": "No evaluation criteria"})
    env_info = tau2_cache.domain_cache(domain).environment_reward(task, simulation.messages, solo_mode)
    action_info = ActionEvaluator.calculate_reward(task=task, full_trajectory=simulation.messages)
    communicate_info = CommunicateEvaluator.calculate_reward(task=task, full_trajectory=simulation.messages)

    reward = 1.0
    basis = set(task.evaluation_criteria.reward_basis)
    breakdown = {}
    if basis & {RewardType.DB, RewardType.ENV_ASSERTION}:
        if env_info.reward_breakdown is not None:
            breakdown.update(env_info.reward_breakdown)
        reward *= env_info.reward
    if basis & {RewardType.ACTION}:
        if action_info.reward_breakdown is not None:
            breakdown.update(action_info.reward_breakdown)
        reward *= action_info.reward
    if basis & {RewardType.NL_ASSERTION}:
        raise ValueError("NL assertions are part of the reward basis, but they are not being evaluated.")
    if basis & {RewardType.COMMUNICATE}:
        if communicate_info.reward_breakdown is not None:
            breakdown.update(communicate_info.reward_breakdown)
        reward *= communicate_info.reward
    return RewardInfo(
        reward=reward,
        db_check=env_info.db_check,
        env_assertions=env_info.env_assertions,
        action_checks=action_info.action_checks,
        nl_assertions=None,
        communicate_checks=communicate_info.communicate_checks,
        reward_basis=task.evaluation_criteria.reward_basis,
        reward_breakdown=breakdown,
        info={"env": env_info.info, "nl": None, "communicate": communicate_info.info,
              "action": action_info.info},
    )
