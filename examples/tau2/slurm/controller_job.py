"""The training controller as a SLURM job of its own (`tau2_rl.sh slurm --submit`, `smoke --submit`): login
nodes end long processes, and a job's controller outlives the user's session, its time limit and
preemption (it requeues itself: slurm/requeue.py).

    python -m examples.tau2.slurm.controller_job --check [--entry train|smoke] [--signal SIG@S] [ARGS...]
    python -m examples.tau2.slurm.controller_job [--entry train|smoke] [--max-requeues N] [--signal SIG@S] \\
        ARGFILE

`--check`, run by `tau2_rl.sh` before `sbatch`: the entry's own pre-flight (`tau2_train.py`'s: the
config, the add-ons' services: what plain `tau2_rl.sh slurm` checks before it starts anything; or the smoke
run's), whether a node can ever run the controller's own job as `TAU2_CONTROLLER_SBATCH` asks (its
`--cpus-per-task`, `--mem` and `--partition`, against `sinfo`; on the workers' partition, beside their
jobs), and whether its `--time` leaves room for the warning signal. It prints the problems, one sentence
each; exit status 0 means submit.

ARGFILE holds the entry's arguments, NUL-separated, written by `tau2_rl.sh` readable only by its user (any
override, however quoted, stays one argument; the proxy's admin key comes with the job's environment,
`TAU2_ADMIN_KEY`, never on a command line). Every incarnation of the job reads it; it is deleted when the
run ends for good (finished, refused, or not requeued again). The controller runs as the entry does;
`scancel` of this job sends it SIGTERM, on which it stops its workers and cancels their jobs
(`runtime.process.exit_on_sigterm`), as on any other exit; SLURM's warning signal and a failure during the
run make it requeue its own job (slurm/requeue.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import re
import signal
import sys
import traceback
from pathlib import Path

from areal.infra.scheduler.exceptions import WorkerFailedError

from examples.tau2.lifecycle.watchdog import CONTROL, InferenceServerDied, StopRequested, WorkerJobEnded
from examples.tau2.runtime.console import console_logging
from examples.tau2.runtime.process import ON_SIGTERM, exit_after
from examples.tau2.slurm import queue, requeue
from examples.tau2.slurm.plan import CONTROLLER_JOB, JobRequest, unschedulable
from examples.tau2.slurm.requeue import Cause, Journal, WarningSignal
from examples.tau2.slurm.scheduler import WorkerJobCannotStart

logger = logging.getLogger("tau2_areal.slurm")

ENTRIES = {"train": "examples.tau2.tau2_train", "smoke": "examples.tau2.cpu.smoke"}
"""What a controller job runs: the module whose `main(argv)` it calls and whose `preflight` checks it
(named, not imported here: the smoke run is a CPU add-on, above this one)."""

SBATCH_ENV = "TAU2_CONTROLLER_SBATCH"
DEFAULT_SBATCH = "--cpus-per-task=4 --mem=32G"
"""The controller job's sbatch options when `TAU2_CONTROLLER_SBATCH` is unset (tau2_rl.sh's default)."""
EXAMPLE_SBATCH = "--cpus-per-task=1 --mem=4G"
_SHORT = {"-c": "cpus-per-task", "-p": "partition", "-t": "time"}
_LONG = ("cpus-per-task", "mem", "mem-per-cpu", "partition", "time")
_MB_PER_UNIT = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def read_args(path: Path) -> list[str]:
    """The arguments in `path` (NUL-separated); the file stays for the job's next incarnation."""
    return [a.decode() for a in path.read_bytes().split(b"\0") if a]


def sbatch_values(options: str) -> dict[str, str]:
    """The values of the options the check reads (`--cpus-per-task`/`-c`, `--mem`, `--mem-per-cpu`,
    `--partition`/`-p`, `--time`/`-t`, as `--opt=V`, `--opt V`, `-cV` or `-c V`) in `options`, split on
    whitespace as tau2_rl.sh passes them to sbatch; the last of each counts, as with sbatch."""
    tokens = options.split()
    values: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        token, i = tokens[i], i + 1
        name, value = "", None
        if token.startswith("--"):
            key, eq, given = token[2:].partition("=")
            name, value = (key, given if eq else None) if key in _LONG else ("", None)
        elif token[:2] in _SHORT:
            name, value = _SHORT[token[:2]], token[2:] or None
        if not name:
            continue
        if value is None:
            value, i = (tokens[i], i + 1) if i < len(tokens) else ("", i)
        values[name] = value
    return values


def size_mb(value: str, option: str) -> int:
    """SLURM's size (`32G`, `4096`: MB by default, K/M/G/T) in MB; ValueError names `option`."""
    m = re.fullmatch(r"(\d+)([KMGT]?)B?", value.strip().upper())
    if not m:
        raise ValueError(f"{option}={value} is not a size sbatch reads (e.g. 32G, 4096M)")
    return int(int(m.group(1)) * _MB_PER_UNIT[m.group(2) or "M"])


