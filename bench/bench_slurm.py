"""SLURM on this machine: how long the throw-away cluster takes to come up and go down, and how long a
worker that dies at start takes to fail the run, through the project's scheduler and through AReaL 1.0.4's.

    python bench/bench_slurm.py [--runs 5] [--stock-timeout 300]     (as root; prints a Markdown table)

A dead worker: the actor's command is `python3 -m no_such_module`, so the job's worker exits at once. The
time runs from `create_workers` (the `sbatch`) to the exception `get_workers` raises. AReaL's own scheduler
is given its default `startup_timeout` (300 s) unless `--stock-timeout` says otherwise, and, as its
`PPOTrainer` needs to submit anything, `cluster.n_gpus_per_node=8` (it divides by it; the spec asks no
GPU). The smoke run through SLURM against the local scheduler is timed with farm-bench (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from examples.tau2.slurm import local_cluster  # noqa: E402
from examples.tau2.slurm.local_cluster import ClusterSpec  # noqa: E402


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def bring_up(runs: int) -> list[tuple[str, str, str]]:
    rows = []
    for nodes in (1, 2):
        ups, downs = [], []
        for _ in range(runs):
            root = Path(tempfile.mkdtemp(prefix="tau2-bench-slurm-", dir="/tmp")) / "c"
            start = time.monotonic()
            local_cluster.up(root, ClusterSpec(nodes=nodes))
            ups.append(time.monotonic() - start)
            start = time.monotonic()
            local_cluster.down(root)
            downs.append(time.monotonic() - start)
        rows.append((f"{nodes} node(s)", spread(ups), spread(downs)))
    return rows


def dead_worker(scheduler_name: str, stock_timeout: float) -> tuple[float, str]:
    """Seconds from submission to the failure, and the first line of what was raised."""
    from areal.api import Job
    from areal.api.cli_args import SchedulingStrategy
    from areal.infra.scheduler.slurm import SlurmScheduler

    from examples.tau2.cpu.smoke_config import load_smoke_config
    from examples.tau2.slurm.scheduler import Tau2SlurmScheduler

    root = Path(tempfile.mkdtemp(prefix="tau2-bench-dead-"))
    (root / "nr").mkdir()
    overrides = [f"cluster.fileroot={root}", f"cluster.name_resolve.nfs_record_root={root}/nr",
                 "scheduler.type=slurm", "actor.scheduling_spec.0.cmd=python3 -m no_such_module"]
    if scheduler_name == "areal":
        overrides.append("cluster.n_gpus_per_node=8")
    config, _, _ = load_smoke_config(overrides)
    scheduler = (Tau2SlurmScheduler(config) if scheduler_name == "project" else
                 SlurmScheduler(exp_config=config, container_type="none", startup_timeout=stock_timeout))
    job = Job(replicas=1, tasks=[config.actor.scheduling_spec[0]], role="actor",
              scheduling_strategy=SchedulingStrategy())
    start = time.monotonic()
    scheduler.create_workers(job)
    try:
        scheduler.get_workers("actor")
        raise AssertionError("the dead worker was reported ready")
    except Exception as e:  # what a user sees
        took = time.monotonic() - start
        said = f"{type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}"
    with contextlib.suppress(Exception):
        scheduler.delete_workers()
    return took, said


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--stock-timeout", type=float, default=300.0)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit}, {args.runs} runs each\n")
    print("| local SLURM | up s (median, min-max) | down s |\n|---|---|---|")
    for row in bring_up(args.runs):
        print("| " + " | ".join(row) + " |")
    print("\n| a worker that dies at start | failed after s | what the controller raised |\n|---|---|---|")
    root = Path(tempfile.mkdtemp(prefix="tau2-bench-slurm-", dir="/tmp")) / "c"
    with local_cluster.running(root, ClusterSpec(nodes=1)) as cluster:
        import os

        os.environ["SLURM_CONF"] = str(cluster.conf)
        results = {name: dead_worker(name, args.stock_timeout) for name in ("project", "areal")}
    for name, (took, said) in results.items():
        print(f"| {name} | {took:.1f} | {said[:160]} |")
    ratio = results["areal"][0] / results["project"][0]
    print(f"\nAReaL's scheduler / the project's: {ratio:.0f}x longer to fail")
    return 0


if __name__ == "__main__":
    sys.exit(main())
