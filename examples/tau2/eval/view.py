"""The trajectory browser: a static site over training dumps, evaluation output folders and τ² results files.

    python -m examples.tau2.eval.view runs/dumps runs/eval-a runs/eval-b/tau2_results/airline_results.json \\
        --out runs/view

Each argument is one source: a folder `econfig.dump_dir` wrote episode records to (episode/record.py), an
output folder of `eval.evaluate` (trials.jsonl and the dumps its records name), or a τ² `Results` JSON file
(tau2's own, or the ones `eval.tau2_results` writes). `SITE/index.html` opens from disk (file://) or over
HTTP: the pages are plain HTML, CSS and one script (view_site/), and the data are scripts that call a
global registration function, because browsers refuse `fetch()` of file:// URLs but run `<script src>`.
The index holds one short row per episode; each episode's record is its own file, loaded when it is
opened, and the messages' text for the search is one more file, loaded on the first search.
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import logging
import shutil
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from examples.tau2.episode.record import failed_checks
from examples.tau2.episode.task_check import SUCCESS_THRESHOLD
from examples.tau2.eval.metrics import TaskTrust, TrialRecord, final_trials
from examples.tau2.runtime.process import setup_runtime

logger = logging.getLogger("tau2_areal.view")

SITE_FILES = Path(__file__).with_name("view_site")
"""The page, its script and its style, copied into every site."""
MARKER = "<!-- tau2 trajectory browser -->"
"""In every index.html written here: a folder holding another index.html is never written over."""
LIMIT_TERMINATIONS = frozenset({"max_steps", "context_exceeded"})
"""Terminations that ran out of room (turns or context) rather than failing the task outright."""


STAT_FIELDS = ("wall_s", "agent_latency_s", "user_latency_s", "judge_latency_s", "eval_s", "num_agent_turns",
               "num_tool_calls", "num_invalid_tool_calls")
"""An episode record's figures that the episode page shows."""


class Outcome(StrEnum):
    """What the overview's outcome filter chooses among."""

    SUCCESS = "success"
    FAILURE = "failure"
    LIMIT = "context exceeded / max turns"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Column:
    """One column of the overview: a training step of a dump folder, an evaluation, a results file."""

    label: str
    title: str
    kind: str
    domain_modules: tuple[str, ...] = ()
    """The domain modules an evaluation loaded (its run.json): the split look-up loads them too."""
    trust: TaskTrust | None = None
    """Which of an evaluation's tasks pay for less than the job, as its run recorded them."""


@dataclass
class Episode:
    """One episode (or rejected trial), as the pages show it."""

    domain: str
    task_id: str
    termination: str
    tau2_reward: float | None
    messages: list[dict[str, Any]]
    raw: dict[str, Any]
    """The records the episode came from, as stored (the page's "raw JSON"): `dump` or `simulation`, and
    `trial` (an eval's trials.jsonl line). Their messages are `messages`, written once."""
    path: str
    trial: int | None = None
    seed: int | None = None
    reward: float | None = None
    rejection: str = ""
    rejection_detail: str = ""
    note: str = ""
    reward_info: dict[str, Any] | None = None
    failed: list[str] = field(default_factory=list)
    grade: dict[str, Any] | None = None
    """The dump's `grade` (`episode/record.py`): the turn that met each action and fact, the database
    difference."""
    stats: dict[str, float] = field(default_factory=dict)
    order: str = ""
    """Sorts a dump folder's episodes by when they ended (`--episodes-per-step`)."""
    step: int | None = None
    column: int = -1

    @property
    def outcome(self) -> Outcome:
        if self.rejection:
            return Outcome.REJECTED
        if self.tau2_reward is not None and self.tau2_reward >= SUCCESS_THRESHOLD:
            return Outcome.SUCCESS
        return Outcome.LIMIT if self.termination in LIMIT_TERMINATIONS else Outcome.FAILURE

    def page_json(self) -> dict[str, Any]:
        """The episode's data file: what the episode page and the compare page read."""
        return {
            "domain": self.domain, "task_id": self.task_id, "trial": self.trial, "seed": self.seed,
            "outcome": self.outcome.value, "termination": self.termination, "tau2_reward": self.tau2_reward,
            "reward": self.reward, "rejection": self.rejection, "rejection_detail": self.rejection_detail,
            "note": self.note, "failed": self.failed, "reward_info": self.reward_info, "stats": self.stats,
            "grade": self.grade,
            "messages": self.messages, "path": self.path,
            "raw": {k: {f: v for f, v in rec.items() if f != "messages"} for k, rec in self.raw.items()},
        }

    def search_text(self) -> str:
        """What the overview's text search looks in: the messages (tool calls and results included)."""
        parts = [self.rejection_detail, self.note]
        for m in self.messages:
            parts.append(str(m.get("content") or ""))
            for call in m.get("tool_calls") or []:
                parts.append(f"{call.get('name')} {json.dumps(call.get('arguments'), ensure_ascii=False)}")
        return " ".join(p for p in parts if p).lower()


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _is_results(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("simulations"), list) and "info" in data


