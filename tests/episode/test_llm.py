"""Reply parsing and message conversion: a bad model reply maps to a named termination; a reply that
is not a chat completion at all is the endpoint's failure (fuzzed over real HTTP)."""

from __future__ import annotations

import asyncio
import base64
import collections
import copy
import json
import random
import string
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletion
from tau2.data_model.message import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage

from examples.tau2.episode.llm import (
    MAX_DETAIL_CHARS,
    ChatEndpoint,
    ContextExceeded,
    InvalidOutput,
    MalformedReply,
    ParsedReply,
    parse_completion,
    parse_reply,
    to_openai_messages,
)
from examples.tau2.tau2_utils import EpisodeRejected, RejectReason, Termination


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


# --- replies that are not chat completions: the endpoint's failure, never the model's or a bug -------

VALID = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Let me look.", "tool_calls": [call()]}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
CONTENT_TYPES = ["application/json", "application/json; charset=utf-8", "text/html", "text/plain",
                 "application/octet-stream", None]
# Paths `parse_completion` checks, and what they may hold: "str?" a string or null, "list?" a list or
# null, "list" a list, "obj" an object, "type" a tool-call type.
_TOOL_CALL = ("choices", 0, "message", "tool_calls", 0)
CHECKED = [(("id",), "str?"), (("choices",), "list"), (("choices", 0), "obj"),
           (("choices", 0, "message"), "obj"), (("choices", 0, "finish_reason"), "str?"),
           (("choices", 0, "message", "content"), "str?"), (("choices", 0, "message", "tool_calls"), "list?"),
           (_TOOL_CALL, "obj"), ((*_TOOL_CALL, "id"), "str?"), ((*_TOOL_CALL, "type"), "type"),
           ((*_TOOL_CALL, "function"), "obj"), ((*_TOOL_CALL, "function", "name"), "str"),
           ((*_TOOL_CALL, "function", "arguments"), "str?")]
REQUIRED = [("choices",), ("choices", 0), ("choices", 0, "message"), (*_TOOL_CALL, "function"),
            (*_TOOL_CALL, "function", "name")]


def garbage(rng: random.Random, depth: int = 0) -> Any:
    """Any JSON value: scalars, or lists and objects of garbage nested up to 3 deep."""
    pick = rng.randrange(8 if depth < 3 else 5)
    if pick == 0:
        return None
    if pick == 1:
        return rng.random() < 0.5
    if pick == 2:
        return rng.randint(-9, 10**12)
    if pick == 3:
        return rng.random() * 1e6
    if pick == 4:
        return "".join(rng.choice(string.printable) for _ in range(rng.randrange(12)))
    if pick == 5:
        return [garbage(rng, depth + 1) for _ in range(rng.randrange(4))]
    if pick == 6:
        return {rng.choice(["choices", "message", "content", "x", ""]): garbage(rng, depth + 1)
                for _ in range(rng.randrange(4))}
    return [{"message": garbage(rng, depth + 1)}]


def wrong_value(rng: random.Random, kind: str) -> Any:
    """A garbage value that a field of this kind must not hold."""
    allowed = {"str?": (str, type(None)), "str": str, "list?": (list, type(None)), "list": list,
               "obj": dict, "type": ()}[kind]
    while True:
        v = garbage(rng) if rng.random() < 0.9 or kind != "type" else rng.choice(["tool", "Function", ""])
        if not isinstance(v, allowed) and not (kind == "type" and v in (None, "function", "custom")):
            return v


def _set(doc: Any, path: tuple, value: Any, delete: bool = False) -> None:
    for key in path[:-1]:
        doc = doc[key]
    if delete:
        del doc[path[-1]]
    else:
        doc[path[-1]] = value


