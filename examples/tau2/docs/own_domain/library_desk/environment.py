"""The three functions tau2's registry calls: an environment, the tasks, and the task splits.

Every path is relative to this package, so the domain works from wherever it is imported and needs
nothing from tau2's data directory.
"""

import json
from pathlib import Path

from tau2.data_model.tasks import Task
from tau2.environment.environment import Environment

from .data_model import LibraryDB
from .tools import LibraryTools

DOMAIN_NAME = "library"
DATA_DIR = Path(__file__).parent / "data"
DB_PATH = DATA_DIR / "db.json"
POLICY_PATH = DATA_DIR / "policy.md"
TASKS_PATH = DATA_DIR / "tasks.json"
SPLITS_PATH = DATA_DIR / "split_tasks.json"


def get_environment(db: LibraryDB | None = None, solo_mode: bool = False) -> Environment:
    """A fresh front desk: its own copy of the database (tau2 builds one per run and per grading).

    Raises ValueError for solo mode: solo mode needs tasks with tickets and a policy for an agent that
    works alone, and this domain has neither.
    """
    if solo_mode:
        raise ValueError(f"the {DOMAIN_NAME} domain has no solo mode")
    if db is None:
        db = LibraryDB.load(str(DB_PATH))
    return Environment(domain_name=DOMAIN_NAME, policy=POLICY_PATH.read_text(), tools=LibraryTools(db))


def get_tasks(task_split_name: str | None = None) -> list[Task]:
    """All tasks, or those of one split ('train', 'test' or 'base')."""
    tasks = [Task.model_validate(task) for task in json.loads(TASKS_PATH.read_text())]
    if task_split_name is None:
        return tasks
    splits = get_tasks_split()
    if task_split_name not in splits:
        raise ValueError(f"unknown task split {task_split_name!r}; the splits are {sorted(splits)}")
    wanted = set(splits[task_split_name])
    return [task for task in tasks if task.id in wanted]


def get_tasks_split() -> dict[str, list[str]]:
    """Task ids by split: 'train' and 'test' are disjoint, 'base' is all of them."""
    return json.loads(SPLITS_PATH.read_text())
