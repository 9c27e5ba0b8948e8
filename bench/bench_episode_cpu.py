"""CPU and memory of tau2's side of an episode: stock tau2 against `tau2_cache`, side by side.

The same scripted episodes (airline, retail, telecom; policy `oracle`, which replays the ground truth,
and `noop`, which refuses) run through `Tau2AgentWorkflow` on both paths in one process: first inside
`tau2_cache.enabled(False)` (stock tau2: registry task loader, environment constructor,
`evaluate_simulation`) with no cache in memory, then on the default cached path. The scripted endpoint
runs in a separate process, so this process's CPU time (`getrusage`, all threads) is the episode's CPU
outside the LLM. Every recorded trajectory, plus ground-truth trajectories with the last action dropped
or altered (mostly failing), is also scored alone on each path, timing tau2's part (task load,
environment, evaluation) with `time.process_time` and comparing the full `RewardInfo`s. Last,
tracemalloc measures the cache and the memory one in-flight episode holds. Exit status 1 on any
reward mismatch.

    .venv/bin/python bench/bench_episode_cpu.py --tasks-per-domain 6
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import random
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tau2.data_model.message import AssistantMessage, Message, ToolCall, UserMessage
from tau2.data_model.simulation import SimulationRun, TerminationReason
from tau2.data_model.tasks import Action, Task

from examples.tau2.compat import tau2_cache
from examples.tau2.cpu.scripted_endpoint import EndpointProcess
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.tau2_agent import Tau2AgentWorkflow
from examples.tau2.tau2_utils import EpisodeResult, Termination

DOMAINS = ("airline", "retail", "telecom")
POLICIES = ("oracle", "noop")
MODES = ("stock", "cached")


def cpu_s() -> float:
    """CPU seconds of this process, every thread (the workflow's orchestrator threads included)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def mode(name: str):
    return tau2_cache.enabled(name == "cached")


# --------------------------------------------------------------------------------------------------
# Episodes through the workflow


class GcMeter:
    """CPU seconds spent in Python's garbage collector (stock environments are large object graphs)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.process_time()
        else:
            self.total += time.process_time() - self._start


GC = GcMeter()


@dataclass
class Measured:
    cpu_s: float
    gc_s: float


@contextlib.contextmanager
def measure(out: list[Measured]) -> Iterator[None]:
    gc.collect()  # the previous episode's garbage is not billed to this one
    cpu0, gc0 = cpu_s(), GC.total
    yield
    out.append(Measured(cpu_s() - cpu0, GC.total - gc0))


@dataclass
class Episode:
    domain: str
    task_id: str
    policy: str
    cost: list[Measured] = field(default_factory=list)
    result: EpisodeResult | None = None


async def run_workflow_episodes(url: str, tasks: dict[str, list[str]]) -> list[Episode]:
    """Every (domain, policy, task) once, sequentially, on the current path."""
    workflows = {p: Tau2AgentWorkflow(user_base_url=url, user_model="user", agent_model=p) for p in POLICIES}
    episodes = [Episode(d, t, p) for d in DOMAINS for p in POLICIES for t in tasks[d]]
    try:
        for ep in episodes:
            with measure(ep.cost):
                ep.result = await workflows[ep.policy].run_episode(
                    {"domain": ep.domain, "task_id": ep.task_id}, base_url=url, api_key="bench")
    finally:
        for wf in workflows.values():
            await wf.aclose()
    return episodes


_TERMINATION = {Termination.AGENT_STOP: TerminationReason.AGENT_STOP,
                Termination.USER_STOP: TerminationReason.USER_STOP,
                Termination.MAX_STEPS: TerminationReason.MAX_STEPS,
                Termination.TOO_MANY_ERRORS: TerminationReason.TOO_MANY_ERRORS}


def simulation_of(result: EpisodeResult) -> SimulationRun:
    """The trajectory tau2 scored, rebuilt from the episode's JSON messages."""
    return SimulationRun.model_validate({
        "id": "bench", "task_id": result.task_id, "start_time": "", "end_time": "", "duration": 0.0,
        "termination_reason": _TERMINATION.get(result.termination, TerminationReason.AGENT_ERROR),
        "messages": result.messages,
    })


def simulate(domain: str, task: Task, actions: list[Action]) -> SimulationRun:
    """A consistent trajectory of `actions` executed on a fresh environment (for failing variants)."""
    env = tau2_domain.make_environment(domain)
    init = task.initial_state
    messages: list[Message] = list(init.message_history or []) if init else []
    if init is not None:
        env.set_state(init.initialization_data, init.initialization_actions, list(messages))
    messages += [AssistantMessage(role="assistant", content="Hi! How can I help you today?"),
                 UserMessage(role="user", content="I need help with my request.")]
    for i, action in enumerate(actions):
        call = ToolCall(id=f"call_{i}", name=action.name, arguments=action.arguments,
                        requestor=action.requestor)
        role_cls = UserMessage if action.requestor == "user" else AssistantMessage
        messages += [role_cls(role=action.requestor, content=None, tool_calls=[call]), env.get_response(call)]
    info = task.evaluation_criteria.communicate_info or []
    messages += [AssistantMessage(role="assistant", content=" ".join(["Done.", *info])),
                 UserMessage(role="user", content="Thanks. ###STOP###")]
    return SimulationRun(id="bench", task_id=task.id, start_time="", end_time="", duration=0.0,
                         termination_reason=TerminationReason.USER_STOP, messages=messages)


def failing_variants(domain: str, task_id: str) -> Iterator[tuple[str, SimulationRun]]:
    task = tau2_domain.get_task(domain, task_id)
    gt = list(task.evaluation_criteria.actions or [])
    if not gt:
        return
    yield "drop_last", simulate(domain, task, gt[:-1])
    last = gt[-1]
    args = dict(last.arguments)
    key = next((k for k, v in args.items() if isinstance(v, str)), None)
    if key is not None:
        args[key] += "9"
        yield "alter_last", simulate(domain, task, gt[:-1] + [last.model_copy(update={"arguments": args})])


# --------------------------------------------------------------------------------------------------
# tau2's part alone


@dataclass
class Tau2Cost:
    task_s: float
    env_s: float
    eval_s: float
    gc_s: float

    @property
    def total_s(self) -> float:
        return self.task_s + self.env_s + self.eval_s


def tau2_part(domain: str, sim: SimulationRun) -> tuple[Tau2Cost, dict]:
    """What the workflow asks of tau2 per episode: the task, one environment, the evaluation."""
    gc.collect()
    gc0 = GC.total
    t0 = time.process_time()
    task = tau2_domain.get_task(domain, sim.task_id)
    t1 = time.process_time()
    tau2_domain.make_environment(domain)
    t2 = time.process_time()
    reward = tau2_domain.evaluate(sim, task, domain, solo_mode=False)
    t3 = time.process_time()
    return Tau2Cost(t1 - t0, t2 - t1, t3 - t2, GC.total - gc0), reward.model_dump()


# --------------------------------------------------------------------------------------------------
# Memory


def traced(fn: Callable[[], object]) -> tuple[object, int, int]:
    """(result, bytes still allocated afterwards, peak bytes during `fn`) under tracemalloc."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    result = fn()
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return result, current - before, peak - before


def in_flight_bytes(domain: str, sim: SimulationRun, n: int) -> int:
    """Memory held per live episode: `n` environments, each with the episode's tool calls applied."""
    task = tau2_domain.get_task(domain, sim.task_id)
    init = task.initial_state

    def build() -> list:
        envs = []
        for _ in range(n):
            env = tau2_domain.make_environment(domain)
            env.set_state(init.initialization_data if init else None,
                          init.initialization_actions if init else None, sim.messages)
            envs.append(env)
        return envs

    envs, held, _ = traced(build)
    del envs
    return held // n


# --------------------------------------------------------------------------------------------------


def _ms(x: float) -> str:
    return f"{x * 1e3:9.1f}"


def _mib(x: float) -> str:
    return f"{x / 2**20:8.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks-per-domain", type=int, default=6,
                        help="tasks sampled (seed 0) from each domain's test split")
    parser.add_argument("--in-flight", type=int, default=8,
                        help="live environments built per mode to measure memory per in-flight episode")
    args = parser.parse_args()
    if args.tasks_per_domain <= 0 or args.in_flight <= 0:
        parser.error("--tasks-per-domain and --in-flight must be positive")
    tasks = {d: sorted(random.Random(0).sample(tau2_domain.task_ids(d, "test"), args.tasks_per_domain))
             for d in DOMAINS}
    tau2_cache.clear()  # the stock pass runs as a stock process would: no cache in memory

    with EndpointProcess() as endpoint:
        url = endpoint.url
        with mode("stock"):
            stock_eps = asyncio.run(run_workflow_episodes(url, tasks))
            # The trajectories tau2 scored, plus failing variants of the ground truth.
            trajectories = [(e.domain, e.policy, simulation_of(e.result)) for e in stock_eps]
            for d in DOMAINS:
                for t in tasks[d]:
                    trajectories += [(d, name, sim) for name, sim in failing_variants(d, t)]
            stock_costs = [tau2_part(d, sim) for d, _, sim in trajectories]
        stock_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

        print("## cache warm-up (once per process and domain; CPU s)")
        for d in DOMAINS:
            cache = tau2_cache.domain_cache(d)
            t0 = time.process_time()
            cache.tasks()
            t1 = time.process_time()
            cache.snapshots()
            t2 = time.process_time()
            for t in tasks[d]:
                cache.gold_state(tau2_domain.get_task(d, t))
            t3 = time.process_time()
            print(f"{d:8s} tasks {t1 - t0:6.2f}  db snapshot {t2 - t1:6.2f}  gold state "
                  f"{(t3 - t2) / len(tasks[d]) * 1e3:6.1f} ms/task")

        with mode("cached"):
            cached_eps = asyncio.run(run_workflow_episodes(url, tasks))
            cached_costs = [tau2_part(d, sim) for d, _, sim in trajectories]

    print("\n## workflow episodes: CPU s per episode of this process, all threads (the scripted endpoint "
          "runs in another process); in parentheses the part spent in garbage collection")
    print(f"{'domain':8s} {'policy':7s} {'n':>3s} {'stock':>16s} {'cached':>16s} {'ratio':>7s}  mean reward")
    for d in DOMAINS:
        for p in [*POLICIES, "all"]:
            pairs = [(s, c) for s, c in zip(stock_eps, cached_eps, strict=True)
                     if s.domain == d and p in ("all", s.policy)]
            st = [s.cost[0] for s, _ in pairs]
            ca = [c.cost[0] for _, c in pairs]
            stock, cached = statistics.mean(m.cpu_s for m in st), statistics.mean(m.cpu_s for m in ca)
            print(f"{d:8s} {p:7s} {len(pairs):3d} {stock:7.3f} ({statistics.mean(m.gc_s for m in st):5.3f}) "
                  f"{cached:7.3f} ({statistics.mean(m.gc_s for m in ca):5.3f}) {stock / cached:6.1f}x  "
                  f"{statistics.mean(c.result.tau2_reward for _, c in pairs):.2f}")
    workflow_mismatch = sum(
        (s.result.tau2_reward, s.result.reward_breakdown) != (c.result.tau2_reward, c.result.reward_breakdown)
        for s, c in zip(stock_eps, cached_eps, strict=True))

    print("\n## tau2's part per episode (CPU ms): task load + environment + evaluation, on the recorded "
          "trajectories and failing variants; gc = garbage collection inside")
    print(f"{'domain':8s} {'n':>3s} {'path':7s} {'task':>9s} {'env':>9s} {'eval':>9s} {'total':>9s} "
          f"{'gc':>9s} {'ratio':>8s}")
    mismatches = sum(s[1] != c[1] for s, c in zip(stock_costs, cached_costs, strict=True))
    for d in DOMAINS:
        totals = {}
        for m, all_costs in (("stock", stock_costs), ("cached", cached_costs)):
            cs = [c for (dd, _, _), (c, _) in zip(trajectories, all_costs, strict=True) if dd == d]
            totals[m] = statistics.mean(c.total_s for c in cs)
            ratio = f"{totals['stock'] / totals[m]:7.0f}x" if m == "cached" else ""
            print(f"{d:8s} {len(cs):3d} {m:7s} {_ms(statistics.mean(c.task_s for c in cs))} "
                  f"{_ms(statistics.mean(c.env_s for c in cs))} {_ms(statistics.mean(c.eval_s for c in cs))} "
                  f"{_ms(totals[m])} {_ms(statistics.mean(c.gc_s for c in cs))} {ratio}")
    by_kind: dict[str, list[float]] = {}
    for (d, kind, _), (_, dump) in zip(trajectories, cached_costs, strict=True):
        by_kind.setdefault(f"{d}/{kind}", []).append(dump["reward"])
    print("mean tau2 reward by trajectory: " + ", ".join(
        f"{k} {statistics.mean(v):.2f} (n={len(v)})" for k, v in by_kind.items()))

    # Tool listing: what the workflow does per episode (env.get_tools() + schemas) vs the cached ToolSet.
    print("\n## tool listing per episode (CPU ms): env.get_tools()/get_user_tools() + openai_schema, "
          "vs cached tau2_domain.tools()")
    for d in DOMAINS:
        env = tau2_domain.make_environment(d)
        per = {}
        for m, listing in (("stock", lambda env=env: tau2_cache.ToolSet.of(env)),
                           ("cached", lambda d=d: tau2_domain.tools(d))):
            listing()
            t0 = time.process_time()
            for _ in range(5):
                listing()
            per[m] = (time.process_time() - t0) / 5
        print(f"{d:8s} per episode {_ms(per['stock'])}  cached {per['cached'] * 1e6:7.1f} us")

    # Telecom task loading after warm-up.
    ids = tau2_domain.task_ids("telecom", "test")
    t0 = time.perf_counter()
    for i in range(1000):
        tau2_domain.get_task("telecom", ids[i % len(ids)])
    cached_load = (time.perf_counter() - t0) / 1000
    with mode("stock"):
        t0 = time.perf_counter()
        tau2_domain.get_task("telecom", ids[0])
        stock_load = time.perf_counter() - t0
    print(f"\n## telecom get_task: stock {stock_load * 1e3:.0f} ms, cached after warm-up "
          f"{cached_load * 1e6:.1f} us (wall)")

    # Memory.
    print("\n## memory (tracemalloc, MiB)")
    tau2_cache.clear()
    for d in DOMAINS:
        cache = tau2_cache.domain_cache(d)
        _, held, _ = traced(lambda cache=cache, d=d: (cache.tasks(), cache.snapshots(),
                                                      [cache.gold_state(tau2_domain.get_task(d, t))
                                                       for t in tasks[d]]))
        oracle = next(sim for dd, k, sim in trajectories if dd == d and k == "oracle")
        per_ep = {}
        peak_eval = {}
        for m in MODES:
            with mode(m):
                per_ep[m] = in_flight_bytes(d, oracle, args.in_flight)
                task = tau2_domain.get_task(d, oracle.task_id)
                _, _, peak_eval[m] = traced(
                    lambda task=task, d=d, sim=oracle: tau2_domain.evaluate(sim, task, d, False))
        print(f"{d:8s} cache {_mib(held)}  per in-flight episode: stock {_mib(per_ep['stock'])} cached "
              f"{_mib(per_ep['cached'])}  evaluation peak: stock {_mib(peak_eval['stock'])} cached "
              f"{_mib(peak_eval['cached'])}")
    intact = all(s is None or s.intact() for d in DOMAINS for s in tau2_cache.domain_cache(d).snapshots())
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"process peak RSS {stock_peak / 1024:.0f} MiB after the stock pass, {ru.ru_maxrss / 1024:.0f} MiB "
          "at the end (cached pass and memory probes included)")

    print(f"\nreward mismatches: workflow episodes {workflow_mismatch}/{len(stock_eps)}, "
          f"RewardInfo of the same trajectory {mismatches}/{len(trajectories)}; snapshots intact: {intact}")
    return 0 if workflow_mismatch == mismatches == 0 and intact else 1


if __name__ == "__main__":
    sys.exit(main())
