"""AReaL's proxy rendering switched to the serving engine's (training/served_prompt.py)."""

from __future__ import annotations

import asyncio
import inspect
import json
import random

import pytest
from areal.experimental.openai import client
from areal.utils import hf_utils
from tokenizers import AddedToken
from transformers import AutoTokenizer

from examples.tau2.compat import UnsupportedVersion
from examples.tau2.compat.serving_render import ServingEngine, template_inputs
from examples.tau2.cpu.tiny_model import tokenizer_dir
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.training.served_prompt import (
    AREAL_RENDERING,
    PARITY_RECORD_ENV,
    REQUEST_TOOL_CHOICE,
    SERVING_ENGINE_ENV,
    TOOL_CHOICE_WRAPPER,
    PieceEncoder,
    ServingTemplate,
    install_from_env,
    install_proxy_rendering,
    keeping_tool_choice,
    serving_engine_name,
)

AREAL_CREATE = client.AsyncCompletionsWithReward.__dict__["create"]
TOOLS = [{"type": "function", "function": {"name": n, "description": f"Does {n}.",
                                           "parameters": {"type": "object", "properties": {}}}}
         for n in ("f", "g")]


@pytest.fixture(autouse=True)
def restore():
    yield
    client.apply_chat_template = hf_utils.apply_chat_template
    client.AsyncCompletionsWithReward.create = AREAL_CREATE


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


def test_install_wraps_areals_create_once_keeping_its_signature_and_back():
    install_proxy_rendering(ServingEngine.SGLANG)
    install_proxy_rendering(ServingEngine.SGLANG)
    create = client.AsyncCompletionsWithReward.create
    assert getattr(create, TOOL_CHOICE_WRAPPER) and create.__wrapped__ is AREAL_CREATE  # wrapped once
    # AReaL's proxy passes the request arguments that this signature names
    assert inspect.signature(create) == inspect.signature(AREAL_CREATE)
    install_proxy_rendering(None)
    assert client.AsyncCompletionsWithReward.create is AREAL_CREATE


def test_another_areals_create_is_refused():
    async def create(self, *, messages, tools=None, **kwargs):
        return None

    create.__qualname__ = "AsyncCompletionsWithReward.create"
    client.AsyncCompletionsWithReward.create = create  # no tool_choice: not the audited one
    with pytest.raises(UnsupportedVersion, match="AsyncCompletionsWithReward.create"):
        install_proxy_rendering(ServingEngine.SGLANG)


def test_the_requests_tool_choice_is_visible_while_create_runs_and_only_then():
    from openai import NOT_GIVEN

    seen = []

    async def create(self, **kwargs):
        seen.append(REQUEST_TOOL_CHOICE.get())
        await asyncio.sleep(0)
        seen.append(REQUEST_TOOL_CHOICE.get())

    wrapped = keeping_tool_choice(create)
    named = {"type": "function", "function": {"name": "g"}}

    async def both():  # concurrent requests each see their own
        await asyncio.gather(wrapped(None, tool_choice="none"), wrapped(None, tool_choice=named))

    asyncio.run(both())
    assert sorted(map(str, seen)) == sorted(map(str, ["none", "none", named, named]))
    asyncio.run(wrapped(None, tool_choice=NOT_GIVEN))
    asyncio.run(wrapped(None))
    assert seen[-2:] == ["auto", "auto"]
    assert REQUEST_TOOL_CHOICE.get() == "auto"


def test_the_template_renders_the_requests_tool_choice():
    """SGLang's server renders no tools for `none` and only the named one; vLLM's all of them."""
    rendered = []
    for engine in ServingEngine:
        template = ServingTemplate(engine, lambda tok, messages, tools=None, **kw: tools, None)
        for choice in ("auto", "none", {"type": "function", "function": {"name": "g"}}):
            token = REQUEST_TOOL_CHOICE.set(choice)
            try:
                tools = template(None, [{"role": "user", "content": "x"}], tools=TOOLS)
            finally:
                REQUEST_TOOL_CHOICE.reset(token)
            rendered.append([t["function"]["name"] for t in tools or []])
    assert rendered == [["f", "g"], [], ["g"], ["f", "g"], ["f", "g"], ["f", "g"]]


