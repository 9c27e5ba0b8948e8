"""The serving engines' template inputs (compat/serving_render.py), step by step.

Token-level agreement with the real engines is tests/cpu/test_parity.py's (SGLang's own chat server
code on recorded tau2 conversations; a live vLLM server's /tokenize).
"""

from __future__ import annotations

import json

import pytest

from examples.tau2.compat import UnsupportedVersion
from examples.tau2.compat.serving_render import ServingEngine, template_inputs

TOOL = {"type": "function", "function": {"name": "f", "description": "Does f.",
                                         "parameters": {"type": "object", "properties": {}}}}
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b": "é", "a": 1}'}}]}
MESSAGES = [{"role": "user", "content": "hi"}, CALL, {"role": "tool", "content": "ok", "tool_call_id": "c1"}]


def test_sglang_dumps_tools_through_its_models_and_parses_arguments():
    messages, tools = template_inputs(ServingEngine.SGLANG, MESSAGES, [TOOL])
    assert tools == [{"type": "function", "function": {
        "description": "Does f.", "name": "f", "parameters": {"type": "object", "properties": {}},
        "strict": False}}]
    assert list(tools[0]["function"]) == ["description", "name", "parameters", "strict"]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"b": "é", "a": 1}  # order kept
    assert messages[2]["tool_call_id"] == "c1"
    assert all(v is not None for m in messages for v in m.values())  # None fields dropped
    assert MESSAGES[1]["tool_calls"][0]["function"]["arguments"] == '{"b": "é", "a": 1}'  # input untouched
    _, none = template_inputs(ServingEngine.SGLANG, MESSAGES, [TOOL], tool_choice="none")
    assert none is None


def test_vllm_mirror_dumps_function_definitions_and_coerces_arguments():
    bare = {"type": "function", "function": {"name": "g"}}
    messages, tools = template_inputs(ServingEngine.VLLM, MESSAGES, [TOOL, bare])
    assert [list(t["function"]) for t in tools] == [["name", "description", "parameters"]] * 2
    assert tools[1]["function"] == {"name": "g", "description": None, "parameters": None}
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"b": "é", "a": 1}
    bad = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "f", "arguments": a}}]}
        for a in ("{not json", "[1, 2]", "")]
    empty = {"role": "assistant", "content": "x", "tool_calls": []}
    rendered, _ = template_inputs(ServingEngine.VLLM, [*bad, empty], [TOOL])
    assert [m["tool_calls"][0]["function"]["arguments"] for m in rendered[:3]] == [{}, {}, {}]
    assert "tool_calls" not in rendered[3]
    # vLLM renders the tools even for tool_choice "none" (unless its server excludes them on request)
    assert template_inputs(ServingEngine.VLLM, MESSAGES, [TOOL], tool_choice="none")[1] == tools[:1]


def test_the_sglang_rendering_refuses_another_sglang(monkeypatch):
    import examples.tau2.compat as compat

    monkeypatch.setattr(compat, "installed_version", lambda package: "0.5.9")
    with pytest.raises(UnsupportedVersion, match="sglang 0.5.10.post1"):
        template_inputs(ServingEngine.SGLANG, MESSAGES, [TOOL])


def test_rendered_arguments_are_what_the_template_writes(tokenizer):
    for engine in ServingEngine:
        messages, tools = template_inputs(engine, MESSAGES, [TOOL])
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        assert '{"name": "f", "arguments": {"b": "é", "a": 1}}' in text  # re-serialised, not escaped
        assert json.dumps(tools[0]) in text
