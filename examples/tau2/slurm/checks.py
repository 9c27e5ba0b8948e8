"""Pre-flight checks of a SLURM run: what applies to the chosen container mode, and whether the cluster
(when `sinfo` answers from here) can ever run the jobs. One sentence per problem; nothing is started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from examples.tau2.episode import domain as tau2_domain
from examples.tau2.lifecycle.validate import shared_paths
from examples.tau2.settings.config import curriculum_outcomes_dir
from examples.tau2.slurm import queue
from examples.tau2.slurm.controller_job import SBATCH_ENV
from examples.tau2.slurm.plan import CONTROLLER_JOB, JobRequest, run_requests, unplaceable, unschedulable
from examples.tau2.slurm.scheduler import CONTAINER_TYPES, NO_MOUNT, pending_limit_s, start_timeout_s

REPO = Path(__file__).resolve().parents[3]


def run_domain_modules(config: Any) -> list[tau2_domain.DomainModule]:
    """The run's `econfig.domain_modules`, imported (none if one cannot be: the pre-flight says why)."""
    try:
        return tau2_domain.load_modules(config.econfig.domain_modules)
    except tau2_domain.DomainError:
        return []


def installed(module: tau2_domain.DomainModule) -> bool:
    """Whether a domain module was installed as a package (a container image must hold it), not a folder."""
    return module.root.name in ("site-packages", "dist-packages")


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
    for setting in (pending_limit_s, start_timeout_s):
        try:
            setting()
        except ValueError as e:
            errors.append(str(e))
    if ask_cluster and queue.available():
        errors += check_capacity(config, CONTROLLER_JOB.get())
    return errors


def check_capacity(config: Any, controller: JobRequest | None = None) -> list[str]:
    """Every job of the run fits enough nodes of the partition `sinfo` reports, and all of them (with the
    `controller`'s own job, if any) fit it at once (SLURM unreachable: no problem)."""
    try:
        nodes = queue.nodes()
        requests = run_requests(config)
    except (queue.SlurmError, ValueError):
        return []  # an unreachable cluster is not a config problem; a bad backend is reported elsewhere
    problems = [p for p in (unschedulable(r, nodes) for r in requests) if p]
    if problems:
        return problems
    try:
        shared = queue.allocation()
    except queue.SlurmError:
        return []
    fix = "lower the roles' scheduling_spec (cpu, mem, gpu)" + (
        f", or {SBATCH_ENV}'s --cpus-per-task and --mem" if controller else "") + \
        ", or use a partition with more nodes"
    problem = unplaceable([*requests, *([controller] if controller else [])], nodes, shared, fix)
    return [problem] if problem else []


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


def container_paths(config: Any) -> dict[str, str]:
    """Host directories every SLURM worker reads or writes by the controller's path: each must be bound
    into a container at the same path (`check_slurm`)."""
    paths = dict(shared_paths(config))
    paths["this checkout (the workers import examples.tau2 from it)"] = str(REPO)
    if config.econfig.dump_dir:
        paths["econfig.dump_dir"] = config.econfig.dump_dir
    if config.curriculum.enabled:
        paths["curriculum outcomes directory"] = curriculum_outcomes_dir(config)
    if config.actor.path and Path(config.actor.path).is_dir():
        paths["actor.path"] = config.actor.path
    for module in run_domain_modules(config):
        if not installed(module):  # an installed one must be in the image
            paths[f"domain module {module.name}'s folder"] = str(module.root)
    return paths


def check_domain_modules_importable(config: Any) -> list[str]:
    """Under SLURM, every rollout worker imports `econfig.domain_modules`: a native worker gets the
    controller's `sys.path` (AReaL's), a container worker only its spec's PYTHONPATH, which must hold the
    folder each module was imported from (that it is bound into the container is `check_slurm`'s)."""
    errors = []
    specs = role_specs(config)
    role, spec = ("rollout", specs["rollout"]) if "rollout" in specs else ("actor", specs["actor"])
    if spec.container_type == "none":
        return []  # the rollout workers run the episodes; natively they get the controller's sys.path
    pythonpath = (spec.env_vars or {}).get("PYTHONPATH") or str(Path.cwd())
    entries = {Path(p).resolve() for p in pythonpath.split(":") if p}
    where = f"{role}.scheduling_spec[0].env_vars.PYTHONPATH={pythonpath}"
    for m in run_domain_modules(config):
        if installed(m):
            errors.append(f"domain module {m.name} is installed in {m.root}, which the rollout containers "
                          "do not see; install it in the image too")
        elif m.root not in entries:
            errors.append(f"domain module {m.name} is imported from {m.root}, which is not on the rollout "
                          f"containers' PYTHONPATH ({where}); add it there (tau2_rl.sh slurm adds your "
                          "PYTHONPATH when TAU2_IMAGE is set)")
    return errors
