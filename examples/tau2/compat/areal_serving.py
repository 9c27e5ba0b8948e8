"""AReaL 1.0.4's proxy rendering prompts as the serving engine does: the trainer learns the served prompt.

AReaL's proxy applies the chat template itself (`ArealOpenAI.chat.completions.create` calls the module
name `areal.experimental.openai.client.apply_chat_template`), and its prompt differs from the one SGLang's
or vLLM's own chat server builds for the same request (`serving_render`). Three pieces fix that:

1. `install_proxy_rendering` points that one name at `ServingTemplate`, which hands the template the
   messages and tools as the serving engine's server would (`serving_render.template_inputs`). It checks
   that the name is still AReaL's `hf_utils.apply_chat_template` first, so another AReaL fails loudly.
   The request's `tool_choice` changes the served prompt too (SGLang renders no tools for `none` and only
   the named one for a named choice), but AReaL's `AsyncCompletionsWithReward.create` keeps it to itself
   and calls the template without it: `install_proxy_rendering` also wraps that `create` so that the
   request's `tool_choice` is in `REQUEST_TOOL_CHOICE` (a context variable, so concurrent requests each
   see their own) while it runs, where `ServingTemplate` reads it.
2. The rollout engines `ServingSGLangEngine` / `ServingvLLMEngine` call it when they are created. AReaL's
   proxy process creates the rollout engine class it is given by import path, so this runs inside the
   proxy, where the template is applied; the engine reads the serving engine from `SERVING_ENGINE_ENV`.
3. `ServingRolloutMixin` (before `PPOTrainer`) creates the rollout controller with those engine classes
   and puts `SERVING_ENGINE_ENV` (and, for the smoke run's per-step check, `PARITY_RECORD_ENV`) into
   the rollout workers' environment, which the proxies they fork inherit.

With `PARITY_RECORD_ENV` set, every rendered request is appended to `<dir>/requests-<pid>.jsonl` with
the policy version that served it, so a check can compare it with the live server (`training.parity`).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import logging
import os
import threading
from copy import deepcopy
from pathlib import Path
from typing import Any

from areal import PPOTrainer
from areal.api.cli_args import (
    InferenceEngineConfig,
    SchedulingStrategy,
    SchedulingStrategyType,
    SGLangConfig,
    vLLMConfig,
)
from areal.engine.sglang_remote import RemoteSGLangEngine
from areal.engine.vllm_remote import RemotevLLMEngine
from areal.utils.environ import is_single_controller

from examples.tau2.compat import UnsupportedVersion, require
from examples.tau2.compat.areal_groups import PartialGroupEngine
from examples.tau2.compat.serving_render import ServingEngine, template_inputs
from examples.tau2.slurm.scheduler import Tau2SchedulerMixin

logger = logging.getLogger("tau2_areal.serving")

SERVING_ENGINE_ENV = "TAU2_SERVING_ENGINE"
"""`sglang` or `vllm`: whose prompt the proxy renders; `areal`: AReaL's own rendering (parity off)."""
AREAL_RENDERING = "areal"
PARITY_RECORD_ENV = "TAU2_PARITY_RECORD_DIR"
"""A folder: the proxy appends every rendered request there (`requests-<pid>.jsonl`)."""
RECORD_PREFIX = "requests-"


def serving_engine_name(configured: str, rollout_backend: str) -> str:
    """`econfig.serving_engine` resolved: `auto` is the rollout backend (sglang or vllm)."""
    return rollout_backend if configured == "auto" else configured


REQUEST_TOOL_CHOICE: contextvars.ContextVar[Any] = contextvars.ContextVar("tau2_request_tool_choice",
                                                                          default="auto")
"""The `tool_choice` of the chat request whose prompt is being rendered (`auto` when it gave none)."""
TOOL_CHOICE_WRAPPER = "_tau2_keeps_tool_choice"
"""Marks the wrapped `create`, so that installing twice never wraps it twice."""


def _tool_choice_value(tool_choice: Any) -> Any:
    """The request's `tool_choice`, `auto` when omitted (the OpenAI SDK's `NOT_GIVEN`, or None)."""
    from openai import NotGiven

    return "auto" if tool_choice is None or isinstance(tool_choice, NotGiven) else tool_choice


