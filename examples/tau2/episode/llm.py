"""OpenAI-compatible chat calls for the policy, the user simulator and the judge: infrastructure failures
are retried, then reject the episode; a reply that is no chat completion is the endpoint's failure
(`MalformedReply`); a completion that is no valid turn is the model's (`InvalidOutput`); a prompt past the
context is recognised from the refusal's wording (`context_refusal`) and never retried."""

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
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from examples.tau2.tau2_utils import EpisodeRejected, RejectReason, Termination, logger

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
        if isinstance(m, SystemMessage | UserMessage):
            out.append({"role": m.role, "content": m.content or ""})
        elif isinstance(m, AssistantMessage):
            d: dict[str, Any] = {"role": "assistant", "content": m.content or ""}
            if m.tool_calls:
                d["tool_calls"] = [{"id": tc.id, "type": "function",
                                    "function": {"name": tc.name, "arguments": json.dumps(tc.arguments)}}
                                   for tc in m.tool_calls]
            out.append(d)
        elif isinstance(m, ToolMessage):
            out.append({"role": "tool", "content": m.content or "", "tool_call_id": m.id})
        else:
            raise TypeError(f"cannot send a {type(m).__name__} to a chat model")
    return out


class InvalidOutput(Exception):
    """The model's reply is not a valid turn. For the policy this ends the episode (scored)."""

    def __init__(self, detail: str, raw_text: str, termination: Termination = Termination.INVALID_OUTPUT):
        super().__init__(detail)
        self.termination, self.detail, self.raw_text = termination, detail, raw_text


class ContextExceeded(Exception):
    """The next prompt does not fit the model's context, refused by AReaL's proxy before sending (HTTP 500,
    with `rollout.agent.engine_max_tokens` set) or by the server (HTTP 400). Never retried: the conversation
    can only grow. Ends the policy's episode, scored; rejects the episode of the user simulator or judge."""

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
        if m := pattern.search(text):
            lengths = {name: int(number) for name, number in m.groupdict().items()}
            return ContextExceeded(lengths.get("prompt"), lengths.get("limit"), refused_by)
    return None


MAX_DETAIL_CHARS = 600
"""A rejection's detail is cut to this (a server's error can echo the whole request's token ids)."""


def shorten(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class MalformedReply(Exception):
    """An endpoint answered with a body that is not a chat completion: the endpoint failed, not the
    model. Retried like a 5xx, then the episode is rejected with that endpoint's reason."""


def parse_completion(body: bytes) -> ChatCompletion:
    """Check the fields of one reply body that are read against the chat-completion schema; raise
    `MalformedReply` if it fails. Everything else is the model's reply, judged by `parse_reply`."""

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
        if not isinstance(tc, dict) or tc.get("type") not in (None, "function", "custom"):
            raise bad("a tool call is not an object of a known type")
        fn = tc.get("function")
        if tc.get("id") is not None and not isinstance(tc["id"], str):
            raise bad("a tool call id is not a string")
        if tc.get("type") != "custom" and not (isinstance(fn, dict) and isinstance(fn.get("name"), str)
                                               and isinstance(fn.get("arguments"), str | None)):
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


def parse_reply(completion: ChatCompletion, requestor: str = "assistant") -> ParsedReply:
    """Judge one completion (from `parse_completion`): InvalidOutput for a reply that is no turn (scored).
    `requestor`: who makes its tool calls (tau2's user simulator has tools of its own)."""
    choice = completion.choices[0]
    raw = choice.message.content or ""
    if choice.finish_reason == "length":
        raise InvalidOutput("reply hit the token limit", raw, Termination.TRUNCATED)
    calls: list[ToolCall] = []
    for tc in choice.message.tool_calls or []:
        fn = getattr(tc, "function", None)
        if fn is None:
            raise InvalidOutput(f"non-function tool call {tc!r}", raw)
        try:
            args = json.loads(fn.arguments) if fn.arguments else {}
        except (ValueError, RecursionError) as e:  # a JSONDecodeError, or nested too deeply
            why = getattr(e, "msg", type(e).__name__)
            problem = f"tool call {fn.name!r} has malformed JSON arguments ({why})"
            raise InvalidOutput(problem, raw + f"\n[tool_call {fn.name}: {fn.arguments}]") from None
        if not isinstance(args, dict):
            raise InvalidOutput(f"tool call {fn.name!r} arguments are not an object", raw)
        calls.append(ToolCall(id=tc.id or f"call_{len(calls)}", name=fn.name, arguments=args,
                              requestor=requestor))
    content = strip_reasoning(raw) or None
    if not calls and content and "<tool_call>" in content:
        # The server could not parse the model's tool-call text (AReaL's proxy returns it raw).
        raise InvalidOutput("unparseable <tool_call> text", raw)
    if not calls and not content:
        raise InvalidOutput("empty reply", raw)
    return ParsedReply(content, calls, raw, completion.id or "", choice.finish_reason or "")


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 409, 425, 429) or exc.status_code >= 500
    return isinstance(exc, MalformedReply | openai.APIConnectionError | openai.APITimeoutError
                      | httpx.TransportError)


