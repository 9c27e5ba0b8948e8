"""AReaL's proxy rendering switched to the serving engine's (compat/areal_serving.py)."""

from __future__ import annotations

import json

import pytest
from areal.experimental.openai import client
from areal.utils import hf_utils

from examples.tau2.compat import UnsupportedVersion
from examples.tau2.compat.areal_serving import (
    AREAL_RENDERING,
    PARITY_RECORD_ENV,
    SERVING_ENGINE_ENV,
    ServingTemplate,
    install_from_env,
    install_proxy_rendering,
    serving_engine_name,
)
from examples.tau2.compat.serving_render import ServingEngine


@pytest.fixture(autouse=True)
def restore():
    yield
    client.apply_chat_template = hf_utils.apply_chat_template


class _Versioned:
    def get_version(self) -> int:
        return 7


def test_install_switches_the_proxys_template_call_and_back():
    install_proxy_rendering(ServingEngine.SGLANG)
    assert isinstance(client.apply_chat_template, ServingTemplate)
    install_proxy_rendering(ServingEngine.VLLM)  # idempotent: wraps AReaL's function, never itself
    assert client.apply_chat_template.original is hf_utils.apply_chat_template
    assert client.apply_chat_template.engine is ServingEngine.VLLM
    install_proxy_rendering(None)
    assert client.apply_chat_template is hf_utils.apply_chat_template


def test_another_areal_is_refused():
    client.apply_chat_template = lambda *a, **k: []
    with pytest.raises(UnsupportedVersion, match="audit examples/tau2/compat/areal_serving.py"):
        install_proxy_rendering(ServingEngine.SGLANG)


def test_the_environment_selects_the_rendering_and_recording(monkeypatch, tmp_path):
    monkeypatch.delenv(SERVING_ENGINE_ENV, raising=False)
    with pytest.raises(RuntimeError, match=SERVING_ENGINE_ENV):
        install_from_env(_Versioned())
    monkeypatch.setenv(SERVING_ENGINE_ENV, AREAL_RENDERING)
    monkeypatch.setenv(PARITY_RECORD_ENV, str(tmp_path))
    install_from_env(_Versioned())
    template = client.apply_chat_template
    assert isinstance(template, ServingTemplate) and template.engine is None  # AReaL's, but recorded

    calls = []
    template.original = lambda tok, messages, tools=None, **kw: calls.append((messages, tools)) or [1, 2]
    assert template(None, [{"role": "user", "content": "x"}], tools=None, tokenize=True) == [1, 2]
    [line] = (tmp_path).glob("requests-*.jsonl")
    record = json.loads(line.read_text())
    assert record == {"version": 7, "messages": [{"role": "user", "content": "x"}], "tools": None,
                      "prompt_ids": [1, 2]}


def test_auto_follows_the_rollout_backend():
    assert serving_engine_name("auto", "sglang") == "sglang"
    assert serving_engine_name("auto", "vllm") == "vllm"
    assert serving_engine_name("vllm", "sglang") == "vllm"
