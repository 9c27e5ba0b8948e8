"""The one door to tau2's domains: tasks, environments and the evaluator.

Everything the workflow, the training entry and the evaluation need from tau2's registry goes through
here. By default it is served by `compat.tau2_cache` (tasks parsed once, environments forked from a database
snapshot, the gold end state of each task computed once), with rewards identical to tau2's
`evaluate_simulation(..., EvaluationType.ALL, ...)`. Inside `tau2_cache.enabled(False)`, or on a tau2
release the cache does not mirror, every call goes to stock tau2 instead.
"""

from __future__ import annotations

import functools

from tau2.data_model.simulation import RewardInfo, SimulationRun
from tau2.data_model.tasks import Task
from tau2.environment.environment import Environment
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.registry import registry

from examples.tau2.compat import tau2_cache, tau2_judge
from examples.tau2.tau2_utils import DOMAINS, SOLO_DOMAINS


def _check_domain(domain: str) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {domain!r}; known: {', '.join(DOMAINS)}")


def _tasks_by_id(domain: str) -> dict[str, Task]:
    if tau2_cache.is_enabled():
        return tau2_cache.domain_cache(domain).tasks()
    return _stock_tasks_by_id(domain)


@functools.cache
def _stock_tasks_by_id(domain: str) -> dict[str, Task]:
    """tau2's task loader, once per process: parsing telecom's 2,285 tasks takes ~1 s, far too long per
    lookup. Tasks are read-only and outside what the evaluator compares, so stock rewards stay stock."""
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


def evaluate(simulation: SimulationRun, task: Task, domain: str, solo_mode: bool,
             judge: tau2_judge.Judge | None = None) -> RewardInfo:
    """tau2's `evaluate_simulation` with every criterion (DB/env, actions, communicate, and on tau2
    1.0.x the NL assertions, whose verdicts come from `judge`; without one such a task raises `NoJudge`)."""
    _check_domain(domain)
    if not tau2_judge.needs_judge(task):
        return _evaluate(simulation, task, domain, solo_mode)
    tau2_judge.install()
    with tau2_judge.judging(judge):
        return _evaluate(simulation, task, domain, solo_mode)


def _evaluate(simulation: SimulationRun, task: Task, domain: str, solo_mode: bool) -> RewardInfo:
    if tau2_cache.is_enabled():
        return tau2_cache.evaluate_all(simulation, task, domain, solo_mode)
    return evaluate_simulation(
        simulation=simulation,
        task=task,
        evaluation_type=EvaluationType.ALL,
        solo_mode=solo_mode,
        domain=domain,
    )
