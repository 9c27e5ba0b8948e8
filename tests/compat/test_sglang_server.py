"""SGLang's own chat server code on CPU (tests/compat/sglang_server.py): its prompts, and nothing leaking."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compat.sglang_server import (
    GPU_ONLY_MODULES,
    GpuOnlyModule,
    SGLangChatServer,
    sglang_import_scope,
    sglang_model_dir,
)

PARAMETERS = {"type": "object", "properties": {"a": {"type": "integer"}}}
TOOLS = [{"type": "function", "function": {"name": n, "description": f"Does {n}.", "parameters": PARAMETERS}}
         for n in ("f", "g")]
MESSAGES = [
    {"role": "system", "content": "You help."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b": "é", "a": 1}'}}]},
    {"role": "tool", "content": "ok", "tool_call_id": "c1"},
]


SGLANG_ENV = ("TORCHINDUCTOR_CACHE_DIR", "DG_JIT_CACHE_DIR", "DG_JIT_USE_NVRTC")
"""Environment variables SGLang's server modules set when imported."""


def process_state() -> dict[str, Any]:
    """What SGLang's import changes process-wide (and the placeholders)."""
    return {"event loop policy": asyncio.get_event_loop_policy(),
            "threading._register_atexit": threading._register_atexit,  # type: ignore[attr-defined]
            "environment": {k: os.environ.get(k) for k in SGLANG_ENV},
            "placeholders": set(GPU_ONLY_MODULES) & set(sys.modules)}


@pytest.fixture(scope="module")
def state_before_server() -> dict[str, Any]:
    return process_state()


@pytest.fixture(scope="module")
def server(state_before_server: dict[str, Any],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangChatServer]:
    from examples.tau2.cpu.tiny_model import tokenizer_dir

    with SGLangChatServer(sglang_model_dir(tmp_path_factory.mktemp("sglang-model"), tokenizer_dir())) as s:
        yield s


def body(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": MESSAGES, "tools": TOOLS, **extra}


def sglang_tool(name: str) -> dict[str, object]:
    """A tool as SGLang's `Tool` model dumps it: description first, `strict` added."""
    return {"type": "function", "function": {"description": f"Does {name}.", "name": name,
                                             "parameters": PARAMETERS, "strict": False}}


def expected_ids(tokenizer: object, tools: list[dict[str, object]] | None) -> list[int]:
    """The prompt written out by hand: SGLang's tool dumps, the call's arguments parsed into a dict."""
    messages = [dict(m) for m in MESSAGES]
    messages[2] = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"b": "é", "a": 1}}}]}
    return list(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                              tokenize=True, return_dict=False))


def test_the_server_builds_sglangs_prompt_for_each_tool_choice(server, tokenizer):
    both = [sglang_tool("f"), sglang_tool("g")]
    assert server.prompt_ids(body()) == expected_ids(tokenizer, both)
    assert server.prompt_ids(body(tool_choice="required")) == expected_ids(tokenizer, both)
    assert server.prompt_ids(body(tool_choice="none")) == expected_ids(tokenizer, None)
    named = {"type": "function", "function": {"name": "g"}}
    assert server.prompt_ids(body(tool_choice=named)) == expected_ids(tokenizer, [sglang_tool("g")])
    text = tokenizer.decode(server.prompt_ids(body()))
    assert '{"name": "f", "arguments": {"b": "é", "a": 1}}' in text and '"strict": false' in text


def test_a_request_sglang_rejects_is_an_error_not_a_prompt(server):
    with pytest.raises(RuntimeError, match="built no request: 400"):
        server.prompt_ids({"model": "m", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "sometimes"})


def test_no_placeholder_module_or_sglang_import_side_effect_outlives_the_server(server, state_before_server):
    assert process_state() == state_before_server
    assert not state_before_server["placeholders"]
    assert importlib.util.find_spec("torchvision") is None
    from transformers.utils import is_torchvision_available

    assert not is_torchvision_available()


def test_the_import_scope_restores_what_an_import_changes(monkeypatch):
    monkeypatch.delenv("TAU2_SCOPE_PROBE", raising=False)
    monkeypatch.setenv("TAU2_SCOPE_KEPT", "before")
    policy = asyncio.get_event_loop_policy()
    with sglang_import_scope():
        import torchvision.io  # the placeholder, a package with submodules

        assert isinstance(torchvision.io, GpuOnlyModule)
        with pytest.raises(RuntimeError, match="torchvision.io.decode_jpeg is GPU-only"):
            torchvision.io.decode_jpeg(b"")
        asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
        threading._register_atexit = lambda *a, **k: None  # type: ignore[attr-defined]
        os.environ["TAU2_SCOPE_PROBE"] = "set"
        os.environ["TAU2_SCOPE_KEPT"] = "changed"
    assert asyncio.get_event_loop_policy() is policy
    assert threading._register_atexit.__module__ == "threading"  # type: ignore[attr-defined]
    assert "TAU2_SCOPE_PROBE" not in os.environ and os.environ["TAU2_SCOPE_KEPT"] == "before"
    assert not set(GPU_ONLY_MODULES) & set(sys.modules)


def test_a_real_gpu_module_is_never_shadowed(monkeypatch):
    monkeypatch.setitem(sys.modules, "sgl_kernel", types.ModuleType("sgl_kernel"))
    with pytest.raises(RuntimeError, match="sgl_kernel already imported"), sglang_import_scope():
        pass


def test_the_model_directory_is_a_qwen3_config_and_the_tokenizer(tmp_path):
    from transformers import AutoConfig

    from examples.tau2.cpu.tiny_model import tokenizer_dir

    folder = sglang_model_dir(tmp_path / "m", tokenizer_dir())
    assert AutoConfig.from_pretrained(folder).architectures == ["Qwen3ForCausalLM"]
    copied = {p.name for p in Path(folder).iterdir()}
    assert {p.name for p in tokenizer_dir().iterdir() if p.is_file()} <= copied
