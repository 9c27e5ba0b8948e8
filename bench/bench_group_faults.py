"""What a failing user simulator costs a training step: AReaL 1.0.4's groups vs partial groups.

    .venv/bin/python bench/bench_group_faults.py [--groups 96] [--group-size 8] [--faults 0 20 50]

AReaL's real rollout path on CPU (`bench/scripted_sglang.py`: LocalScheduler, an rpc_server rollout
worker, AReaL's proxy, a scripted SGLang server that takes `--generate-ms` per generation) plays
`--groups` GRPO groups of `--group-size` airline episodes (Tau2AgentWorkflow, tau2's evaluator) as one
batch, with the scripted user simulator down for about P per mille of the episodes (`faulty<P>:user`:
503 on every request, so each of those is rejected after its retries). Two rollout engines, each with
a fresh user endpoint, so that the same arrival indices fail:
- `areal`: AReaL's own `RemoteSGLangEngine` (one rejected episode fails its whole group);
- `partial`: the training's engine (`training/group_workflow.py`: a rejected episode drops only itself), with
  AReaL's own prompt rendering, so that only the group handling differs; uniform groups are kept
  (`drop_uniform_groups: false`; every scripted episode scores 1), so that only rejections drop groups.
Per engine and fault rate: episodes rejected, groups kept, episodes trained, policy generations made
and how many of them no training row holds (wasted rollout work), when `rollout_batch` returned and when
the batch's last generation was made (AReaL returns a failed group at its first failure while its other
episodes go on generating; the next cell starts only after they are done).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from areal.engine.sglang_remote import RemoteSGLangEngine
from areal.infra.rpc.rtensor import RTensor

from bench.scripted_sglang import TASK, ScriptedSGLang, rollout_config, rollout_controller
from examples.tau2.cpu.scripted_endpoint import EndpointThread
from examples.tau2.runtime.process import setup_runtime
from examples.tau2.tau2_train import WORKFLOW
from examples.tau2.training.served_prompt import AREAL_RENDERING, SERVING_ENGINE_ENV
from examples.tau2.training.trainer import Tau2SGLangEngine

ENGINES = {"areal": RemoteSGLangEngine, "partial": Tau2SGLangEngine}
TURNS_PER_EPISODE = 2
"""The scripted episode: a tool call, then the closing reply; one training row each."""


@dataclass
class Cell:
    engine: str
    fault_permille: int
    episodes: int
    rejected: int
    groups_kept: int
    episodes_trained: int
    generations: int
    generations_wasted: int
    wall_s: float
    busy_s: float


def settle(sglang: ScriptedSGLang, quiet_s: float) -> float:
    """Wait until no generation arrived for `quiet_s` (AReaL's failed groups return before their other
    episodes end; those keep generating) and return when the last one arrived (monotonic)."""
    count, last = len(sglang.requests), time.monotonic()
    while time.monotonic() - last < quiet_s:
        time.sleep(0.1)
        if len(sglang.requests) != count:
            count, last = len(sglang.requests), time.monotonic()
    return last


def run_engine(name: str, args: argparse.Namespace, root: Path) -> list[Cell]:
    cells = []
    with ScriptedSGLang(delay_s=args.generate_ms / 1000) as sglang, EndpointThread() as user:
        config = rollout_config(root / name, turn_discount=1.0, env={SERVING_ENGINE_ENV: AREAL_RENDERING},
                                max_concurrent_rollouts=args.concurrent_groups,
                                max_head_offpolicyness=len(args.faults) * args.groups + 1)
        kwargs = dict(user_base_url=user.url, agent_model="default", max_completion_tokens=256,
                      episode_timeout_s=300.0, request_timeout_s=60.0, llm_retries=args.retries,
                      retry_backoff_s=args.backoff_s, drop_uniform_groups=False)
        with rollout_controller(ENGINES[name], config, sglang, root / name) as controller:
            # warm-up (imports, tau2's tasks, the proxy's first sessions), not measured
            controller.rollout_batch([dict(TASK)], workflow=WORKFLOW,
                                     workflow_kwargs={**kwargs, "user_model": "failfirst0:user"},
                                     group_size=args.group_size)
            for permille in args.faults:
                model = f"faulty{permille}:user"
                generations = len(sglang.requests)
                start = time.monotonic()
                results = [RTensor.localize(r) for r in controller.rollout_batch(
                    [dict(TASK) for _ in range(args.groups)], workflow=WORKFLOW,
                    workflow_kwargs={**kwargs, "user_model": model}, group_size=args.group_size)]
                wall = time.monotonic() - start
                busy = settle(sglang, quiet_s=2 * (args.backoff_s + args.generate_ms / 1000) + 1) - start
                rows = sum(int(r["input_ids"].shape[0]) for r in results)
                made = len(sglang.requests) - generations
                episodes = args.groups * args.group_size
                cells.append(Cell(
                    engine=name, fault_permille=permille, episodes=episodes,
                    rejected=user.endpoint.outage(model)[1],
                    groups_kept=len(results), episodes_trained=rows // TURNS_PER_EPISODE, generations=made,
                    generations_wasted=made - rows, wall_s=wall, busy_s=busy))
                print(json.dumps(asdict(cells[-1])), flush=True)
    return cells


def table(cells: list[Cell], groups: int) -> str:
    lines = ["| fault rate | engine | episodes rejected | groups kept | episodes trained | "
             "generations wasted | batch returned s | rollout busy s |", "|---|---|---|---|---|---|---|---|"]
    for c in sorted(cells, key=lambda c: (c.fault_permille, c.engine)):
        wasted = c.generations_wasted / max(c.generations, 1)
        lines.append(f"| {c.fault_permille / 10:g} % | {c.engine} | {c.rejected}/{c.episodes} | "
                     f"{c.groups_kept}/{groups} | {c.episodes_trained}/{c.episodes} | "
                     f"{c.generations_wasted}/{c.generations} ({wasted:.0%})"
                     f" | {c.wall_s:.1f} | {c.busy_s:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--groups", type=int, default=96, help="groups submitted as one rollout batch")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--faults", type=int, nargs="+", default=[0, 20, 50],
                        help="per mille of episodes whose user simulator is down")
    parser.add_argument("--concurrent-groups", type=int, default=8)
    parser.add_argument("--generate-ms", type=float, default=100.0, help="time of one scripted generation")
    parser.add_argument("--retries", type=int, default=1, help="llm_retries of each user request")
    parser.add_argument("--backoff-s", type=float, default=0.5)
    parser.add_argument("--json", type=Path, help="also write the cells here")
    args = parser.parse_args(argv)
    setup_runtime()
    with tempfile.TemporaryDirectory(prefix="bench-group-faults-") as tmp:
        cells = [c for name in ENGINES for c in run_engine(name, args, Path(tmp))]
    print(table(cells, args.groups))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
