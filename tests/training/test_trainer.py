"""training/trainer.py: the one layer over AReaL. It refuses another AReaL release, the rollout it builds
carries the served-prompt rendering to the workers, and its rollout engines build the training's GRPO
groups (the groups themselves: tests/training/test_group_workflow.py; the whole path through AReaL's proxy:
tests/test_proxy_integration.py; the table of the AReaL names it replaces, compat/replaced.py:
tests/compat/test_replaced.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from areal.api import RolloutWorkflow
from areal.api.cli_args import AgentConfig, InferenceEngineConfig
from areal.engine.sglang_remote import RemoteSGLangEngine, SGLangBackend
from areal.engine.vllm_remote import RemotevLLMEngine
from areal.infra.remote_inf_engine import GroupedRolloutWorkflow

from examples.tau2.compat import AREAL_RELEASE, UnsupportedVersion
from examples.tau2.cpu.trainer import CpuvLLMBackend, CpuvLLMEngine
from examples.tau2.tau2_train import WORKFLOW
from examples.tau2.tau2_utils import EpisodeRejected, RejectReason
from examples.tau2.training.group_workflow import DropRejectedProxyWorkflow, PartialGroupWorkflow
from examples.tau2.training.served_prompt import PARITY_RECORD_ENV, SERVING_ENGINE_ENV
from examples.tau2.training.trainer import (
    Tau2InfEngine,
    Tau2PPOTrainer,
    Tau2SGLangEngine,
    Tau2vLLMEngine,
)
from tests.tau2_train_support import load


def test_another_areal_release_is_refused_at_construction(monkeypatch):
    from examples.tau2 import compat

    monkeypatch.setattr(compat, "installed_version", lambda package: "9.9.9")
    with pytest.raises(UnsupportedVersion, match=rf"mirrors areal {AREAL_RELEASE}, but areal 9.9.9"):
        Tau2PPOTrainer(SimpleNamespace())


class _Controller:
    """Stands in for the rollout controller AReaL's `as_controller` returns: records what it was given."""

    def __init__(self, config: Any, scheduler: Any):
        self.config, self.scheduler, self.init_kwargs = config, scheduler, None
        self.server_infos = ["server"]

    def initialize(self, **kwargs: Any) -> None:
        self.init_kwargs = kwargs


@pytest.mark.parametrize("backend,engine_class,serving", [("sglang", Tau2SGLangEngine, "sglang"),
                                                          ("vllm", Tau2vLLMEngine, "vllm")])
def test_the_rollout_workers_get_the_serving_engine_and_no_unused_evaluation_rollout(
        monkeypatch, tmp_path, backend, engine_class, serving):
    config = load(f"cluster.fileroot={tmp_path}").config
    monkeypatch.setattr(engine_class, "as_controller", classmethod(lambda cls, c, s: _Controller(c, s)))
    trainer = Tau2PPOTrainer.__new__(Tau2PPOTrainer)  # __init__ would start a cluster
    trainer.config, trainer.scheduler, trainer.parity_record_dir = config, "the scheduler", str(tmp_path)
    parallel = SimpleNamespace(tp_size=1, pp_size=1)
    trainer.rollout_alloc = SimpleNamespace(backend=backend, parallel=parallel)
    rollout = trainer._init_rollout(config.rollout)
    assert rollout.scheduler == "the scheduler" and rollout.init_kwargs["role"] == "rollout"
    specs = rollout.config.scheduling_spec
    assert all(spec.env_vars[SERVING_ENGINE_ENV] == serving for spec in specs)
    assert all(spec.env_vars[PARITY_RECORD_ENV] == str(tmp_path) for spec in specs)
    assert not any(SERVING_ENGINE_ENV in (spec.env_vars or {}) for spec in config.rollout.scheduling_spec)
    trainer.rollout, trainer.valid_dataloader = rollout, None
    assert trainer._init_rollout(config.rollout, is_eval=True) is None  # nothing would ever validate
    trainer.valid_dataloader = "validates"
    evaluation = trainer._init_rollout(config.rollout, is_eval=True)
    assert evaluation.init_kwargs == {
        "role": "eval-rollout", "server_args": rollout.init_kwargs["server_args"], "server_infos": ["server"]}
    assert all(spec.gpu == 0 for spec in evaluation.config.scheduling_spec)


# ---------------------------------------------------------------------------------------------
# The rollout engines: the training's GRPO groups (training/group_workflow.py)

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


def test_a_reply_of_stop_tokens_alone_is_an_empty_reply_and_any_other_is_left_as_it_is(tokenizer):
    """AReaL's `output_tokens_without_stop` raises on a reply of nothing but the end-of-text token (its
    proxy then answers 500); `EmptyReply` gives that reply's text as empty, its tokens and logprobs kept."""
    from areal.api import ModelResponse

    from examples.tau2.training.trainer import EmptyReply

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    stopped = ModelResponse(input_tokens=[1, 2], output_tokens=[eos], output_logprobs=[-0.3],
                            output_versions=[4], stop_reason="stop", tokenizer=tokenizer)
    with pytest.raises(ValueError, match="All output_tokens are EOS or PAD tokens"):
        _ = stopped.output_tokens_without_stop
    empty = EmptyReply.of(stopped)
    assert isinstance(empty, EmptyReply) and empty.output_tokens_without_stop == []
    assert (empty.input_tokens, empty.output_tokens, empty.output_logprobs, empty.output_versions) == (
        [1, 2], [eos], [-0.3], [4])
    assert isinstance(EmptyReply.of(dataclasses.replace(stopped, output_tokens=[eos, pad])), EmptyReply)
    for other in (dataclasses.replace(stopped, output_tokens=[7, eos]),
                  dataclasses.replace(stopped, output_tokens=[eos], stop_reason="length"),
                  dataclasses.replace(stopped, output_tokens=[])):
        assert EmptyReply.of(other) is other