def malformed_cases(n: int, seed: int = 14) -> list[tuple[str, str | None, bytes]]:
    """`n` distinct (label, content type, body) replies that are not chat completions (fixed seed)."""
    rng = random.Random(seed)
    valid = json.dumps(VALID).encode()
    cases: dict[bytes, tuple[str, str | None, bytes]] = {}
    while len(cases) < n:
        doc = copy.deepcopy(VALID)
        how = rng.randrange(8)
        if how == 0:
            label, body = "truncated", valid[: rng.randrange(len(valid))]
        elif how == 1:
            label, body = "not json", rng.choice([
                b"<html><body><h1>502 Bad Gateway</h1></body></html>", b"Internal Server Error", b"",
                b"OK", b"{'choices': []}", b"data: " + valid + b"\n\ndata: [DONE]\n\n", b"\x00" * 8,
                "".join(rng.choice(string.ascii_letters + " :") for _ in range(40)).encode()])
        elif how == 2:
            label, body = "bytes", bytes([0xFF]) + rng.randbytes(rng.randrange(1, 64))
        elif how == 3:
            label = "not an object"
            value = rng.choice([[], [VALID], "chat.completion", 200, None, True, garbage(rng)])
            body = json.dumps(value).encode()
            if body.startswith(b"{"):
                body = b"[" + body + b"]"
        elif how == 4:
            path = rng.choice(REQUIRED)
            label = "dropped " + ".".join(map(str, path))
            _set(doc, path, None, delete=True)
            for unread in rng.sample(["object", "created", "model", "usage"], rng.randrange(5)):
                del doc[unread]  # and maybe some fields that are not read: still not a completion
            body = json.dumps(doc).encode()
        elif how in (5, 6):
            path, kind = rng.choice(CHECKED)
            label = "wrong " + ".".join(map(str, path))
            _set(doc, path, wrong_value(rng, kind))
            body = json.dumps(doc).encode()
        else:
            label, body = "other", rng.choice([
                b'{"error": {"message": "overloaded"}}', json.dumps({**VALID, "choices": []}).encode(),
                b"[" * 100_000, b'{"choices": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
                valid + b"garbage", valid.replace(b'"', b"'")])
        cases.setdefault(body, (label, rng.choice(CONTENT_TYPES), body))
    return list(cases.values())


FUZZ_CASES = malformed_cases(300)


def test_fuzz_cases_are_varied():
    labels = collections.Counter(label.split(" ")[0] for label, _, _ in FUZZ_CASES)
    assert set(labels) == {"truncated", "not", "bytes", "dropped", "wrong", "other"}
    assert min(labels.values()) >= 5 and len({body for _, _, body in FUZZ_CASES}) == 300


def test_every_fuzz_case_is_a_malformed_reply():
    for _, _, body in FUZZ_CASES:
        with pytest.raises(MalformedReply, match="not a chat completion"):
            parse_completion(body)


@pytest.mark.parametrize("doc", [
    VALID,
    {"choices": [{"message": {"content": "hi"}}]},  # only what is read
    {**VALID, "usage": "n/a", "model": 3, "extra": [1, {"x": None}]},  # fields not read are not checked
    {**VALID, "_fields_set": 1, "__cls": None, "": {}},
    {"id": None, "choices": [{"finish_reason": None, "message": {"content": None, "tool_calls": None}}]},
    {"choices": [{"message": {"tool_calls": [{"function": {"name": "f", "arguments": None}}]}}]},
])
def test_well_formed_completions_parse(doc):
    completion = parse_completion(json.dumps(doc).encode())
    assert completion.choices[0].message.content == doc["choices"][0]["message"].get("content")