def time_limit_s(value: str) -> float | None:
    """sbatch's `--time` (`M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`) in seconds; None for no limit
    (`UNLIMITED`, `INFINITE`). ValueError for anything else."""
    text = value.strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        raise ValueError(f"--time={value} is not a time limit sbatch reads (e.g. 30, 4:00:00, 1-00:00:00)")
    days, first, second, third = (int(g) if g is not None else None for g in m.groups())
    if days is not None:  # D-H, D-H:M, D-H:M:S
        hours, mins, secs = first, second or 0, third or 0
    elif third is not None:  # H:M:S
        hours, mins, secs = first, second, third
    else:  # M, M:S
        hours, mins, secs = 0, first, second or 0
    return float((((days or 0) * 24 + hours) * 60 + mins) * 60 + secs)


def time_problem(options: str, warning: WarningSignal) -> str:
    """'' when the `--time` of `options` (if any) leaves the warning signal room: SLURM sends it `grace` s
    before the limit, up to a minute early, so a limit of at most grace + 1 min warns each incarnation as
    it starts, and none trains a step. Else why not, in one sentence."""
    value = sbatch_values(options).get("time")
    if value is None:
        return ""
    try:
        limit = time_limit_s(value)
    except ValueError as e:
        return f'{SBATCH_ENV}="{options}" is not a request sbatch takes: {e}'
    least = warning.grace_s + requeue.SIGNAL_EARLY_S
    if limit is None or limit > least:
        return ""
    shorter = (f", or a shorter --signal (e.g. {warning.name}@{int(limit - requeue.SIGNAL_EARLY_S) // 2})"
               if limit > 2 * requeue.SIGNAL_EARLY_S else "")
    return (f"--time={value} ({limit:.0f} s) leaves no room for the warning signal {warning.name}@"
            f"{warning.grace_s}, which SLURM sends {warning.grace_s} s before the time limit and up to a "
            "minute early, so every incarnation would be told to stop as it starts; set "
            f"{SBATCH_ENV}'s --time above {least:.0f} s ({least / 60:.1f} min){shorter}")


def controller_request(options: str) -> tuple[JobRequest, list[str]]:
    """(the controller's job as `options` ask for it, the partitions they name: [] for the default).
    Raises ValueError, naming the option, for a value sbatch would refuse."""
    values = sbatch_values(options)
    cpus = values.get("cpus-per-task", "1")
    if not cpus.isdigit() or int(cpus) < 1:
        raise ValueError(f"--cpus-per-task={cpus} is not a number of CPUs")
    if "mem" in values:
        mem_mb = size_mb(values["mem"], "--mem")
    else:  # no request: SLURM's default (DefMemPerNode, often all of a node) is not known here
        mem_mb = size_mb(values.get("mem-per-cpu", "0"), "--mem-per-cpu") * int(cpus)
    partitions = [p for p in values.get("partition", "").split(",") if p]
    request = JobRequest(role="controller", nodes=1, tasks_per_node=1, cpus_per_task=int(cpus),
                         mem_mb_per_node=mem_mb, gpus_per_node=0)
    return request, partitions


def controller_problem(options: str) -> str:
    """'' when a node can run the controller's own job as `options` (TAU2_CONTROLLER_SBATCH) ask; else why
    not and what to set, in one sentence. '' too when SLURM does not answer (the SLURM add-on says so)."""
    setting = f'{SBATCH_ENV}="{options}"'
    try:
        request, partitions = controller_request(options)
    except ValueError as e:
        return f'{setting} is not a request sbatch takes: {e}; set {SBATCH_ENV}, e.g. to "{DEFAULT_SBATCH}"'
    if not queue.available():
        return ""
    try:
        nodes = [n for p in partitions or [None] for n in queue.nodes(p)]
    except queue.SlurmError:
        return ""
    if not nodes:
        where = f"partition {','.join(partitions)}" if partitions else "the default partition"
        return (f"SLURM reports no node in {where} for the controller job ({setting}); set {SBATCH_ENV}'s "
                "--partition to one that `sinfo` lists")
    return unschedulable(request, nodes, fix=(
        f"set {SBATCH_ENV} (now \"{options}\") to --cpus-per-task and --mem that one node has, with room "
        f"for the run's other jobs if they share it, e.g. \"{EXAMPLE_SBATCH}\""))


def check(argv: list[str]) -> int:
    """`tau2_rl.sh slurm --submit` before `sbatch`: the entry's own pre-flight of the run (a `--dry-run` in
    `argv` is left to the job; the run is checked as it would start), with the controller job's request,
    its place beside the workers' jobs and its time limit among its problems. Prints them; 0 means
    submit."""
    entry, warning = "train", requeue.DEFAULT_WARNING
    while argv[:1] in (["--entry"], ["--signal"]) and len(argv) > 1:
        entry, warning = (argv[1], warning) if argv[0] == "--entry" else (entry, argv[1])
        argv = argv[2:]
    module = importlib.import_module(ENTRIES[entry])
    options = os.environ.get(SBATCH_ENV) or DEFAULT_SBATCH
    controller = controller_problem(options)
    try:
        timing = time_problem(options, WarningSignal.parse(warning))
    except ValueError as e:
        timing = str(e)
    more = [p for p in (controller, timing) if p]
    if entry == "train":
        from examples.tau2.settings.config import pop_dry_run

        _, argv = pop_dry_run(argv)
    beside_workers = CONTROLLER_JOB.set(None if controller else controller_on_workers_partition(options))
    try:
        _, status = module.preflight(argv, more=more)
    finally:
        CONTROLLER_JOB.reset(beside_workers)
    if status == 2 and more:  # a config that does not load: these are still worth knowing
        for problem in more:
            print(f"controller_job: {problem}", file=sys.stderr)
    return status


