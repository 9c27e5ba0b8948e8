"""The SLURM client commands the project needs (`squeue`, `sinfo`, `scancel`, `scontrol`), typed.

AReaL 1.0.4's own helpers (`areal.infra.utils.slurm`) map job states through a fixed table that lacks
several of SLURM's (`CONFIGURING`, `NODE_FAIL`, `PREEMPTED`, `SUSPENDED`, ... raise `KeyError`) and drop
the pending reason; these keep SLURM's own words, which is what a user needs to read.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass

RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING"})
"""States in which a job's processes run on. COMPLETING is not one: the job has ended (cancelled, failed
or done) and SLURM is killing what is left, for up to `KillWait`; its workers answer no more calls."""
ACTIVE_STATES = RUNNING_STATES | {"COMPLETING", "PENDING", "REQUEUED", "RESIZING", "SUSPENDED", "STOPPED",
                                  "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
"""States in which a job still holds (or waits for) resources; every other state is final."""
NEVER_SCHEDULED_REASONS = frozenset({"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit",
                                     "BadConstraints", "InvalidAccount", "InvalidQOS", "AssocMaxJobsLimit",
                                     "QOSMaxCpuPerJobLimit", "QOSMaxGRESPerJob", "QOSMaxMemoryPerJob",
                                     "QOSMaxNodePerJobLimit", "PartitionDown", "PartitionInactive",
                                     "NodeDown", "ReqNodeNotAvail", "DependencyNeverSatisfied"})
"""Pending reasons that mean the job will not start by itself (a config or partition problem)."""
COMMAND_TIMEOUT_S = 30.0
SEP = "|"


class SlurmError(RuntimeError):
    """A SLURM command failed or SLURM is not reachable; the message says which and why."""


@dataclass(frozen=True)
class JobStatus:
    """One job as `squeue` reports it."""

    job_id: int
    state: str
    """SLURM's state name, e.g. PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, NODE_FAIL."""
    reason: str
    """Why it pends, or why it ended (`None` when SLURM gives none)."""
    nodes: str
    """The node list it runs (or ran) on; empty while pending."""
    name: str

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES

    @property
    def never_starts(self) -> bool:
        """Pending for a reason no wait fixes (of `ReqNodeNotAvail, UnavailableNodes:n1`, the first word)."""
        return self.state == "PENDING" and self.reason.split(",")[0].strip() in NEVER_SCHEDULED_REASONS

    def describe(self) -> str:
        where = f" on {self.nodes}" if self.nodes and self.nodes != "(null)" else ""
        why = f" ({self.reason})" if self.reason and self.reason != "None" else ""
        return f"SLURM job {self.job_id} ({self.name}) is {self.state}{why}{where}"


@dataclass(frozen=True)
class NodeInfo:
    """One node as `sinfo` reports it."""

    name: str
    partition: str
    default_partition: bool
    cpus: int
    memory_mb: int
    gpus: int
    """GPUs of its generic resources (`gpu` or `gpu:<type>` GRES); 0 without any."""
    state: str

    @property
    def usable(self) -> bool:
        return not any(s in self.state for s in ("down", "drain", "fail", "inval", "unk"))


@dataclass(frozen=True)
class Allocation:
    """How SLURM shares a node between jobs (`scontrol show config`)."""

    whole_nodes: bool
    """`select/linear`: every job gets whole nodes, however little it asks."""
    memory: bool
    """Memory is a consumable resource (a `SelectTypeParameters` with `MEMORY`): jobs share a node's."""


def allocation() -> Allocation:
    """This cluster's `Allocation`; raises `SlurmError` when `scontrol` does not answer."""
    pairs = (line.split("=", 1) for line in run("scontrol", "show", "config").splitlines() if "=" in line)
    settings = {k.strip(): v.strip() for k, v in pairs}
    return Allocation(whole_nodes=settings.get("SelectType", "") == "select/linear",
                      memory="MEMORY" in settings.get("SelectTypeParameters", "").upper())


def available() -> bool:
    """Whether SLURM's client commands are on this machine's PATH."""
    return all(shutil.which(c) for c in ("sbatch", "squeue", "scancel", "sinfo"))


