"""Tau2AgentWorkflow through AReaL's real rollout path, on CPU, against a scripted SGLang server.

The whole single-controller path that `PPOTrainer` uses for agent workflows runs here:
LocalScheduler -> rpc_server worker process -> the training's rollout engine (`Tau2SGLangEngine`) ->
RolloutController.start_proxy() (AReaL forks its OpenAI-compatible proxy worker) ->
rollout_batch(workflow=<import string>, group_size), set up by
`bench/scripted_sglang.py`. Only the model is fake: a small HTTP server that speaks
SGLang's `/generate` (input_ids in; output token ids and logprobs out) and replies with the real Qwen3
tokens of a scripted turn: first a `<tool_call>` for a real airline tool, then a closing sentence.
AReaL's proxy applies Qwen3's chat template, parses the tool call with sglang's parser, tau2 runs the
tool and scores the episode, and the proxy exports one training row per completion.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
from areal.infra.rpc.rtensor import RTensor

from bench.scripted_sglang import (
    CLOSING,
    TASK,
    TOOL_CALL,
    ScriptedSGLang,
    rollout_config,
    rollout_controller,
    scripted_logprobs,
)
from examples.tau2.cpu.scripted_endpoint import EndpointThread
from examples.tau2.tau2_train import WORKFLOW
from examples.tau2.training.served_prompt import SERVING_ENGINE_ENV
from examples.tau2.training.trainer import Tau2SGLangEngine
from tests.fault_relay import FAULTS, FaultRelay

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TURN_DISCOUNT = 0.5
MAX_COMPLETION_TOKENS = 256


@pytest.fixture
def fake_sglang() -> Iterator[ScriptedSGLang]:
    with ScriptedSGLang() as server:
        yield server


def run_groups(tmp_path: Path, fake: ScriptedSGLang, user: EndpointThread, groups: list[tuple[str, int]],
               engine_max_tokens: int | None = None) -> list[list[dict[str, torch.Tensor]]]:
    """One GRPO group per (user-simulator model, episodes), one after the other, through one real
    controller and the training's rollout engine; every process is gone on return. Episodes are dumped
    under tmp_path/dumps. Uniform groups are kept: every group here is one (a scripted policy)."""
    config = rollout_config(tmp_path, turn_discount=TURN_DISCOUNT, env={SERVING_ENGINE_ENV: "sglang"},
                            engine_max_tokens=engine_max_tokens)
    workflow_kwargs = dict(
        user_base_url=user.url, agent_model="default", max_completion_tokens=MAX_COMPLETION_TOKENS,
        episode_timeout_s=120.0, request_timeout_s=60.0, llm_retries=1, retry_backoff_s=0.1,
        dump_dir=str(tmp_path / "dumps"), drop_uniform_groups=False,
    )
    with rollout_controller(Tau2SGLangEngine, config, fake, tmp_path) as controller:
        return [[RTensor.localize(r) for r in controller.rollout_batch(
            [TASK], workflow=WORKFLOW, workflow_kwargs={**workflow_kwargs, "user_model": user_model},
            group_size=group_size)] for user_model, group_size in groups]


def test_tau2_episodes_through_areal_proxy_and_a_rejected_episode_drops_only_itself(tmp_path, fake_sglang,
                                                                                    endpoint, monkeypatch):
    """A group of 2 episodes, then groups of 4 whose user simulator is down for the first 1 (then 3) of
    its episodes: each of those is rejected after its retries; the first such group keeps its 3 other
    episodes, the second has 1 left and is dropped (AReaL 1.0.4 alone would drop both:
    tests/training/test_trainer.py)."""
    monkeypatch.setenv("AREAL_PROXY_WARN_ONCE", "1")  # inherited by the workers
    results, one_down, three_down = run_groups(tmp_path, fake_sglang, endpoint, [
        ("user", 2), ("failfirst1:user", 4), ("failfirst3:user", 4)])
    assert not psutil.Process().children(recursive=True), "a worker process outlived the test"
    assert len(results) == 1, "the group was rejected (see the worker logs under tmp_path/logs)"
    traj = results[0]

    # 2 episodes x 2 completions, one row each (export_style individual), in episode order.
    assert traj["input_ids"].shape[0] == 4
    # The episode reward (tau2: 1.0) goes to the last completion, discounted to the earlier one.
    assert traj["rewards"].tolist() == [TURN_DISCOUNT, 1.0, TURN_DISCOUNT, 1.0]

    tok = fake_sglang.tokenizer
    call_ids, closing_ids = fake_sglang.reply_ids(TOOL_CALL), fake_sglang.reply_ids(CLOSING)
    prompts_sent = [r["input_ids"] for r in fake_sglang.requests[:4]]  # the first group's
    for row in range(4):
        length = int(traj["attention_mask"][row].sum())
        ids = traj["input_ids"][row, :length].tolist()
        mask = traj["loss_mask"][row, :length].tolist()
        logprobs = traj["logprobs"][row, :length].tolist()
        versions = traj["versions"][row, :length].tolist()
        n_out = sum(mask)
        prompt, output = ids[: length - n_out], ids[length - n_out:]
        assert mask == [0] * len(prompt) + [1] * n_out  # only the policy's tokens are trained
        assert prompt in prompts_sent  # exactly what SGLang received
        expected = call_ids if row % 2 == 0 else closing_ids
        assert output == expected  # the scripted token ids, <|im_end|> included
        assert logprobs[len(prompt):] == pytest.approx(scripted_logprobs(len(expected)))
        assert logprobs[: len(prompt)] == [0.0] * len(prompt)
        assert versions == [-1] * len(prompt) + [0] * n_out

    first_prompt = tok.decode(traj["input_ids"][0, : int(traj["attention_mask"][0].sum())])
    assert '"name": "get_user_details"' in first_prompt  # tau2's airline tools were offered
    second = traj["input_ids"][1, : int(traj["attention_mask"][1].sum()) - len(closing_ids)].tolist()
    second_prompt = tok.decode(second)
    # The proxy parsed the <tool_call> into a real tool call, tau2 ran it, and the result came back.
    assert "<tool_response>" in second_prompt and "Amelia" in second_prompt and "Davis" in second_prompt
    # Every policy request carried the workflow's per-turn token limit.
    assert {r["sampling_params"]["max_new_tokens"] for r in fake_sglang.requests} == {MAX_COMPLETION_TOKENS}

    assert len(one_down) == 1, "the group was lost (see the worker logs under tmp_path/logs)"
    # 3 episodes x 2 completions; the rejected episode left no row
    assert one_down[0]["rewards"].tolist() == [TURN_DISCOUNT, 1.0] * 3
    assert three_down == []
    assert endpoint.endpoint.requests["failfirst3:user"] >= 3 * 2  # each down episode: a try + a retry


CONTEXT = 5200
"""Tokens of context the proxy enforces in the test below: the first prompt (tau2's airline system prompt
and tools) fits with room for a reply, the second (the first plus the tool call and the user's details
that the tool returned) does not."""


def test_an_episode_past_the_context_is_scored_not_retried_and_its_group_kept(tmp_path, fake_sglang, endpoint,
                                                                              monkeypatch):
    """AReaL's proxy refuses the second policy prompt before sending it (`engine_max_tokens`): each episode
    ends as `context_exceeded`, is scored by tau2 (0: it ended early) and trained, the refused request is
    neither sent nor retried, and the group of two is kept (without the uniform-group filter, which
    would drop two equal rewards for its own reason)."""
    monkeypatch.setenv("AREAL_PROXY_WARN_ONCE", "1")
    [results] = run_groups(tmp_path, fake_sglang, endpoint, [("user", 2)], engine_max_tokens=CONTEXT)
    assert not psutil.Process().children(recursive=True), "a worker process outlived the test"
    assert len(results) == 1, "the group was rejected (see the worker logs under tmp_path/logs)"
    traj = results[0]
    # one completion per episode (the tool call), each carrying the episode's reward: 0
    assert traj["input_ids"].shape[0] == 2 and traj["rewards"].tolist() == [0.0, 0.0]
    assert len(fake_sglang.requests) == 2  # the second prompt of each episode never reached SGLang
    assert all(len(r["input_ids"]) < CONTEXT for r in fake_sglang.requests)
    dumps = [json.loads(p.read_text()) for p in (tmp_path / "dumps").rglob("*.json")]
    assert [d["termination"] for d in dumps] == ["context_exceeded"] * 2
    for d in dumps:
        prompt = int(re.search(r"the prompt \((\d+) tokens\)", d["note"]).group(1))
        assert prompt > CONTEXT and d["tau2_reward"] == 0.0 and d["num_invalid_tool_calls"] == 0
        assert d["note"].endswith(f"does not fit the context ({CONTEXT} tokens), refused by AReaL's proxy")
    log = "\n".join(p.read_text() for p in (tmp_path / "logs").rglob("*.log"))  # the worker's, and merged
    assert re.search(r"tau2 airline/41 ended: context exceeded: the prompt \(\d+ tokens\) does not fit "
                     rf"the context \({CONTEXT} tokens\), refused by AReaL's proxy; scored 0.000", log)
    assert "rejected (" not in log


GAVE_UP = ("timeout", *FAULTS, "the SDK's own retry")
"""How a client gives up on a completion AReaL's proxy has recorded (tests/fault_relay.py)."""


