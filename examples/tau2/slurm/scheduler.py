"""AReaL 1.0.4's `SlurmScheduler` as the config describes it: with or without a container, failing fast.

AReaL's `PPOTrainer._init_scheduler` builds `SlurmScheduler(exp_config=config)`, whose job script ignores
most of the config and hides failures; `Tau2PPOTrainer._init_scheduler` builds `Tau2SlurmScheduler`, which
keeps AReaL's scheduler (worker discovery, RPC,
forking of the proxies, engine calls) and replaces what a first cluster run hits:

1. Containers: AReaL runs every worker as `singularity exec --bind /storage:/storage <image>` and never
   reads the spec's `container_type`, `mount` or `srun_additional_args` (`_generate_sbatch_script`, ~line
   898). Here each role's `scheduling_spec[0]` decides: `container_type: apptainer` (its `image`, `mount`)
   or `none` (native), with its own srun arguments.
2. Environment: AReaL passes the spec's `env_vars` (PYTHONPATH, thread counts, the proxy's rendering)
   only as `singularity --env K=V`, unquoted, so native workers never get them, and it sets PYTHONPATH to
   the controller's `sys.path`, which inside a container shadows the image's packages. Here they are
   exported in the job script natively and passed as `--env` in a container, quoted in both; a container
   keeps the spec's PYTHONPATH (default: this checkout).
3. Interpreter: AReaL runs `python3` from whatever PATH the job has, and forks the proxies with the
   controller's `sys.executable` even inside a container. Here a native worker and its forks run the
   controller's interpreter (as AReaL's LocalScheduler does), a container's the spec's `cmd` (the image's).
4. A worker that dies at start: AReaL's job script pipes `srun` into `tee`, so the job ends COMPLETED, and
   only FAILED or CANCELLED end the wait: 300 s and no reason. Here the script sets `pipefail`, and any
   final state, or a PENDING reason no wait fixes, fails the wait at once, naming the job, its state and
   node, with the tail of the worker's log.
5. A busy queue: AReaL's 300 s wait for a role's workers (`get_workers`) counts from submission, so a job
   that pends behind other users' jobs fails the run. Here a job pending for a reason that can clear
   (Priority, Resources, QOS limits, ...) is waited for, up to `TAU2_PENDING_LIMIT` (default 24 h), with a
   line every minute; AReaL's wait (`TAU2_WORKER_START_TIMEOUT`, default 300 s) starts once it runs.
6. Clean-up: AReaL's `delete_workers` signals RUNNING jobs only (pending ones stay queued) and sleeps 2 s
   per role. Here the job is cancelled in any state, and the call returns once SLURM has ended it.
7. Resources: `cluster.n_gpus_per_node=0` divides by zero in `create_workers`, and a job no node can run is
   submitted anyway (PENDING until the timeout, or refused by `sbatch` without naming the role). Here
   CPU-only clusters work, and each job's request is compared with `sinfo` before `sbatch`.

Every job id goes to the run's `JobRegistry` as soon as `sbatch` returns it, for the reaper and reruns.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from areal.api import Job, Worker
from areal.api.cli_args import SchedulingSpec
from areal.infra.scheduler.exceptions import WorkerCreationError, WorkerFailedError, WorkerNotFoundError
from areal.infra.scheduler.slurm import SlurmScheduler
from areal.infra.utils.proc import build_streaming_log_cmd

from examples.tau2.slurm import queue
from examples.tau2.slurm.plan import JobRequest, unschedulable
from examples.tau2.slurm.registry import JobRegistry

logger = logging.getLogger("tau2_areal.slurm")

CONTAINER_TYPES = ("apptainer", "none")
NO_MOUNT = ("", "none")
HEALTH_CHECK_INTERVAL_S = 1.0
"""AReaL polls job state and worker health every 5 s; 1 s makes a failed start visible within seconds."""
LOG_TAIL_LINES = 20
PENDING_LIMIT_ENV = "TAU2_PENDING_LIMIT"
DEFAULT_PENDING_LIMIT = "24h"
"""On a shared cluster jobs pend for minutes or hours; a day is past any queue that will ever start them."""
START_TIMEOUT_ENV = "TAU2_WORKER_START_TIMEOUT"
PENDING_POLL_S = 5.0
PENDING_LOG_EVERY_S = 60.0
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class WorkerJobCannotStart(WorkerFailedError):
    """A role's job pends for a reason no wait clears, or past the pending limit: it was cancelled, and a
    requeue of the controller would only pend again (slurm/controller_job.py stops for good on it)."""


def duration_setting_s(text: str, name: str) -> float:
    """`90`, `90s`, `30m`, `24h` or `2d` in seconds; ValueError naming `name` for anything else."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", text.strip().lower())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{name}={text} is not a positive duration; set it like 90s, 30m, 24h or 2d")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def pending_limit_s() -> float:
    """How long a worker job may pend (`TAU2_PENDING_LIMIT`, `tau2_rl.sh ... --pending-limit`)."""
    return duration_setting_s(os.environ.get(PENDING_LIMIT_ENV) or DEFAULT_PENDING_LIMIT, PENDING_LIMIT_ENV)


