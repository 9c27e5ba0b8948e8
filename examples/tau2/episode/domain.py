"""The one door to tau2's domains: tasks, environments and the evaluator.

A domain is one of tau2's built-in ones (`BUILTIN_DOMAINS`), served by `compat.tau2_cache` with tau2's
exact rewards, or one that a module named in `econfig.domain_modules` registers with tau2's registry
(`load_modules`, docs/own_domain.md), served by stock tau2 (as is every domain when the cache is off).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import re
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from loguru import logger as loguru_logger
from tau2.data_model.simulation import RewardInfo, SimulationRun
from tau2.data_model.tasks import Task
from tau2.environment.environment import Environment
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.registry import registry

from examples.tau2.compat import tau2_cache, tau2_judge

logger = logging.getLogger("tau2_areal.domain")

BUILTIN_DOMAINS = ("airline", "retail", "telecom", "mock")
"""tau2's own domains, which the evaluator cache mirrors."""
SOLO_DOMAINS = ("telecom", "mock")
"""The built-in domains with tickets (tau2 raises for solo mode on the others; a module's: `solo_problem`)."""


class DomainError(ValueError):
    """A domain, split or domain module a run cannot use; the message is one sentence."""


@dataclasses.dataclass(frozen=True)
class DomainModule:
    """A module named in `econfig.domain_modules`, once imported."""

    name: str
    domains: tuple[str, ...]
    """The domains it registered (with an environment and tasks)."""
    root: Path
    """The `sys.path` entry it was imported from: where every worker must find it."""


_modules: dict[str, DomainModule] = {}
_refused: dict[str, DomainError] = {}
"""Modules that failed to load, with why: importing one again would find its partial registrations."""
_modules_lock = threading.RLock()
_ALREADY_REGISTERED = re.compile(r"(?:Domain|Tasks) (\S+) already registered")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")


def name_problem(domain: object) -> str:
    """'' when `domain` is a plain name (letters, digits, `_`, `-`); else why not, in one sentence. Output
    folders and file names are made of domain names: a `/`, `..` or space would make one a path."""
    if isinstance(domain, str) and _PLAIN_NAME.fullmatch(domain):
        return ""
    return f"tau2 domain name {domain!r} is not a plain name: use only letters, digits, '_' and '-'"


def load_modules(names: Iterable[str]) -> list[DomainModule]:
    """Import each domain module once per process (later calls return what the first found, or raise
    what it raised). DomainError: the module does not import, registers no domain with tasks, or
    registers a name that is taken."""
    with _modules_lock:
        loaded = []
        for name in names:
            if name in _refused:
                raise _refused[name]
            try:
                loaded.append(_modules.get(name) or _load(name))
            except DomainError as e:
                _refused[name] = e
                raise
        return loaded


def _load(name: str) -> DomainModule:
    if not all(part.isidentifier() for part in name.split(".")):
        raise DomainError(f"domain module {name!r} is not a module name: name it as Python imports it, "
                          "e.g. econfig.domain_modules=[my_pkg.my_domain], with its folder on PYTHONPATH")
    before = set(registry.get_domains()) | set(registry.get_task_sets())
    was_imported = name in sys.modules
    importlib.invalidate_caches()  # a module written after this process started is found too
    loguru_logger.disable("tau2.registry")  # a refused registration is said once, by _import_problem
    try:
        module = importlib.import_module(name)
    except Exception as e:  # whatever the module raises: it is the module's problem, said in one line
        raise DomainError(_import_problem(name, e)) from None
    finally:
        loguru_logger.enable("tau2.registry")
    new = (set(registry.get_domains()) | set(registry.get_task_sets())) - before
    if not new and was_imported:  # imported before it was named here: its registrations by origin
        new = {d for d in registry.get_domains()
               if f"{getattr(registry.get_env_constructor(d), '__module__', '')}.".startswith(f"{name}.")}
    domains = tuple(sorted(d for d in new if d in registry.get_domains() and d in registry.get_task_sets()))
    for domain in domains:
        if name_problem(domain):
            raise DomainError(f"domain module {name!r} registers {domain!r}, which is not a plain name: "
                              "rename it with only letters, digits, '_' and '-'")
    if not domains:
        raise DomainError(f"domain module {name!r} registers no tau2 domain with tasks (it must call "
                          "registry.register_domain and registry.register_tasks for one name)")
    file = getattr(module, "__file__", None)
    path = Path(file).resolve() if file else None  # its sys.path root: one folder up per package level
    root = path.parents[name.count(".") + (path.name == "__init__.py")] if path else Path.cwd()
    loaded = DomainModule(name, domains, root)
    _modules[name] = loaded
    logger.info("domain module %s (%s) registered %s", name, loaded.root, ", ".join(domains))
    return loaded


