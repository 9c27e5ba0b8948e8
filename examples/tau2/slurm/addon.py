"""SLURM as an add-on (`scheduler.type=slurm`). The reaper (`lifecycle/reaper.py`) loads it to cancel a
dead controller's jobs and must start at once, so importing it imports no AReaL: the hooks that need
AReaL (the checks, the scheduler) import it when asked."""

from __future__ import annotations

from typing import Any

from examples.tau2.settings.addons import Addon, Unreachable
from examples.tau2.slurm import queue
from examples.tau2.slurm.registry import cancel_run_jobs


class SlurmAddon(Addon):
    """A run whose workers are SLURM jobs."""

    name, service = "slurm", "SLURM"

    def problems(self, config: Any) -> list[str]:
        from examples.tau2.slurm.checks import check_domain_modules_importable, check_slurm, container_paths

        return check_slurm(config, container_paths(config)) + check_domain_modules_importable(config)

    def unavailable(self, config: Any) -> str:
        return queue.unreachable()

    def plan(self, config: Any) -> list[str]:
        from examples.tau2.slurm.checks import describe_cluster

        return describe_cluster(config)

    def scheduler(self, config: Any) -> Any:
        from examples.tau2.slurm.scheduler import Tau2SlurmScheduler

        return Tau2SlurmScheduler(config)

    def cancel_jobs(self, fileroot: str, experiment: str, trial: str) -> list[Any]:
        try:
            return cancel_run_jobs(fileroot, experiment, trial)
        except queue.SlurmError as e:
            raise Unreachable(str(e)) from e
