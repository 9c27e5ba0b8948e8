"""compat/areal_groups.py: a rejected episode drops only itself from its GRPO group (AReaL 1.0.4).

In-process: the group workflows with scripted member episodes, and which workflows AReaL's engine
builds. The whole path (controller, rollout worker, AReaL's proxy, tau2 episodes with a user simulator
that is down for some of them) is in tests/test_proxy_integration.py.
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

from examples.tau2.compat.areal_groups import (
    MIN_GROUP_EPISODES,
    DropRejectedProxyWorkflow,
    PartialGroupWorkflow,
)
from examples.tau2.cpu.trainer import CpuvLLMBackend, CpuvLLMEngine
from examples.tau2.tau2_train import WORKFLOW
from examples.tau2.tau2_utils import EpisodeRejected, RejectReason
from examples.tau2.training.served_prompt import SERVING_ENGINE_ENV
from examples.tau2.training.trainer import Tau2InfEngine, Tau2SGLangEngine, Tau2vLLMEngine

LOG = logging.getLogger("test")


class Scripted(RolloutWorkflow):
    """Member episodes in call order: a dict of rows, None (dropped), or an exception to raise; each
    takes `delay_s` and records when it ended."""

    def __init__(self, outcomes: list[Any], delay_s: float = 0.0):
        self.outcomes, self.delay_s = list(outcomes), delay_s
        self.ended: list[float] = []

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> Any:
        outcome = self.outcomes.pop(0)
        await asyncio.sleep(self.delay_s if not isinstance(outcome, BaseException) else 0.0)
        self.ended.append(asyncio.get_running_loop().time())
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def rows(*names: str) -> dict[str, str]:
    return {name: f"row {name}" for name in names}


def rejected() -> EpisodeRejected:
    return EpisodeRejected(RejectReason.USER_ENDPOINT, "user simulator down")


def test_areal_s_own_group_is_lost_when_one_episode_raises():
    """AReaL 1.0.4's behaviour that this module replaces: one raising episode fails the group."""
    group = GroupedRolloutWorkflow(Scripted([rows("a"), rejected(), rows("c"), rows("d")]), 4, LOG)
    with pytest.raises(EpisodeRejected):
        asyncio.run(group.arun_episode(None, {}))


def test_a_dropped_episode_leaves_the_rest_of_its_group():
    group = PartialGroupWorkflow(Scripted([rows("a1", "a2"), None, rows("c1"), rows("d1", "d2")]), 4, LOG)
    assert asyncio.run(group.arun_episode(None, {})) == rows("a1", "a2", "c1", "d1", "d2")


def test_a_group_with_fewer_than_two_remaining_episodes_is_dropped():
    assert MIN_GROUP_EPISODES == 2
    group = PartialGroupWorkflow(Scripted([None, rows("b"), None, None]), 4, LOG)
    assert asyncio.run(group.arun_episode(None, {})) is None
    # an episode that made no policy call (no rows) does not count as remaining either
    group = PartialGroupWorkflow(Scripted([{}, rows("b"), None, None]), 4, LOG)
    assert asyncio.run(group.arun_episode(None, {})) is None
    group = PartialGroupWorkflow(Scripted([None, rows("b"), None, rows("d")]), 4, LOG)
    assert asyncio.run(group.arun_episode(None, {})) == rows("b", "d")


def test_any_other_failure_still_fails_the_group_after_its_episodes_end():
    member = Scripted([rows("a"), ValueError("a bug"), rows("c")], delay_s=0.2)

    async def go() -> float:
        with pytest.raises(ValueError, match="a bug"):
            await PartialGroupWorkflow(member, 3, LOG).arun_episode(None, {})
        return asyncio.get_running_loop().time()

    returned = asyncio.run(go())
    assert len(member.ended) == 3 and returned >= max(member.ended)  # no sibling is left running


AGENT_KWARGS = {"user_base_url": "http://127.0.0.1:1/v1", "user_model": "user"}


def _engine_config(mode: str = "inline") -> InferenceEngineConfig:
    return InferenceEngineConfig(
        experiment_name="groups", trial_name="t", backend="sglang:d1",
        agent=AgentConfig(agent_cls_path="unused", admin_api_key="k", mode=mode, turn_discount=0.5))


def test_the_engine_builds_partial_groups_of_rejection_dropping_episodes():
    engine = Tau2InfEngine(_engine_config(), SGLangBackend())
    group = engine._resolve_workflow(WORKFLOW, AGENT_KWARGS, group_size=8, proxy_addr="http://127.0.0.1:1")
    assert type(group) is PartialGroupWorkflow and group.group_size == 8
    assert type(group.workflow) is DropRejectedProxyWorkflow and group.workflow.discount == 0.5
    single = engine._resolve_workflow(WORKFLOW, AGENT_KWARGS, group_size=1, proxy_addr="http://127.0.0.1:1")
    assert type(single) is DropRejectedProxyWorkflow
    # AReaL's own workflow classes are grouped as AReaL does
    own = engine._resolve_workflow(Scripted([]), None, group_size=2)
    assert type(own) is GroupedRolloutWorkflow


def test_other_agent_modes_keep_areal_s_proxy_workflow():
    engine = Tau2InfEngine(_engine_config("subproc"), SGLangBackend())
    group = engine._resolve_workflow(WORKFLOW, AGENT_KWARGS, group_size=2, proxy_addr="http://127.0.0.1:1")
    assert type(group) is GroupedRolloutWorkflow and type(group.workflow) is not DropRejectedProxyWorkflow


@pytest.mark.parametrize("engine_class,base,backend", [
    (Tau2SGLangEngine, RemoteSGLangEngine, SGLangBackend),
    (Tau2vLLMEngine, RemotevLLMEngine, None),
    (CpuvLLMEngine, RemotevLLMEngine, CpuvLLMBackend),
])
def test_the_training_rollout_engines_use_partial_groups(monkeypatch, engine_class, base, backend):
    monkeypatch.setenv(SERVING_ENGINE_ENV, "areal")
    engine = engine_class(_engine_config())
    assert isinstance(engine, base) and type(engine._engine) is Tau2InfEngine
    if backend is not None:
        assert type(engine._engine.backend) is backend
