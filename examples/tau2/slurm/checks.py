"""Pre-flight checks of a SLURM run: what applies to the chosen container mode, and whether the cluster
(when `sinfo` answers from here) can ever run the jobs. One sentence per problem; nothing is started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from examples.tau2.slurm import queue
from examples.tau2.slurm.plan import run_requests, unschedulable
from examples.tau2.slurm.scheduler import CONTAINER_TYPES, NO_MOUNT


def bind_mounts(spec: Any) -> list[tuple[Path, Path]]:
    """The spec's `mount` (`SRC:DST[:opts],...`) as (host, container) pairs."""
    if spec.mount in NO_MOUNT:
        return []
    pairs = []
    for item in spec.mount.split(","):
        src, _, rest = item.strip().partition(":")
        dst = rest.split(":", 1)[0] or src
        pairs.append((Path(src), Path(dst)))
    return pairs


def visible_in_container(spec: Any, path: Path) -> bool:
    """Whether `path` (on the host) is at the same path inside the spec's container: the workers use the
    controller's paths as they are."""
    return any(path.is_relative_to(src) and src == dst for src, dst in bind_mounts(spec))


def role_specs(config: Any) -> dict[str, Any]:
    """The first scheduling spec of each role that submits jobs; config.yaml's rollout shares the actor's
    (`${actor.scheduling_spec}`), and is then checked once, as `actor`."""
    rollout, actor = config.rollout.scheduling_spec[0], config.actor.scheduling_spec[0]
    return {"actor": actor} if rollout == actor else {"rollout": rollout, "actor": actor}


def check_slurm(config: Any, paths: dict[str, str], ask_cluster: bool = True) -> list[str]:
    """Problems of a `scheduler.type=slurm` run: the container settings of each role (the image exists, and
    `paths` — name: host directory every worker reads or writes — are bound at the same place), GPUs on a
    CPU-only cluster, and the job sizes against `sinfo` when `ask_cluster` and SLURM answers."""
    errors = []
    specs = role_specs(config)
    for role, spec in specs.items():
        where = f"{role}.scheduling_spec[0]"
        workers = role if len(specs) > 1 else "rollout and actor"
        if spec.container_type not in CONTAINER_TYPES:
            errors.append(f"{where}.container_type={spec.container_type!r} must be apptainer (workers in "
                          "`singularity exec <image>`) or none (workers run natively on the nodes)")
            continue
        if config.cluster.n_gpus_per_node == 0 and spec.gpu > 0:
            errors.append(f"{where}.gpu={spec.gpu} but cluster.n_gpus_per_node=0 (a CPU-only cluster); set "
                          "the gpu of every scheduling_spec to 0, or n_gpus_per_node to the nodes' GPUs")
        if spec.container_type == "none":
            continue
        if not Path(spec.image).is_file():
            errors.append(f"{where}.image={spec.image} does not exist (container_type=apptainer runs every "
                          f"{workers} worker in `singularity exec <image>`); build the image, or set "
                          "container_type=none to run natively (configs/slurm_native.yaml)")
        for name, value in paths.items():
            path = Path(value).absolute()
            if value and not visible_in_container(spec, path):
                errors.append(f"{name}={value} is not bound into the {workers} containers at the same path "
                              f"({where}.mount={spec.mount!r}); add it to the mount or move it under one")
    if ask_cluster and queue.available():
        errors += check_capacity(config)
    return errors


def check_capacity(config: Any) -> list[str]:
    """Every job of the run fits enough nodes of the partition `sinfo` reports (SLURM unreachable: none)."""
    try:
        nodes = queue.nodes()
        requests = run_requests(config)
    except (queue.SlurmError, ValueError):
        return []  # an unreachable cluster is not a config problem; a bad backend is reported elsewhere
    return [p for p in (unschedulable(r, nodes) for r in requests) if p]


def describe_cluster(config: Any) -> list[str]:
    """The plan's SLURM lines: each job's request, and the nodes `sinfo` reports (or that it does not)."""
    try:
        requests = run_requests(config)
    except ValueError:
        return []
    lines = [f"job: {r.describe()}" for r in requests]
    specs = role_specs(config)
    for role, spec in specs.items():
        mode = (f"apptainer {spec.image}, mount {spec.mount}" if spec.container_type == "apptainer"
                else "natively, the controller's interpreter" if spec.container_type == "none"
                else spec.container_type)
        lines.append(f"{role if len(specs) > 1 else 'rollout and actor'} workers: {mode}")
    if not queue.available():
        return [*lines, "SLURM: no client on this machine; job sizes not compared with the nodes"]
    try:
        nodes = queue.nodes()
    except queue.SlurmError as e:
        return [*lines, f"SLURM: not reachable from here ({e}); job sizes not compared with the nodes"]
    summary = ", ".join(f"{n.name} ({n.cpus} CPUs, {n.memory_mb} MB, {n.gpus} GPUs, {n.state})"
                        for n in nodes)
    return [*lines, f"SLURM nodes of partition {nodes[0].partition if nodes else '?'}: {summary or 'none'}"]