@pytest.mark.parametrize("message,fragment", [
    ({"content": None, "tool_calls": [call(arguments="{oops")]}, "malformed JSON"),
    ({"content": None, "tool_calls": [call(arguments="[" * 100_000)]}, "malformed JSON"),
    ({"content": ""}, "empty"),
    ({"tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "f", "input": "x"}}]}, "non-function"),
])
def test_well_formed_completion_with_bad_content_is_the_models_output(message, fragment):
    completion = parse_completion(json.dumps({"choices": [{"message": message}]}).encode())
    with pytest.raises(InvalidOutput) as info:
        parse_reply(completion)
    assert info.value.termination is Termination.INVALID_OUTPUT and fragment in info.value.detail


def _endpoint(url: str, client: httpx.AsyncClient, reason: RejectReason, retries: int = 1) -> ChatEndpoint:
    return ChatEndpoint(base_url=url, api_key="k", model="raw", http_client=client, reject_reason=reason,
                        request_timeout_s=10.0, retries=retries, backoff_s=0.001)


def _raw(body: bytes, content_type: str | None, **extra: Any) -> dict[str, Any]:
    return {"x_raw_reply": {"body_b64": base64.b64encode(body).decode(), "content_type": content_type,
                            **extra}}


def test_fuzzed_replies_over_http_are_retried_then_rejected_as_the_endpoints_failure(endpoint):
    """Every fuzz case, served with HTTP 200 over 127.0.0.1, to the policy and the user endpoint."""
    reasons = [RejectReason.POLICY_ENDPOINT, RejectReason.USER_ENDPOINT]

    async def one(i: int, client: httpx.AsyncClient) -> tuple[RejectReason, type, int]:
        _, content_type, body = FUZZ_CASES[i]
        chat = _endpoint(endpoint.url, client, reasons[i % 2])
        with pytest.raises(EpisodeRejected) as info:
            await chat.complete([{"role": "user", "content": "hi"}], None, **_raw(body, content_type))
        return info.value.reason, type(info.value.__cause__), chat.failed_attempts

    async def go() -> list[tuple[RejectReason, type, int]]:
        async with httpx.AsyncClient() as client:  # one at a time: 300 connections at once are slower
            return [await one(i, client) for i in range(len(FUZZ_CASES))]

    before = endpoint.endpoint.requests["raw"]
    outcomes = asyncio.run(go())
    assert [reason for reason, _, _ in outcomes] == [reasons[i % 2] for i in range(len(FUZZ_CASES))]
    assert {cause for _, cause, _ in outcomes} == {MalformedReply}
    assert {attempts for _, _, attempts in outcomes} == {2}  # first try + 1 retry, as for a 5xx
    assert endpoint.endpoint.requests["raw"] - before == 2 * len(FUZZ_CASES)


def test_undecodable_body_over_http_is_the_endpoints_failure(endpoint):
    async def go() -> EpisodeRejected:
        async with httpx.AsyncClient() as client:
            chat = _endpoint(endpoint.url, client, RejectReason.POLICY_ENDPOINT)
            with pytest.raises(EpisodeRejected) as info:
                await chat.complete([{"role": "user", "content": "hi"}], None,
                                    **_raw(json.dumps(VALID).encode(), "application/json",
                                           headers={"Content-Encoding": "gzip"}))
            assert chat.failed_attempts == 2
            return info.value

    assert asyncio.run(go()).reason is RejectReason.POLICY_ENDPOINT


def test_valid_raw_reply_over_http_is_a_completion(endpoint):
    async def go() -> ParsedReply:
        async with httpx.AsyncClient() as client:
            chat = _endpoint(endpoint.url, client, RejectReason.POLICY_ENDPOINT)
            completion, _ = await chat.complete([{"role": "user", "content": "hi"}], None,
                                                **_raw(json.dumps(VALID).encode(), "text/plain"))
            assert chat.failed_attempts == 0
            return parse_reply(completion)

    reply = asyncio.run(go())
    assert reply.content == "Let me look." and reply.tool_calls[0].name == "get_user_details"


VLLM_PROMPT_TOO_LONG = ("This model's maximum context length is 4096 tokens. However, your prompt contains "
                        "4200 input tokens, which exceeds this limit even without any output tokens. Please "
                        "reduce the length of the input prompt.")
SGLANG_TOTAL_TOO_LONG = ("Requested token count exceeds the model's maximum context length of 32768 tokens. "
                         "You requested a total of 34000 tokens: 31952 tokens from the input messages and "
                         "2048 tokens for the completion.")
OPENAI_TOO_LONG = ("This model's maximum context length is 128000 tokens. However, your messages resulted in "
                   "130000 tokens. Please reduce the length of the messages.")
CONTEXT_REFUSALS = [  # (status, body, prompt tokens, context, refused by): the wordings context_refusal knows
    (500, {"detail": "len of prompt tokens 5454 exceeds max_total_tokens 5200"}, 5454, 5200, "AReaL's proxy"),
    (500, {"detail": "len of prompt tokens 33000 exceeds engine_max_tokens 32768"}, 33000, 32768,
     "AReaL's proxy"),
    (400, {"error": {"message": VLLM_PROMPT_TOO_LONG, "type": "BadRequestError", "param": "input_tokens"}},
     4200, 4096, "the server"),
    (400, {"error": {"message": "The decoder prompt (length 5000) is longer than the maximum model length "
                                "of 4096. Make sure that `max_model_len` is no smaller than the number of "
                                "text tokens."}}, 5000, 4096, "the server"),
    (400, {"error": {"message": "Input length (5000) exceeds model's maximum context length (4096)."}},
     5000, 4096, "the server"),
    (400, {"object": "error", "message": "The input (40000 tokens) is longer than the model's context "
                                         "length (32768 tokens).", "code": 400}, 40000, 32768, "the server"),
    (400, {"object": "error", "message": SGLANG_TOTAL_TOO_LONG, "code": 400}, 31952, 32768, "the server"),
    (400, {"error": {"message": OPENAI_TOO_LONG, "code": "context_length_exceeded"}}, 130000, 128000,
     "the server"),
    (400, {"error": {"message": "Too long.", "code": "context_length_exceeded"}}, None, None, "the server"),
]


def _refused(status: int, body: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return _raw(json.dumps(body).encode(), "application/json", status=status, **extra)


@pytest.mark.parametrize("status, body, prompt, limit, refused_by", CONTEXT_REFUSALS)
def test_a_prompt_past_the_context_ends_the_policy_s_episode_at_the_first_refusal(
        endpoint, status, body, prompt, limit, refused_by):
    """Over real HTTP: AReaL's proxy's and the servers' refusals end the policy's episode with both lengths
    in one short sentence, after one request (never retried); for the user simulator they reject it."""
    async def go(reason: RejectReason) -> tuple[BaseException, int]:
        async with httpx.AsyncClient() as client:
            chat = ChatEndpoint(base_url=endpoint.url, api_key="k", model="raw", http_client=client,
                                reject_reason=reason, request_timeout_s=10.0, retries=3, backoff_s=0.001)
            with pytest.raises((ContextExceeded, EpisodeRejected)) as info:
                await chat.complete([{"role": "user", "content": "hi"}], None, **_refused(status, body))
            return info.value, chat.failed_attempts

    policy, attempts = asyncio.run(go(RejectReason.POLICY_ENDPOINT))
    assert isinstance(policy, ContextExceeded) and attempts == 1
    assert (policy.prompt_tokens, policy.limit, policy.refused_by) == (prompt, limit, refused_by)
    assert policy.termination is Termination.CONTEXT_EXCEEDED
    assert policy.detail.startswith("context exceeded: the prompt")
    if prompt is not None:
        lengths = f"({prompt} tokens) does not fit the context ({limit} tokens), refused by {refused_by}"
        assert lengths in policy.detail
    user, attempts = asyncio.run(go(RejectReason.USER_ENDPOINT))
    assert isinstance(user, EpisodeRejected) and user.reason is RejectReason.USER_ENDPOINT and attempts == 1
    assert user.detail == f"{policy.detail} (not retried)"


def test_other_errors_are_retried_and_their_detail_is_cut_short(endpoint):
    """A 500 that is not about the context is retried as before; a 400 is not retried; a server error that
    echoes a huge body (e.g. every token id of the request) is cut to MAX_DETAIL_CHARS in the rejection."""
    huge = {"detail": "Internal server error: " + ", ".join(str(i) for i in range(20000))}

    async def go(status: int, body: dict[str, Any]) -> tuple[EpisodeRejected, int]:
        async with httpx.AsyncClient() as client:
            chat = _endpoint(endpoint.url, client, RejectReason.POLICY_ENDPOINT, retries=2)
            with pytest.raises(EpisodeRejected) as info:
                await chat.complete([{"role": "user", "content": "hi"}], None, **_refused(status, body))
            return info.value, chat.failed_attempts

    rejected, attempts = asyncio.run(go(500, huge))
    assert attempts == 3 and len(rejected.detail) < MAX_DETAIL_CHARS + 40
    assert rejected.detail.endswith("characters)")
    rejected, attempts = asyncio.run(go(400, {"error": {"message": "bad request: unknown field"}}))
    assert attempts == 1 and "unknown field" in rejected.detail
    # the same wording under a status no server uses for it is not taken for a context refusal
    rejected, attempts = asyncio.run(go(503, CONTEXT_REFUSALS[0][1]))
    assert attempts == 3
