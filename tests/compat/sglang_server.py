"""SGLang 0.5.10.post1's own OpenAI chat server code, run on CPU: the prompt it builds for a request.

The reference for "the proxy trains on SGLang's prompt": not a mirror of SGLang's steps but its code path.
A chat request body goes through SGLang's FastAPI `app` (`/v1/chat/completions`: `validate_json_request`,
validation into its `ChatCompletionRequest`) into `OpenAIServingChat.handle_request` (`_process_messages`,
`_apply_jinja_template`), which hands a `GenerateReqInput` to the tokenizer manager. For text requests the
tokenizer manager passes `input_ids` to the scheduler unchanged, so the ids recorded there are the prompt.

What is not SGLang's own, because a CPU machine cannot run it and a prompt does not depend on it:
- the tokenizer manager has no ZMQ channels, scheduler or watchdog: its `__init__` runs only SGLang's
  `init_model_config`, `init_tokenizer_and_processor` and `init_request_logging_and_dumping`, and
  `generate_request` records the request and stops;
- `torchvision` and `sgl_kernel` are GPU builds that SGLang imports at module level for JPEG decoding,
  InternVL image preprocessing and KV-cache transfer kernels, never for a text request: placeholder
  modules (whose functions raise if called) stand in while SGLang is imported and are removed from
  `sys.modules` afterwards, so the rest of the process (transformers) still sees no torchvision.
SGLang's import also changes process-wide state (asyncio's event loop policy, `threading._register_atexit`,
environment variables, warning filters, the httpx logger's level); that is restored after the import.

The model directory is a `Qwen3ForCausalLM` config plus the tokenizer's files (`sglang_model_dir`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import sys
import threading
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from examples.tau2.compat import require

SGLANG_VERSION = "0.5.10.post1"
GPU_ONLY_MODULES = ("torchvision", "torchvision.io", "torchvision.transforms",
                    "torchvision.transforms.functional", "sgl_kernel", "sgl_kernel.kvcacheio")
"""Imported by SGLang's server modules at import time; used only on GPU paths a text request never takes."""
CHAT_PATH = "/v1/chat/completions"


class GpuOnlyModule(types.ModuleType):
    """A stand-in for a GPU-only module: any function taken from it raises when called."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        module = self.__name__

        def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"{module}.{name} is GPU-only and not installed on this machine")

        unavailable.__name__ = name
        return unavailable


@contextlib.contextmanager
def sglang_import_scope() -> Iterator[None]:
    """Import SGLang's server modules inside: GPU-only placeholders present, process-wide state restored."""
    import transformers.utils  # noqa: F401  (its availability flags are set now, before any placeholder)

    present = [name for name in GPU_ONLY_MODULES if name in sys.modules]
    if present:
        raise RuntimeError(f"{', '.join(present)} already imported: the placeholders would shadow them")
    policy = asyncio.get_event_loop_policy()
    register_atexit = threading._register_atexit  # type: ignore[attr-defined]
    environ = dict(os.environ)
    httpx_level = logging.getLogger("httpx").level
    for name in GPU_ONLY_MODULES:  # parents first
        module = GpuOnlyModule(name)
        module.__path__ = []  # a package, so that its submodules import
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SGLang's notes that CUDA kernels are unavailable
            yield
    finally:
        for name in GPU_ONLY_MODULES:
            if isinstance(sys.modules.get(name), GpuOnlyModule):
                del sys.modules[name]
        asyncio.set_event_loop_policy(policy)
        threading._register_atexit = register_atexit  # type: ignore[attr-defined]
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update({k: v for k, v in environ.items() if os.environ.get(k) != v})
        logging.getLogger("httpx").setLevel(httpx_level)


def sglang_model_dir(folder: Path, tokenizer_dir: Path) -> Path:
    """A model directory SGLang's server starts from: a Qwen3 causal-LM config and the tokenizer's files."""
    from transformers import Qwen3Config

    folder.mkdir(parents=True, exist_ok=True)
    Qwen3Config(architectures=["Qwen3ForCausalLM"]).to_json_file(folder / "config.json")
    for path in tokenizer_dir.iterdir():
        if path.is_file():
            shutil.copyfile(path, folder / path.name)
    return folder


RECORDED = "recorded by the test harness; nothing generated"
"""The error the recording tokenizer manager raises once it has the request (SGLang answers it as a 400)."""


class SGLangChatServer:
    """SGLang's OpenAI chat endpoint over an in-memory transport; `prompt_ids(body)` is the prompt it builds.

    Building it imports SGLang's server (tens of seconds): build one per test module or session.
    """

    def __init__(self, model_dir: Path):
        require("sglang", SGLANG_VERSION, "the SGLang chat server reference (tests/compat/sglang_server.py)")
        with sglang_import_scope():
            from sglang.srt.entrypoints import http_server
            from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
            from sglang.srt.managers.template_manager import TemplateManager
            from sglang.srt.managers.tokenizer_manager import TokenizerManager
            from sglang.srt.server_args import ServerArgs

            class RecordingTokenizerManager(TokenizerManager):
                """SGLang's tokenizer manager without its IPC: records what would go to the scheduler."""

                def __init__(self, server_args: ServerArgs):
                    self.server_args = server_args
                    self.requests: list[Any] = []
                    self.init_model_config()
                    self.init_tokenizer_and_processor()
                    self.init_request_logging_and_dumping()

                async def generate_request(self, obj: Any, request: Any = None) -> Any:
                    self.requests.append(obj)
                    raise ValueError(RECORDED)  # `_handle_non_streaming_request` answers it, quietly
                    yield  # an async generator, as SGLang's

            server_args = ServerArgs(model_path=str(model_dir), device="cpu")
            self.tokenizer_manager = RecordingTokenizerManager(server_args)
            templates = TemplateManager()
            templates.initialize_templates(self.tokenizer_manager, server_args.model_path,
                                           server_args.chat_template, server_args.completion_template)
            self.app = http_server.app
            self.serving_chat = OpenAIServingChat(self.tokenizer_manager, templates)
        import httpx

        self._loop = asyncio.new_event_loop()
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://sglang")

    def generate_input(self, body: dict[str, Any]) -> Any:
        """The `GenerateReqInput` SGLang's chat server hands its tokenizer manager for `body`."""
        from fastapi.exceptions import FastAPIDeprecationWarning

        before = len(self.tokenizer_manager.requests)
        self.app.state.openai_serving_chat = self.serving_chat  # as SGLang's lifespan sets it (one app)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FastAPIDeprecationWarning)  # SGLang's error responses' class
            response = self._loop.run_until_complete(self._client.post(
                CHAT_PATH, content=json.dumps(body), headers={"Content-Type": "application/json"}))
        if len(self.tokenizer_manager.requests) != before + 1 or RECORDED not in response.text:
            raise RuntimeError(f"SGLang's chat server built no request: {response.status_code} "
                               f"{response.text[:500]}")
        return self.tokenizer_manager.requests.pop()

    def prompt_ids(self, body: dict[str, Any]) -> list[int]:
        """The prompt token ids SGLang's chat server sends its scheduler for the chat request `body`."""
        request = self.generate_input(body)
        if request.input_ids is None:
            raise RuntimeError("SGLang's chat server passed text, not token ids, to its tokenizer manager")
        return list(request.input_ids)

    def close(self) -> None:
        self._loop.run_until_complete(self._client.aclose())
        self._loop.close()

    def __enter__(self) -> SGLangChatServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