def controller_on_workers_partition(options: str) -> JobRequest | None:
    """The controller's job as `options` ask for it when it runs on the workers' partition (it names none,
    or theirs), where it takes a node's share beside their jobs; else None."""
    try:
        request, partitions = controller_request(options)
        workers = queue.nodes()
    except (ValueError, queue.SlurmError):
        return None
    return request if not partitions or (workers and partitions == [workers[0].partition]) else None


def parse_job_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m examples.tau2.slurm.controller_job")
    parser.add_argument("--entry", choices=sorted(ENTRIES), default="train")
    parser.add_argument("--max-requeues", type=int, default=requeue.MAX_REQUEUES)
    parser.add_argument("--signal", type=WarningSignal.parse, default=requeue.DEFAULT_WARNING)
    parser.add_argument("argfile", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--check"]:
        return check(argv[1:])
    opts = parse_job_args(argv)
    job = int(os.environ.get("SLURM_JOB_ID") or 0)
    restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    console_logging(logger)
    journal = Journal.beside(opts.argfile)
    earlier = journal.endings()
    print(f"controller_job: SLURM job {job} on {os.uname().nodename}"
          + (f", incarnation {restart + 1}" if restart else ""), flush=True)
    if restart:
        print(f"controller_job: {requeue.describe_resume(earlier, restart, opts.max_requeues)}", flush=True)
        CONTROL.on_first_step = lambda: print(
            f"controller_job: {requeue.describe_first_step(earlier, restart)}", flush=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a batch job may inherit SIGINT ignored
    warning = requeue.WarningHandler(job, opts.signal)
    warning.install()
    # SIGTERM: scancel, or SLURM requeues the job (scontrol requeue, preemption): noted before the clean-up,
    # which SLURM may cut short; the arguments file stays for a next incarnation.
    ON_SIGTERM.append(lambda: journal.append(requeue.ending(
        restart, Cause.TERMINATED, "SIGTERM to the controller: scontrol requeue, preemption or scancel",
        warning.signal_at)))
    module = importlib.import_module(ENTRIES[opts.entry])
    try:
        status = module.main(read_args(opts.argfile))
    except (StopRequested, KeyboardInterrupt) as e:
        if not CONTROL.stop_reason or warning.cause is None:
            raise
        detail = str(e) or (f"{CONTROL.stop_reason}; interrupted before a step's end (the steps since "
                            "the last save run again)")
        return requeue_or_stop(job, restart, opts, journal, earlier, warning.cause, detail, warning.signal_at)
    except Exception as e:
        traceback.print_exc()
        cause = (Cause.UNSCHEDULABLE if isinstance(e, WorkerJobCannotStart) else
                 Cause.WORKER_LOST if isinstance(e, (WorkerJobEnded, WorkerFailedError)) else
                 Cause.SERVER_DIED if isinstance(e, InferenceServerDied) else Cause.FAILED)
        return requeue_or_stop(job, restart, opts, journal, earlier, cause, summary(e), warning.signal_at)
    opts.argfile.unlink(missing_ok=True)
    return status


def summary(e: BaseException) -> str:
    """`Type: first line` of an exception; for AReaL's `WorkerFailedError`, the first line of the worker's
    story (slurm/scheduler.py names the job, its state and node there) rather than its exit code."""
    text = getattr(e, "stderr", "") or str(e)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {first}"[:500]


def requeue_or_stop(job: int, restart: int, opts: argparse.Namespace, journal: Journal,
                    earlier: list[requeue.Ending], cause: Cause, detail: str, signal_at: float | None) -> int:
    """After the run stopped (its workers stopped and their jobs cancelled): requeue this job, or, past the
    bound, say why not and end for good (status 1)."""
    end = requeue.ending(restart, cause, detail, signal_at, requeued=True)
    why_not = requeue.why_not_requeue(earlier, end, opts.max_requeues) if job else "not a SLURM job"
    saved = f"step {end.saved_step} saved" if end.saved_step else "no step saved"
    if why_not:
        journal.append(dataclasses.replace(end, requeued=False))
        print(f"controller_job: stopped for good after {cause.value} ({detail}); {saved}; not requeued: "
              f"{why_not}", flush=True)
        opts.argfile.unlink(missing_ok=True)
        return 1
    journal.append(end)
    print(f"controller_job: requeue {restart + 1} of at most {opts.max_requeues}: {cause.value} ({detail}); "
          f"{saved}, {end.steps_lost} step(s) lost; requeueing SLURM job {job}", flush=True)
    requeue.requeue_job(job)
    return 0


if __name__ == "__main__":
    exit_after(main)
