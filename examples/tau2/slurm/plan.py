"""The SLURM jobs a training run submits, and whether the cluster can ever run them.

One job per role that is not colocated (the rollout servers, the trainer ranks, a reference or critic
model): AReaL 1.0.4's `SlurmScheduler.create_workers` turns a role's replicas and scheduling spec into
`--nodes`, `--ntasks-per-node`, `--cpus-per-task`, `--mem` and `--gres=gpu:<n_gpus_per_node>`;
`JobRequest.for_role` does the same arithmetic, so that `--dry-run` and the scheduler (before `sbatch`)
can compare it with what `sinfo` reports and refuse a job that no wait would start. The run holds each job
until it ends, so its jobs must also fit the partition all at once (`unplaceable`): else the last one pends
behind the others for good, while the scheduler waits for a busy queue to clear.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from examples.tau2.slurm.queue import Allocation, NodeInfo


@dataclass(frozen=True)
class JobRequest:
    """What one role's job asks SLURM for."""

    role: str
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    mem_mb_per_node: int
    gpus_per_node: int
    """The `--gres=gpu:N` request (AReaL asks for whole nodes); 0: no GRES at all."""

    @classmethod
    def for_role(cls, role: str, spec: Any, replicas: int, n_gpus_per_node: int) -> JobRequest:
        """As `SlurmScheduler.create_workers` computes it; a CPU-only cluster (`n_gpus_per_node=0`) gets
        one node for a role without GPUs instead of AReaL's division by zero."""
        total_gpus = spec.gpu * replicas
        if total_gpus > 0 and n_gpus_per_node > 0:
            nodes = max(1, math.ceil(total_gpus / n_gpus_per_node))
        else:
            nodes = 1
        per_node = max(1, replicas // nodes)
        return cls(role=role, nodes=nodes, tasks_per_node=per_node, cpus_per_task=spec.cpu,
                   mem_mb_per_node=spec.mem * 1024 * per_node,
                   gpus_per_node=n_gpus_per_node if total_gpus > 0 else 0)

    @property
    def cpus_per_node(self) -> int:
        return self.cpus_per_task * self.tasks_per_node

    def describe(self) -> str:
        gpus = f", {self.gpus_per_node} GPUs" if self.gpus_per_node else ""
        return (f"{self.role} job ({self.nodes} node(s) x {self.tasks_per_node} task(s) of "
                f"{self.cpus_per_task} CPUs = {self.cpus_per_node} CPUs, {self.mem_mb_per_node} MB{gpus} "
                "per node)")

    def fits(self, node: NodeInfo) -> bool:
        return (node.usable and node.cpus >= self.cpus_per_node and node.memory_mb >= self.mem_mb_per_node
                and node.gpus >= self.gpus_per_node)


CONTROLLER_JOB: ContextVar[JobRequest | None] = ContextVar("CONTROLLER_JOB", default=None)
"""The controller's own job when `--submit` makes it one on the workers' partition (set by
`controller_job.check`, which runs as `__main__`, so the variable lives here, imported by both): it holds
its node too, so it is part of the layout `checks.check_capacity` places."""


def unschedulable(request: JobRequest, nodes: list[NodeInfo], fix: str = "") -> str:
    """Why no wait would start `request` on `nodes` (one sentence), or '' when enough nodes fit it; `fix`
    ends the sentence with what to change (default: a role's scheduling_spec)."""
    if not nodes:
        return f"the {request.role} job cannot run: SLURM reports no node in the partition"
    fitting = [n for n in nodes if request.fits(n)]
    if len(fitting) >= request.nodes:
        return ""
    usable = [n for n in nodes if n.usable] or nodes
    biggest = max(usable, key=lambda n: (n.gpus, n.cpus, n.memory_mb))
    gpus = f", {biggest.gpus} GPUs" if biggest.gpus else ", no GPU (GRES)"
    partition = nodes[0].partition
    if not fix and request.gpus_per_node and not any(n.gpus for n in nodes):
        fix = (f"this partition declares no GPUs: set cluster.n_gpus_per_node=0 and the {request.role} "
               "scheduling_spec's gpu to 0 for a CPU-only run, or use a partition with GPUs")
    fix = fix or f"lower the {request.role} scheduling_spec (cpu, mem, gpu) or cluster.n_gpus_per_node"
    return (f"SLURM can never start the {request.describe()}: {len(fitting)} of the {len(nodes)} node(s) of "
            f"partition {partition} fit it, {request.nodes} needed (largest: {biggest.cpus} CPUs, "
            f"{biggest.memory_mb} MB{gpus}); {fix}")


def unplaceable(requests: list[JobRequest], nodes: list[NodeInfo], allocation: Allocation,
                fix: str = "") -> str:
    """'' when the jobs of `requests`, each of which fits a node alone (`unschedulable`), can all run at once
    on `nodes` as `allocation` shares them; else why not, one sentence ending with `fix` (default: the
    roles' scheduling_spec)."""
    free = [(n.cpus, n.memory_mb, n.gpus) for n in nodes if n.usable]
    if _place_all(sorted(requests, key=_size, reverse=True), free, allocation):
        return ""
    jobs = ", ".join(r.describe() for r in requests)
    fix = fix or "lower the roles' scheduling_spec (cpu, mem, gpu), or use a partition with more nodes"
    how = "whole nodes per job (select/linear)" if allocation.whole_nodes else \
        "CPUs, GPUs" + (" and memory" if allocation.memory else "") + " shared"
    return (f"SLURM can never run the jobs of this run at once ({jobs}) on the {len(free)} usable node(s) of "
            f"partition {nodes[0].partition if nodes else '?'} ({how}), and the run holds each job until it "
            f"ends, so the last one would pend for good; {fix}")


def _size(request: JobRequest) -> tuple[int, int, int, int]:
    return request.nodes, request.gpus_per_node, request.cpus_per_node, request.mem_mb_per_node


def _place_all(requests: list[JobRequest], free: list[tuple[int, int, int]], allocation: Allocation) -> bool:
    """Whether every request finds its nodes in `free` ((CPUs, MB, GPUs) left per node), trying each kind
    of node once per pick: a handful of jobs over any number of nodes."""
    if not requests:
        return True
    return _place(requests[0], requests[0].nodes, free, 0, requests[1:], allocation)


def _place(request: JobRequest, left: int, free: list[tuple[int, int, int]], start: int,
           rest: list[JobRequest], allocation: Allocation) -> bool:
    if left == 0:
        return _place_all(rest, free, allocation)
    tried = set()
    for i in range(start, len(free)):
        cpus, mem, gpus = free[i]
        if free[i] in tried or cpus < request.cpus_per_node or gpus < request.gpus_per_node or \
                mem < request.mem_mb_per_node:
            continue
        tried.add(free[i])
        taken = (-1, -1, -1) if allocation.whole_nodes else \
            (cpus - request.cpus_per_node, mem - request.mem_mb_per_node * allocation.memory,
             gpus - request.gpus_per_node)
        if _place(request, left - 1, [*free[:i], taken, *free[i + 1:]], i + 1, rest, allocation):
            return True
    return False


def run_requests(config: Any) -> list[JobRequest]:
    """The jobs `PPOTrainer` submits for `config` (roles colocated with another submit none).
    Raises ValueError for a backend AReaL cannot parse."""
    from examples.tau2.settings.config import parse_backend

    n_gpus = config.cluster.n_gpus_per_node
    requests = []
    rollout = parse_backend(config.rollout.backend).parallel
    if config.rollout.scheduling_strategy.type != "colocation":
        # The rollout controller scales one server's spec by its size (tp x pp), as AReaL does.
        size = rollout.tp_size * rollout.pp_size
        spec = config.rollout.scheduling_spec[0]
        scaled = _Spec(cpu=spec.cpu * size, mem=spec.mem * size, gpu=size if spec.gpu > 0 else 0)
        requests.append(JobRequest.for_role("rollout", scaled, rollout.dp_size, n_gpus))
    engines = [("actor", config.actor)]
    if config.actor.kl_ctl > 0 and config.ref is not None:
        engines.append(("ref", config.ref))
    if config.critic is not None:
        engines.append(("critic", config.critic))
    for role, engine in engines:
        if engine.scheduling_strategy.type == "colocation":
            continue
        world = parse_backend(engine.backend).parallel.world_size
        requests.append(JobRequest.for_role(role, engine.scheduling_spec[0], world, n_gpus))
    return requests


@dataclass(frozen=True)
class _Spec:
    cpu: int
    mem: int
    gpu: int
