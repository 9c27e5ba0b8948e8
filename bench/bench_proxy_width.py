"""Hundreds of episodes in flight through AReaL's real rollout worker and proxy: nothing lost, nothing
duplicated, and what the proxy adds.

    .venv/bin/python bench/bench_proxy_width.py [--widths 64,512] [--generate-ms 500] [--per-in-flight-ms 2]

AReaL's real rollout path on CPU (`bench/scripted_sglang.py`: LocalScheduler, an rpc_server rollout
worker with the training's engine, the OpenAI-compatible proxy AReaL forks beside it, and a scripted SGLang
server) plays, per width, width / 8 GRPO groups of 8 airline episodes (Tau2AgentWorkflow, tau2's evaluator,
the scripted user simulator in its own process answering after `--user-ms`), all submitted at once. Each
generation takes `--generate-ms` plus `--per-in-flight-ms` for every other generation in flight when it
arrives, as a batching server's latency grows with its batch.

Per width, from the rows the groups recorded (`TAU2_RECORD_ROWS`) and the server's own count: every
episode scored or rejected (none lost), every completion id in one row only (none duplicated), every
generation the server made in some row, or an orphan the episode never received; the most generations in
flight at the server; the proxy's added latency (a policy call's mean as the episode waited for it less
the server's mean generation: the proxy's and the worker's loop's share), and the proxy's and the rollout
worker's resident memory at the peak above that before the batch, per episode in flight.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from areal.infra.rpc.rtensor import RTensor

from bench.scripted_sglang import TASK, ScriptedSGLang, rollout_config, rollout_controller
from examples.tau2.cpu.async_checks import ROWS, load_groups
from examples.tau2.cpu.scripted_endpoint import EndpointProcess
from examples.tau2.runtime.process import setup_runtime
from examples.tau2.tau2_train import WORKFLOW
from examples.tau2.training.group_workflow import ROWS_RECORD_ENV
from examples.tau2.training.served_prompt import SERVING_ENGINE_ENV
from examples.tau2.training.trainer import Tau2SGLangEngine

GROUP_SIZE = 8


@dataclass
class Width:
    episodes: int
    groups_returned: int
    groups_rejected: int
    scored: int
    rejected: int
    lost: int
    rows: int
    trained_rows: int
    duplicated_ids: int
    generations: int
    orphans: int
    max_in_flight: int
    wall_s: float
    call_ms: float
    generate_ms: float
    proxy_added_ms: float
    proxy_cpu_ms_per_generation: float
    worker_cpu_ms_per_generation: float
    proxy_mib_per_episode: float
    worker_mib_per_episode: float


def cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


class PeakRss:
    """The largest resident memory of each process in `procs` while in the `with` block, sampled every
    0.1 s, beside what each held on entry; and the CPU each used in the block."""

    def __init__(self, procs: dict[str, psutil.Process]) -> None:
        self.procs = procs
        self.before = {name: p.memory_info().rss for name, p in procs.items()}
        self.cpu_before = {name: cpu_s(p) for name, p in procs.items()}
        self.cpu_used: dict[str, float] = {}
        self.peak = dict(self.before)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            for name, p in self.procs.items():
                self.peak[name] = max(self.peak[name], p.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.cpu_used = {name: cpu_s(p) - self.cpu_before[name] for name, p in self.procs.items()}

    def grown_mib(self, name: str) -> float:
        return (self.peak[name] - self.before[name]) / 2**20


def rollout_processes(proxy_addr: str) -> dict[str, psutil.Process]:
    """The rollout worker and the proxy AReaL forked: this process's descendants, the proxy the one that
    listens on `proxy_addr`'s port, the worker the `rpc_server` of role rollout."""
    port = int(proxy_addr.rsplit(":", 1)[1])
    found: dict[str, psutil.Process] = {}
    for p in psutil.Process().children(recursive=True):
        try:
            if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in p.net_connections("tcp")):
                found["proxy"] = p
            elif "--role" in (cmd := p.cmdline()) and cmd[cmd.index("--role") + 1] == "rollout":
                found["worker"] = p
        except psutil.NoSuchProcess:
            continue
    if set(found) != {"proxy", "worker"}:
        raise RuntimeError(f"found {sorted(found)} of the rollout worker and its proxy")
    return found


def audit(groups: list[dict]) -> dict[str, int]:
    """Per recorded group's episodes: scored (its rows are exactly the turns it took) or rejected (a reason,
    no rows); anything else is lost. Completion ids in more than one row are duplicated."""
    scored = rejected = lost = rows = 0
    seen: set[str] = set()
    duplicated = 0
    for group in groups:
        for episode in group["episodes"]:
            ids = [row[0] for row in episode["rows"]]
            duplicated += sum(cid in seen for cid in ids)
            seen.update(ids)
            rows += len(ids)
            if episode["rejected"]:
                rejected += 1
                lost += bool(ids)
            elif ids and ids == episode["taken"]:
                scored += 1
            else:
                lost += 1
    return {"scored": scored, "rejected": rejected, "lost": lost, "rows": rows, "duplicated_ids": duplicated}


