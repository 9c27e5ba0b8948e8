"""Curriculum: per-task solve rates steer which tau2 tasks the trainer samples (off by default).

Where the rates come from. The episodes run in AReaL's rollout workers; the controller (this process,
which owns the training dataloader) sees neither a task id next to a reward (an exported trajectory
carries tokens and rewards, not the dataset row) nor the groups the GRPO filter drops (all-failure and
all-success groups never leave the worker). So the training workflow, `CurriculumAgentWorkflow`
(`curriculum/addon.py`), appends one JSON line per scored episode to a file of its own under
`curriculum.outcomes_dir` (default `<cluster.fileroot>/tau2_curriculum/<experiment>/<trial>`, shared
storage like the rest of `fileroot`), and the controller reads the new lines each time it draws a batch.
Rejected episodes (infrastructure failures) have no reward and leave no line; evaluation episodes run
the plain workflow and leave none either.

What it changes. `CurriculumSampler` replaces the `DistributedSampler` of AReaL's training dataloader
(`Tau2PPOTrainer._create_dataloader` overrides AReaL's, the one place AReaL builds it).
For every batch it reads the new outcomes, puts each task in a bucket by its solve rate over its last
`window` episodes, and samples the batch's rows with the bucket weights:

    new       fewer than `min_attempts` episodes recorded
    unsolved  none of the recent episodes solved
    partial   some solved (the rows GRPO learns from)
    solved    all recent episodes solved
    retired   the last `retire_after` episodes all solved (weight 0 by default: dropped)

and at least `unsolved_floor` of the probability mass goes to unsolved tasks while there are any.
An episode counts as solved when its exact tau2 reward is at least `success_threshold`.

State. The sampler is `Stateful`: the dataloader's `state_dict` (which AReaL's recover handler saves
with every recover checkpoint and loads on resume) carries the per-task windows, the read offsets of
the outcome files, the random generator and the position in the epoch, so a resumed run continues with
the same rates and does not count an episode twice. A fresh (not resumed) run ignores lines that were
already in the directory. Each draw logs one line and records `curriculum/bucket/<name>` (tasks per
bucket), `curriculum/sampled/<name>` (rows of the batch per bucket) and `curriculum/outcomes` in the
controller's stats tracker, which AReaL commits with the step (console, TensorBoard, W&B).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import socket
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.utils import stats_tracker
from torch.utils.data import Sampler

from examples.tau2.settings.config import BUCKETS, CurriculumConfig

logger = logging.getLogger("tau2_areal.curriculum")

OUTCOME_FILE_PREFIX = "outcomes-"
STATS_PREFIX = "curriculum"


# ---------------------------------------------------------------------------------------------
# Outcomes: one JSON line per scored episode, one file per worker process


@dataclass(frozen=True)
class Outcome:
    """One scored training episode, as the worker that ran it recorded it."""

    domain: str
    task_id: str
    tau2_reward: float
    reward: float
    """The reward the workflow returned to AReaL (shaped)."""
    time: float = 0.0

    @property
    def key(self) -> str:
        return task_key(self.domain, self.task_id)

    @classmethod
    def from_json(cls, line: str) -> Outcome:
        d = json.loads(line)
        return cls(domain=str(d["domain"]), task_id=str(d["task_id"]), tau2_reward=float(d["tau2_reward"]),
                   reward=float(d["reward"]), time=float(d.get("time", 0.0)))


def task_key(domain: str, task_id: str) -> str:
    return f"{domain}/{task_id}"


def append_outcome(directory: str | Path, outcome: Outcome) -> Path:
    """Append one line to this process's outcome file (opened and closed per line: readers on other
    nodes of a shared filesystem see whole lines after close)."""
    path = Path(directory) / f"{OUTCOME_FILE_PREFIX}{socket.gethostname()}-{os.getpid()}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(dataclasses.asdict(outcome), separators=(",", ":")) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
    return path


class OutcomeReader:
    """Reads the lines appended since the last call, from every outcome file of a directory."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.offsets: dict[str, int] = {}
        """File name -> bytes already read (whole lines only)."""

    def _files(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(self.directory.glob(f"{OUTCOME_FILE_PREFIX}*.jsonl"))

    def skip_existing(self) -> None:
        """Start after what is there now (a fresh run must not inherit an earlier run's outcomes)."""
        for path in self._files():
            self.offsets[path.name] = path.stat().st_size

    def read_new(self) -> list[Outcome]:
        out: list[Outcome] = []
        for path in self._files():
            start = self.offsets.get(path.name, 0)
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line being written now is read next time
            for raw in data[:end].splitlines():
                try:
                    out.append(Outcome.from_json(raw.decode("utf-8")))
                except (ValueError, KeyError, TypeError) as e:
                    logger.warning("curriculum: skipping a malformed line in %s: %s", path, e)
            self.offsets[path.name] = start + end
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"offsets": dict(self.offsets)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.offsets = dict(state["offsets"])


# ---------------------------------------------------------------------------------------------
# Solve rates and the bucket policy


class SolveRates:
    """The latest `window` outcomes (solved or not) of every task seen."""

    def __init__(self, window: int):
        self.window = window
        self.recent: dict[str, list[bool]] = {}
        self.attempts: Counter[str] = Counter()

    def add(self, key: str, solved: bool) -> None:
        recent = self.recent.setdefault(key, [])
        recent.append(solved)
        del recent[:-self.window]
        self.attempts[key] += 1

    def rate(self, key: str) -> float | None:
        recent = self.recent.get(key)
        return sum(recent) / len(recent) if recent else None

    def bucket(self, key: str, config: CurriculumConfig) -> str:
        recent = self.recent.get(key, [])
        if len(recent) < config.min_attempts:
            return "new"
        tail = recent[-config.retire_after:] if config.retire_after else []
        if config.retire_after and len(tail) == config.retire_after and all(tail):
            return "retired"
        solved = sum(recent)
        if solved == 0:
            return "unsolved"
        return "solved" if solved == len(recent) else "partial"

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window, "recent": {k: list(v) for k, v in self.recent.items()},
                "attempts": dict(self.attempts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.recent = {k: list(v)[-self.window:] for k, v in state["recent"].items()}
        self.attempts = Counter(state["attempts"])


def row_probabilities(buckets: Sequence[str], config: CurriculumConfig) -> list[float]:
    """Sampling probability of each row from its task's bucket: bucket weights, then the unsolved floor.

    All weights zero (e.g. every task retired): uniform, so that training can go on.
    """
    weights = config.weights.as_dict()
    raw = [weights[b] for b in buckets]
    total = sum(raw)
    if total <= 0:
        return [1.0 / len(buckets)] * len(buckets) if buckets else []
    probs = [w / total for w in raw]
    unsolved = [i for i, b in enumerate(buckets) if b == "unsolved"]
    mass = sum(probs[i] for i in unsolved)
    floor = config.unsolved_floor
    if unsolved and mass < floor and mass < 1:
        raw_unsolved = sum(raw[i] for i in unsolved)
        scale_rest = (1 - floor) / (1 - mass)
        probs = [p * scale_rest for p in probs]
        for i in unsolved:
            probs[i] = floor * (raw[i] / raw_unsolved if raw_unsolved > 0 else 1 / len(unsolved))
    return probs


def weighted_sample(rng: random.Random, probs: Sequence[float], k: int) -> list[int]:
    """k indices drawn by probability, without replacement while enough rows have positive probability
    (Efraimidis-Spirakis keys), then with replacement for the rest."""
    positive = [i for i, p in enumerate(probs) if p > 0]
    # key log(u)/p ranks like u**(1/p) but does not underflow to ties for small p
    keys = {i: math.log(1.0 - rng.random()) / probs[i] for i in positive}
    keyed = sorted(positive, key=keys.__getitem__, reverse=True)
    chosen = keyed[:k]
    if len(chosen) < k and positive:
        chosen += rng.choices(positive, weights=[probs[i] for i in positive], k=k - len(chosen))
    return chosen


# ---------------------------------------------------------------------------------------------
# The sampler AReaL's training dataloader draws from


@dataclass(frozen=True)
class Draw:
    """What one batch draw saw and chose (logged, recorded as stats, returned for tests)."""

    number: int
    epoch: int
    new_outcomes: int
    tasks_per_bucket: dict[str, int]
    sampled_per_bucket: dict[str, int]
    indices: list[int]

    def log_line(self) -> str:
        tasks = ", ".join(f"{b} {n}" for b, n in self.tasks_per_bucket.items())
        sampled = ", ".join(f"{b} {n}" for b, n in self.sampled_per_bucket.items() if n)
        return (f"curriculum draw {self.number} (epoch {self.epoch}): +{self.new_outcomes} outcomes; "
                f"tasks {tasks}; sampled {len(self.indices)}: {sampled}")


class CurriculumSampler(Sampler[int]):
    """Index sampler over the training rows: each batch drawn by the current solve-rate buckets.

    An epoch has as many indices as the plain sampler gives (`len`), so AReaL's steps per epoch do not
    change; a batch holds distinct rows unless fewer rows can be sampled than it needs.
    """

    def __init__(self, keys: Sequence[str], config: CurriculumConfig, batch_size: int, *,
                 reader: OutcomeReader, seed: int, drop_last: bool = True,
                 on_draw: Callable[[Draw], None] | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.keys = list(keys)
        self.config = config
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.reader = reader
        self.rates = SolveRates(config.window)
        self.rng = random.Random(seed)
        self.on_draw = on_draw
        self.epoch = 0
        self.draws = 0
        self.outcomes_read = 0
        self._yielded = 0
        self._resume_at: int | None = None

    def __len__(self) -> int:
        n = len(self.keys)
        return n - n % self.batch_size if self.drop_last else n

    def __iter__(self) -> Iterator[int]:
        self._yielded = self._resume_at or 0
        self._resume_at = None
        while self._yielded < len(self):
            for index in self.draw(min(self.batch_size, len(self) - self._yielded)).indices:
                self._yielded += 1
                yield index
        self.epoch += 1
        self._yielded = 0

    def refresh(self) -> int:
        """Read the outcomes recorded since the last refresh; returns how many."""
        outcomes = self.reader.read_new()
        for o in outcomes:
            self.rates.add(o.key, o.tau2_reward >= self.config.success_threshold)
        self.outcomes_read += len(outcomes)
        return len(outcomes)

    def buckets(self) -> list[str]:
        """The bucket of each row's task, now."""
        by_key = {k: self.rates.bucket(k, self.config) for k in set(self.keys)}
        return [by_key[k] for k in self.keys]

    def draw(self, k: int) -> Draw:
        """Refresh the rates and draw the next k row indices."""
        new = self.refresh()
        buckets = self.buckets()
        indices = weighted_sample(self.rng, row_probabilities(buckets, self.config), k)
        task_bucket = dict(zip(self.keys, buckets, strict=True))
        tasks = Counter(task_bucket.values())
        sampled = Counter(buckets[i] for i in indices)
        self.draws += 1
        draw = Draw(number=self.draws, epoch=self.epoch, new_outcomes=new,
                    tasks_per_bucket={b: tasks[b] for b in BUCKETS},
                    sampled_per_bucket={b: sampled[b] for b in BUCKETS}, indices=indices)
        logger.info("%s", draw.log_line())
        record_stats(draw, self.outcomes_read)
        if self.on_draw is not None:
            self.on_draw(draw)
        return draw

    def state_dict(self) -> dict[str, Any]:
        yielded = self._yielded if self._resume_at is None else self._resume_at  # loaded, not yet iterated
        return {"yielded": yielded, "epoch": self.epoch, "draws": self.draws,
                "outcomes_read": self.outcomes_read, "rng": self.rng.getstate(),
                "rates": self.rates.state_dict(), "reader": self.reader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_at = int(state["yielded"])
        self.epoch, self.draws = int(state["epoch"]), int(state["draws"])
        self.outcomes_read = int(state["outcomes_read"])
        self.rng.setstate(_as_rng_state(state["rng"]))
        self.rates.load_state_dict(state["rates"])
        self.reader.load_state_dict(state["reader"])
        logger.info("curriculum: resumed at draw %d (epoch %d, %d outcomes read, %d tasks tracked)",
                    self.draws, self.epoch, self.outcomes_read, len(self.rates.recent))


def _as_rng_state(state: Any) -> tuple:
    """random.Random's state, also after a round trip through lists (JSON, YAML)."""
    version, internal, gauss = state
    return int(version), tuple(int(x) for x in internal), gauss


def record_stats(draw: Draw, outcomes_read: int) -> None:
    """Per-draw scalars in this process's stats tracker (AReaL's controller exports them each step)."""
    values = {f"{STATS_PREFIX}/bucket/{b}": float(n) for b, n in draw.tasks_per_bucket.items()}
    values |= {f"{STATS_PREFIX}/sampled/{b}": float(n) for b, n in draw.sampled_per_bucket.items()}
    values[f"{STATS_PREFIX}/outcomes"] = float(outcomes_read)
    stats_tracker.scalar(**values)


def row_keys(dataset: Any) -> list[str]:
    """`domain/task_id` of every row of a map-style dataset of tau2 rows."""
    rows = (dataset[i] for i in range(len(dataset)))
    return [task_key(str(row["domain"]), str(row["task_id"])) for row in rows]


def curriculum_dataloader(dataset: Any, curriculum: CurriculumConfig, *, batch_size: int, drop_last: bool,
                          seed: int, outcomes: str | Path) -> Any:
    """AReaL's training dataloader (a `StatefulDataLoader` returning rows as they are) with a
    `CurriculumSampler` in place of its `DistributedSampler`.

    Outcome lines already in `outcomes` are skipped; a resumed run's loaded state restores its offsets."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    directory = Path(outcomes)
    directory.mkdir(parents=True, exist_ok=True)
    reader = OutcomeReader(directory)
    reader.skip_existing()
    sampler = CurriculumSampler(row_keys(dataset), curriculum, batch_size, reader=reader, seed=seed,
                                drop_last=drop_last)
    logger.info("curriculum: %d rows, outcomes in %s", len(sampler.keys), directory)
    return StatefulDataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last,
                              num_workers=0, collate_fn=_rows)


def _rows(batch: list[Any]) -> list[Any]:
    return batch
