"""The core's one extension point: the add-ons a config turns on (`scheduler.type=slurm`,
`curriculum.enabled`), loaded here by import string, since the core imports none (pyproject.toml's
import contracts). The core asks them, where an add-on changes a run, for the hooks of `Addon`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class Unreachable(RuntimeError):
    """An add-on's outside service (e.g. SLURM) did not answer; the message says which and why."""


class Addon:
    """What an add-on gives a run; each default gives nothing (`config`: a `Tau2PPOConfig`)."""

    name, service = "", ""  # its name in `ADDONS`; the outside service its jobs run on, as messages name it

    def problems(self, config: Any) -> list[str]:
        """The run's problems in this add-on's part, one sentence each (pre-flight and `--dry-run`)."""
        return []

    def unavailable(self, config: Any) -> str:
        """Why the services it needs do not answer now ('' when they do); not asked by `--dry-run`."""
        return ""

    def plan(self, config: Any) -> list[str]:
        """Lines of the `--dry-run` plan, shown under the add-on's name."""
        return []

    def scheduler(self, config: Any) -> Any:
        """The scheduler AReaL's trainer runs its workers with (None: AReaL's own)."""
        return None

    def train_dataloader(self, dataset: Any, config: Any, *, batch_size: int, drop_last: bool) -> Any:
        """The training dataloader (None: AReaL's)."""
        return None

    def train_workflow(self, config: Any, workflow: str,
                       kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The training workflow (an import string, rebuilt in the workers) and its kwargs."""
        return workflow, kwargs

    def cancel_jobs(self, fileroot: str, experiment: str, trial: str) -> list[Any]:
        """Cancel the trial's jobs it started (each has `.job_id`, `.describe()`); else `Unreachable`."""
        return []


ADDONS: dict[str, tuple[str, Callable[[Any], bool]]] = {  # name: where it is, when a config turns it on
    "slurm": ("examples.tau2.slurm.addon:SlurmAddon", lambda c: c.scheduler.type == "slurm"),
    "curriculum": ("examples.tau2.curriculum.addon:CurriculumAddon", lambda c: c.curriculum.enabled),
}
SCHEDULER_ADDONS = ("slurm",)  # the add-ons that are a `scheduler.type`
SCHEDULERS = ("local", *SCHEDULER_ADDONS)  # AReaL 1.0.4 runs agent workflows only under its single controller


def load(name: str) -> Addon:
    """The add-on called `name` (a key of `ADDONS`)."""
    module, attr = ADDONS[name][0].split(":")
    return getattr(importlib.import_module(module), attr)()


def enabled(config: Any) -> list[Addon]:
    """The add-ons `config` turns on, in `ADDONS`' order."""
    return [load(name) for name, (_, on) in ADDONS.items() if on(config)]


def scheduler_addon(scheduler_type: str) -> Addon | None:
    """The add-on of a `scheduler.type` (None for AReaL's own schedulers, e.g. `local`)."""
    return load(scheduler_type) if scheduler_type in SCHEDULER_ADDONS else None
