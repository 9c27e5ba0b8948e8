"""A throw-away tau2 domain written by a test: a parking garage, with other tools than the example domain's.

`write_domain(folder, module, domain)` writes an importable module that registers `domain` with tau2's
registry when imported; each test names its own module and domain, since tau2's registry is per process and
refuses a name twice. `tasks` and `splits` change what it registers, so that tests can plant bad tasks.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

MODULE = '''
"""A parking garage: spots on levels, and reservations by licence plate."""
import json
from pathlib import Path

from pydantic import BaseModel
from tau2.data_model.tasks import Task
from tau2.environment.db import DB
from tau2.environment.environment import Environment
from tau2.environment.toolkit import ToolKitBase, ToolType, is_tool
from tau2.registry import registry

HERE = Path(__file__).parent


class Spot(BaseModel):
    spot_id: str
    level: int
    plate: str | None = None


class Garage(DB):
    spots: dict[str, Spot]


class GarageTools(ToolKitBase):
    db: Garage

    def __init__(self, db: Garage) -> None:
        super().__init__(db)

    @is_tool(ToolType.READ)
    def free_spots(self, level: int) -> list[str]:
        """The free spots of a level.

        Args:
            level: The level, 0 or 1.
        """
        return sorted(s.spot_id for s in self.db.spots.values() if s.level == level and s.plate is None)

    @is_tool(ToolType.WRITE)
    def reserve_spot(self, spot_id: str, plate: str) -> str:
        """Reserve a free spot for a car.

        Args:
            spot_id: The spot.
            plate: The car's licence plate.
        """
        spot = self.db.spots.get(spot_id)
        if spot is None or spot.plate is not None:
            raise ValueError(f"spot {spot_id} is not free")
        spot.plate = plate
        return f"spot {spot_id} reserved for {plate}"


def get_environment(db: Garage | None = None, solo_mode: bool = False) -> Environment:
    if solo_mode:
        raise ValueError("the garage has no solo mode")
    db = db or Garage.model_validate(json.loads((HERE / "DOMAIN_db.json").read_text()))
    return Environment(domain_name="DOMAIN", policy="Reserve only free spots.", tools=GarageTools(db))


def get_tasks(split: str | None = None) -> list[Task]:
    tasks = [Task.model_validate(t) for t in json.loads((HERE / "DOMAIN_tasks.json").read_text())]
    return tasks if split is None else [t for t in tasks if t.id in get_tasks_split()[split]]


def get_tasks_split() -> dict[str, list[str]]:
    return json.loads((HERE / "DOMAIN_splits.json").read_text())


registry.register_domain(get_environment, "DOMAIN")
registry.register_tasks(get_tasks, "DOMAIN", get_task_splits=get_tasks_split)
'''

DB = {"spots": {"A1": {"spot_id": "A1", "level": 0}, "A2": {"spot_id": "A2", "level": 0, "plate": "X-1"},
                "B1": {"spot_id": "B1", "level": 1}}}


def task(task_id: str, actions: list[tuple[str, dict[str, Any]]] | None,
         reward_basis: tuple[str, ...] = ("DB",)) -> dict[str, Any]:
    """A tau2 task whose ground truth is `actions` (None: no evaluation criteria at all)."""
    criteria = None if actions is None else {
        "actions": [{"action_id": f"{task_id}_{n}", "requestor": "assistant", "name": name, "arguments": args}
                    for n, (name, args) in enumerate(actions)],
        "reward_basis": list(reward_basis),
    }
    return {
        "id": task_id,
        "user_scenario": {"instructions": {
            "domain": "parking", "reason_for_call": f"I need a parking spot (task {task_id}).",
            "known_info": "My plate is P-7.", "task_instructions": "Ask for a spot on level 0."}},
        "evaluation_criteria": criteria,
    }


TASKS = [task("1", [("reserve_spot", {"spot_id": "A1", "plate": "P-7"})]),
         task("2", [("free_spots", {"level": 1}), ("reserve_spot", {"spot_id": "B1", "plate": "P-7"})]),
         task("3", [])]
SPLITS = {"train": ["1", "2"], "test": ["3"]}


def write_domain(folder: Path, module: str, domain: str, tasks: list[dict[str, Any]] | None = None,
                 splits: dict[str, list[str]] | None = None, solo: bool = False) -> Path:
    """Write `<folder>/<module>.py` registering `domain` (and its data beside it); returns its path.
    `solo`: its environment also builds in solo mode."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{domain}_db.json").write_text(json.dumps(DB))
    (folder / f"{domain}_tasks.json").write_text(json.dumps(TASKS if tasks is None else tasks))
    (folder / f"{domain}_splits.json").write_text(json.dumps(SPLITS if splits is None else splits))
    path = folder / f"{module}.py"
    text = textwrap.dedent(MODULE).replace("DOMAIN", domain)
    if solo:
        refusal = '    if solo_mode:\n        raise ValueError("the garage has no solo mode")\n'
        text = text.replace(refusal, "")
    path.write_text(text)
    return path