def test_a_completion_whose_client_gave_up_is_no_row_and_the_turns_taken_keep_their_discount_chain(
        tmp_path, endpoint, monkeypatch):
    """One GRPO group of 2 airline episodes (2 turns each) per way a client gives up on a completion the
    proxy recorded: the first request times out at the client while SGLang is still generating it (the
    proxy serves it to its end, 1.6 s before the episode's later turns, 1.5 s each, end); or, through
    `FaultRelay`, its answer is reset, a 502 or a malformed body; or (an agent whose retries are the OpenAI
    SDK's) a 502 the SDK retries. Each time the proxy recorded 5 completions for the 4 turns taken: 4 rows,
    each episode's reward chained over its own 2 turns ([0.5, 1.0]; AReaL 1.0.4 alone trains the orphan
    too, the issue's 0.25, 0.5, 1.0, 0.5, 1.0)."""
    monkeypatch.setenv("AREAL_PROXY_WARN_ONCE", "1")
    config = rollout_config(tmp_path, turn_discount=TURN_DISCOUNT, env={SERVING_ENGINE_ENV: "sglang"},
                            max_head_offpolicyness=len(GAVE_UP) - 1)
    tau2_kwargs = dict(user_base_url=endpoint.url, user_model="user", agent_model="default",
                       max_completion_tokens=MAX_COMPLETION_TOKENS, episode_timeout_s=120.0,
                       request_timeout_s=4.0, llm_retries=2, retry_backoff_s=0.1, drop_uniform_groups=False)
    # The timed-out completion ends 1.5 s after its client gave up and 1.6 s before its episode ends and is
    # exported: margins a loaded machine keeps, so that the proxy has recorded it, an orphan, by then.
    with (ScriptedSGLang(delay_s=1.5, first_delays_s=[5.5]) as sglang,
          rollout_controller(Tau2SGLangEngine, config, sglang, tmp_path) as controller,
          FaultRelay(controller.proxy_addrs[0]) as relay):
        trained: dict[str, list[float]] = {}
        for path in GAVE_UP:
            sdk = path == "the SDK's own retry"
            relay.faults = ["502" if sdk else path] if path != "timeout" else []
            generated, started = len(sglang.requests), time.monotonic()
            controller.submit(TASK, workflow="tests.fault_relay.SdkRetryAgent" if sdk else WORKFLOW,
                              workflow_kwargs={} if sdk else tau2_kwargs, group_size=2, proxy_addr=relay.url)
            [traj] = controller.wait(1)
            assert traj is not None, f"{path}: the group was rejected (the worker logs: tmp_path/logs)"
            traj = RTensor.localize(traj)
            assert len(sglang.requests) - generated == 5, f"{path}: the proxy served no orphan"
            if path == "timeout":
                assert time.monotonic() - started > 4.0  # the client gave up after request_timeout_s
            else:
                assert relay.faulted[-1] == ("502" if sdk else path) and not relay.faults
            assert traj["input_ids"].shape[0] == traj["rewards"].shape[0]
            trained[path] = traj["rewards"].tolist()
        stats = controller.export_stats()
    assert trained == {path: [TURN_DISCOUNT, 1.0, TURN_DISCOUNT, 1.0] for path in GAVE_UP}
    assert stats["rollout/tau2/rows/not_taken"] == pytest.approx(0.5)  # one per group of two episodes
    assert stats["rollout/tau2/rows/missing"] == 0.0
    assert not psutil.Process().children(recursive=True), "a worker process outlived the test"


