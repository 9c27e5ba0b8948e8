"""OpenAI-compatible chat calls for the policy and the user simulator.

Converts tau2 messages to Chat Completions dicts, retries infrastructure failures with backoff
(tenacity), checks that each reply is a chat completion at all (`parse_completion`: a reply that is
not is the endpoint's failure, `MalformedReply`), and turns a completion back into a tau2 message —
or into a typed `InvalidOutput` when the model's reply is not a valid turn. A prompt that has outgrown
the context is recognised from the refusal's wording (`context_refusal`) and never retried.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

import httpx
import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion
from tau2.data_model.message import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from examples.tau2.tau2_utils import EpisodeRejected, RejectReason, Termination

_RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


_THINK_RE = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def strip_reasoning(text: str | None) -> str | None:
    """Remove `<think>...</think>` blocks (AReaL's proxy returns them inside `content`)."""
    if text is None:
        return None
    stripped = _THINK_RE.sub("", text)
    if "</think>" in stripped:  # template opened <think> in the prompt: only the closing tag is generated
        stripped = stripped.split("</think>", 1)[1]
    return stripped.strip()


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """tau2 messages -> Chat Completions messages (strict: no None fields, no extra keys)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, SystemMessage):
            out.append({"role": "system", "content": m.content or ""})
        elif isinstance(m, UserMessage):
            out.append({"role": "user", "content": m.content or ""})
        elif isinstance(m, AssistantMessage):
            d: dict[str, Any] = {"role": "assistant", "content": m.content or ""}
            if m.tool_calls:
                d["tool_calls"] = [
                    {
                        "id": tc.id,
                        "type": "function",
                        "function": {"name": tc.name, "arguments": json.dumps(tc.arguments)},
                    }
                    for tc in m.tool_calls
                ]
            out.append(d)
        elif isinstance(m, ToolMessage):
            out.append({"role": "tool", "content": m.content or "", "tool_call_id": m.id})
        else:
            raise TypeError(f"cannot send a {type(m).__name__} to a chat model")
    return out


class InvalidOutput(Exception):
    """The model's reply is not a valid turn. For the policy this ends the episode (scored)."""

    def __init__(self, termination: Termination, detail: str, raw_text: str):
        super().__init__(detail)
        self.termination = termination
        self.detail = detail
        self.raw_text = raw_text


class ContextExceeded(Exception):
    """The next prompt does not fit the model's context. AReaL's proxy refuses it before sending
    (`len of prompt tokens N exceeds max_total_tokens M`, HTTP 500, with `rollout.agent.engine_max_tokens`
    set); a server refuses it itself (vLLM, SGLang, OpenAI: HTTP 400). Never retried: the same
    conversation can only grow. For the policy it ends the episode, scored
    (`Termination.CONTEXT_EXCEEDED`); for the user simulator or the judge it rejects the episode."""

    termination = Termination.CONTEXT_EXCEEDED

    def __init__(self, prompt_tokens: int | None, limit: int | None, refused_by: str):
        self.prompt_tokens, self.limit, self.refused_by = prompt_tokens, limit, refused_by
        prompt = f" ({prompt_tokens} tokens)" if prompt_tokens is not None else ""
        context = f" ({limit} tokens)" if limit is not None else ""
        self.detail = (f"context exceeded: the prompt{prompt} does not fit the context{context}, refused by "
                       f"{refused_by}")
        super().__init__(self.detail)


_CONTEXT_REFUSALS = (
    # AReaL 1.0.4's proxy (experimental/openai/client.py), before it sends anything
    (re.compile(r"len of prompt tokens (?P<prompt>\d+) exceeds (?:max_total|engine_max)_tokens "
                r"(?P<limit>\d+)"), "AReaL's proxy"),
    # vLLM (renderers/params.py, v1/engine/input_processor.py, serve/utils/api_utils.py)
    (re.compile(r"maximum context length is (?P<limit>\d+) tokens\. However, your prompt contains "
                r"(?:at least )?(?P<prompt>\d+) input tokens"), "the server"),
    (re.compile(r"prompt \(length (?P<prompt>\d+)\) is longer than the maximum model length of "
                r"(?P<limit>\d+)"), "the server"),
    (re.compile(r"Input length \((?P<prompt>\d+)\) exceeds model's maximum context length "
                r"\((?P<limit>\d+)\)"), "the server"),
    # SGLang (tokenizer_manager's request validation)
    (re.compile(r"The input \((?P<prompt>\d+) tokens\) is longer than the model's context length "
                r"\((?P<limit>\d+) tokens\)"), "the server"),
    (re.compile(r"maximum context length of (?P<limit>\d+) tokens\. You requested a total of \d+ tokens: "
                r"(?P<prompt>\d+) tokens from the input"), "the server"),
    # OpenAI
    (re.compile(r"maximum context length is (?P<limit>\d+) tokens\. However, your messages resulted in "
                r"(?P<prompt>\d+) tokens"), "the server"),
    (re.compile(r"context_length_exceeded"), "the server"),
)


def context_refusal(error: openai.APIStatusError) -> ContextExceeded | None:
    """The refusal of a prompt that does not fit the context, as AReaL's proxy and the servers word it
    (`_CONTEXT_REFUSALS`), with the lengths they name; None for any other error."""
    if error.status_code not in (400, 413, 422, 500):
        return None
    text = f"{error.message} {json.dumps(error.body, default=str) if error.body is not None else ''}"
    for pattern, refused_by in _CONTEXT_REFUSALS:
        m = pattern.search(text)
        if m:
            numbers = m.groupdict()
            return ContextExceeded(int(numbers["prompt"]) if "prompt" in numbers else None,
                                   int(numbers["limit"]) if "limit" in numbers else None, refused_by)
    return None


MAX_DETAIL_CHARS = 600
"""A rejection's detail is cut to this (a server's error can echo the whole request's token ids)."""


def shorten(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class MalformedReply(Exception):
    """An endpoint answered with a body that is not a chat completion: the endpoint failed, not the
    model. Retried like a 5xx, then the episode is rejected with that endpoint's reason."""


_TOOL_CALL_TYPES = (None, "function", "custom")


def parse_completion(body: bytes) -> ChatCompletion:
    """Check one reply body against the chat-completion schema; raise `MalformedReply` if it fails.

    Schema-invalid: a body that is not JSON (empty, truncated, an HTML page, bad encoding, nested
    too deeply); JSON that is not an object; `choices` missing, not a list or empty; `choices[0]` or
    its `message` not an object; `content` not a string or null; `tool_calls` not a list or null; a
    tool call that is not an object, whose `id` is not a string or null, whose `type` is not null,
    "function" or "custom", or (unless "custom") whose `function` is not an object with a string
    `name` and a string-or-null `arguments`; `finish_reason` or the top-level `id` not a string or
    null. The content type and the fields not read here (usage, model, role, ...) are not checked.
    Everything else is the model's reply, judged by `parse_reply`.
    """

    def bad(what: str) -> MalformedReply:
        return MalformedReply(f"reply is not a chat completion: {what} ({len(body)} bytes: {body[:120]!r})")

    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise bad(f"not JSON ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise bad(f"JSON {type(data).__name__}, not an object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise bad("no choices")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise bad("choices[0] has no message object")
    for obj, key, types in ((data, "id", str), (choice, "finish_reason", str),
                            (message, "content", str), (message, "tool_calls", list)):
        if obj.get(key) is not None and not isinstance(obj[key], types):
            raise bad(f"{key} is a {type(obj[key]).__name__}")
    for tc in message.get("tool_calls") or []:
        if not isinstance(tc, dict) or tc.get("type") not in _TOOL_CALL_TYPES:
            raise bad("a tool call is not an object of a known type")
        fn = tc.get("function")
        if tc.get("id") is not None and not isinstance(tc["id"], str):
            raise bad("a tool call id is not a string")
        if tc.get("type") != "custom" and not (
            isinstance(fn, dict) and isinstance(fn.get("name"), str)
            and isinstance(fn.get("arguments"), str | None)
        ):
            raise bad("a tool call has no function with a string name and arguments")
    # Only the model's fields: an extra key such as "_fields_set" must not reach `model_construct`.
    fields = ChatCompletion.model_fields
    return ChatCompletion.model_construct(**{k: v for k, v in data.items() if k in fields})


@dataclass
class ParsedReply:
    content: str | None
    tool_calls: list[ToolCall]
    raw_text: str
    completion_id: str
    finish_reason: str


def parse_reply(completion: ChatCompletion) -> ParsedReply:
    """Judge one completion (from `parse_completion`). Raises InvalidOutput for replies that cannot
    be a turn: the model's output, scored."""
    choice = completion.choices[0]
    raw = choice.message.content or ""
    if choice.finish_reason == "length":
        raise InvalidOutput(Termination.TRUNCATED, "reply hit the token limit", raw)
    calls: list[ToolCall] = []
    for tc in choice.message.tool_calls or []:
        fn = getattr(tc, "function", None)
        if fn is None:
            raise InvalidOutput(Termination.INVALID_OUTPUT, f"non-function tool call {tc!r}", raw)
        try:
            args = json.loads(fn.arguments) if fn.arguments else {}
        except (ValueError, RecursionError) as e:  # a JSONDecodeError, or nested too deeply
            raise InvalidOutput(
                Termination.INVALID_OUTPUT,
                f"tool call {fn.name!r} has malformed JSON arguments ({getattr(e, 'msg', type(e).__name__)})",
                raw + f"\n[tool_call {fn.name}: {fn.arguments}]",
            ) from None
        if not isinstance(args, dict):
            raise InvalidOutput(
                Termination.INVALID_OUTPUT, f"tool call {fn.name!r} arguments are not an object", raw
            )
        calls.append(ToolCall(id=tc.id or f"call_{len(calls)}", name=fn.name, arguments=args))
    content = strip_reasoning(raw) or None
    if not calls and content and "<tool_call>" in content:
        # The server could not parse the model's tool-call text (AReaL's proxy returns it raw).
        raise InvalidOutput(Termination.INVALID_OUTPUT, "unparseable <tool_call> text", raw)
    if not calls and not content:
        raise InvalidOutput(Termination.INVALID_OUTPUT, "empty reply", raw)
    return ParsedReply(content, calls, raw, completion.id or "", choice.finish_reason or "")


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, MalformedReply | openai.APIConnectionError | openai.APITimeoutError
                  | httpx.TransportError):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in _RETRYABLE_STATUS or exc.status_code >= 500
    return False


class ChatEndpoint:
    """One OpenAI-compatible endpoint with retries; failures after retries reject the episode."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        http_client: httpx.AsyncClient,
        reject_reason: RejectReason,
        request_timeout_s: float,
        retries: int,
        backoff_s: float,
        context_ends_episode: bool = False,
    ):
        """`context_ends_episode`: a prompt past the context raises `ContextExceeded` (the policy's
        endpoint: the episode ends, scored) instead of rejecting the episode with `reject_reason`."""
        # max_retries=0: retries are ours, so they are counted and bounded in one place.
        self.client = AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            http_client=http_client,
            max_retries=0,
            timeout=request_timeout_s,
        )
        self.model = model
        self.reject_reason = reject_reason
        self.retries = retries
        self.backoff_s = backoff_s
        self.context_ends_episode = context_ends_episode
        self.failed_attempts = 0
        self.headers: dict[str, str] = {}
        """Sent with every request (task and episode ids, for server-side tracing)."""

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **sampling: Any
    ) -> tuple[ChatCompletion, float]:
        """One chat completion and its latency in seconds.

        The body is posted as built: it is already plain JSON, and the SDK's per-request
        transformation of every message and tool schema would cost ~2.5 ms of CPU per call.
        """
        # `extra_body` (e.g. a Qwen3 user simulator's chat_template_kwargs) is merged into the body,
        # as the OpenAI SDK does with its argument of that name.
        extra_body = sampling.pop("extra_body", None) or {}
        body: dict[str, Any] = {"model": self.model, "messages": messages, **sampling, **extra_body}
        if tools:
            body["tools"] = tools
            body.setdefault("tool_choice", "auto")
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.retries + 1),
            wait=wait_exponential(multiplier=self.backoff_s, max=30.0),
            retry=retry_if_exception(_is_retryable),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    start = time.perf_counter()
                    try:
                        response = await self.client.post(
                            "/chat/completions", cast_to=httpx.Response, body=body,
                            options={"headers": self.headers},
                        )
                        completion = parse_completion(response.content)
                    except openai.APIStatusError as e:
                        self.failed_attempts += 1
                        refusal = context_refusal(e)
                        if refusal is not None:
                            raise refusal from e  # not retryable
                        raise
                    except Exception:
                        self.failed_attempts += 1
                        raise
                    return completion, time.perf_counter() - start
        except ContextExceeded as e:
            if self.context_ends_episode:
                raise
            raise EpisodeRejected(self.reject_reason, f"{e.detail} (not retried)") from e
        except (openai.OpenAIError, MalformedReply) as e:
            raise EpisodeRejected(
                self.reject_reason,
                shorten(f"{type(e).__name__} after {self.failed_attempts} failed attempt(s): {e}"),
            ) from e
        except httpx.HTTPError as e:
            raise EpisodeRejected(self.reject_reason, shorten(f"{type(e).__name__}: {e}")) from e
        raise AssertionError("unreachable")
