"""SLURM on this machine: how long the throw-away cluster takes to come up and go down, and how long a
worker that dies at start takes to fail the run, through the project's scheduler and through AReaL 1.0.4's.

    python bench/bench_slurm.py [--runs 5] [--stock-timeout 300] [--smoke-kill]   (as root; Markdown)

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


def smoke_kill() -> tuple[float, float, int]:
    """The CI-sized smoke run through SLURM, `kill -9` of its controller right after step 1's save:
    (seconds until no job of the run is active, until no process of it is left, jobs it had)."""
    import os
    import signal

    from examples.tau2.slurm import queue
    from examples.tau2.slurm.registry import JobRegistry, job_name_prefix

    root = Path(tempfile.mkdtemp(prefix="tau2-bench-kill-"))
    cmd = [sys.executable, "-m", "examples.tau2.cpu.smoke", "scheduler.type=slurm",
           f"cluster.fileroot={root}", f"cluster.name_resolve.nfs_record_root={root}/nr",
           "total_train_steps=2", "gconfig.n_samples=3", "econfig.max_steps=8", "seed=7"]
    with (root / "run.log").open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    while not any((root / "checkpoints").glob("*/*/*/recover_info/step_info.json")):
        if proc.poll() is not None:
            raise RuntimeError(f"the smoke run ended first (log {root / 'run.log'})")
        time.sleep(0.2)
    jobs = JobRegistry.of_trial(str(root), "tau2-smoke-cpu", "run").job_ids()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    while [j for j in queue.jobs_named(job_name_prefix("tau2-smoke-cpu", "run")) if j.active]:
        time.sleep(0.1)
    jobs_gone = time.monotonic() - killed
    import psutil

    while [p for p in psutil.process_iter(["cmdline"]) if str(root) in " ".join(p.info["cmdline"] or [])]:
        time.sleep(0.1)
    return jobs_gone, time.monotonic() - killed, len(jobs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--stock-timeout", type=float, default=300.0)
    parser.add_argument("--smoke-kill", action="store_true",
                        help="also time kill -9 of a CI-sized smoke run's controller until its jobs are gone")
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
        if args.smoke_kill:
            jobs_gone, all_gone, jobs = smoke_kill()
    for name, (took, said) in results.items():
        print(f"| {name} | {took:.1f} | {said[:160]} |")
    ratio = results["areal"][0] / results["project"][0]
    print(f"\nAReaL's scheduler / the project's: {ratio:.0f}x longer to fail")
    if args.smoke_kill:
        print(f"\nkill -9 of the smoke run's controller after step 1's save: its {jobs} jobs ended "
              f"{jobs_gone:.1f} s later, its last process {all_gone:.1f} s later")
    return 0


if __name__ == "__main__":
    sys.exit(main())
