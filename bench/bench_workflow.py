"""Throughput, CPU cost and event-loop lag of Tau2AgentWorkflow with many episodes in flight.

A scripted OpenAI-compatible endpoint runs in a separate process and answers every request after a fixed
latency (policy and user simulator), so the numbers measure this process only: the tau2 orchestrator
threads, the HTTP clients and the evaluator. The same batch of concurrent episodes runs once per size of
the orchestrator thread pool (`max_concurrent_episodes`), side by side; asyncio's default executor size on
this machine, min(32, cpus + 4), is what `asyncio.to_thread` would give.

    .venv/bin/python bench/bench_workflow.py --episodes 256 --latency-ms 200 --pools 6,16,64,256
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time
from dataclasses import dataclass

from examples.tau2.cpu.scripted_endpoint import EndpointProcess
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.tau2_agent import Tau2AgentWorkflow


@dataclass
class Run:
    pool: int
    episodes: int
    wall_s: float
    cpu_s: float
    mean_reward: float
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float

    @property
    def eps_per_s(self) -> float:
        return self.episodes / self.wall_s


async def _lag_monitor(samples: list[float], stop: asyncio.Event, period: float = 0.01) -> None:
    """How late the event loop wakes up from a 10 ms sleep: what every other coroutine suffers too."""
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(period)
        samples.append(time.perf_counter() - t0 - period)


async def run_batch(url: str, rows: list[dict], latency_ms: int, pool: int) -> Run:
    wf = Tau2AgentWorkflow(user_base_url=url, user_model=f"user@{latency_ms}",
                           agent_model=f"oracle@{latency_ms}", max_concurrent_episodes=pool,
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
    q = statistics.quantiles([x * 1000 for x in lags], n=100)
    return Run(pool, len(rows), wall, cpu, statistics.mean(r.reward for r in results),
               q[49], q[98], max(lags) * 1000)


def rows_for(domain: str, n: int) -> list[dict]:
    ids = tau2_domain.task_ids(domain, "test")
    return [{"domain": domain, "task_id": ids[i % len(ids)]} for i in range(n)]


async def main_async(args: argparse.Namespace) -> None:
    pools = [int(p) for p in args.pools.split(",")]
    with EndpointProcess() as endpoint:
        url = endpoint.url
        rows = rows_for(args.domain, args.episodes)
        await run_batch(url, rows[:8], 0, 8)  # warm-up: imports, task caches, first env builds
        runs = [await run_batch(url, rows, args.latency_ms, pool) for pool in pools]
        per_domain = [(d, await run_batch(url, rows_for(d, args.per_domain), 0, args.per_domain))
                      for d in ("airline", "retail", "telecom")]

    print(f"\n{args.episodes} concurrent {args.domain} episodes, scripted policy and user at "
          f"{args.latency_ms} ms per call ({os.cpu_count()} CPUs); threads = max_concurrent_episodes")
    print(f"{'threads':>8}{'eps/s':>8}{'CPU s/ep':>10}{'reward':>8}{'lag p50':>9}{'lag p99':>9}"
          f"{'lag max':>9}  (ms)")
    for r in runs:
        print(f"{r.pool:>8}{r.eps_per_s:>8.2f}{r.cpu_s / r.episodes:>10.3f}{r.mean_reward:>8.2f}"
              f"{r.lag_p50_ms:>9.1f}{r.lag_p99_ms:>9.1f}{r.lag_max_ms:>9.1f}")
    first = runs[0]
    for r in runs[1:]:
        print(f"{r.pool} vs {first.pool} threads: throughput {r.eps_per_s / first.eps_per_s:.2f}x, "
              f"CPU per episode {r.cpu_s / first.cpu_s:.2f}x, lag p99 {r.lag_p99_ms / first.lag_p99_ms:.1f}x")
    print(f"\nCPU seconds per episode outside the LLM, {args.per_domain} concurrent episodes per domain, "
          "no added latency:")
    for domain, r in per_domain:
        print(f"  {domain:<8} {r.cpu_s / r.episodes:.3f} s/episode  ({r.eps_per_s:.2f} eps/s, "
              f"mean reward {r.mean_reward:.2f})")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--latency-ms", type=int, default=200)
    parser.add_argument("--pools", default="6,16,64,256", help="thread-pool sizes to compare")
    parser.add_argument("--domain", default="telecom", choices=["airline", "retail", "telecom"])
    parser.add_argument("--per-domain", type=int, default=20)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
