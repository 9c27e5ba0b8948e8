"""The figures the results pages and the README show are the ones their raw sources hold.

Each measurement that a command writes as JSON (the learning run's `learn.json`, the group-fault
benchmark's `group_faults.json`, the sync-against-async benchmark's `async_learn.json`, the proxy-width
benchmark's `proxy_width.json`) is rendered again
here with the command's own table code, and every line of that rendering must appear in the pages that show
it: a figure edited by hand, or a rerun whose JSON was committed without its tables, fails here.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

from examples.tau2.cpu.learn import PolicyScore, SeedResult, table, task_table

ROOT = Path(__file__).resolve().parents[1]
LEARN = ROOT / "examples" / "tau2" / "docs" / "learn"


OWN_DOMAIN = LEARN / "library"
"""The learning run on the example domain of docs/own_domain.md."""


def learn_results(folder: Path = LEARN) -> list[SeedResult]:
    rows = json.loads((folder / "learn.json").read_text())
    return [SeedResult(**{**row, "before": PolicyScore(**row["before"]),
                          "after": PolicyScore(**row["after"])}) for row in rows]


def evaluation_trials(results: list[SeedResult]) -> int:
    return results[0].after.episodes // results[0].after.tasks  # every trial of every task was scored


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| seed |")
            and not line.startswith("| task")]


def test_learn_md_is_the_rendering_of_learn_json():
    results = learn_results()
    assert (LEARN / "learn.md").read_text().strip() == table(results, evaluation_trials(results)).strip()


def test_the_learning_results_page_shows_learn_json():
    results = learn_results()
    page = (LEARN / "README.md").read_text()
    start = page.index("## Result")
    result_section = page[start:page.index("\n## ", start)]
    for row in table_rows(table(results, evaluation_trials(results))):
        assert row in result_section, row
    for row in table_rows(task_table(results)):
        assert row.strip() in result_section, row


def test_the_own_domain_learning_results_are_the_rendering_of_their_learn_json():
    results = learn_results(OWN_DOMAIN)
    rendered = table(results, evaluation_trials(results))
    assert (OWN_DOMAIN / "learn.md").read_text().strip() == rendered.strip()
    page = (LEARN / "README.md").read_text()
    start = page.index("## Your own domain")
    section = page[start:page.index("\n## ", start)]
    for row in table_rows(rendered):
        assert row in section, row


def test_the_readme_quotes_the_learning_gains_of_learn_json():
    gains = [f"{r.gain:+.3f}" for r in learn_results()]
    readme = (ROOT / "README.md").read_text()
    assert f"{gains[0]}, {gains[1]} and {gains[2]} in 3 of 3 independent seeds" in readme


def test_the_group_fault_table_is_the_rendering_of_group_faults_json(monkeypatch):
    bench = load_bench("bench_group_faults", monkeypatch)
    cells = [bench.Cell(**c) for c in json.loads((ROOT / "bench" / "group_faults.json").read_text())]
    groups = cells[0].episodes // 8
    results = (ROOT / "bench" / "RESULTS.md").read_text()
    assert bench.table(cells, groups) in results


def test_the_proxy_width_table_is_the_rendering_of_proxy_width_json(monkeypatch):
    bench = load_bench("bench_proxy_width", monkeypatch)
    widths = [bench.Width(**w) for w in json.loads((ROOT / "bench" / "proxy_width.json").read_text())]
    assert bench.table(widths) in (ROOT / "bench" / "RESULTS.md").read_text()


def load_bench(name: str, monkeypatch):
    path = ROOT / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # its dataclass resolves annotations there
    spec.loader.exec_module(bench)
    return bench


def test_the_sync_against_async_table_is_the_rendering_of_async_learn_json(monkeypatch):
    bench = load_bench("bench_async_learn", monkeypatch)
    runs = [bench.Run(**r) for r in json.loads((ROOT / "bench" / "async_learn.json").read_text())]
    assert {r.mode for r in runs} == {"sync", "async"}, "the benchmark is the two modes side by side"
    assert bench.table(runs) in (ROOT / "bench" / "RESULTS.md").read_text()


def test_every_section_of_bench_results_that_is_named_exists():
    """A measured figure lives in bench/RESULTS.md once; other pages name its section, which must be there
    (a section renamed or a figure removed without its references fails here)."""
    headings = [line[3:].strip() for line in (ROOT / "bench" / "RESULTS.md").read_text().splitlines()
                if line.startswith("## ")]
    tracked = subprocess.run(["git", "ls-files", "*.md", "*.yaml", "*.py"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    reference = re.compile(r"RESULTS\.md(?:\]\([^)]*\))?,\s*[\"']([^\"']+)[\"']")
    named = {}
    for rel in tracked:
        text = " ".join((ROOT / rel).read_text(encoding="utf-8").replace("#", " ").split())
        for name in reference.findall(text):
            named.setdefault(name, rel)
    assert "Prefix-shared (tree) training on one H100" in named  # TRAINING.md's link to the H100 figures
    missing = {name: rel for name, rel in named.items() if not any(h.startswith(name) for h in headings)}
    assert not missing, missing
