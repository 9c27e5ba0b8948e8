"""OpenMP threads that spin while they wait, against threads that sleep (`OMP_WAIT_POLICY=PASSIVE`), when
processes share the cores: as the CPU runs' trainer, vLLM server and controller do, and the test suite's
workers.

    python bench/bench_omp_wait.py [--builds 2] [--steps 60]   (Markdown)

The work is the tiny policy's build (`python -m examples.tau2.cpu.tiny_model`: torch on every core),
`--builds` of them at once with different seeds, each into a fresh cache folder so that each really builds;
then one alone. Each under OpenMP's default and under `PASSIVE`, one after the other in one session.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("default", "PASSIVE")


def builds_at_once(n: int, steps: int, policy: str, first_seed: int) -> float:
    """Seconds until `n` tiny-model builds started together have all finished."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    with tempfile.TemporaryDirectory(prefix="bench-omp-") as folder:
        started = time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-m", "examples.tau2.cpu.tiny_model", "--warmup-steps",
                                   str(steps), "--warmup-domain", "mock", "--seed", str(first_seed + i),
                                   "--cache-dir", f"{folder}/{i}"],
                                  cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True)
                 for i in range(n)]
        for p in procs:
            _, err = p.communicate()
            if p.returncode != 0:
                raise SystemExit(f"a tiny-model build failed:\n{err[-3000:]}")
        return time.monotonic() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--builds", type=int, default=2, help="builds at once (default: 2)")
    parser.add_argument("--steps", type=int, default=60, help="warm-up steps per build (default: 60)")
    args = parser.parse_args(argv)
    seconds: dict[tuple[str, int], float] = {}
    for n, seed in ((args.builds, 100), (1, 200)):
        for policy in POLICIES:
            seconds[policy, n] = builds_at_once(n, args.steps, policy, seed)
    print(f"| tiny-model builds ({args.steps} warm-up steps), {os.cpu_count()} cores | OpenMP default | "
          "`OMP_WAIT_POLICY=PASSIVE` | PASSIVE / default |")
    print("|---|---|---|---|")
    for n in (args.builds, 1):
        default, passive = seconds["default", n], seconds["PASSIVE", n]
        label = f"{n} at once" if n > 1 else "1 alone"
        print(f"| {label} | {default:.1f} s | {passive:.1f} s | {passive / default:.2f} |")


if __name__ == "__main__":
    main()
