"""`tau2_rl.sh check-tasks`: which tasks of a domain a reward can be trusted on (episode/task_check.py says
how each task is checked), as `check_tasks.json` and `check_tasks.md`; exits 1 when the ground truth of some
task does not score 1.0.

    bash examples/tau2/tau2_rl.sh check-tasks --domains airline --output-dir out/check
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from examples.tau2.episode.task_check import TABLE, Flag, TaskCheck, check_domain_tasks
from examples.tau2.runtime.files import write_atomic

logger = logging.getLogger("tau2_areal.check_tasks")

JSON_FILE = "check_tasks.json"
MARKDOWN_FILE = "check_tasks.md"


# ---------------------------------------------------------------------------------------------
# Reports


def summary(checks: Sequence[TaskCheck]) -> list[str]:
    """One line per domain, then one per flag found: counts and, for the few, the task ids."""
    lines = []
    by_domain: dict[str, list[TaskCheck]] = defaultdict(list)
    for c in checks:
        by_domain[c.domain].append(c)
    for domain, own in by_domain.items():
        sound = sum(not c.oracle_problems for c in own)
        lines.append(f"{domain}: {len(own)} tasks; the oracle scores 1.0 on {sound}")
        for flag in Flag:
            ids = [c.task_id for c in own if flag.value in c.flags]
            if ids:
                shown = ", ".join(ids[:8]) + (f", ... ({len(ids) - 8} more)" if len(ids) > 8 else "")
                lines.append(f"  {flag.value}: {len(ids)} ({shown})")
    return lines


def oracle_failures(checks: Iterable[TaskCheck]) -> list[str]:
    return [f"{c.domain} task {c.task_id!r} ({c.oracle_reward:.3f}): {'; '.join(c.oracle_problems)}"
            for c in checks if c.oracle_problems]


def split_counts(checks: Sequence[TaskCheck]) -> list[str]:
    """A markdown table: per domain and split, its tasks, sound oracles and each flag's count."""
    counts: dict[tuple[str, str], list[TaskCheck]] = defaultdict(list)
    for c in checks:
        for split in c.split.split("+"):
            counts[(c.domain, split)].append(c)
    rows = ["| domain | split | tasks | oracle 1.0 | " + " | ".join(f.value for f in Flag) + " |",
            "|---|---|---|---|" + "---|" * len(Flag)]
    for (domain, split), own in counts.items():
        flags = " | ".join(str(sum(f.value in c.flags for c in own)) for f in Flag)
        sound = sum(not c.oracle_problems for c in own)
        rows.append(f"| {domain} | {split} | {len(own)} | {sound} | {flags} |")
    return rows


def markdown(checks: Sequence[TaskCheck], release: str) -> str:
    def reward(r: float | None) -> str:
        return "" if r is None else f"{r:.3f}"

    rows = ["| domain | task | split | oracle | nothing | partial | flags |", "|---|---|---|---|---|---|---|"]
    rows += [f"| {c.domain} | `{c.task_id}` | {c.split} | {reward(c.oracle_reward)} "
             f"| {reward(c.nothing_reward)} | {reward(c.partial_reward)} | {', '.join(c.flags)} |"
             for c in checks]
    failures = oracle_failures(checks)
    return "\n".join([f"# Task check ({release})", "", "## Counts per split", "", *split_counts(checks), "",
                      "## Summary", "", *[f"    {line}" for line in summary(checks)], "",
                      *(["## The oracle fails", "", *[f"- {f}" for f in failures], ""] if failures else []),
                      "## Tasks", "", *rows]) + "\n"


def write_table(table: Path, release: str, checks: Sequence[TaskCheck]) -> None:
    """Merge this release's flags of the checked domains into `table`: release -> domain -> flag -> ids."""
    data = json.loads(table.read_text()) if table.is_file() else {}
    data["command"] = ("bash examples/tau2/tau2_rl.sh check-tasks --domains mock airline retail telecom "
                       f"--output-dir DIR --table {TABLE.relative_to(TABLE.parents[3])} [--tau2 SOURCE]")
    per_release = data.setdefault("releases", {}).setdefault(release, {})
    for domain in dict.fromkeys(c.domain for c in checks):
        own = [c for c in checks if c.domain == domain]
        per_release[domain] = {f.value: ids for f in Flag
                               if (ids := [c.task_id for c in own if f.value in c.flags])}
    write_atomic(table, json.dumps(data, indent=1, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tau2_rl.sh check-tasks", description=__doc__.split("\n\n")[0])
    p.add_argument("--domains", nargs="+", metavar="NAME",
                   help="domains to check (default: those of --domain-modules, else airline retail telecom)")
    p.add_argument("--domain-modules", nargs="+", default=[], metavar="MOD",
                   help="modules that register own τ²-format domains (importable, e.g. via PYTHONPATH)")
    p.add_argument("--split", help="only this split of each domain (default: every split)")
    p.add_argument("--output-dir", type=Path, required=True, help=f"where {JSON_FILE} and {MARKDOWN_FILE} go")
    p.add_argument("--tau2", type=Path, metavar="SOURCE",
                   help="check under this tau2-bench source tree or .tar.gz instead of the installed τ² "
                        "(run in a child process)")
    p.add_argument("--table", type=Path, metavar="FILE",
                   help=f"also merge the flags into this table (the built-in one: {TABLE.name})")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.tau2 is not None:
        from examples.tau2.releases.upstream import REPO, overlay_env, source_tree

        rest = list(sys.argv[1:] if argv is None else argv)
        i = rest.index("--tau2") if "--tau2" in rest else None
        rest = rest[:i] + rest[i + 2:] if i is not None else [a for a in rest if not a.startswith("--tau2=")]
        env = overlay_env(source_tree(args.tau2.resolve()))
        env["PYTHONPATH"] = f"{REPO}:{env['PYTHONPATH']}"
        child = [sys.executable, "-m", "examples.tau2.eval.check_tasks", *rest]
        return subprocess.run(child, env=env).returncode
    from examples.tau2.runtime.console import console_logging
    from examples.tau2.runtime.process import setup_runtime

    setup_runtime("ERROR")
    console_logging(logger)
    from examples.tau2.compat.tau2_release import installed_release
    from examples.tau2.episode import domain as tau2_domain

    try:
        modules = tau2_domain.load_modules(args.domain_modules)
        domains = args.domains or [d for m in modules for d in m.domains] or ["airline", "retail", "telecom"]
        for d in domains:
            tau2_domain.check_domain(d, args.domain_modules)
            if args.split:
                tau2_domain.task_ids(d, args.split)
    except tau2_domain.DomainError as e:
        print(f"check-tasks: {e}", file=sys.stderr)
        return 2
    release = installed_release().label
    checks = [c for d in domains for c in check_domain_tasks(d, args.split)]
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(args.output_dir / JSON_FILE, json.dumps(
        {"release": release, "tasks": [dataclasses.asdict(c) for c in checks]}, indent=1) + "\n")
    write_atomic(args.output_dir / MARKDOWN_FILE, markdown(checks, release))
    if args.table is not None:
        write_table(args.table, release, checks)
    print(f"check-tasks ({release}):")
    print("\n".join(summary(checks)))
    print(f"written: {args.output_dir / JSON_FILE}, {args.output_dir / MARKDOWN_FILE}")
    if failures := oracle_failures(checks):
        print(f"the oracle (each task's ground truth) is not a sound 1.0 on {len(failures)} task(s):",
              file=sys.stderr)
        for line in failures:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
