"""AReaL's proxy rendering each prompt as the serving engine's own chat server does.

AReaL's proxy applies the chat template itself, and its prompt differs from the server's
(`compat/serving_render.py`), so the trainer would learn a prompt no server shows the policy.
`install_proxy_rendering` replaces two AReaL names in the proxy process (rows of `compat/replaced.py`).
The engine comes from `SERVING_ENGINE_ENV`; with `PARITY_RECORD_ENV` set, each rendered request is
appended to `<dir>/requests-<pid>.jsonl` for `cpu.parity`.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from examples.tau2.compat import UnsupportedVersion
from examples.tau2.compat.serving_render import ServingEngine, template_inputs

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


def keeping_tool_choice(create: Any) -> Any:
    """AReaL's `create`, with the request's `tool_choice` (`auto` when omitted: None or the SDK's
    `NOT_GIVEN`) in `REQUEST_TOOL_CHOICE` while it runs. `functools.wraps` keeps its signature visible,
    which AReaL's proxy reads to pick the arguments it passes."""
    from openai import NotGiven

    @functools.wraps(create)
    async def create_keeping_tool_choice(self: Any, *args: Any, **kwargs: Any) -> Any:
        choice = kwargs.get("tool_choice")
        token = REQUEST_TOOL_CHOICE.set("auto" if choice is None or isinstance(choice, NotGiven) else choice)
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
        raise UnsupportedVersion("areal.experimental.openai.client.AsyncCompletionsWithReward.create is no "
                                 "longer the coroutine taking `tool_choice` that examples/tau2/training/"
                                 "served_prompt.py wraps: audit it for this AReaL")
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


class PieceEncoder:
    """A tokenizer's ids for a rendered prompt, each piece between two added tokens (`<|im_start|>`,
    `<tool_call>`, ...) encoded once a process. Exact: the tokenizer itself cuts the text at its added
    tokens before it normalizes and pre-tokenizes each piece alone, so a prompt's ids are its pieces' ids
    in order; and an episode's every prompt repeats the pieces of the one before (the system prompt with
    its tools, ~4,800 of airline's tokens, is one piece for all episodes). `exact` is False for a tokenizer
    whose added tokens strip, match whole words or match normalized text: those cut differently."""

    def __init__(self, tokenizer: Any, pieces: int = 16384):
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        backend = getattr(tokenizer, "backend_tokenizer", None)  # a slow tokenizer has none: not exact
        self.exact = backend is not None and bool(added) and not any(
            t.lstrip or t.rstrip or t.single_word or t.normalized for t in added.values())
        self.ids = {t.content: i for i, t in added.items()}
        self._cut = re.compile("(" + "|".join(map(re.escape, sorted(self.ids, key=len, reverse=True))) + ")")
        self._piece = functools.lru_cache(maxsize=pieces)(
            lambda piece: tuple(backend.encode(piece, add_special_tokens=False).ids))

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for i, part in enumerate(self._cut.split(text)):
            if i % 2:
                ids.append(self.ids[part])
            elif part:
                ids.extend(self._piece(part))
        return ids


@dataclass(eq=False)  # compared and hashed by identity, as AReaL's function
class ServingTemplate:
    """AReaL's `apply_chat_template`, fed the messages and tools as `engine`'s server builds them for the
    request's `tool_choice` (None: as AReaL does); the text it renders is tokenized by `PieceEncoder`
    (AReaL tokenizes the whole prompt again each turn, the proxy's largest cost: bench/RESULTS.md
    "Through AReaL's rollout worker and proxy at width")."""

    engine: ServingEngine | None
    original: Any
    recorder: RequestRecorder | None
    encoders: dict[int, tuple[Any, PieceEncoder]] = field(default_factory=dict)
    """Per tokenizer, by identity, beside the tokenizer itself (so that its id is not reused)."""

    def __call__(self, tokenizer: Any, messages: list[dict[str, Any]], *, tools: Any = None,
                 tokenize: bool = True, **kwargs: Any) -> Any:
        tool_choice = REQUEST_TOOL_CHOICE.get()
        rendered_messages, rendered_tools = ((messages, tools) if self.engine is None else
                                             template_inputs(self.engine, messages, tools, tool_choice))
        encoder = self._encoder(tokenizer) if tokenize else None
        if encoder is not None and encoder.exact:
            result = encoder.encode(self.original(tokenizer, rendered_messages, tools=rendered_tools,
                                                  tokenize=False, **kwargs))
        else:
            result = self.original(tokenizer, rendered_messages, tools=rendered_tools, tokenize=tokenize,
                                   **kwargs)
        if self.recorder is not None and tokenize:
            self.recorder.write(messages, tools, result, tool_choice)
        return result

    def _encoder(self, tokenizer: Any) -> PieceEncoder:
        if id(tokenizer) not in self.encoders:
            self.encoders[id(tokenizer)] = (tokenizer, PieceEncoder(tokenizer))
        return self.encoders[id(tokenizer)][1]


def install_proxy_rendering(engine: ServingEngine | None, record_dir: str | None = None,
                            rollout_engine: Any = None) -> None:
    """Make AReaL's proxy (this process) render prompts as `engine`'s server does; None: AReaL's own.
    Idempotent; `record_dir` also records every rendered request (with `rollout_engine`'s version)."""
    from areal.experimental.openai import client
    from areal.utils import hf_utils

    current = client.apply_chat_template
    if current is not hf_utils.apply_chat_template and not isinstance(current, ServingTemplate):
        raise UnsupportedVersion(
            "areal.experimental.openai.client.apply_chat_template is no longer areal.utils.hf_utils."
            "apply_chat_template: audit examples/tau2/training/served_prompt.py for this AReaL")
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
    """`install_proxy_rendering` as `Tau2PPOTrainer` set it in the rollout workers' environment."""
    name = os.environ.get(SERVING_ENGINE_ENV)
    if not name:
        raise RuntimeError(f"{SERVING_ENGINE_ENV} is not set: {type(rollout_engine).__name__} is created "
                           "by Tau2PPOTrainer's rollout controller, which sets it for its workers")
    engine = None if name == AREAL_RENDERING else ServingEngine(name)
    install_proxy_rendering(engine, os.environ.get(PARITY_RECORD_ENV) or None, rollout_engine)

