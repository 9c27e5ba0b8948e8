"""The training controller as a SLURM job of its own (`tau2_rl.sh slurm --submit`): login nodes end long
processes, and a job's controller outlives the user's session.

    python -m examples.tau2.slurm.controller_job --check [TAU2_TRAIN ARGS...]
    python -m examples.tau2.slurm.controller_job ARGFILE

`--check`, run by `tau2_rl.sh` before `sbatch`: the pre-flight of `tau2_train.py` (the config, the add-ons'
services: what plain `tau2_rl.sh slurm` checks before it starts anything), and whether a node can ever run
the controller's own job as `TAU2_CONTROLLER_SBATCH` asks (its `--cpus-per-task`, `--mem` and
`--partition`, against `sinfo`). It prints the problems, one sentence each; exit status 0 means submit.

ARGFILE holds `tau2_train.py`'s arguments, NUL-separated, written by `tau2_rl.sh` readable only by its
user (any override, however quoted, stays one argument; the proxy's admin key comes with the job's
environment, `TAU2_ADMIN_KEY`, never on a command line); it is deleted once read. The
controller then runs as `tau2_train.py` does; `scancel` of this job sends it SIGTERM, on which it stops its
workers and cancels their jobs (`runtime.process.exit_on_sigterm`), as on any other exit.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from examples.tau2.runtime.process import exit_after
from examples.tau2.slurm import queue
from examples.tau2.slurm.plan import JobRequest, unschedulable

SBATCH_ENV = "TAU2_CONTROLLER_SBATCH"
DEFAULT_SBATCH = "--cpus-per-task=4 --mem=32G"
"""The controller job's sbatch options when `TAU2_CONTROLLER_SBATCH` is unset (tau2_rl.sh's default)."""
EXAMPLE_SBATCH = "--cpus-per-task=1 --mem=4G"
_SHORT = {"-c": "cpus-per-task", "-p": "partition"}
_LONG = ("cpus-per-task", "mem", "mem-per-cpu", "partition")
_MB_PER_UNIT = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def read_args(path: Path) -> list[str]:
    """The arguments in `path` (NUL-separated), which is then removed."""
    try:
        data = path.read_bytes()
    finally:
        path.unlink(missing_ok=True)
    return [a.decode() for a in data.split(b"\0") if a]


def sbatch_values(options: str) -> dict[str, str]:
    """The values of the options the check reads (`--cpus-per-task`/`-c`, `--mem`, `--mem-per-cpu`,
    `--partition`/`-p`, as `--opt=V`, `--opt V`, `-cV` or `-c V`) in `options`, split on whitespace as
    tau2_rl.sh passes them to sbatch; the last of each counts, as with sbatch."""
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
    """`tau2_rl.sh slurm --submit` before `sbatch`: `tau2_train`'s own pre-flight of the run (a `--dry-run`
    in `argv` is left to the job; the run is checked as it would start), with the controller job's request
    among its problems. Prints them; 0 means submit."""
    from examples.tau2 import tau2_train
    from examples.tau2.settings.config import pop_dry_run

    _, argv = pop_dry_run(argv)
    controller = controller_problem(os.environ.get(SBATCH_ENV) or DEFAULT_SBATCH)
    _, status = tau2_train.preflight(argv, more=[controller] if controller else [])
    if status == 2 and controller:  # a config that does not load: the request is still worth knowing
        print(f"controller_job: {controller}", file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--check"]:
        return check(argv[1:])
    if len(argv) != 1:
        print("usage: python -m examples.tau2.slurm.controller_job --check [ARGS...] | ARGFILE",
              file=sys.stderr)
        return 2
    from examples.tau2 import tau2_train

    job = os.environ.get("SLURM_JOB_ID", "?")
    print(f"controller_job: SLURM job {job} on {os.uname().nodename}", flush=True)
    return tau2_train.main(read_args(Path(argv[0])))


if __name__ == "__main__":
    exit_after(main)
