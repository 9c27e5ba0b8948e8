"""The CPU learning run synchronous and asynchronous, side by side: what overlapping rollout and training
buys.

    .venv/bin/python bench/bench_async_learn.py [--seeds 1] [--trials 8] [--out DIR] [--json FILE] [k=v ...]

For each seed, `tau2_rl.sh learn` (cpu/learn.py: evaluate, train 36 steps, evaluate) twice in turn, on the
same start policy, the same seeds and the same paced vLLM server (`smoke.serve_step_ms`), the order
alternating from seed to seed:
- `sync`: `rollout.max_head_offpolicyness=0`: a step's episodes start only once the previous step's weights
  are served, so the rollout waits while the trainer trains, and the trainer while the rollout plays;
- `async`: `configs/learn_cpu.yaml` as shipped (one step ahead): the next step's episodes play while the
  trainer trains, and a weight swap meets them mid-episode.
Per run, from its own files: steps and training minutes (start-up included), the median step (the sum of
AReaL's `timeperf/*` of the step: waiting for the batch, logprob recomputation, the update, the weight
swap, saves), how long the trainer waited for its batch (`timeperf/rollout`, as a share of the steps'
time), how long no episode was in flight (the rollout idle, as a share of the loop's time: from the first
episode's start to the last trained batch, each episode's span from its dump), τ² success before and after
(72 episodes each at 8 trials), and whether the smoke run's checks passed. `key=value` overrides go to both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = {"sync": ["rollout.max_head_offpolicyness=0"], "async": []}
"""Mode -> the overrides that make it; async is the learning run's default."""


@dataclass
class Run:
    seed: int
    mode: str
    steps: int
    train_s: float
    step_s: float
    """Median over steps of the step's summed `timeperf/*`."""
    trainer_wait: float
    """Share of the steps' time the trainer waited for its batch (`timeperf/rollout`)."""
    rollout_idle: float
    """Share of the loop (first episode start to the last batch trained) with no episode in flight."""
    before: float
    after: float
    checks_passed: bool

    @property
    def gain(self) -> float:
        return self.after - self.before


def idle_share(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """The share of [start, end] that no span covers."""
    covered, reach = 0.0, start
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return 1.0 - covered / (end - start) if end > start else 0.0


def episode_spans(dump_dir: Path) -> list[tuple[float, float]]:
    """Each dumped episode's [start, end] in epoch seconds (a dump is written as its episode is scored)."""
    spans = []
    for path in dump_dir.glob("*/*/*.json"):
        end = path.stat().st_mtime
        spans.append((end - json.loads(path.read_text())["wall_s"], end))
    return spans


def measure(seed: int, mode: str, folder: Path) -> Run:
    row = json.loads((folder / "learn.json").read_text())[0]
    stats = [json.loads(line) for line in (folder / f"seed{seed}" / "stats.jsonl").read_text().splitlines()]
    step_s = [sum(v for k, v in s.items() if k.startswith("timeperf/")) for s in stats]
    waits = [s.get("timeperf/rollout", 0.0) for s in stats]
    fileroot = folder / "run"
    batches = sorted(fileroot.glob(f"logs/*/*/seed{seed}/records/batches/batch-*.pt"))
    spans = episode_spans(next(fileroot.glob(f"tau2_dumps/*/seed{seed}")))
    loop_start, loop_end = min(a for a, _ in spans), batches[-1].stat().st_mtime
    return Run(seed=seed, mode=mode, steps=len(stats), train_s=row["train_s"],
               step_s=statistics.median(step_s), trainer_wait=sum(waits) / sum(step_s),
               rollout_idle=idle_share([s for s in spans if s[0] < loop_end], loop_start, loop_end),
               before=row["before"]["success_rate"], after=row["after"]["success_rate"],
               checks_passed=not row["smoke_problems"])


def run_learn(seed: int, mode: str, trials: int, folder: Path, overrides: list[str]) -> Run:
    fileroot = folder / "run"
    cmd = [sys.executable, "-m", "examples.tau2.cpu.learn", "--seeds", str(seed), "--trials", str(trials),
           "--out", str(folder), f"cluster.fileroot={fileroot}",
           f"cluster.name_resolve.nfs_record_root={fileroot}/name_resolve", *MODES[mode], *overrides]
    log = folder / "learn.log"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"seed {seed} {mode}: {' '.join(cmd[2:])} (log: {log})", flush=True)
    with log.open("w") as out:
        subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, check=False)
    return measure(seed, mode, folder)


def table(runs: list[Run]) -> str:
    lines = ["| seed | mode | steps | step s (median) | train min | trainer waits | rollout idle | "
             "success before | success after | gain | checks |", "|---" * 11 + "|"]
    for r in runs:
        lines.append(f"| {r.seed} | {r.mode} | {r.steps} | {r.step_s:.1f} | {r.train_s / 60:.1f} | "
                     f"{r.trainer_wait:.0%} | {r.rollout_idle:.0%} | {r.before:.3f} | {r.after:.3f} | "
                     f"{r.gain:+.3f} | {'passed' if r.checks_passed else 'FAILED'} |")
    for seed in dict.fromkeys(r.seed for r in runs):
        pair = {r.mode: r for r in runs if r.seed == seed}
        if len(pair) == 2:
            a, s = pair["async"], pair["sync"]
            lines.append(f"\nseed {seed}, async / sync: step {a.step_s / s.step_s:.2f}, "
                         f"training minutes {a.train_s / s.train_s:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--out", type=Path,
                        default=Path("/tmp/tau2-areal/bench-async-learn") / time.strftime("%Y%m%d-%H%M%S"))
    parser.add_argument("--json", type=Path, help="write the runs' figures here as well")
    args, overrides = parser.parse_known_args(argv)
    runs = []
    for i, seed in enumerate(args.seeds):
        for mode in list(MODES)[:: 1 if i % 2 == 0 else -1]:
            runs.append(run_learn(seed, mode, args.trials, args.out / f"seed{seed}-{mode}", overrides))
            print(table(runs), flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=2) + "\n")
    return 0 if all(r.checks_passed for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