def _is_dump(data: Any) -> bool:
    return isinstance(data, dict) and "tau2_reward" in data and isinstance(data.get("messages"), list)


def episode_from_dump(dump: dict[str, Any], path: Path) -> Episode:
    """An episode record of `episode/record.py` (τ²'s reward info in `tau2_run`, when the dump has it)."""
    run = dump.get("tau2_run") or {}
    info = run.get("reward_info")
    ep = Episode(
        domain=str(dump["domain"]), task_id=str(dump["task_id"]),
        termination=str(dump.get("termination", "")), tau2_reward=_float(dump["tau2_reward"]),
        reward=_float(dump.get("reward")), messages=dump["messages"],
        raw={"dump": dump}, path=str(path), seed=run.get("seed"), note=str(dump.get("note") or ""),
        reward_info=info, step=dump.get("step") if isinstance(dump.get("step"), int) else None,
        order=str(run.get("end_time") or path.name),
        stats={k: dump[k] for k in STAT_FIELDS if isinstance(dump.get(k), int | float)},
        grade=dump.get("grade") or None,
    )
    if ep.outcome is not Outcome.SUCCESS and info:
        ep.failed = failed_checks(info)
    return ep


def episode_from_simulation(sim: dict[str, Any], domain: str, path: Path) -> Episode:
    """A `SimulationRun` of a τ² results file."""
    info = sim.get("reward_info")
    ep = Episode(
        domain=str(domain), task_id=str(sim["task_id"]), termination=str(sim.get("termination_reason") or ""),
        tau2_reward=_float((info or {}).get("reward")), messages=sim.get("messages") or [],
        raw={"simulation": sim}, path=str(path), trial=sim.get("trial"), seed=sim.get("seed"),
        reward_info=info,
        stats={"wall_s": sim["duration"]} if isinstance(sim.get("duration"), int | float) else {},
    )
    if ep.outcome is not Outcome.SUCCESS and info:
        ep.failed = failed_checks(info)
    return ep


def load_results_file(path: Path, data: dict[str, Any]) -> tuple[Column, list[Episode]]:
    info = data.get("info") or {}
    domain = (info.get("environment_info") or {}).get("domain_name") or path.stem.removesuffix("_results")
    agent_info = info.get("agent_info") or {}
    agent = agent_info.get("llm") or agent_info.get("implementation")
    column = Column(label=path.stem, title=f"τ² results {path} (agent {agent})", kind="tau2")
    return column, [episode_from_simulation(s, domain, path) for s in data["simulations"]]


def _dump_of(record: dict[str, Any], folder: Path) -> Path | None:
    """The record's dump: where it says, or at the same place under this folder (a moved folder)."""
    if not record.get("dump_path"):
        return None
    named = Path(record["dump_path"])
    if named.is_file():
        return named
    parts = named.parts
    if "dumps" in parts:
        moved = folder.joinpath(*parts[len(parts) - parts[::-1].index("dumps") - 1:])
        if moved.is_file():
            return moved
    return None


