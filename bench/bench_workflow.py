"""Episodes in flight: how close `Tau2AgentWorkflow` comes to the limit at 32, 256 and 1,024 at once.

A scripted OpenAI-compatible endpoint runs in its own process and answers every policy and user-simulator
request after a fixed latency (1.5 s: about one turn of a loaded GPU server), so the figures are this
process's: tau2's orchestrator, the HTTP clients and the evaluator. `max_concurrent_episodes` is set to
the width, so every episode starts at once.

The ideal: a batch started at once ends no sooner than its longest episode run alone, nor sooner than its
CPU over the cores (each task once at a low width gives both). Every reward must equal the task's reward
at the low width. Lag: how late a 10 ms sleep on the workflow's event loop wakes up.

    .venv/bin/python bench/bench_workflow.py --widths 32,256,1024 --latency-ms 1500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import time
from dataclasses import asdict, dataclass

from examples.tau2.cpu.scripted_endpoint import EndpointProcess
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.tau2_agent import Tau2AgentWorkflow


@dataclass
class Batch:
    width: int
    wall_s: float
    cpu_s: float
    longest_s: float
    rewards: dict[str, float]
    """Reward per task id (every task's episodes must agree)."""
    lag_p99_ms: float
    lag_max_ms: float

    @property
    def cpu_per_episode(self) -> float:
        return self.cpu_s / self.width


async def _lag_monitor(samples: list[float], stop: asyncio.Event, period: float = 0.01) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(period)
        samples.append(time.perf_counter() - t0 - period)


async def run_batch(url: str, rows: list[dict], latency_ms: int) -> Batch:
    wf = Tau2AgentWorkflow(user_base_url=url, user_model=f"user@{latency_ms}",
                           agent_model=f"oracle@{latency_ms}", max_concurrent_episodes=len(rows),
                           episode_timeout_s=3600)
    lags: list[float] = []
    stop = asyncio.Event()
    monitor = asyncio.create_task(_lag_monitor(lags, stop))
    cpu0, t0 = time.process_time(), time.perf_counter()
    results = await asyncio.gather(*[wf.run_episode(r, base_url=url, api_key="bench") for r in rows])
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    stop.set()
    await monitor
    await wf.aclose()
    rewards: dict[str, set[float]] = {}
    for r in results:
        rewards.setdefault(r.task_id, set()).add(r.reward)
    if any(len(v) > 1 for v in rewards.values()):
        raise SystemExit(f"rewards differ between episodes of one task: {rewards}")
    q = statistics.quantiles([x * 1000 for x in lags], n=100) if len(lags) > 1 else [0.0] * 99
    return Batch(len(rows), wall, cpu, max(r.wall_s for r in results),
                 {k: v.pop() for k, v in rewards.items()}, q[98], max(lags, default=0.0) * 1000)


def rows_for(domain: str, n: int) -> list[dict]:
    ids = tau2_domain.task_ids(domain, "test")
    return [{"domain": domain, "task_id": ids[i % len(ids)]} for i in range(n)]


async def main_async(args: argparse.Namespace) -> None:
    widths = [int(w) for w in args.widths.split(",")]
    cores = os.cpu_count() or 1
    report: dict[str, dict] = {}
    with EndpointProcess() as endpoint:
        for domain in args.domains.split(","):
            await run_batch(endpoint.url, rows_for(domain, 8), 0)  # warm-up: imports, task caches
            tasks = len(tau2_domain.task_ids(domain, "test"))
            alone = await run_batch(endpoint.url, rows_for(domain, tasks), args.latency_ms)
            batches = [await run_batch(endpoint.url, rows_for(domain, w), args.latency_ms) for w in widths]
            report[domain] = {"alone": asdict(alone), "batches": [asdict(b) for b in batches]}
            print(f"\n{domain}: {tasks} test tasks once each: longest episode {alone.longest_s:.1f} s, "
                  f"{alone.cpu_per_episode:.3f} CPU s an episode; {args.latency_ms} ms a call, {cores} cores")
            print("| in flight | wall s | ideal s | of ideal | CPU s/episode | vs lowest width | lag p99 ms "
                  "| lag max ms | rewards equal |")
            print("|---|---|---|---|---|---|---|---|---|")
            for b in batches:
                ideal = max(alone.longest_s, b.width * alone.cpu_per_episode / cores)
                same = all(b.rewards[t] == alone.rewards[t] for t in b.rewards)
                print(f"| {b.width:,} | {b.wall_s:.1f} | {ideal:.1f} | {ideal / b.wall_s:.0%} | "
                      f"{b.cpu_per_episode:.3f} | {b.cpu_per_episode / batches[0].cpu_per_episode:.2f}x | "
                      f"{b.lag_p99_ms:.0f} | {b.lag_max_ms:.0f} | {'yes' if same else 'NO'} |")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--widths", default="32,256,1024", help="episodes in flight, one batch each")
    parser.add_argument("--latency-ms", type=int, default=1500)
    parser.add_argument("--domains", default="airline,retail,telecom")
    parser.add_argument("--json", default="", help="also write the figures here")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
