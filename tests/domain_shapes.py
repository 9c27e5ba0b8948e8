"""Domains of other shapes than the project's own: the example domain's tools, database and policy
(docs/own_domain/library_desk) with as many tasks as a test asks for, with or without splits, under a name
and module of the test's choosing.

Each task is one of the example's eight that need work, renumbered, so every task keeps a ground truth
that grades 1.0 and training leaves none out (tasks 1 and 5 pay for doing nothing: test_task_check.py).
A module registers its domain with tau2's registry when imported, once per process: each test names its own.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tau2" / "docs" / "own_domain" / "library_desk"
NEED_WORK = (0, 2, 3, 4, 6, 7, 8, 9)
"""The example's tasks that no do-nothing or half-done agent passes."""

NO_SPLITS_INIT = '''"""A copy of the example domain without task splits (its one split is `all`)."""
from tau2.registry import registry

from .environment import DOMAIN_NAME, get_environment, get_tasks

registry.register_domain(get_environment, DOMAIN_NAME)
registry.register_tasks(get_tasks, DOMAIN_NAME)
'''


def write_domain(folder: Path, module: str, domain: str, n_train: int, n_test: int = 2,
                 splits: bool = True) -> str:
    """Write the package `folder/module` registering `domain`; returns the split to train on (`train`, or
    `all` without splits, where the `n_test` tasks are training tasks too)."""
    target = folder / module
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns("__pycache__"))
    environment = target / "environment.py"
    environment.write_text(environment.read_text().replace('DOMAIN_NAME = "library"',
                                                           f'DOMAIN_NAME = "{domain}"'))
    example = json.loads((EXAMPLE / "data" / "tasks.json").read_text())
    tasks = []
    for i in range(n_train + n_test):
        task = json.loads(json.dumps(example[NEED_WORK[i % len(NEED_WORK)]]))
        task["id"] = f"t{i}"
        task["user_scenario"]["instructions"]["domain"] = domain
        for j, action in enumerate(task["evaluation_criteria"]["actions"] or []):
            action["action_id"] = f"t{i}_{j}"
        tasks.append(task)
    (target / "data" / "tasks.json").write_text(json.dumps(tasks, indent=1))
    ids = [t["id"] for t in tasks]
    (target / "data" / "split_tasks.json").write_text(json.dumps(
        {"train": ids[:n_train], "test": ids[n_train:], "base": ids}))
    if not splits:
        (target / "__init__.py").write_text(NO_SPLITS_INIT)
        return "all"
    return "train"