def _import_problem(name: str, e: BaseException) -> str:
    """Why module `name` did not import, in one sentence: not found (with the fix), a name taken, or the
    error with the file and line of the module's own code that raised it."""
    missing = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
    if missing and (name == missing or name.startswith(missing + ".")):
        parent, _, leaf = missing.rpartition(".")
        if parent in sys.modules:
            folder = next(iter(getattr(sys.modules[parent], "__path__", [])), "")
            return f"domain module {name!r} is not found: package {parent!r} ({folder}) has no {leaf!r}"
        return (f"domain module {name!r} is not on the Python path: add the folder that holds "
                f"{missing.split('.')[0]!r} (PYTHONPATH=/path/to/that/folder:$PYTHONPATH) or install it")
    if taken := _ALREADY_REGISTERED.search(str(e)):
        owner = next((m.name for m in _modules.values() if taken.group(1) in m.domains),
                     "tau2 or a module imported earlier")
        whose = ("the name of a built-in tau2 domain" if taken.group(1) in BUILTIN_DOMAINS else
                 f"which {owner} registers already")
        return f"domain module {name!r} registers {taken.group(1)!r}, {whose}; give its domain another name"
    return f"domain module {name!r} does not import ({_where(e, name)}{_last_line(e)})"


def _where(error: BaseException, module: str) -> str:
    """'FILE, line N: ' of the module's (or its package's) own code where the import failed: a syntax
    error's spot, else the deepest frame that runs the package's code; '' when none does."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}, line {error.lineno}: "
    package = module.split(".")[0]
    spots = [(frame.f_code.co_filename, line) for frame, line in traceback.walk_tb(error.__traceback__)
             if (frame.f_globals.get("__name__") or "").split(".")[0] == package]
    return f"{spots[-1][0]}, line {spots[-1][1]}: " if spots else ""


def loaded_modules() -> list[DomainModule]:
    """The domain modules this process imported, in order."""
    with _modules_lock:
        return list(_modules.values())


def known_domains() -> tuple[str, ...]:
    """The domains a run may name: the built-in ones and those the loaded modules registered."""
    return BUILTIN_DOMAINS + tuple(d for m in loaded_modules() for d in m.domains)


def is_builtin(domain: str) -> bool:
    return domain in BUILTIN_DOMAINS


def check_domain(domain: str, modules: Iterable[str] | None = None) -> None:
    """Raises DomainError for a domain neither built in nor registered by a loaded module. `modules`: the
    ones the run named (default: every module this process loaded)."""
    if problem := name_problem(domain):
        raise DomainError(problem)
    if domain not in known_domains():
        names = [m.name for m in loaded_modules()] if modules is None else list(modules)
        named = (f"econfig.domain_modules {names} register no such domain" if names else
                 "econfig.domain_modules is empty: name the module that registers it, e.g. "
                 "econfig.domain_modules=[my_pkg.my_domain]")
        raise DomainError(f"unknown tau2 domain {domain!r}; known: {', '.join(known_domains())} ({named})")


def _cached(domain: str) -> bool:
    """Whether the evaluator cache serves this domain (it mirrors the built-in ones only)."""
    return tau2_cache.is_enabled() and is_builtin(domain)


def grading(domain: str) -> str:
    """How the domain's episodes are graded, in a few words (the dry run's plan says it)."""
    return "through the evaluator cache" if _cached(domain) else "by stock tau2"


def _tasks_by_id(domain: str) -> dict[str, Task]:
    return tau2_cache.domain_cache(domain).tasks() if _cached(domain) else _stock_tasks_by_id(domain)


@functools.cache
def _stock_tasks_by_id(domain: str) -> dict[str, Task]:
    """tau2's task loader (split None: every task), once per process: parsing telecom's tasks takes ~1 s.
    Tasks are read-only and outside what the evaluator compares, so stock rewards stay stock."""
    return {t.id: t for t in registry.get_tasks_loader(domain)(None)}


def get_task(domain: str, task_id: str) -> Task:
    """The task object. Shared between episodes: treat it as read-only."""
    check_domain(domain)
    try:
        return _tasks_by_id(domain)[task_id]
    except KeyError:
        raise KeyError(f"tau2 domain {domain!r} has no task {task_id!r}") from None


def splits(domain: str) -> dict[str, list[str]]:
    """Split name -> task ids. A domain without a splits loader (`mock`) has one split, `all`."""
    check_domain(domain)
    loader = registry.get_task_splits_loader(domain)
    found = loader() if loader is not None else {"all": _tasks_by_id(domain)}
    return {name: list(ids) for name, ids in found.items()}


def task_ids(domain: str, split: str) -> list[str]:
    available = splits(domain)
    if split not in available:
        raise DomainError(f"tau2 domain {domain!r} has no split {split!r}; available: "
                          f"{', '.join(sorted(available))}")
    return list(available[split])


def solo_problem(domain: str) -> str:
    """'' when the domain runs in solo mode; else why not, in one sentence."""
    check_domain(domain)
    if is_builtin(domain):
        return "" if domain in SOLO_DOMAINS else (
            f"solo mode needs a domain with tickets ({', '.join(SOLO_DOMAINS)} or one from a module); "
            f"{domain} has none")
    try:
        registry.get_env_constructor(domain)(solo_mode=True)
    except Exception as e:
        return f"tau2 domain {domain!r} does not build in solo mode ({_last_line(e)})"
    return ""


def make_environment(domain: str, solo_mode: bool = False) -> Environment:
    """A fresh environment with its own database, as tau2's `run_task` builds it."""
    check_domain(domain)
    if solo_mode and is_builtin(domain) and domain not in SOLO_DOMAINS:
        raise DomainError(f"tau2 domain {domain!r} does not support solo mode")
    if _cached(domain):
        return tau2_cache.domain_cache(domain).environment(solo_mode=solo_mode)
    constructor = registry.get_env_constructor(domain)
    return constructor(solo_mode=True) if solo_mode else constructor()


