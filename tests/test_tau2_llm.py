"""Reply parsing and message conversion: every malformed reply maps to a named termination."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletion
from tau2.data_model.message import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage

from examples.tau2.tau2_llm import InvalidOutput, parse_reply, to_openai_messages
from examples.tau2.tau2_utils import Termination


def completion(content=None, tool_calls=None, finish_reason="stop") -> ChatCompletion:
    return ChatCompletion.model_validate({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": finish_reason,
                     "message": {"role": "assistant", "content": content, "tool_calls": tool_calls}}],
    })


def call(name="get_user_details", arguments='{"user_id": "u1"}'):
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_tool_call_with_reasoning_is_parsed_and_reasoning_dropped():
    reply = parse_reply(completion("<think>\nlook up</think>\n\n", [call()], "tool_calls"))
    assert reply.content is None
    assert reply.tool_calls == [ToolCall(id="call_1", name="get_user_details", arguments={"user_id": "u1"})]
    assert reply.completion_id == "chatcmpl-1"


def test_text_reply_keeps_text_without_reasoning():
    assert parse_reply(completion("<think>hm</think>Hello there")).content == "Hello there"
    # Qwen3 templates may open <think> in the prompt: only the closing tag is generated.
    assert parse_reply(completion("reasoning...</think>\n\nHello")).content == "Hello"


@pytest.mark.parametrize("kwargs,termination,fragment", [
    ({"tool_calls": [call(arguments='{"user_id": ')]}, Termination.INVALID_OUTPUT, "malformed JSON"),
    ({"tool_calls": [call(arguments='["u1"]')]}, Termination.INVALID_OUTPUT, "not an object"),
    ({"content": '<tool_call>\n{"name": "x", "arguments": {\n</tool_call>'}, Termination.INVALID_OUTPUT,
     "unparseable"),
    ({"content": ""}, Termination.INVALID_OUTPUT, "empty"),
    ({"content": "<think>only thinking</think>"}, Termination.INVALID_OUTPUT, "empty"),
    ({"content": "word " * 100, "finish_reason": "length"}, Termination.TRUNCATED, "token limit"),
])
def test_invalid_replies_are_classified(kwargs, termination, fragment):
    with pytest.raises(InvalidOutput) as info:
        parse_reply(completion(**kwargs))
    assert info.value.termination is termination and fragment in info.value.detail


def test_empty_argument_string_means_no_arguments():
    assert parse_reply(completion(None, [call(arguments="")])).tool_calls[0].arguments == {}


def test_tau2_messages_become_strict_chat_messages():
    msgs = [
        SystemMessage(role="system", content="policy"),
        AssistantMessage(role="assistant", content="Hi"),
        UserMessage(role="user", content="help"),
        AssistantMessage(role="assistant", tool_calls=[ToolCall(id="c1", name="f", arguments={"a": 1})]),
        ToolMessage(id="c1", role="tool", content="ok", requestor="assistant"),
    ]
    assert to_openai_messages(msgs) == [
        {"role": "system", "content": "policy"},
        {"role": "assistant", "content": "Hi"},
        {"role": "user", "content": "help"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "content": "ok", "tool_call_id": "c1"},
    ]
