"""The curriculum as an add-on (`curriculum.enabled=true`): its pre-flight checks, the training
dataloader that samples by solve rate (`sampler.py`), and the workflow that records the outcomes it reads
(`workflow.py`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from examples.tau2.curriculum.sampler import curriculum_dataloader
from examples.tau2.settings.addons import Addon
from examples.tau2.settings.config import curriculum_outcomes_dir

CURRICULUM_WORKFLOW = "examples.tau2.curriculum.workflow.CurriculumAgentWorkflow"


def check_curriculum(config: Any) -> list[str]:
    """Pre-flight checks of the `curriculum` section (`config`: a Tau2PPOConfig), one sentence each."""
    curriculum = config.curriculum
    errors = curriculum.validate()
    if not curriculum.enabled:
        return errors
    path = Path(curriculum_outcomes_dir(config)).absolute()
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not (probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)):
        errors.append(f"curriculum outcomes directory {path} cannot be created ({probe} is not a writable "
                      "directory)")
    if config.train_dataset.num_workers:
        errors.append("curriculum needs train_dataset.num_workers=0 (its sampler reads outcomes and draws "
                      "each batch in the controller process)")
    return errors


class CurriculumAddon(Addon):
    """Training tasks drawn by solve rate; validation stays AReaL's."""

    name = "curriculum"

    def problems(self, config: Any) -> list[str]:
        return check_curriculum(config)

    def train_dataloader(self, dataset: Any, config: Any, *, batch_size: int, drop_last: bool) -> Any:
        return curriculum_dataloader(dataset, config.curriculum, batch_size=batch_size, drop_last=drop_last,
                                     seed=config.seed, outcomes=curriculum_outcomes_dir(config))

    def train_workflow(self, config: Any, workflow: str,
                       kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The same episodes, plus one outcome line each for the sampler."""
        return CURRICULUM_WORKFLOW, {**kwargs, "curriculum_outcomes_dir": curriculum_outcomes_dir(config)}