def state(domain: str, env: Environment) -> tuple[object, object]:
    """The agent and user databases' state: equal exactly when tau2's db hashes are (cache: rows touched)."""
    return (tau2_cache.domain_cache(domain).digests(env) if _cached(domain)
            else (env.get_db_hash(), env.get_user_db_hash()))


def tools(domain: str) -> tau2_cache.ToolSet:
    """The domain's agent and user tools with their OpenAI schemas (shared, read-only; the same for every
    episode and for solo mode): listed once, not per episode (10-50 ms)."""
    check_domain(domain)
    return tau2_cache.domain_cache(domain).tools() if _cached(domain) else _stock_tools(domain)


@functools.cache
def _stock_tools(domain: str) -> tau2_cache.ToolSet:
    return tau2_cache.ToolSet.of(make_environment(domain))


def task_problems(domain: str, ids: Iterable[str], solo_mode: bool = False) -> list[str]:
    """Tasks a run cannot grade, one sentence each: no evaluation criteria, a ground-truth action naming a
    tool its requestor lacks, or one that fails when replayed as tau2's grader does (tau2 only logs that,
    and a do-nothing agent could then pass); in solo mode, a task without a ticket."""
    toolset = tools(domain)
    names = {"assistant": {t.name for t in toolset.agent}, "user": {t.name for t in toolset.user}}
    problems = []
    for task_id in ids:
        task = get_task(domain, task_id)
        if solo_mode and not task.ticket:
            problems.append(f"tau2 domain {domain!r} task {task_id!r} has no ticket, which solo mode gives "
                            "the agent instead of a user")
        if task.evaluation_criteria is None:
            problems.append(f"tau2 domain {domain!r} task {task_id!r} has no evaluation criteria, so every "
                            "episode would score 1.0; give it actions, communicate_info or assertions")
            continue
        actions = task.evaluation_criteria.actions or []
        unknown = [a for a in actions if a.name not in names.get(a.requestor, set())]
        problems += [f"tau2 domain {domain!r} task {task_id!r}: action {a.action_id!r} calls {a.name!r}, "
                     f"which is not a tool of the {a.requestor} there" for a in unknown]
        if actions and not unknown and (failed := _failing_gold_action(domain, task_id)):
            problems.append(f"tau2 domain {domain!r} task {task_id!r}: {failed}")
    return problems