class ChatEndpoint:
    """One OpenAI-compatible endpoint with retries; failures after them reject the episode (`reject_reason`),
    but a prompt past the policy's context raises `ContextExceeded` (the episode ends, scored)."""

    def __init__(self, *, base_url: str, api_key: str, model: str, http_client: httpx.AsyncClient,
                 reject_reason: RejectReason, request_timeout_s: float, retries: int, backoff_s: float,
                 headers: dict[str, str] | None = None):
        # max_retries=0: retries are ours, so they are counted and bounded in one place.
        self.client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0,
                                  timeout=request_timeout_s)
        self.model, self.reject_reason = model, reject_reason
        self.context_ends_episode = reject_reason is RejectReason.POLICY_ENDPOINT
        self.retries, self.backoff_s, self.failed_attempts = retries, backoff_s, 0
        self.headers = headers or {}
        """Sent with every request (task and episode ids, for server-side tracing)."""

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       **sampling: Any) -> tuple[ChatCompletion, float]:
        """One chat completion and its latency in seconds. The body is posted as built (plain JSON): the
        SDK's transformation of every message and tool schema would cost ~2.5 ms of CPU per call."""
        # `extra_body` (e.g. a Qwen3 user simulator's chat_template_kwargs) is merged in, as the SDK does.
        extra_body = sampling.pop("extra_body", None) or {}
        body: dict[str, Any] = {"model": self.model, "messages": messages, **sampling, **extra_body}
        if tools:
            body["tools"] = tools
            body.setdefault("tool_choice", "auto")
        retrying = AsyncRetrying(stop=stop_after_attempt(self.retries + 1), reraise=True,
                                 wait=wait_exponential(multiplier=self.backoff_s, max=30.0),
                                 retry=retry_if_exception(_is_retryable))
        try:
            async for attempt in retrying:
                with attempt:
                    start = time.perf_counter()
                    try:
                        response = await self.client.post("/chat/completions", cast_to=httpx.Response,
                                                          body=body, options={"headers": self.headers})
                        completion = parse_completion(response.content)
                    except Exception as e:
                        self.failed_attempts += 1
                        if isinstance(e, openai.APIStatusError) and (refusal := context_refusal(e)):
                            raise refusal from e  # not retryable
                        logger.warning("%s request failed (attempt %d of %d): %s", self.reject_reason.value,
                                       attempt.retry_state.attempt_number, self.retries + 1,
                                       shorten(f"{type(e).__name__}: {e}", 200))
                        raise
                    return completion, time.perf_counter() - start
        except ContextExceeded as e:
            if self.context_ends_episode:
                raise
            raise EpisodeRejected(self.reject_reason, f"{e.detail} (not retried)") from e
        except (openai.OpenAIError, MalformedReply) as e:
            failed = f"{type(e).__name__} after {self.failed_attempts} failed attempt(s): {e}"
            raise EpisodeRejected(self.reject_reason, shorten(failed)) from e
        except httpx.HTTPError as e:
            raise EpisodeRejected(self.reject_reason, shorten(f"{type(e).__name__}: {e}")) from e
        raise AssertionError("unreachable")
