"""compat/areal_groups.py: the rollout engines build the training's GRPO groups (AReaL 1.0.4).

In-process: which workflows AReaL's engine builds. The groups themselves are in
tests/training/test_group_workflow.py; the whole path (controller, rollout worker, AReaL's proxy, tau2
episodes with a user simulator that is down for some of them) in tests/test_proxy_integration.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from areal.api import RolloutWorkflow
from areal.api.cli_args import AgentConfig, InferenceEngineConfig
from areal.engine.sglang_remote import RemoteSGLangEngine, SGLangBackend
from areal.engine.vllm_remote import RemotevLLMEngine
from areal.infra.remote_inf_engine import GroupedRolloutWorkflow

from examples.tau2.compat.areal_cpu import CpuvLLMBackend, CpuvLLMEngine
from examples.tau2.compat.areal_groups import PartialGroupInfEngine
from examples.tau2.compat.areal_serving import SERVING_ENGINE_ENV, ServingSGLangEngine, ServingvLLMEngine
from examples.tau2.tau2_train import WORKFLOW
from examples.tau2.tau2_utils import EpisodeRejected, RejectReason
from examples.tau2.training.group_workflow import DropRejectedProxyWorkflow, PartialGroupWorkflow

LOG = logging.getLogger("test")


class Scripted(RolloutWorkflow):
    """Member episodes in call order: a dict of rows, or an exception to raise."""

    def __init__(self, outcomes: list[Any]):
        self.outcomes = list(outcomes)

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> Any:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def rows(*names: str) -> dict[str, str]:
    return {name: f"row {name}" for name in names}


def rejected() -> EpisodeRejected:
    return EpisodeRejected(RejectReason.USER_ENDPOINT, "user simulator down")


def test_areal_s_own_group_is_lost_when_one_episode_raises():
    """AReaL 1.0.4's behaviour that the engine's groups replace: one raising episode fails the group."""
    group = GroupedRolloutWorkflow(Scripted([rows("a"), rejected(), rows("c"), rows("d")]), 4, LOG)
    with pytest.raises(EpisodeRejected):
        asyncio.run(group.arun_episode(None, {}))


AGENT_KWARGS = {"user_base_url": "http://127.0.0.1:1/v1", "user_model": "user"}


def _engine_config(mode: str = "inline") -> InferenceEngineConfig:
    return InferenceEngineConfig(
        experiment_name="groups", trial_name="t", backend="sglang:d1",
        agent=AgentConfig(agent_cls_path="unused", admin_api_key="k", mode=mode, turn_discount=0.5))


def test_the_engine_builds_partial_groups_of_rejection_dropping_episodes():
    engine = PartialGroupInfEngine(_engine_config(), SGLangBackend())
    group = engine._resolve_workflow(WORKFLOW, AGENT_KWARGS, group_size=8, proxy_addr="http://127.0.0.1:1")
    assert type(group) is PartialGroupWorkflow and group.group_size == 8
    assert type(group.workflow) is DropRejectedProxyWorkflow and group.workflow.discount == 0.5
    single = engine._resolve_workflow(WORKFLOW, AGENT_KWARGS, group_size=1, proxy_addr="http://127.0.0.1:1")
    assert type(single) is DropRejectedProxyWorkflow
    # AReaL's own workflow classes are grouped as AReaL does
    own = engine._resolve_workflow(Scripted([]), None, group_size=2)
    assert type(own) is GroupedRolloutWorkflow


def test_other_agent_modes_keep_areal_s_proxy_workflow():
    engine = PartialGroupInfEngine(_engine_config("subproc"), SGLangBackend())
    group = engine._resolve_workflow(WORKFLOW, AGENT_KWARGS, group_size=2, proxy_addr="http://127.0.0.1:1")
    assert type(group) is GroupedRolloutWorkflow and type(group.workflow) is not DropRejectedProxyWorkflow


@pytest.mark.parametrize("engine_class,base,backend", [
    (ServingSGLangEngine, RemoteSGLangEngine, SGLangBackend),
    (ServingvLLMEngine, RemotevLLMEngine, None),
    (CpuvLLMEngine, RemotevLLMEngine, CpuvLLMBackend),
])
def test_the_training_rollout_engines_use_partial_groups(monkeypatch, engine_class, base, backend):
    monkeypatch.setenv(SERVING_ENGINE_ENV, "areal")
    engine = engine_class(_engine_config())
    assert isinstance(engine, base) and type(engine._engine) is PartialGroupInfEngine
    if backend is not None:
        assert type(engine._engine.backend) is backend
