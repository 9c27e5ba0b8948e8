"""The curriculum as an add-on (`curriculum.enabled=true`): its pre-flight checks, the training
dataloader that samples by solve rate (`sampler.py`), and the training workflow that records the outcomes
the sampler reads.

`CurriculumAgentWorkflow` runs in AReaL's rollout workers (rebuilt from the import string and kwargs
`tau2_train.train_call` passes) and appends each scored episode's task and rewards to this process's file
under `curriculum_outcomes_dir`. A rejected episode raises before anything is written; evaluation runs
the plain workflow.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import httpx

from examples.tau2.curriculum.sampler import Outcome, append_outcome, curriculum_dataloader
from examples.tau2.lifecycle.validate import creatable
from examples.tau2.settings.addons import Addon
from examples.tau2.settings.config import CurriculumConfig, curriculum_outcomes_dir
from examples.tau2.tau2_agent import Tau2AgentWorkflow
from examples.tau2.tau2_utils import EpisodeResult, logger

CURRICULUM_WORKFLOW = "examples.tau2.curriculum.addon.CurriculumAgentWorkflow"


def check_curriculum(config: Any) -> list[str]:
    """Pre-flight checks of the `curriculum` section (`config`: a Tau2PPOConfig), one sentence each."""
    errors = setting_problems(config.curriculum)
    if not config.curriculum.enabled:
        return errors
    path = Path(curriculum_outcomes_dir(config)).absolute()
    if problem := creatable(path):
        errors.append(f"curriculum outcomes directory {path} cannot be created ({problem})")
    if config.train_dataset.num_workers:
        errors.append("curriculum needs train_dataset.num_workers=0 (its sampler reads outcomes and draws "
                      "each batch in the controller process)")
    return errors


def setting_problems(curriculum: CurriculumConfig) -> list[str]:
    """Problems with the settings themselves (none are checked while disabled)."""
    if not curriculum.enabled:
        return []
    errors = []
    if curriculum.window < 1:
        errors.append(f"curriculum.window must be at least 1, got {curriculum.window}")
    if not 1 <= curriculum.min_attempts <= max(curriculum.window, 1):
        errors.append(f"curriculum.min_attempts must be between 1 and curriculum.window={curriculum.window}, "
                      f"got {curriculum.min_attempts}")
    if not 0 <= curriculum.retire_after <= max(curriculum.window, 0):
        errors.append(f"curriculum.retire_after must be between 0 (never) and curriculum.window="
                      f"{curriculum.window}, got {curriculum.retire_after}")
    if not 0 < curriculum.success_threshold <= 1:
        errors.append(f"curriculum.success_threshold must be in (0, 1], got {curriculum.success_threshold}")
    if not 0 <= curriculum.unsolved_floor < 1:
        errors.append(f"curriculum.unsolved_floor must be in [0, 1), got {curriculum.unsolved_floor}")
    weights = curriculum.weights.as_dict()
    negative = [f"{k}={v:g}" for k, v in weights.items() if v < 0 or not math.isfinite(v)]
    if negative:
        errors.append(f"curriculum.weights must be finite and non-negative, got {', '.join(negative)}")
    elif weights["new"] <= 0:
        errors.append("curriculum.weights.new must be positive: every task starts new, so nothing could "
                      "be sampled")
    return errors


class CurriculumAddon(Addon):
    """Training tasks drawn by solve rate; validation stays AReaL's."""

    name = "curriculum"

    def problems(self, config: Any) -> list[str]:
        return check_curriculum(config)

    def plan(self, config: Any) -> list[str]:
        c = config.curriculum
        weights = " / ".join(f"{k} {v:g}" for k, v in c.weights.as_dict().items())
        retire = f"retire after {c.retire_after} solved in a row" if c.retire_after else "never retire"
        return [f"solve rates over the last {c.window} episodes (new below {c.min_attempts}; solved: tau2 "
                f"reward >= {c.success_threshold:g}); weights {weights}; {retire}; unsolved floor "
                f"{c.unsolved_floor:g}; outcomes in {curriculum_outcomes_dir(config)}"]

    def train_dataloader(self, dataset: Any, config: Any, *, batch_size: int, drop_last: bool) -> Any:
        return curriculum_dataloader(dataset, config.curriculum, batch_size=batch_size, drop_last=drop_last,
                                     seed=config.seed, outcomes=curriculum_outcomes_dir(config))

    def train_workflow(self, config: Any, workflow: str,
                       kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The same episodes, plus one outcome line each for the sampler."""
        return CURRICULUM_WORKFLOW, {**kwargs, "curriculum_outcomes_dir": curriculum_outcomes_dir(config)}


class CurriculumAgentWorkflow(Tau2AgentWorkflow):
    """`Tau2AgentWorkflow` that records every scored episode for the curriculum.

    Kwargs: `curriculum_outcomes_dir` plus the `Tau2EnvConfig` fields of the plain workflow.
    """

    def __init__(self, curriculum_outcomes_dir: str, **kwargs: Any):
        super().__init__(**kwargs)
        if not curriculum_outcomes_dir:
            raise ValueError("CurriculumAgentWorkflow needs curriculum_outcomes_dir")
        self.outcomes_dir = Path(curriculum_outcomes_dir)

    async def run_episode(self, data: dict[str, Any], *, base_url: str, api_key: str,
                          http_client: httpx.AsyncClient | None = None) -> EpisodeResult:
        result = await super().run_episode(data, base_url=base_url, api_key=api_key, http_client=http_client)
        outcome = Outcome(domain=result.domain, task_id=result.task_id, tau2_reward=result.tau2_reward,
                          reward=result.reward, time=time.time())
        try:
            await asyncio.to_thread(append_outcome, self.outcomes_dir, outcome)
        except OSError as e:  # the episode still trains; the curriculum misses one outcome
            logger.warning("curriculum: cannot record %s in %s: %s", outcome.key, self.outcomes_dir, e)
        return result