def keeping_tool_choice(create: Any) -> Any:
    """AReaL's `create`, with the request's `tool_choice` in `REQUEST_TOOL_CHOICE` while it runs.

    `functools.wraps` keeps its signature visible, which AReaL's proxy reads to pick the arguments it passes.
    """

    @functools.wraps(create)
    async def create_keeping_tool_choice(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = REQUEST_TOOL_CHOICE.set(_tool_choice_value(kwargs.get("tool_choice")))
        try:
            return await create(self, *args, **kwargs)
        finally:
            REQUEST_TOOL_CHOICE.reset(token)

    setattr(create_keeping_tool_choice, TOOL_CHOICE_WRAPPER, True)
    return create_keeping_tool_choice


def _areal_create(completions: type) -> Any:
    """AReaL's own `AsyncCompletionsWithReward.create` (unwrapped), checked to be the one audited."""
    create = completions.__dict__.get("create")
    original = getattr(create, "__wrapped__", None) if getattr(create, TOOL_CHOICE_WRAPPER, False) else create
    audited = (inspect.iscoroutinefunction(original)
               and getattr(original, "__qualname__", "") == "AsyncCompletionsWithReward.create"
               and "tool_choice" in inspect.signature(original).parameters)
    if not audited:
        raise UnsupportedVersion(
            "areal.experimental.openai.client.AsyncCompletionsWithReward.create is no longer the coroutine "
            "taking `tool_choice` that examples/tau2/compat/areal_serving.py wraps: audit it for this AReaL")
    return original


class RequestRecorder:
    """Appends each rendered request to one JSONL file per process (the proxy's)."""

    def __init__(self, folder: str, engine: Any = None):
        self.path = Path(folder) / f"{RECORD_PREFIX}{os.getpid()}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.engine = engine
        self._lock = threading.Lock()

    def write(self, messages: Any, tools: Any, prompt_ids: list[int], tool_choice: Any = "auto") -> None:
        version = self.engine.get_version() if self.engine is not None else -1
        line = json.dumps({"version": version, "messages": messages, "tools": tools,
                           "tool_choice": tool_choice, "prompt_ids": list(prompt_ids)})
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


class ServingTemplate:
    """AReaL's `apply_chat_template`, fed the messages and tools as `engine`'s server builds them for the
    request's `tool_choice`."""

    def __init__(self, engine: ServingEngine | None, original: Any, recorder: RequestRecorder | None):
        self.engine = engine
        self.original = original
        self.recorder = recorder

    def __call__(self, tokenizer: Any, messages: list[dict[str, Any]], *, tools: Any = None,
                 **kwargs: Any) -> Any:
        tool_choice = REQUEST_TOOL_CHOICE.get()
        rendered_messages, rendered_tools = ((messages, tools) if self.engine is None else
                                             template_inputs(self.engine, messages, tools, tool_choice))
        result = self.original(tokenizer, rendered_messages, tools=rendered_tools, **kwargs)
        if self.recorder is not None and kwargs.get("tokenize", True):
            self.recorder.write(messages, tools, result, tool_choice)
        return result


def install_proxy_rendering(engine: ServingEngine | None, record_dir: str | None = None,
                            rollout_engine: Any = None) -> None:
    """Make AReaL's proxy (this process) render prompts as `engine`'s server does; None: AReaL's own.

    Idempotent; `record_dir` also records every rendered request (with `rollout_engine`'s version).
    """
    require("areal", "1.0.4", "the proxy rendering (examples/tau2/compat/areal_serving.py)")
    from areal.experimental.openai import client
    from areal.utils import hf_utils

    current = client.apply_chat_template
    if current is not hf_utils.apply_chat_template and not isinstance(current, ServingTemplate):
        raise UnsupportedVersion(
            "areal.experimental.openai.client.apply_chat_template is no longer areal.utils.hf_utils."
            "apply_chat_template: audit examples/tau2/compat/areal_serving.py for this AReaL")
    completions = client.AsyncCompletionsWithReward
    create = _areal_create(completions)
    recorder = RequestRecorder(record_dir, rollout_engine) if record_dir else None
    if engine is None and recorder is None:
        client.apply_chat_template = hf_utils.apply_chat_template
        completions.create = create
    else:
        client.apply_chat_template = ServingTemplate(engine, hf_utils.apply_chat_template, recorder)
        completions.create = keeping_tool_choice(create)


def install_from_env(rollout_engine: Any) -> None:
    """`install_proxy_rendering` as `ServingRolloutMixin` configured it through the environment."""
    name = os.environ.get(SERVING_ENGINE_ENV)
    if not name:
        raise RuntimeError(f"{SERVING_ENGINE_ENV} is not set: {type(rollout_engine).__name__} is created "
                           "by ServingRolloutMixin's rollout controller, which sets it for its workers")
    engine = None if name == AREAL_RENDERING else ServingEngine(name)
    install_proxy_rendering(engine, os.environ.get(PARITY_RECORD_ENV) or None, rollout_engine)


class ServingRenderEngine:
    """Mixin for AReaL's rollout engines: creating one installs the serving engine's rendering."""

    def __init__(self, config: InferenceEngineConfig, *args: Any, **kwargs: Any):
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]
        install_from_env(self)