def run_width(controller, sglang: ScriptedSGLang, procs: dict[str, psutil.Process], root: Path,
              kwargs: dict, episodes: int, timeout_s: float) -> Width:
    groups = episodes // GROUP_SIZE
    before_groups, before_generations = len(load_groups(root)), len(sglang.requests)
    before_served = len(sglang.served_s)
    sglang.max_in_flight = 0
    controller.export_stats()  # clears the worker's tracker: the figures below are this batch's
    with PeakRss(procs) as rss:
        start = time.monotonic()
        for _ in range(groups):
            controller.submit(dict(TASK), workflow=WORKFLOW, workflow_kwargs=kwargs, group_size=GROUP_SIZE)
        results = controller.wait(groups, timeout=timeout_s)
        wall = time.monotonic() - start
    stats = controller.export_stats()
    mine = load_groups(root)[before_groups:]
    counts = audit(mine)
    counts["lost"] += episodes - sum(len(g["episodes"]) for g in mine)  # of groups that never ended
    kept = [RTensor.localize(r) for r in results if r is not None]
    served = sglang.served_s[before_served:]
    generations = len(sglang.requests) - before_generations
    call_ms = 1000 * stats["rollout/tau2/agent_latency_s"] / stats["rollout/tau2/num_agent_turns"]
    generate_ms = 1000 * sum(served) / len(served)
    return Width(
        episodes=episodes, groups_returned=len(results), groups_rejected=sum(r is None for r in results),
        **counts, trained_rows=sum(int(t["input_ids"].shape[0]) for t in kept),
        generations=generations, orphans=generations - counts["rows"],
        max_in_flight=sglang.max_in_flight, wall_s=wall, call_ms=call_ms, generate_ms=generate_ms,
        proxy_added_ms=call_ms - generate_ms,
        proxy_cpu_ms_per_generation=1000 * rss.cpu_used["proxy"] / generations,
        worker_cpu_ms_per_generation=1000 * rss.cpu_used["worker"] / generations,
        proxy_mib_per_episode=rss.grown_mib("proxy") / episodes,
        worker_mib_per_episode=rss.grown_mib("worker") / episodes)


def table(widths: list[Width]) -> str:
    head = ("in flight", "scored / rejected / lost", "rows (trained)", "duplicated ids",
            "generations (orphans)", "at the server, most", "wall", "policy call", "generation", "proxy adds",
            "CPU/generation: proxy, worker", "MiB/episode: proxy, worker")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in widths:
        lines.append(
            f"| {w.episodes} | {w.scored} / {w.rejected} / {w.lost} | {w.rows} ({w.trained_rows}) | "
            f"{w.duplicated_ids} | {w.generations} ({w.orphans}) | {w.max_in_flight} | {w.wall_s:.1f} s | "
            f"{w.call_ms:.0f} ms | {w.generate_ms:.0f} ms | {w.proxy_added_ms:.0f} ms | "
            f"{w.proxy_cpu_ms_per_generation:.1f}, {w.worker_cpu_ms_per_generation:.1f} ms | "
            f"{w.proxy_mib_per_episode:.2f}, {w.worker_mib_per_episode:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--widths", default="64,512",
                        help="episodes in flight, comma-separated (groups of 8)")
    parser.add_argument("--generate-ms", type=float, default=500.0, help="a generation's time alone")
    parser.add_argument("--per-in-flight-ms", type=float, default=2.0,
                        help="added to a generation per other generation in flight at its arrival")
    parser.add_argument("--user-ms", type=int, default=500, help="the user simulator's time a reply")
    parser.add_argument("--timeout-s", type=float, default=1200.0, help="the most a width's batch may take")
    parser.add_argument("--json", type=Path, help="also write the rows of the table here")
    args = parser.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    if any(w <= 0 or w % GROUP_SIZE for w in widths):
        parser.error(f"--widths: each a positive multiple of the group size, {GROUP_SIZE}")
    setup_runtime()
    results = []
    with (tempfile.TemporaryDirectory(prefix="bench-proxy-width-") as tmp,
          ScriptedSGLang(delay_s=args.generate_ms / 1000, delay_per_in_flight_s=args.per_in_flight_ms / 1000)
          as sglang, EndpointProcess() as user):
        root = Path(tmp)
        groups = max(widths) // GROUP_SIZE
        config = rollout_config(root, turn_discount=1.0, env={SERVING_ENGINE_ENV: "sglang",
                                                              ROWS_RECORD_ENV: str(root / ROWS)},
                                max_concurrent_rollouts=groups,
                                max_head_offpolicyness=sum(widths) // GROUP_SIZE + 1)
        kwargs = dict(user_base_url=user.url, user_model=f"user@{args.user_ms}", agent_model="default",
                      max_completion_tokens=256, episode_timeout_s=args.timeout_s, request_timeout_s=600.0,
                      max_concurrent_episodes=max(widths), drop_uniform_groups=False)
        with rollout_controller(Tau2SGLangEngine, config, sglang, root) as controller:
            # warm-up (imports, tau2's tasks, the proxy's first sessions), not measured
            controller.rollout_batch([dict(TASK)], workflow=WORKFLOW, workflow_kwargs=kwargs,
                                     group_size=GROUP_SIZE)
            procs = rollout_processes(controller.proxy_addrs[0])
            for width in widths:
                results.append(run_width(controller, sglang, procs, root, kwargs, width, args.timeout_s))
                print(json.dumps(asdict(results[-1])), flush=True)
        failed = not all(w.lost == 0 and w.duplicated_ids == 0 and w.orphans == 0 for w in results)
        if failed:
            kept = Path(tempfile.mkdtemp(prefix="bench-proxy-width-logs-"))
            shutil.copytree(root / "logs", kept / "logs")
            shutil.copytree(root / ROWS, kept / ROWS)
            print(f"something was lost, duplicated or orphaned: the workers' logs and rows are in {kept}")
    print(f"{args.generate_ms:g} ms a generation + {args.per_in_flight_ms:g} ms per other in flight, "
          f"user {args.user_ms} ms, {os.cpu_count()} cores")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(w) for w in results], indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
