"""The training workflow when the curriculum is on: `Tau2AgentWorkflow` plus one outcome line per episode.

It runs in AReaL's rollout workers (rebuilt from the import string and kwargs `tau2_train.train_call`
passes) and appends each scored episode's task and rewards to this process's file under
`curriculum_outcomes_dir`, where the controller's `CurriculumSampler` reads it (`curriculum/sampler.py`).
A rejected episode raises before anything is written. Evaluation runs the plain workflow.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from examples.tau2.curriculum.sampler import Outcome, append_outcome
from examples.tau2.tau2_agent import Tau2AgentWorkflow
from examples.tau2.tau2_utils import EpisodeResult, logger


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