def run(*args: str, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """A SLURM command's stdout; raises `SlurmError` with its stderr when it fails."""
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):  # SLURM's clients would retry for a minute, then fail
        raise SlurmError(f"SLURM_CONF={conf} does not exist")
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise SlurmError(f"`{args[0]}` is not installed on this machine (no SLURM client)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(args)}` did not answer within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        said = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise SlurmError(f"`{args[0]}` failed: {'; '.join(said)[:400] or f'exit status {done.returncode}'}")
    return done.stdout


def query_jobs(job_ids: list[int]) -> dict[int, JobStatus]:
    """The status of each of `job_ids` that SLURM still knows (finished jobs stay for `MinJobAge`)."""
    if not job_ids:
        return {}
    out = run("squeue", "-h", "-t", "all", "-j", ",".join(map(str, job_ids)),
              "-o", SEP.join(("%i", "%T", "%r", "%N", "%j")))
    return {j.job_id: j for j in _parse_jobs(out)}


def jobs_named(prefix: str, user: str | None = None) -> list[JobStatus]:
    """This user's jobs whose name starts with `prefix`, in any state SLURM still remembers."""
    out = run("squeue", "-h", "-t", "all", "-u", user or getpass.getuser(),
              "-o", SEP.join(("%i", "%T", "%r", "%N", "%j")))
    return [j for j in _parse_jobs(out) if j.name.startswith(prefix)]


def time_left_s(job_id: int) -> float | None:
    """Seconds before `job_id` reaches its time limit (None: it has none, or SLURM does not say)."""
    return duration_s(run("squeue", "-h", "-j", str(job_id), "-o", "%L").strip())


def duration_s(text: str) -> float | None:
    """SLURM's `[D-][HH:]MM:SS` in seconds; None for anything else (`UNLIMITED`, `INVALID`, '')."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text)
    if not m:
        return None
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _parse_jobs(out: str) -> list[JobStatus]:
    jobs = []
    for line in out.splitlines():
        parts = line.strip().split(SEP, 4)
        if len(parts) == 5 and parts[0].isdigit():
            jobs.append(JobStatus(int(parts[0]), parts[1], parts[2], parts[3], parts[4]))
    return jobs


def cancel(job_ids: list[int], wait_s: float = 30.0, grace_s: float = 5.0,
           poll_s: float = 0.5) -> list[JobStatus]:
    """Cancel `job_ids` in whatever state they are (pending ones too: `scancel` without a signal, which
    SIGTERMs the running ones); after `grace_s` SIGKILL what still runs, and wait up to `wait_s` in all
    for them to leave the active states. Returns those still active then."""
    if not job_ids:
        return []
    _scancel(*map(str, job_ids))
    start = time.monotonic()
    killed = False
    while True:
        left = [j for j in query_jobs(job_ids).values() if j.active]
        elapsed = time.monotonic() - start
        if not left or elapsed >= wait_s:
            return left
        running = [str(j.job_id) for j in left if j.state == "RUNNING"]  # a signal to a pending job: refused
        if not killed and elapsed >= grace_s and running:
            _scancel("--signal=KILL", "--full", *running)
            killed = True
        time.sleep(poll_s)


def _scancel(*args: str) -> None:
    try:
        run("scancel", *args)
    except SlurmError as e:
        if "Invalid job id" not in str(e) and "already completing" not in str(e):  # gone, or going
            raise


def nodes(partition: str | None = None) -> list[NodeInfo]:
    """The nodes of `partition` (default: the default partition, or every node if none is marked)."""
    out = run("sinfo", "-h", "-N", "-o", SEP.join(("%N", "%P", "%c", "%m", "%G", "%t")))
    found = []
    for line in out.splitlines():
        parts = line.strip().split(SEP)
        if len(parts) != 6:
            continue
        name, part, cpus, mem, gres, state = parts
        found.append(NodeInfo(name, part.rstrip("*"), part.endswith("*"), int(cpus),
                              int(mem.rstrip("+") or 0), _gpus(gres), state))
    wanted = partition or os.environ.get("SBATCH_PARTITION")
    if wanted:
        return [n for n in found if n.partition == wanted]
    default = [n for n in found if n.default_partition]
    return default or found


def _gpus(gres: str) -> int:
    """GPUs in a GRES string such as `gpu:8`, `gpu:h100:8(S:0-1)` or `(null)`."""
    total = 0
    for item in gres.split(","):
        fields = item.split("(")[0].split(":")
        if fields[0] == "gpu" and len(fields) >= 2 and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def job_log_tail(path: str, lines: int = 20) -> str:
    """The last `lines` lines of a worker's log, or a note that there is none yet."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            tail = f.readlines()[-lines:]
    except OSError:
        return f"(no log at {path})"
    return "".join(tail).rstrip() or f"({path} is empty)"


def unreachable() -> str:
    """'' when SLURM answers from this machine; else why not and what to do (one sentence)."""
    if not available():
        return ("scheduler.type=slurm but this machine has no SLURM client (sbatch, squeue, sinfo); run from "
                "a login node, or bring up a local one: bash examples/tau2/tau2_rl.sh slurm-local up")
    try:
        nodes()
    except SlurmError as e:
        return (f"scheduler.type=slurm but SLURM does not answer ({e}); check SLURM_CONF, or bring up a "
                "local one: bash examples/tau2/tau2_rl.sh slurm-local up")
    return ""