def load_eval_folder(folder: Path) -> tuple[Column, list[Episode]]:
    """An `eval.evaluate` output folder: each trial's final record (a rejection retried later counts once,
    as in the run's metrics), with its dump when it has one."""
    from examples.tau2.eval.evaluate import RUN_FILE, TRIALS_FILE, TRUST_KEY

    lines = (folder / TRIALS_FILE).read_text(encoding="utf-8").splitlines()
    records = [TrialRecord.from_json(json.loads(line)) for line in lines if line.strip()]
    run = {}
    if (folder / RUN_FILE).is_file():
        run = json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))
    settings = run.get("settings") or {}
    column = Column(label=folder.name, kind="eval",
                    title=f"evaluation {folder}: policy {settings.get('policy_model', '?')}, "
                          f"split {settings.get('split', '?')}, {settings.get('trials', '?')} trials",
                    domain_modules=tuple((settings.get("episode") or {}).get("domain_modules") or ()),
                    trust=TaskTrust.from_json(run[TRUST_KEY]) if TRUST_KEY in run else None)
    episodes = []
    for record in sorted(final_trials(records).values(), key=lambda r: r.key):
        dump_path = _dump_of(record.to_json(), folder)
        if record.scored and dump_path:
            ep = episode_from_dump(json.loads(dump_path.read_text(encoding="utf-8")), dump_path)
        else:
            ep = Episode(domain=record.domain, task_id=record.task_id, termination=record.termination,
                         tau2_reward=record.tau2_reward, reward=record.reward, messages=[], raw={},
                         path=str(folder / TRIALS_FILE), rejection=record.rejection,
                         rejection_detail=record.rejection_detail, note=record.note,
                         stats={"wall_s": record.wall_s})
        ep.trial, ep.seed, ep.raw["trial"] = record.trial, record.seed, record.to_json()
        ep.failed = list(record.failed_checks) or ep.failed
        if ep.rejection:
            ep.termination = f"rejected: {ep.rejection}"
        episodes.append(ep)
    return column, episodes


def _json_files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*.json")):
        parts = path.relative_to(folder).parts
        if not any(part.endswith(".superseded") or part.startswith(".") for part in parts):
            yield path