class ServingSGLangEngine(ServingRenderEngine, PartialGroupEngine, RemoteSGLangEngine):
    """AReaL's SGLang rollout engine; its proxy renders as `SERVING_ENGINE_ENV` says, and a rejected
    episode drops only itself from its group (`compat/areal_groups.py`)."""


class ServingvLLMEngine(ServingRenderEngine, PartialGroupEngine, RemotevLLMEngine):
    """AReaL's vLLM rollout engine; its proxy renders as `SERVING_ENGINE_ENV` says, and a rejected
    episode drops only itself from its group (`compat/areal_groups.py`)."""


class ServingRolloutMixin:
    """Put before AReaL's `PPOTrainer`: its rollout (and evaluation rollout) uses the engines above.

    `serving_engine` is `sglang`, `vllm` or `areal`; the default follows `econfig.serving_engine`.
    `parity_record_dir`, when set, records every rendered request there.
    """

    config: Any
    rollout_alloc: Any
    actor_alloc: Any
    scheduler: Any
    rollout: Any
    parity_record_dir: str = ""

    def __init__(self, config: Any, *args: Any, **kwargs: Any):
        require("areal", "1.0.4", "ServingRolloutMixin (examples/tau2/compat/areal_serving.py)")
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]

    def rollout_engine_class(self) -> type:
        return {"sglang": ServingSGLangEngine, "vllm": ServingvLLMEngine}[self.rollout_alloc.backend]

    def serving_env(self) -> dict[str, str]:
        econfig = getattr(self.config, "econfig", None)
        configured = getattr(econfig, "serving_engine", "auto")
        env = {SERVING_ENGINE_ENV: serving_engine_name(configured, self.rollout_alloc.backend)}
        if self.parity_record_dir:
            env[PARITY_RECORD_ENV] = self.parity_record_dir
        return env

    def _init_rollout(self, rollout_config: InferenceEngineConfig, is_eval: bool = False,
                      lora_path: str | None = None):
        """AReaL's `PPOTrainer._init_rollout` (single controller, no LoRA), with the engines above, and no
        evaluation rollout for a run that never validates (no validation data loader, which AReaL sets
        up just before): AReaL 1.0.4 builds one whenever it is not in online mode (rl_trainer.py ~312), a
        forked worker per server plus, once proxies start, its proxy, that nothing would ever use (what
        that costs a CPU smoke run: bench/RESULTS.md, "Smoke run without the unused evaluation workers").
        AReaL checks `eval_rollout is None` wherever it uses it."""
        if is_eval and getattr(self, "valid_dataloader", None) is None:
            return None
        if lora_path is not None or not is_single_controller() or rollout_config._version == "v2":
            raise NotImplementedError("the serving-engine rendering runs on AReaL's single controller "
                                      "(scheduler.type local or slurm), without LoRA or the v2 controller")
        config = deepcopy(rollout_config)
        for spec in config.scheduling_spec:
            spec.env_vars = {**(spec.env_vars or {}), **self.serving_env()}
        if is_eval:  # as AReaL: no off-policyness bound, colocated with the rollout servers
            config.max_head_offpolicyness = int(1e12)
            config.scheduling_strategy = SchedulingStrategy(
                type=SchedulingStrategyType.colocation, target="rollout")
            for spec in config.scheduling_spec:
                spec.gpu = 0
        parallel = self.rollout_alloc.parallel
        if self.rollout_alloc.backend == "sglang":
            if self.config.rollout.return_routed_experts:
                self.config.sglang.enable_return_routed_experts = True
            server_args = SGLangConfig.build_args(sglang_config=self.config.sglang, tp_size=parallel.tp_size,
                                                  pp_size=parallel.pp_size, base_gpu_id=0)
        else:
            if self.config.rollout.return_routed_experts:
                raise ValueError("return_routed_experts is not supported with the vLLM backend")
            server_args = vLLMConfig.build_args(vllm_config=self.config.vllm, tp_size=parallel.tp_size,
                                                pp_size=parallel.pp_size)
        controller = self.rollout_engine_class().as_controller(config, self.scheduler)
        init_kwargs: dict[str, Any] = dict(role="rollout", server_args=server_args)
        if is_eval:
            init_kwargs.update(server_infos=self.rollout.server_infos, role="eval-rollout")
        controller.initialize(**init_kwargs)
        return controller



class ServingPPOTrainer(Tau2SchedulerMixin, ServingRolloutMixin, PPOTrainer):
    """AReaL's `PPOTrainer` whose proxy renders prompts as the serving engine does (the GPU entry's), on
    this machine or through SLURM (`slurm/scheduler.py`)."""
