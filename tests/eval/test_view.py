"""The trajectory browser (eval.view) in a real browser: Debian's `chromium`, driven by Playwright, opens the
site from file:// (and once over HTTP), on a real evaluation against the scripted endpoint (`route:`
policies decide which trials pass, fail or are rejected), its episode dumps read as a training run's, and
τ²'s own results file.

scripts/test.sh installs `chromium` as root. Without it the tests fail when CI=true, else skip and say so.
With TAU2_VIEW_SCREENSHOTS=DIR they also leave the three pages' screenshots there (docs/view.md's).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.tau2.eval.evaluate import main as eval_main
from examples.tau2.eval.view import MARKER, Episode, Outcome, build_site, main

CHROMIUM = Path("/usr/bin/chromium")
TASKS = ["create_task_1", "impossible_task_1", "update_task_1"]
# create_task_1 passes both trials; update_task_1 passes trial 0 and does nothing in trial 1 (its database
# check fails); impossible_task_1 answers nothing in trial 0 (invalid output) and is rejected in trial 1.
POLICY = ("route:create_task_1.*=oracle;update_task_1.0=oracle;update_task_1.1=noop;"
          "impossible_task_1.1=error500")
NOOP_REPLY = "cannot help with that"


def _browser_missing() -> str:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (requirements/cpu.lock pins it)"
    if not CHROMIUM.is_file():
        return f"{CHROMIUM} is missing: Debian's chromium package (scripts/test.sh installs it as root)"
    return ""


@pytest.fixture(scope="module")
def browser(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Chromium, started after the evaluation: Playwright's driver keeps an event loop running in this
    thread, where the evaluation's `asyncio.run` would then refuse to start."""
    missing = _browser_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the trajectory browser's tests need a browser: {missing}")
        pytest.skip(missing)
    request.getfixturevalue("eval_run")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM),
                                    args=["--no-sandbox"] if os.geteuid() == 0 else [])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def eval_run(endpoint_server, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("view") / "eval-a"
    args = ["--policy-base-url", endpoint_server.url, "--policy-model", POLICY, "--output-dir", str(out),
            "--user-base-url", endpoint_server.url, "--user-model", "user", "--llm-retries", "1",
            "--retry-backoff-s", "0.01", "--request-timeout-s", "20", "--concurrency", "4",
            "--domains", "mock", "--split", "all", "--task-ids", *TASKS, "--trials", "2"]
    assert eval_main(args) == 0
    return out


@pytest.fixture(scope="module")
def site(eval_run: Path) -> Path:
    """The eval folder, its dumps as a training run's (3 episodes a step: 2 steps) and τ²'s results file."""
    out = eval_run.parent / "site"
    counts = build_site([eval_run, eval_run / "dumps", eval_run / "tau2_results" / "mock_results.json"], out,
                        episodes_per_step=3)
    # 6 trials (one rejected) + their 5 dumps + 5 simulations in τ²'s file
    assert counts == {"episodes": 16, "tasks": 3, "columns": 4, "index_bytes": counts["index_bytes"]}
    return out


@pytest.fixture
def page(browser: Any, site: Path) -> Iterator[Any]:
    """A page of the site opened from disk; any request that is not a file of the site fails the test."""
    context = browser.new_context(viewport={"width": 1100, "height": 640})
    page = context.new_page()
    foreign: list[str] = []
    errors: list[str] = []
    own = (f"file://{site}/", "blob:")
    page.on("request", lambda r: None if r.url.startswith(own) else foreign.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"file://{site}/index.html")
    page.wait_for_selector("#overview tbody tr")
    yield page
    context.close()
    assert foreign == [] and errors == []


def go(page: Any, fragment: str, name: str) -> None:
    """Open a page of the site by its address and wait until it is drawn."""
    page.evaluate("f => { tau2View.last = null; location.hash = f; }", fragment)
    page.wait_for_function("p => tau2View.last && tau2View.last.page === p", arg=name)


def rows(page: Any) -> list[str]:
    return page.eval_on_selector_all("#overview tbody th.name a", "els => els.map(e => e.textContent)")


def shoot(page: Any, name: str) -> None:
    target = os.environ.get("TAU2_VIEW_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(target) / name))


def episode_scripts(page: Any) -> list[str]:
    return page.eval_on_selector_all('script[src^="data/ep-"]', "els => els.map(e => e.getAttribute('src'))")


@pytest.mark.slow
def test_the_overview_lists_every_task_with_a_column_per_source_and_step(page):
    assert rows(page) == [f"mock/{t}" for t in TASKS]
    heads = page.eval_on_selector_all("#overview thead th", "els => els.map(e => e.textContent)")
    assert heads == ["task", "eval-a", "dumps step 1", "dumps step 2", "mock_results"]
    cells = page.eval_on_selector_all("#overview tbody tr", "trs => trs.map(tr => tr.cells[1].textContent)")
    assert cells == ["2/2", "0/1 +1✕", "1/2"]  # the rejected trial counts apart
    totals = page.eval_on_selector_all("tr.totals td", "tds => tds.map(td => td.textContent)")
    # eval-a: pass^1 = (1 + 0 + 1/2) / 3; pass^2 over the 2 tasks with 2 scored trials = (1 + 0) / 2
    assert totals[0] == "pass^1 0.500pass^2 0.500" and totals[3] == totals[0]
    assert episode_scripts(page) == []  # the index alone: no episode's data yet
    shoot(page, "overview.png")


@pytest.mark.slow
def test_filters_narrow_the_overview(page):
    page.select_option("select[name=outcome]", "rejected")
    page.wait_for_function("() => document.querySelectorAll('#overview tbody tr').length === 1")
    assert rows(page) == ["mock/impossible_task_1"]
    assert "outcome=rejected" in page.url  # the filters travel in the address
    page.select_option("select[name=outcome]", "")
    page.select_option("select[name=termination]", "user_stop")
    page.wait_for_function("() => document.querySelectorAll('#overview tbody tr').length === 2")
    assert rows(page) == ["mock/create_task_1", "mock/update_task_1"]
    page.select_option("select[name=termination]", "")
    assert not page.eval_on_selector_all('script[src="data/search.js"]', "els => els.length")
    page.fill("input[name=q]", NOOP_REPLY.upper())  # the search ignores case
    page.wait_for_function("() => document.querySelectorAll('#overview tbody tr').length === 1")
    assert rows(page) == ["mock/update_task_1"]
    page.fill("input[name=q]", "no such words anywhere")
    page.wait_for_function("() => document.querySelectorAll('#overview tbody tr').length === 0")


@pytest.mark.slow
def test_an_episode_shows_its_conversation_and_the_criterion_it_failed(page, eval_run):
    go(page, "#/task/2", "task")  # mock/update_task_1
    failing = page.locator("tr.ep", has_text="failure").filter(has_text="eval-a")
    failing.locator("a").click()
    page.wait_for_selector(".timeline .msg")
    assert page.inner_text(".grade .oc") == "failure"
    assert page.eval_on_selector_all(".grade ul.failed li", "els => els.map(e => e.textContent)") == [
        "DB: db_match false (the end state differs from the ground truth's)"]
    assert "✗ end state differs" in page.inner_text(".grade .db.unmet")
    diff = page.eval_on_selector_all("table.dbdiff tr", "trs => trs.map(tr => tr.innerText.split('\\t'))")
    assert diff[1:] == [["tasks", "task_1", "status", '"pending"', '"completed"']], diff  # the dump's grade
    assert "✗ update_task_status(" in page.inner_text(".grade ul.checks")  # the action it never took
    assert NOOP_REPLY in page.inner_text(".timeline")
    assert len(episode_scripts(page)) == 1  # only the opened episode's data file was loaded
    raw = page.get_attribute("#raw", "href")
    dump = json.loads(page.evaluate("u => fetch(u).then(r => r.text())", raw))["dump"]
    recorded = [json.loads(line) for line in (eval_run / "trials.jsonl").read_text().splitlines()]
    noop = next(r for r in recorded if r["task_id"] == "update_task_1" and r["trial"] == 1)
    assert dump == json.loads(Path(noop["dump_path"]).read_text())  # the raw JSON is the dump as stored
    shoot(page, "episode.png")


@pytest.mark.slow
def test_an_episode_with_tool_calls_shows_them_and_their_results(page):
    go(page, "#/task/0", "task")  # mock/create_task_1, oracle: one tool call
    page.locator("tr.ep", has_text="success").first.locator("a").click()
    page.wait_for_selector(".timeline .msg.tool")
    assert page.inner_text(".timeline .call .fn") == "create_task"
    assert '"title": "Important Meeting"' in page.inner_text(".timeline .msg.tool pre")  # pretty-printed
    assert page.eval_on_selector_all(".grade ul.failed", "els => els.length") == 0


def _same(a: dict, b: dict) -> bool:
    calls = [[(c["name"], c["arguments"]) for c in m.get("tool_calls") or []] for m in (a, b)]
    return (a["role"], a.get("content") or "", calls[0]) == (b["role"], b.get("content") or "", calls[1])


@pytest.mark.slow
def test_compare_marks_the_first_differing_turn(page, eval_run):
    go(page, "#/task/2", "task")
    ids = page.eval_on_selector_all("tr.ep", "trs => trs.filter(t => t.cells[1].textContent === 'eval-a')"
                                             ".map(t => Number(t.dataset.ep))")
    assert len(ids) == 2
    go(page, f"#/cmp/{ids[0]}/{ids[1]}", "compare")
    first = page.get_attribute("#compare tr.first-diff", "data-turn")
    dumps = {r["trial"]: json.loads(Path(r["dump_path"]).read_text())["messages"]
             for r in map(json.loads, (eval_run / "trials.jsonl").read_text().splitlines())
             if r["task_id"] == "update_task_1"}
    expected = next(i for i, (a, b) in enumerate(zip(dumps[0], dumps[1], strict=False)) if not _same(a, b))
    assert first == str(expected) and expected > 0
    same = page.eval_on_selector_all(
        "#compare tbody tr", "trs => trs.filter(t => t.classList.contains('same')).map(t => t.dataset.turn)")
    assert same == [str(i) for i in range(expected)]
    assert f"differ first at turn {expected}" in page.inner_text("#firstdiff")
    shoot(page, "compare.png")


@pytest.mark.slow
def test_keyboard_navigation(page):
    selected = "() => document.querySelector('tr.sel').dataset"
    page.keyboard.press("j")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("k")
    assert page.evaluate(selected)["task"] == "1"
    page.keyboard.press("Enter")
    page.wait_for_function("() => tau2View.last.page === 'task'")
    assert page.url.endswith("#/task/1")
    first = page.evaluate(selected)["ep"]
    page.keyboard.press("Enter")
    page.wait_for_selector(".grade")
    assert page.url.endswith(f"#/ep/{first}")
    page.keyboard.press("j")  # the next episode of the task
    page.wait_for_function("f => !location.hash.endsWith('/' + f)", arg=first)
    page.wait_for_selector(".grade")
    page.keyboard.press("k")
    page.wait_for_function("f => location.hash.endsWith('/ep/' + f)", arg=first)
    page.wait_for_selector(".grade")
    page.keyboard.press("u")
    page.wait_for_function("() => tau2View.last.page === 'task'")
    page.keyboard.press("x")  # mark two: the compare page opens
    page.keyboard.press("j")
    page.keyboard.press("x")
    page.wait_for_selector("#compare")
    assert "#/cmp/" in page.url
    page.keyboard.press("Escape")
    page.wait_for_function("() => tau2View.last.page === 'task'")
    page.keyboard.press("Escape")
    page.wait_for_function("() => tau2View.last.page === 'overview'")
    assert page.evaluate(selected)["task"] == "1"  # back on the row it left from
    page.keyboard.press("/")
    assert page.evaluate("() => document.activeElement.name") == "q"


def test_outcomes_come_from_the_records_termination_and_rejection():
    def ep(**kw: Any) -> Episode:
        return Episode(**{"domain": "d", "task_id": "t", "termination": "agent_stop", "tau2_reward": 0.0,
                          "messages": [], "raw": {}, "path": "", **kw})

    assert ep(tau2_reward=1.0).outcome is Outcome.SUCCESS
    assert ep().outcome is Outcome.FAILURE
    assert ep(termination="context_exceeded").outcome is Outcome.LIMIT
    assert ep(termination="max_steps").outcome is Outcome.LIMIT
    assert ep(tau2_reward=None, rejection="user_endpoint").outcome is Outcome.REJECTED


def test_the_command_refuses_a_folder_it_did_not_write_and_rewrites_its_own(eval_run, tmp_path, capsys):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main([str(eval_run), "--out", str(foreign), "--no-splits"]) == 2
    assert "holds no site of this browser" in capsys.readouterr().err
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    ours = tmp_path / "ours"
    assert main([str(eval_run / "tau2_results" / "mock_results.json"), "--out", str(ours)]) == 0
    assert MARKER in (ours / "index.html").read_text()
    assert main([str(eval_run), "--out", str(ours), "--no-splits"]) == 0  # rebuilt, old episodes gone
    assert len(list((ours / "data").glob("ep-*.js"))) == 6
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    shutil.rmtree(ours)


@pytest.mark.slow
def test_the_site_served_over_http_works_as_from_disk(browser, site):
    """The same site from a plain static HTTP server on 127.0.0.1 (`python -m http.server`): the overview
    and an episode draw, and every request stays on that server."""
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(site)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "the HTTP server did not start"
                time.sleep(0.1)
        context = browser.new_context()
        page = context.new_page()
        foreign: list[str] = []
        errors: list[str] = []
        page.on("request", lambda r: None if r.url.startswith(f"http://127.0.0.1:{port}/") else
                foreign.append(r.url))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"http://127.0.0.1:{port}/index.html")
        page.wait_for_selector("#overview tbody tr")
        assert rows(page) == [f"mock/{t}" for t in TASKS]
        go(page, "#/task/2", "task")
        page.locator("tr.ep", has_text="failure").filter(has_text="eval-a").locator("a").click()
        page.wait_for_selector(".timeline .msg")
        assert "DB: db_match false" in page.inner_text(".grade ul.failed")
        context.close()
        assert foreign == [] and errors == []
    finally:
        server.kill()
        server.wait()
