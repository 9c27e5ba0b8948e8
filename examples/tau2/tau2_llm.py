"""OpenAI-compatible chat calls for the policy and the user simulator.

Converts tau2 messages to Chat Completions dicts, retries infrastructure failures with backoff
(tenacity), and turns a completion back into a tau2 message — or into a typed `InvalidOutput`
when the model's reply is not a valid turn.
"""

from __future__ import annotations

import json
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

from examples.tau2.tau2_utils import EpisodeRejected, RejectReason, Termination, strip_reasoning

_RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


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


@dataclass
class ParsedReply:
    content: str | None
    tool_calls: list[ToolCall]
    raw_text: str
    completion_id: str
    finish_reason: str


def parse_reply(completion: ChatCompletion) -> ParsedReply:
    """Validate one completion. Raises InvalidOutput for replies that cannot be a turn."""
    if not completion.choices:
        raise InvalidOutput(Termination.INVALID_OUTPUT, "completion has no choices", "")
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
        except json.JSONDecodeError as e:
            raise InvalidOutput(
                Termination.INVALID_OUTPUT,
                f"tool call {fn.name!r} has malformed JSON arguments ({e.msg})",
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
    if isinstance(exc, openai.APIConnectionError | openai.APITimeoutError | httpx.TransportError):
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
    ):
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
        body: dict[str, Any] = {"model": self.model, "messages": messages, **sampling}
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
                        completion = await self.client.post(
                            "/chat/completions", cast_to=ChatCompletion, body=body,
                            options={"headers": self.headers},
                        )
                    except Exception:
                        self.failed_attempts += 1
                        raise
                    return completion, time.perf_counter() - start
        except openai.OpenAIError as e:
            raise EpisodeRejected(
                self.reject_reason,
                f"{type(e).__name__} after {self.failed_attempts} failed attempt(s): {e}",
            ) from e
        except httpx.HTTPError as e:
            raise EpisodeRejected(self.reject_reason, f"{type(e).__name__}: {e}") from e
        raise AssertionError("unreachable")