def start_timeout_s() -> float | None:
    """How long a worker may take from its job's start to answering (`TAU2_WORKER_START_TIMEOUT`; None:
    AReaL's 300 s)."""
    value = os.environ.get(START_TIMEOUT_ENV)
    return duration_setting_s(value, START_TIMEOUT_ENV) if value else None


def why(status: queue.JobStatus) -> str:
    """A pending job's reason; SLURM gives `None` until its scheduler has looked at the job."""
    return status.reason if status.reason not in ("", "None") else "not scheduled yet"


def minutes(seconds: float) -> str:
    """`45 s`, `4 min`, `24 h`: how long a job pended, or may."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 3600:g} h" if seconds % 3600 == 0 else f"{seconds // 60:.0f} min"


def worker_interpreter(spec: SchedulingSpec) -> str:
    """The Python a worker runs: natively the controller's own (as AReaL's LocalScheduler does), in a
    container the image's, as the spec's `cmd` names it."""
    first = shlex.split(spec.cmd or "python3")[0]
    if spec.container_type == "none" and first.startswith("python"):
        return sys.executable
    return first


def worker_command(spec: SchedulingSpec) -> str:
    """The spec's `cmd` with its interpreter resolved (`worker_interpreter`)."""
    words = shlex.split(spec.cmd or "python3 -m areal.infra.rpc.rpc_server")
    if words[0].startswith("python"):
        words[0] = worker_interpreter(spec)
    return shlex.join(words)


def container_prefix(spec: SchedulingSpec, env: dict[str, str]) -> str:
    """`singularity exec ... IMAGE` with the spec's mount and every variable quoted, or '' natively."""
    if spec.container_type == "none":
        return ""
    words = ["singularity", "exec", "--no-home", "--writable-tmpfs", "--nv"]
    if spec.mount not in NO_MOUNT:
        words += ["--bind", spec.mount]
    for key, value in env.items():
        words += ["--env", f"{key}={value}"]
    return shlex.join([*words, spec.image])