@functools.cache
def _failing_gold_action(domain: str, task_id: str) -> str:
    """'' when the task's ground-truth actions all run from its start state (as tau2's
    `EnvironmentEvaluator` replays them); else what fails first. Cached: entry points check more than once."""
    task = get_task(domain, task_id)
    try:
        env = tau2_cache.InitialState.of(task).apply(make_environment(domain))  # as the cache's gold state
    except Exception as e:
        return f"its initial state fails to load ({_last_line(e)})"
    for action in task.evaluation_criteria.actions or []:
        try:
            env.make_tool_call(tool_name=action.name, requestor=action.requestor, **action.arguments)
        except Exception as e:
            return f"action {action.action_id!r} ({action.name}) fails when the ground truth is replayed " \
                   f"({_last_line(e)})"
    return ""


def _last_line(error: BaseException) -> str:
    return traceback.format_exception_only(error)[-1].strip()


def problems(modules: Sequence[str], domains: Iterable[str] | Mapping[str, Iterable[str | None]],
             split_names: Iterable[str | None] = (), solo_mode: bool = False, mix: bool = False) -> list[str]:
    """Whether a run can use these domains and splits, one sentence per problem: imports the modules (as
    every rollout worker does), then checks each domain is known, has the splits, runs in solo mode if
    asked, and (a domain from a module) that every task of those splits can be graded. `domains`: names
    sharing `split_names`, or each with its own splits; `mix`: they are `econfig.mix`'s."""
    try:
        load_modules(modules)
    except DomainError as e:
        return [str(e)]
    found = []
    per_domain = domains if isinstance(domains, Mapping) else dict.fromkeys(domains, tuple(split_names))
    for domain, names in per_domain.items():
        try:
            check_domain(domain, modules)
            found += _domain_problems(domain, [s for s in dict.fromkeys(names) if s], solo_mode, mix)
        except DomainError as e:  # unknown, or not a plain name
            found.append(str(e))
        except Exception as e:  # the domain's own code or data fails (a task file that does not parse...)
            found.append(f"tau2 domain {domain!r} fails to load its tasks, splits or tools ({_last_line(e)})")
    return found


def _domain_problems(domain: str, chosen: list[str], solo_mode: bool, mix: bool) -> list[str]:
    available = splits(domain)
    fix = f"; name its own in econfig.mix as {domain}@<train split>/<validation split>" if mix else ""
    found = [f"tau2 domain {domain!r} has no split {s!r} (available: {', '.join(sorted(available))}){fix}"
             for s in chosen if s not in available]
    solo = solo_problem(domain) if solo_mode else ""
    found += [solo] if solo else []
    if not is_builtin(domain):
        ids = dict.fromkeys(t for s in chosen if s in available for t in available[s])
        found += task_problems(domain, ids, solo_mode=solo_mode and not solo)
    return found


def evaluate(simulation: SimulationRun, task: Task, domain: str, solo_mode: bool,
             judge: tau2_judge.Judge | None = None) -> RewardInfo:
    """tau2's `evaluate_simulation` with every criterion (DB/env, actions, communicate, and on tau2
    1.0.x the NL assertions, whose verdicts come from `judge`; without one such a task raises `NoJudge`)."""
    check_domain(domain)
    if not tau2_judge.needs_judge(task):
        return _evaluate(simulation, task, domain, solo_mode)
    tau2_judge.install()
    with tau2_judge.judging(judge):
        return _evaluate(simulation, task, domain, solo_mode)


_stock_graded: set[str] = set()


def _evaluate(simulation: SimulationRun, task: Task, domain: str, solo_mode: bool) -> RewardInfo:
    if _cached(domain):
        return tau2_cache.evaluate_all(simulation, task, domain, solo_mode)
    start = time.perf_counter()
    reward = evaluate_simulation(simulation=simulation, task=task, evaluation_type=EvaluationType.ALL,
                                 solo_mode=solo_mode, domain=domain)
    if domain not in _stock_graded and not is_builtin(domain):
        _stock_graded.add(domain)
        logger.info("tau2 domain %s is graded by stock tau2 (the evaluator cache mirrors only %s): %.3f s "
                    "for its first episode", domain, ", ".join(BUILTIN_DOMAINS), time.perf_counter() - start)
    return reward
