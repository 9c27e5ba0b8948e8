"""The one door to tau2's domains: tasks, environments and the evaluator.

Everything the workflow, the training entry and the evaluation need from tau2's registry goes through
here, so that caching (see `tau2_cache`) lives in one place and rewards keep tau2's exact semantics.
"""

from __future__ import annotations

import functools
import threading

from tau2.data_model.simulation import RewardInfo, SimulationRun
from tau2.data_model.tasks import Task
from tau2.environment.environment import Environment
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.registry import registry

from examples.tau2.tau2_utils import DOMAINS, SOLO_DOMAINS

_lock = threading.Lock()


@functools.cache
def _tasks_by_id(domain: str) -> dict[str, Task]:
    # split None = every task of the domain (telecom: all 2285, a superset of every split).
    return {t.id: t for t in registry.get_tasks_loader(domain)(None)}


def _check_domain(domain: str) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {domain!r}; known: {', '.join(DOMAINS)}")


def get_task(domain: str, task_id: str) -> Task:
    """The task object. Shared between episodes: treat it as read-only."""
    _check_domain(domain)
    with _lock:
        tasks = _tasks_by_id(domain)
    try:
        return tasks[task_id]
    except KeyError:
        raise KeyError(f"tau2 domain {domain!r} has no task {task_id!r}") from None


def splits(domain: str) -> dict[str, list[str]]:
    """Split name -> task ids. `mock` has no splits file: its only split is `all`."""
    _check_domain(domain)
    loader = registry.get_task_splits_loader(domain)
    if loader is None:
        with _lock:
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
    constructor = registry.get_env_constructor(domain)
    return constructor(solo_mode=True) if solo_mode else constructor()


def evaluate(simulation: SimulationRun, task: Task, domain: str, solo_mode: bool) -> RewardInfo:
    """tau2's `evaluate_simulation` with every criterion (DB/env, actions, communicate)."""
    return evaluate_simulation(
        simulation=simulation,
        task=task,
        evaluation_type=EvaluationType.ALL,
        solo_mode=solo_mode,
        domain=domain,
    )