def test_another_areal_is_refused():
    client.apply_chat_template = lambda *a, **k: []
    with pytest.raises(UnsupportedVersion, match="audit examples/tau2/training/served_prompt.py"):
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
                      "tool_choice": "auto", "prompt_ids": [1, 2]}


def test_auto_follows_the_rollout_backend():
    assert serving_engine_name("auto", "sglang") == "sglang"
    assert serving_engine_name("auto", "vllm") == "vllm"
    assert serving_engine_name("vllm", "sglang") == "vllm"


FRAGMENTS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>",
             "<tool_response>", "<|endoftext|>", "<|im_end|", "<tool_call", "\n", "\n\n", " ", "   ", "\t",
             "assistant", "user\n", "Hello, world.", "e\u0301", "\u0301", "caf\u00e9", "ﬁ", "😀", "東京",
             "12345", '{"user_id": "amelia_davis_8890"}', "  leading", "trailing  ", "'s", "'S", "don't"]
"""Pieces of a prompt that stress where a tokenizer cuts: its added tokens and near-misses of them,
whitespace runs, combining marks (NFC joins `e` and U+0301) right after an added token, ligatures,
emoji, CJK, digits and contractions."""


def prompt_pairs(tok, engine: ServingEngine) -> list[tuple[list[int], list[int]]]:
    """(the piece encoder's ids, the tokenizer's own) for every built-in domain's system prompt and tools
    in a conversation with a tool call, its result and a thinking reply, rendered as `engine`'s server."""
    pairs = []
    for name in ("mock", "airline", "retail", "telecom"):
        env = tau2_domain.make_environment(name)
        tools = [t.openai_schema for t in env.get_tools()]
        call = {"id": "c1", "type": "function",
                "function": {"name": tools[0]["function"]["name"], "arguments": '{"id": "x1"}'}}
        messages = [{"role": "system", "content": env.get_policy()},
                    {"role": "user", "content": "Hi, I'd like to change my reservation — café at 10:30? 😀"},
                    {"role": "assistant", "content": "<think>\nLook it up.\n</think>\n\n",
                     "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "c1", "content": '{"status": "ok", "items": [1, 2]}'},
                    {"role": "assistant", "content": "Done.  Anything else?"},
                    {"role": "user", "content": "No<|im_end|> thanks e\u0301"}]
        template = ServingTemplate(engine, hf_utils.apply_chat_template, None)
        ours = template(tok, messages, tools=tools, add_generation_prompt=True)
        rendered, rendered_tools = template_inputs(engine, messages, tools, "auto")
        theirs = hf_utils.apply_chat_template(tok, rendered, tools=rendered_tools, add_generation_prompt=True)
        pairs.append((ours, theirs))
    return pairs


def test_the_piece_encoder_gives_the_tokenizers_own_ids():
    """On 600 random strings of `FRAGMENTS` and on every built-in domain's prompt, as each engine renders
    it; the pieces are cached: the second encoding of a prompt encodes nothing new."""
    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    encoder = PieceEncoder(tok)
    assert encoder.exact
    rng = random.Random(0)
    for _ in range(600):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 40)))
        assert encoder.encode(text) == tok(text, add_special_tokens=False)["input_ids"], repr(text)
    for engine in ServingEngine:
        for ours, theirs in prompt_pairs(tok, engine):
            assert ours == theirs and len(ours) > 100
    text = "<|im_start|>system\nHello<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    encoder.encode(text)
    misses = encoder._piece.cache_info().misses
    assert encoder.encode(text) == tok(text, add_special_tokens=False)["input_ids"]
    assert encoder._piece.cache_info().misses == misses


def test_a_tokenizer_whose_added_tokens_strip_is_tokenized_whole():
    """An added token with lstrip (or rstrip, single_word, normalized) cuts its neighbours too: the
    template's own tokenization runs, as AReaL's."""
    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    tok.add_tokens([AddedToken("<sep>", lstrip=True)])
    assert not PieceEncoder(tok).exact
    calls = []

    def original(tokenizer, messages, tools=None, tokenize=True, **kw):
        calls.append(tokenize)
        return [1, 2, 3] if tokenize else "text"

    assert ServingTemplate(None, original, None)(tok, [{"role": "user", "content": "x"}]) == [1, 2, 3]
    assert calls == [True]