class Tau2SlurmScheduler(SlurmScheduler):
    """AReaL's SlurmScheduler with the config's container settings, fast failures, full clean-up and a
    job registry (the module docstring lists each change)."""

    def __init__(self, exp_config: Any):
        start_timeout = start_timeout_s()
        super().__init__(exp_config=exp_config, health_check_interval=HEALTH_CHECK_INTERVAL_S,
                         **({"startup_timeout": start_timeout} if start_timeout else {}))
        self.pending_limit_s = pending_limit_s()
        self.registry = JobRegistry.of_trial(self.fileroot, self.experiment_name, self.trial_name)

    @property
    def n_gpus_per_node(self) -> int:
        """For AReaL's node arithmetic, which divides by it: a CPU-only cluster (0) counts as 1, and
        `create_workers` refuses any GPU request there first, so no `--gres` is ever asked of it."""
        return self._n_gpus_per_node or 1

    # -----------------------------------------------------------------------------------------
    # Submission

    def create_workers(self, job: Job, *args: Any, **kwargs: Any) -> list[str]:
        spec = job.tasks[0] if job.tasks else None
        if spec is not None and job.scheduling_strategy.type != "colocation":
            self._refuse_unschedulable(job.role, spec, job.replicas)
        worker_ids = super().create_workers(job, *args, **kwargs)
        job_id = self._jobs.get(job.role)  # none for a colocated or forked role
        if job_id is not None:
            log = self._log_path_of(job.role)
            self.registry.record(job.role, job_id, log)
            logger.info("SLURM job %d runs role %s (log %s)", job_id, job.role, log)
        return worker_ids

    def _prepare_worker_specs(self, role: str, num_workers: int,
                              schedulings: list[SchedulingSpec] | None) -> list[SchedulingSpec]:
        """AReaL's, which sets every worker's PYTHONPATH to the controller's `sys.path`: right for a native
        worker, wrong in a container (the controller's venv and standard library would shadow the image's
        packages), where the spec's own PYTHONPATH is kept, or else this checkout (the working directory)."""
        configured = {id(s): (s.env_vars or {}).get("PYTHONPATH") for s in schedulings or []}
        specs = super()._prepare_worker_specs(role, num_workers, schedulings)
        for spec in schedulings or []:
            if spec.container_type != "none":
                spec.env_vars["PYTHONPATH"] = configured[id(spec)] or str(Path.cwd())
        return specs

    def _refuse_unschedulable(self, role: str, spec: SchedulingSpec, replicas: int) -> None:
        if spec.container_type not in CONTAINER_TYPES:
            raise WorkerCreationError(role, f"{role} scheduling_spec container_type={spec.container_type!r} "
                                            f"must be one of {', '.join(CONTAINER_TYPES)}")
        if self._n_gpus_per_node == 0 and spec.gpu > 0:
            raise WorkerCreationError(role, f"cluster.n_gpus_per_node is 0 (a CPU-only cluster) but the "
                                            f"{role} scheduling_spec asks for gpu={spec.gpu}")
        request = JobRequest.for_role(role, spec, replicas, self._n_gpus_per_node)
        try:
            problem = unschedulable(request, queue.nodes())
        except queue.SlurmError as e:
            logger.warning("could not compare the %s job with the cluster's nodes: %s", role, e)
            return
        if problem:
            raise WorkerCreationError(role, problem)

    def _generate_sbatch_script(self, role: str, replicas: int, nodes: int, total_gpus: int,
                                cpus_per_task: int, mem_per_task: int, schedulings: list[SchedulingSpec],
                                nodelist: str | None, exclude: str | None) -> str:
        """The job script: AReaL's directives and srun line, with the role's container settings, its
        environment in either mode, and the worker's exit status as the job's."""
        spec = schedulings[0]
        gpus = total_gpus > 0
        tasks_per_node = replicas // nodes if nodes > 0 else replicas
        directives = [f"--job-name={self._slurm_name(role)}", f"--output={self._log_path_of(role)}.sbatch",
                      "--no-requeue", f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}",
                      f"--cpus-per-task={cpus_per_task}", f"--mem={mem_per_task * tasks_per_node}M"]
        if gpus:
            directives.append(f"--gres=gpu:{self._n_gpus_per_node}")
        if nodelist:
            directives.append(f"--nodelist={nodelist}")
        if exclude:
            directives.append(f"--exclude={exclude}")

        rpc_flags = ["--experiment-name", self.experiment_name, "--trial-name", self.trial_name,
                     "--role", role, "--name-resolve-type", self.name_resolve_config.type,
                     "--nfs-record-root", self.name_resolve_config.nfs_record_root,
                     "--etcd3-addr", self.name_resolve_config.etcd3_addr]
        if self.fileroot:
            rpc_flags += ["--fileroot", str(self.fileroot)]
        inner = list(spec.additional_bash_cmds or [])
        if gpus:  # as AReaL: each task's GPUs from its local rank, before Python starts
            first = f"$((SLURM_LOCALID * {spec.gpu}))"
            devices = first if spec.gpu == 1 else \
                f"$(seq -s, {first} $((SLURM_LOCALID * {spec.gpu} + {spec.gpu - 1})))"
            inner[:0] = [f"export CUDA_VISIBLE_DEVICES={devices}",
                         "export ASCEND_RT_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"]
        inner.append(" ".join([worker_command(spec), *map(shlex.quote, rpc_flags)]))
        task = f"bash -c {shlex.quote(';'.join(inner))}"

        env = dict(spec.env_vars or {})
        prefix = container_prefix(spec, env)
        exports = "" if prefix else "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in env.items())
        mem_per_cpu = mem_per_task // cpus_per_task if cpus_per_task > 0 else mem_per_task
        srun_flags = [f"--nodes={nodes}", f"--ntasks={replicas}", f"--cpus-per-task={cpus_per_task}",
                      f"--mem-per-cpu={mem_per_cpu}M"]
        if gpus:
            srun_flags.append(f"--gres=gpu:{self._n_gpus_per_node}")
        srun = " ".join(["srun", spec.srun_additional_args, *srun_flags, *([prefix] if prefix else []), task])
        pipeline = build_streaming_log_cmd(srun, self._log_path_of(role), self._merged_log_path(), role)
        lines = "\n".join(f"#SBATCH {d}" for d in directives)
        mode = f"container {spec.image}" if prefix else "native, the controller's interpreter"
        return (f"#!/bin/bash\n{lines}\n\n# {role} workers ({mode}): examples/tau2/slurm/scheduler.py\n"
                f"# The job's exit status is the workers' (pipefail), not tee's.\nset -o pipefail\n"
                f"{exports}{pipeline}\n")

    async def _fork_single_worker(self, session: Any, role: str, idx: int, target_wi: Any, target_role: str,
                                  command: str | None = None) -> Any:
        """AReaL's fork, whose command starts with the controller's `sys.executable`: replaced by the
        target worker's interpreter (in a container the controller's path does not exist)."""
        interpreter = worker_interpreter(target_wi.spec) if target_wi.spec is not None else sys.executable
        if interpreter != sys.executable:
            session = _ForkInterpreter(session, interpreter)
        return await super()._fork_single_worker(session, role, idx, target_wi, target_role, command)

    # -----------------------------------------------------------------------------------------
    # Failures

    def get_workers(self, role: str, timeout: float | None = None) -> list[Worker]:
        """AReaL's wait for the role's workers, its timeout counted once the job runs: before, a job
        pending for a reason that can clear is waited for (`_wait_while_pending`)."""
        if role not in self._colocated_roles and role in self._jobs:
            self._wait_while_pending(role)
        return super().get_workers(role, timeout)

    def _wait_while_pending(self, role: str) -> None:
        """Wait while the role's job is PENDING, saying so every minute, up to `pending_limit_s`; past it
        the job is cancelled (`WorkerJobCannotStart`). A reason no wait clears fails at once
        (`_job_status`)."""
        job_id, start, said = self._jobs[role], time.monotonic(), False
        say_at = PENDING_POLL_S  # a job that starts within a poll is not worth a line
        limit = minutes(self.pending_limit_s)
        while (status := self._job_status(role)) is not None and status.state == "PENDING":
            waited = time.monotonic() - start
            if waited >= self.pending_limit_s:
                queue.cancel([job_id])
                raise WorkerJobCannotStart(f"{role}/*", -1, (
                    f"{role}: SLURM job {job_id} pended ({why(status)}) for {minutes(waited)}, past the "
                    f"pending limit of {limit}, so it was cancelled; raise {PENDING_LIMIT_ENV} (tau2_rl.sh "
                    "--pending-limit) or ask for fewer resources"))
            if waited >= say_at:
                logger.warning("%s: SLURM job %d pending (%s) for %s; waiting up to %s (%s)", role, job_id,
                               why(status), minutes(waited), limit, PENDING_LIMIT_ENV)
                say_at, said = say_at + PENDING_LOG_EVERY_S, True
            time.sleep(min(PENDING_POLL_S, self.pending_limit_s - waited))
        if said:
            logger.info("%s: SLURM job %d left the queue after %s", role, job_id,
                        minutes(time.monotonic() - start))

    def _check_job_status(self, role: str) -> None:
        """AReaL's, which fails only on FAILED and CANCELLED: `_job_status`."""
        self._job_status(role)

    def _job_status(self, role: str) -> queue.JobStatus | None:
        """The role's job as SLURM reports it (None: SLURM did not answer). Raises `WorkerFailedError` when
        the job has ended (in any state), `WorkerJobCannotStart` when it pends for a reason no wait fixes
        (then it is cancelled), naming the job, its state, node and the worker log's tail."""
        if role in self._colocated_roles:
            return self._job_status(self._colocated_roles[role])
        if role not in self._jobs:
            raise WorkerNotFoundError(f"Role '{role}' not found")
        job_id = self._jobs[role]
        try:
            status = queue.query_jobs([job_id]).get(job_id)
        except queue.SlurmError as e:
            logger.warning("could not query SLURM job %d (%s): %s", job_id, role, e)
            return None
        if status is None:
            raise WorkerFailedError(f"{role}/*", -1, f"SLURM job {job_id} ({role}) is no longer known to "
                                                     f"SLURM; the worker log ends:\n{self._log_tail(role)}")
        if status.never_starts:
            queue.cancel([job_id])
            raise WorkerJobCannotStart(f"{role}/*", -1, f"{status.describe()}: it can never start, so it was "
                                                        "cancelled; check the role's scheduling_spec and its "
                                                        "partition against `sinfo`")
        if not status.active:
            raise WorkerFailedError(f"{role}/*", -1, f"{self._gone(role, status)}; the worker log ends:\n"
                                                     f"{self._log_tail(role)}")
        return status

    def _gone(self, role: str, status: queue.JobStatus) -> str:
        return f"{status.describe()}: the {role} workers are gone (log {self._log_path_of(role)})"

    def _log_tail(self, role: str) -> str:
        return queue.job_log_tail(self._log_path_of(role), LOG_TAIL_LINES)

    def job_statuses(self) -> dict[str, queue.JobStatus | None]:
        """Each role's job as SLURM reports it now (None: SLURM no longer knows it)."""
        found = queue.query_jobs(list(self._jobs.values()))
        return {role: found.get(job_id) for role, job_id in self._jobs.items()}

    def role_log(self, role: str) -> str:
        return self._log_path_of(role)

    def ended_job(self) -> str:
        """'' while every job of the run runs; else one sentence naming the first that does not (its role,
        state, node and log), for the training watchdog (`lifecycle.watchdog.Watchdog`)."""
        for role, status in self.job_statuses().items():
            if status is not None and status.running:
                continue
            gone = (self._gone(role, status) if status is not None else
                    f"SLURM job {self._jobs[role]} ({role}) is no longer known to SLURM")
            return f"{gone}; rerun the same command to resume from the last saved step"
        return ""

    # -----------------------------------------------------------------------------------------
    # Clean-up

    def delete_workers(self, role: str | None = None, reverse_order: bool = False) -> None:
        """AReaL's two phases (engines destroyed, then the job cancelled) for every state the job may be
        in: a pending job is cancelled too, and the call returns once SLURM has ended the job."""
        if role is None or role in self._colocated_roles or role not in self._jobs:
            return super().delete_workers(role, reverse_order)
        job_id = self._jobs[role]
        try:
            status = queue.query_jobs([job_id]).get(job_id)
        except queue.SlurmError:
            status = None
        if status is not None and status.running:
            self._destroy_engines_on_workers(self._workers.get(role, []))
        try:
            left = queue.cancel([job_id])
        except queue.SlurmError as e:
            left = []
            logger.error("could not cancel SLURM job %d (%s): %s", job_id, role, e)
        if left:
            logger.error("SLURM job %d (%s) is still active after scancel: %s", job_id, role,
                         left[0].describe())
        else:
            self.registry.forget(role)
            logger.info("cancelled SLURM job %d (%s)", job_id, role)
        self._workers.pop(role, None)
        self._jobs.pop(role, None)
        self._job_status_cache.pop(job_id, None)


class _ForkInterpreter:
    """An aiohttp session whose `/fork` requests start the forked worker with `interpreter`."""

    def __init__(self, session: Any, interpreter: str):
        self._session, self._interpreter = session, interpreter

    def post(self, url: str, *args: Any, json: Any = None, **kwargs: Any) -> Any:
        if url.endswith("/fork") and isinstance(json, dict) and json.get("raw_cmd"):
            json = {**json, "raw_cmd": [self._interpreter, *json["raw_cmd"][1:]]}
        return self._session.post(url, *args, json=json, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def describe_jobs(scheduler: Any) -> list[str]:
    """One line per role: which job runs it, on which node(s), and where its log is."""
    if not isinstance(scheduler, Tau2SlurmScheduler):
        return []
    lines = []
    for role, status in scheduler.job_statuses().items():
        where = status.nodes if status is not None else "?"
        state = status.state if status is not None else "unknown"
        lines.append(f"role {role}: SLURM job {scheduler._jobs[role]} on {where} ({state}); "
                     f"log {Path(scheduler.role_log(role))}")
    return lines