def test_an_empty_reply_is_scored_as_the_policy_s_not_retried_as_the_server_s(tmp_path, fake_sglang, endpoint,
                                                                             monkeypatch):
    """The policy ends its first turn at once (the end-of-text token alone). AReaL 1.0.4's proxy answers 500
    ("All output_tokens are EOS or PAD tokens"), the client retries and the empty reply is resampled away;
    through the training's engine (`EmptyReply`) it is an empty reply: the episode ends as an invalid turn,
    scored, with no request failed, and that one token is its row."""
    monkeypatch.setenv("AREAL_PROXY_WARN_ONCE", "1")
    fake_sglang.first_replies = [""]
    [results] = run_groups(tmp_path, fake_sglang, endpoint, [("user", 2)])
    assert len(fake_sglang.requests) == 3  # the empty reply, and the other episode's two turns: no retry
    [dump] = [d for d in (json.loads(p.read_text()) for p in (tmp_path / "dumps").rglob("*.json"))
              if d["termination"] == "invalid_output"]
    assert dump["note"] == "empty reply" and dump["policy_failed_attempts"] == 0 and dump["tau2_reward"] == 0
    [traj] = results
    eos = fake_sglang.tokenizer.eos_token_id
    outputs = [traj["input_ids"][row][traj["loss_mask"][row].bool()].tolist() for row in range(3)]
    assert [eos] in outputs  # the empty reply is trained on: its one token, with the episode's reward