def load_folder(folder: Path, episodes_per_step: int) -> list[tuple[Column, list[Episode]]]:
    """A dump folder (and any τ² results files in it). Its episodes go to one column per training step:
    the record's `step` when it has one, else `episodes_per_step` at a time in the order they ended,
    else one column for the whole folder."""
    dumps: list[Episode] = []
    out = []
    for path in _json_files(folder):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            logger.warning("skipped %s: %s", path, e)
            continue
        if _is_dump(data):
            dumps.append(episode_from_dump(data, path))
        elif _is_results(data):
            out.append(load_results_file(path, data))
    if all(ep.step is not None for ep in dumps) and dumps:
        steps: dict[int | None, list[Episode]] = {}
        for ep in dumps:
            steps.setdefault(ep.step, []).append(ep)
    elif episodes_per_step > 0:
        ordered = sorted(dumps, key=lambda e: (e.order, e.path))
        steps = {i + 1: ordered[i * episodes_per_step:(i + 1) * episodes_per_step]
                 for i in range(-(-len(ordered) // episodes_per_step))}
    else:
        steps = {None: dumps} if dumps else {}
    columns = [(Column(label=folder.name if step is None else f"{folder.name} step {step}", kind="dumps",
                       title=f"episode dumps {folder}" + ("" if step is None else f", step {step}")), eps)
               for step, eps in sorted(steps.items(), key=lambda item: item[0] or 0)]
    return columns + out


def load_source(path: Path, episodes_per_step: int = 0) -> list[tuple[Column, list[Episode]]]:
    """One command-line argument's columns and their episodes."""
    from examples.tau2.eval.evaluate import TRIALS_FILE

    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
        if _is_results(data):
            return [load_results_file(path, data)]
        if _is_dump(data):
            return [(Column(label=path.stem, title=f"episode dump {path}", kind="dumps"),
                     [episode_from_dump(data, path)])]
        raise ValueError(f"{path} is neither a τ² results file nor an episode dump")
    if not path.is_dir():
        raise ValueError(f"{path} does not exist")
    if (path / TRIALS_FILE).is_file():
        return [load_eval_folder(path)]
    columns = load_folder(path, episodes_per_step)
    if not columns:
        raise ValueError(f"{path} holds no episode dump, trials.jsonl or τ² results file")
    return columns


def task_splits(domains: Iterable[str], modules: Iterable[str] = ()) -> dict[tuple[str, str], list[str]]:
    """(domain, task id) -> the τ² splits the task is in, for the domains τ² knows here, with the domain
    modules named loaded (others: none, so no split to filter on)."""
    from examples.tau2.episode import domain as tau2_domain

    for module in modules:
        try:
            tau2_domain.load_modules([module])
        except Exception as e:  # moved or renamed since the run: its domain's tasks go without splits
            logger.info("domain module %r not loaded: %s", module, e)
    out: dict[tuple[str, str], list[str]] = {}
    for domain in domains:
        try:
            splits = tau2_domain.splits(domain)
        except Exception as e:  # a domain of a module not loaded here
            logger.info("no splits for domain %r: %s", domain, e)
            continue
        for split, ids in splits.items():
            for task_id in ids:
                out.setdefault((domain, str(task_id)), []).append(split)
    return out


def task_pays(tasks: Sequence[tuple[str, str]], columns: Sequence[Column]) -> dict[tuple[str, str], str]:
    """(domain, task id) -> "nothing" (a do-nothing agent passes it), "partial" (so does one that skips the
    last write) or "" (it pays only for the job done): as the first evaluation showing the task recorded
    it, else as `tau2_rl.sh check-tasks` finds it under the installed τ² release (the domain modules the
    split look-up loaded). A domain that cannot be checked here has no entry."""
    from examples.tau2.eval.evaluate import task_trust

    out: dict[tuple[str, str], str] = {}
    checked: dict[str, TaskTrust | None] = {}
    for domain, task_id in tasks:
        trust = next((c.trust for c in columns if c.trust is not None and domain in c.trust.rewards_nothing),
                     None)
        if trust is None and domain not in checked:
            try:
                checked[domain] = task_trust({domain: [t for d, t in tasks if d == domain]})
            except Exception as e:  # a domain of a module not loaded here
                logger.info("no task check for domain %r: %s", domain, e)
                checked[domain] = None
        trust = trust or checked.get(domain)
        if trust is not None:
            out[(domain, task_id)] = ("nothing" if trust.free(domain, task_id) else
                                      "" if trust.trusted(domain, task_id) else "partial")
    return out


def _script(call: str, *args: Any) -> str:
    """A data file: one call of the page's registration function (view.js), which works from file://."""
    text = ",".join(json.dumps(a, ensure_ascii=False, separators=(",", ":")) for a in args)
    return f"tau2View.{call}({text});\n"


def _writable(out: Path) -> None:
    index = out / "index.html"
    if out.exists() and any(out.iterdir()) and not (index.is_file() and MARKER in index.read_text()):
        raise ValueError(f"{out} is not empty and holds no site of this browser: choose another --out")


def build_site(sources: Sequence[Path], out: Path, episodes_per_step: int = 0, title: str = "",
               splits: bool = True) -> dict[str, int]:
    """Write the site; returns its counts (episodes, tasks, columns, bytes of the index)."""
    _writable(out)
    columns: list[Column] = []
    episodes: list[Episode] = []
    for source in sources:
        for column, eps in load_source(source, episodes_per_step):
            for ep in eps:
                ep.column = len(columns)
            columns.append(column)
            episodes += eps
    tasks = sorted({(ep.domain, ep.task_id) for ep in episodes},
                   key=lambda t: (t[0], (0, int(t[1]), "") if t[1].isdigit() else (1, 0, t[1])))
    task_index = {t: i for i, t in enumerate(tasks)}
    modules = sorted({m for c in columns for m in c.domain_modules})
    split_of = task_splits(sorted({d for d, _ in tasks}), modules) if splits else {}
    pays = task_pays(tasks, columns) if splits else {}
    terminations = sorted({ep.termination for ep in episodes})
    termination_index = {t: i for i, t in enumerate(terminations)}
    outcomes = [o.value for o in Outcome]

    shutil.rmtree(out / "data", ignore_errors=True)  # a previous build's episodes
    (out / "data").mkdir(parents=True)
    for i, ep in enumerate(episodes):
        (out / "data" / f"ep-{i}.js").write_text(_script("episode", i, ep.page_json()), encoding="utf-8")
    (out / "data" / "search.js").write_text(_script("search", [ep.search_text() for ep in episodes]),
                                            encoding="utf-8")
    index = {
        "title": title or "τ² episodes: " + ", ".join(s.name for s in sources),
        "built": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "columns": [{"label": c.label, "title": c.title, "kind": c.kind} for c in columns],
        "tasks": [{"domain": d, "task_id": t, "splits": split_of.get((d, t), []), "pays": pays.get((d, t))}
                  for d, t in tasks],
        "terminations": terminations, "outcomes": outcomes,
        "episodes": {
            "task": [task_index[(ep.domain, ep.task_id)] for ep in episodes],
            "column": [ep.column for ep in episodes],
            "outcome": [outcomes.index(ep.outcome.value) for ep in episodes],
            "termination": [termination_index[ep.termination] for ep in episodes],
            "trial": [ep.trial for ep in episodes],
            "reward": [None if ep.tau2_reward is None else round(ep.tau2_reward, 4) for ep in episodes],
        },
    }
    index_js = _script("index", index)
    (out / "data" / "index.js").write_text(index_js, encoding="utf-8")
    for name in ("view.js", "view.css"):
        shutil.copyfile(SITE_FILES / name, out / name)
    page = (SITE_FILES / "index.html").read_text(encoding="utf-8")
    (out / "index.html").write_text(page.replace("{{title}}", html.escape(index["title"]))
                                    .replace("{{marker}}", MARKER), encoding="utf-8")
    return {"episodes": len(episodes), "tasks": len(tasks), "columns": len(columns),
            "index_bytes": len(index_js.encode())}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m examples.tau2.eval.view",
        description="Build a static site to browse τ² episodes in (open SITE/index.html from disk).")
    parser.add_argument("sources", nargs="+", type=Path, metavar="DIR",
                        help="an episode dump folder (econfig.dump_dir), an eval output folder, or a τ² "
                             "results JSON file")
    parser.add_argument("--out", type=Path, default=Path("tau2-view"),
                        help="the site's folder (default: %(default)s)")
    parser.add_argument("--episodes-per-step", type=int, default=0, metavar="N",
                        help="a dump folder whose records name no step: N episodes per training step, in the "
                             "order they ended (the step's batch size times the group size); default: one "
                             "column for the folder")
    parser.add_argument("--title", default="", help="the pages' title")
    parser.add_argument("--no-splits", action="store_true",
                        help="do not ask τ² which split each task is in (no split filter) nor which tasks "
                             "pay for doing nothing (no trusted pass^k)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = build_parser().parse_args(argv)
    setup_runtime()  # before τ² is imported (the split look-up): its import-time logging quietened
    try:
        counts = build_site(args.sources, args.out, args.episodes_per_step, args.title, not args.no_splits)
    except ValueError as e:
        print(f"view: {e}", file=sys.stderr)
        return 2
    columns = f"{counts['columns']} column" + ("s" if counts["columns"] != 1 else "")
    print(f"wrote {counts['episodes']} episodes of {counts['tasks']} tasks in {columns}: "
          f"{(args.out / 'index.html').resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
