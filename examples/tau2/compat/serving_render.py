"""The prompt a serving engine's own OpenAI chat server builds for a request, rebuilt token for token.

AReaL 1.0.4's proxy hands the chat template the tools as TypedDicts and tool-call arguments as JSON
strings; vLLM's and SGLang's servers dump tools through their own pydantic models (SGLang adds
`"strict": false`) and parse the arguments into dicts; SGLang also renders tools by `tool_choice`.
`template_inputs` returns what the named engine's server hands the template: SGLang's
`serving_chat.OpenAIServingChat` steps (checked by `tests/cpu/test_parity.py`), vLLM 0.32.0's renderers
(checked against a live server's `/tokenize` in `tests/compat/test_serving_render.py`).
"""

from __future__ import annotations

import copy
import enum
import json
from collections.abc import Sequence
from typing import Any

from examples.tau2.compat import require

SGLANG_VERSION = "0.5.10.post1"
VLLM_VERSION = "0.32.0"


class ServingEngine(enum.StrEnum):
    """The OpenAI-compatible server whose prompt the trainer learns from."""

    SGLANG = "sglang"
    VLLM = "vllm"


def template_inputs(engine: ServingEngine, messages: Sequence[dict[str, Any]],
                    tools: Sequence[dict[str, Any]] | None,
                    tool_choice: Any = "auto") -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) as `engine`'s chat server passes them to the chat template."""
    return (_sglang_inputs if engine is ServingEngine.SGLANG else _vllm_inputs)(messages, tools, tool_choice)


def _sglang_inputs(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
                   tool_choice: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    require("sglang", SGLANG_VERSION, "the SGLang rendering (examples/tau2/compat/serving_render.py)")
    import orjson
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    body: dict[str, Any] = {"messages": list(messages)}
    if tools:
        body["tools"] = list(tools)
        body["tool_choice"] = tool_choice or "auto"
    request = ChatCompletionRequest.model_validate(copy.deepcopy(body))
    # _process_messages: the tools the template sees.
    rendered_tools = None
    if request.tools and request.tool_choice != "none":
        choice = request.tool_choice
        rendered_tools = [t.model_dump() for t in request.tools
                          if isinstance(choice, str) or t.function.name == choice.function.name]
    # _apply_jinja_template (the jinja path every HF chat template takes). For a string content,
    # `process_content_for_template_format` (parser/jinja_template_utils.py, which needs torchvision to
    # import) drops the None fields and nothing else; content parts (images, ...) are not rendered here.
    out = []
    for message in request.messages:
        if message.content is None:
            message.content = ""
        if not isinstance(message.content, str):
            raise NotImplementedError("the SGLang rendering here covers string message contents only")
        msg = {k: v for k, v in message.model_dump().items() if v is not None}
        if msg["role"] == "assistant" and isinstance(msg.get("tool_calls"), list):
            for item in msg["tool_calls"]:
                if "arguments" in item["function"] and isinstance(item["function"]["arguments"], str):
                    item["function"]["arguments"] = orjson.loads(item["function"]["arguments"])
        out.append(msg)
    return out, rendered_tools


def _vllm_function(fn: dict[str, Any]) -> dict[str, Any]:
    """`FunctionDefinition.model_dump()`: name, description, parameters (None when absent), then
    `strict` and `defer_loading` only when set."""
    return {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters"),
            **{key: fn[key] for key in ("strict", "defer_loading") if fn.get(key) is not None}}


def _vllm_inputs(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
                 tool_choice: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    # online_renderer renders the tools even with tool_choice "none" unless the server was started with
    # --exclude-tools-when-tool-choice-none (off by default).
    del tool_choice
    rendered_tools = None if tools is None else [
        {"type": "function", "function": _vllm_function(t["function"])} for t in tools]
    out = []
    for message in messages:
        msg = {k: copy.deepcopy(v) for k, v in message.items() if v is not None}
        if msg.get("role") == "assistant" and isinstance(msg.get("tool_calls"), list):
            if not msg["tool_calls"]:
                msg.pop("tool_calls")
            for item in msg.get("tool_calls", []):
                item["function"]["arguments"] = _vllm_arguments(item["function"].get("arguments"))
        out.append(msg)
    return out, rendered_tools


def _vllm_arguments(arguments: Any) -> dict[str, Any]:
    """`_postprocess_messages`: arguments become a dict; empty, malformed or non-object ones `{}`."""
    try:
        parsed = json.loads(arguments) if arguments and isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return {}
    return parsed if parsed and isinstance(parsed, dict) else {}
