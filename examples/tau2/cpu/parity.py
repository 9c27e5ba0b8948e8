"""Train/serve parity: the prompt AReaL's proxy trains on against the serving engine's own, token for token.

    python -m examples.tau2.cpu.parity [--engine sglang|vllm|areal] [--vllm-url URL] [--tokenizer DIR]
        [--domains D ...] [--tasks N] [--output FILE]          (= bash examples/tau2/tau2_rl.sh parity ...)

1. Records real tau2 conversations: the workflow plays `--tasks` tasks of every domain against the
   scripted oracle, which thinks aloud with the think tool before each action (tool calls with arguments,
   tool results, user turns, think calls), and, for the domains that have one, in solo mode
   (`tool_choice: required`). Every policy request is kept, as the workflow sent it.
2. Sends each through AReaL's real proxy (its FastAPI app and `ArealOpenAI`, in this process), whose
   prompt rendering `--engine` selects (`training/served_prompt.py`; `areal` is AReaL's own), and keeps the
   prompt token ids it asks the engine to extend: what the trainer learns from.
3. Compares them with SGLang 0.5.10.post1's rendering (its own request models, `compat/serving_render.py`)
   and, with `--vllm-url`, with a live vLLM server's `/tokenize` of the same request.
4. Reply side: generated texts (tool calls, malformed ones, think blocks) go back through the proxy and
   through SGLang's own parsers (and, with `--vllm-python`, vLLM's hermes parser); the content the
   workflow keeps and the tool calls must agree.

Prints one line per comparison and the first differing token with its context; exits 1 on any difference
other than the known ones (`KNOWN_REPLY_DIFFERENCES`), 2 when `--vllm-url` or `--vllm-python` is unusable
(checked first, in one sentence). Run it against your own server and model before a training run:
`--vllm-url` and `--tokenizer` (the model's directory).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import urllib.parse
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from examples.tau2.compat.serving_render import ServingEngine, template_inputs
from examples.tau2.episode.domain import BUILTIN_DOMAINS, SOLO_DOMAINS
from examples.tau2.episode.llm import strip_reasoning

PARITY_DOMAINS = BUILTIN_DOMAINS
ADMIN_KEY = "tau2-parity-admin"
CONTEXT_TOKENS = 12
"""Tokens of context shown on each side of a first difference."""

REPLY_TEXTS = {
    "tool call": ('<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": "mia_li_3668"}}'
                  "\n</tool_call>"),
    "two tool calls": ('<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
                       '<tool_call>\n{"name": "b", "arguments": {"y": "é"}}\n</tool_call>'),
    "text then tool call": 'Let me look.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>',
    "think then tool call": ('<think>\nThe user wants a lookup.\n</think>\n\n'
                             '<tool_call>\n{"name": "a", "arguments": {"x": 2}}\n</tool_call>'),
    "think then text": "<think>\nNothing to call.\n</think>\n\nHow can I help you today?",
    "tool call inside think": ('<think>\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
                               "</think>\n\nDone."),
    "malformed arguments": '<tool_call>\n{"name": "a", "arguments": {"x": \n</tool_call>',
    "unclosed tool call": '<tool_call>\n{"name": "a", "arguments": {"x": 1}}',
    "plain text": "Your reservation is confirmed.",
}
"""Generated texts for the reply side (tool names `a`, `b` and `get_user_details` are offered)."""

VLLM_HERMES = "vLLM hermes parser"
"""The reply comparison with vLLM's `--tool-call-parser hermes`."""
KNOWN_DIFFERENCES_DOC = 'examples/tau2/TRAINING.md, "Train on the served prompt"'


@dataclass(frozen=True)
class KnownDifference:
    """A documented reply-side difference between the proxy's parsers and a server's, accepted by the check.

    Accepted only when both sides read the text exactly as recorded here: any other reading of the same
    text is an unknown difference and fails."""

    reply: str
    """The key of `REPLY_TEXTS`."""
    parser: str
    """The reply comparison it belongs to (`Comparison.name`)."""
    proxy: dict[str, Any]
    """What the proxy's parsers make of the text (`_turn`'s form)."""
    server: dict[str, Any]
    """What the server's parser makes of it."""
    why: str


KNOWN_REPLY_DIFFERENCES = (
    KnownDifference(
        "tool call inside think", VLLM_HERMES,
        proxy={"content": "Done.", "tool_calls": []},
        server={"content": "<think>", "tool_calls": [["a", {}]]},
        why="hermes without a reasoning parser does not know <think>, so it calls a tool the model only "
            "thought about; serve with `--reasoning-parser qwen3` (SGLang with it agrees with the proxy)"),
    KnownDifference(
        "unclosed tool call", VLLM_HERMES,
        proxy={"content": '<tool_call>\n{"name": "a", "arguments": {"x": 1}}', "tool_calls": []},
        server={"content": "", "tool_calls": [["a", {"x": 1}]]},
        why="hermes calls a tool whose </tool_call> never came (a reply cut at the token limit); the "
            "proxy keeps it as text, so training counts no call where such a server would make one"),
)
"""The documented differences (TRAINING.md lists the same two); everything else fails the check."""


def known_difference(parser: str, reply: str, proxied: dict[str, Any],
                     served: dict[str, Any]) -> KnownDifference | None:
    """The documented difference this one is, if both sides read `reply` exactly as documented."""
    for known in KNOWN_REPLY_DIFFERENCES:
        if (known.parser, known.reply, known.proxy, known.server) == (parser, reply, proxied, served):
            return known
    return None


@dataclass(frozen=True)
class ParityCase:
    """One policy request of a recorded tau2 episode."""

    domain: str
    task_id: str
    mode: str
    """`conversation` (with a user simulator and the think tool) or `solo`."""
    turn: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_choice: str

    @property
    def label(self) -> str:
        return f"{self.domain}/{self.task_id} {self.mode} request {self.turn}"


@dataclass
class Comparison:
    """One rendering compared with the proxy's, over a set of requests."""

    name: str
    requests: int = 0
    tokens: int = 0
    differing: int = 0
    first: str = ""
    """The first difference that is not a known one, with its context."""
    differing_labels: list[str] = field(default_factory=list)
    """Every differing request or text, known differences included."""
    known: list[str] = field(default_factory=list)
    """Lines naming the differences that are known and accepted (`KNOWN_REPLY_DIFFERENCES`)."""

    @property
    def unknown(self) -> int:
        return self.differing - len(self.known)

    @property
    def ok(self) -> bool:
        return self.requests > 0 and self.unknown == 0

    @property
    def verdict(self) -> str:
        if not self.differing:
            return "identical"
        if not self.known:
            return f"{self.differing} differ"
        if not self.unknown:
            return f"{self.differing} differ, all known"
        return f"{self.differing} differ, {len(self.known)} known"


@dataclass
class ParityReport:
    engine: str
    domains: dict[str, int]
    """Domain -> requests recorded."""
    prompts: list[Comparison] = field(default_factory=list)
    replies: list[Comparison] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.prompts + self.replies) and bool(self.prompts)

    def format(self) -> str:
        lines = [f"train/serve parity: the proxy renders as {self.engine!r}; requests recorded: "
                 + ", ".join(f"{d} {n}" for d, n in self.domains.items())]
        for c in self.prompts:
            lines.append(f"  prompt  {c.name:<34} {c.requests:>4} requests {c.tokens:>8} tokens  {c.verdict}")
            if c.first:
                lines.append(f"          {c.first}")
        for c in self.replies:
            lines.append(f"  reply   {c.name:<34} {c.requests:>4} texts  "
                         + ("agree" if not c.differing else c.verdict))
            lines += [f"          {line}" for line in c.known]
            if c.first:
                lines.append(f"          {c.first}")
        known = sum(len(c.known) for c in self.prompts + self.replies)
        if not self.ok:
            lines.append("PARITY FAILED")
        elif known:
            plural = "s" * (known > 1)
            lines.append(f"PARITY OK, with {known} known difference{plural} ({KNOWN_DIFFERENCES_DOC})")
        else:
            lines.append("PARITY OK")
        return "\n".join(lines)


def render_prompt_ids(tokenizer: Any, engine: ServingEngine, messages: Sequence[dict[str, Any]],
                      tools: Sequence[dict[str, Any]] | None, tool_choice: Any = "auto",
                      **template_kwargs: Any) -> list[int]:
    """The prompt token ids `engine`'s chat server builds for the request (generation prompt added)."""
    msgs, tls = template_inputs(engine, messages, tools, tool_choice)
    return list(tokenizer.apply_chat_template(msgs, tools=tls, add_generation_prompt=True, tokenize=True,
                                              return_dict=False, **template_kwargs))


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where the sequences differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def describe_difference(tokenizer: Any, label: str, trained: Sequence[int], served: Sequence[int],
                        at: int) -> str:
    """The first differing token of two prompts, with the text around it."""
    def show(ids: Sequence[int]) -> str:
        before = tokenizer.decode(list(ids[max(0, at - CONTEXT_TOKENS):at]))
        after = tokenizer.decode(list(ids[at:at + CONTEXT_TOKENS]))
        token = ids[at] if at < len(ids) else "<end>"
        return f"{before!r} [{token}] {after!r}"

    return (f"{label}: first difference at token {at} of {len(trained)} (trained) / {len(served)} (served): "
            f"trained {show(trained)} | served {show(served)}")


# ---------------------------------------------------------------------------------------------
# 1. Recording tau2 conversations


def record_cases(domains: Sequence[str], tasks_per_domain: int) -> list[ParityCase]:
    """Policy requests of oracle episodes: per domain, the first `tasks_per_domain` tasks whose ground
    truth calls a tool, with the think tool; and solo episodes where the domain has tickets."""
    from examples.tau2.cpu.scripted_endpoint import EndpointThread
    from examples.tau2.episode import domain as tau2_domain
    from examples.tau2.tau2_agent import TASK_HEADER, Tau2AgentWorkflow

    cases: list[ParityCase] = []
    with EndpointThread() as endpoint:
        for domain in domains:
            split = "test" if "test" in tau2_domain.splits(domain) else next(iter(tau2_domain.splits(domain)))
            tasks = [t for t in tau2_domain.task_ids(domain, split)
                     if any(a.requestor == "assistant" for a in
                            (tau2_domain.get_task(domain, t).evaluation_criteria.actions or []))]
            for task_id in tasks[:tasks_per_domain]:
                modes = [("conversation", "think", False)]
                if domain in SOLO_DOMAINS:
                    modes.append(("solo", "oracle", True))
                for mode, policy, solo in modes:
                    workflow = Tau2AgentWorkflow(
                        user_base_url=endpoint.url, user_model="user", agent_model=policy,
                        enable_think_tool=not solo, solo_mode=solo, max_steps=60, llm_retries=0,
                        request_timeout_s=60.0, episode_timeout_s=300.0)
                    seen = len(endpoint.endpoint.recent)
                    asyncio.run(_play(workflow, domain, task_id, endpoint.url))
                    task_header = f"{domain}/{task_id}"
                    requests = [r.body for r in list(endpoint.endpoint.recent)[seen:]
                                if r.model == policy and urllib.parse.unquote(r.headers.get(TASK_HEADER, ""))
                                == task_header]
                    cases += [ParityCase(domain, task_id, mode, i, body["messages"], body.get("tools") or [],
                                         body.get("tool_choice", "auto"))
                              for i, body in enumerate(requests)]
    return cases


async def _play(workflow: Any, domain: str, task_id: str, url: str) -> None:
    try:
        await workflow.run_episode({"domain": domain, "task_id": task_id}, base_url=url, api_key="parity")
    finally:
        await workflow.aclose()


# ---------------------------------------------------------------------------------------------
# 2. AReaL's real proxy, in this process


class _CapturingEngine:
    """The rollout engine behind the proxy: records the prompt ids it gets and answers `reply_ids`."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []
        self.reply_ids: list[int] = []

    def get_version(self) -> int:
        return 0

    async def agenerate(self, req: Any) -> Any:
        from areal.api.io_struct import ModelResponse

        self.prompts.append(list(req.input_ids))
        return ModelResponse(input_tokens=list(req.input_ids), output_tokens=list(self.reply_ids),
                             output_logprobs=[0.0] * len(self.reply_ids),
                             output_versions=[0] * len(self.reply_ids), stop_reason="stop",
                             tokenizer=req.tokenizer)


class InProcessProxy:
    """AReaL 1.0.4's proxy app (`proxy_rollout_server.app`) over an in-memory transport, rendering as
    `engine` says (None: AReaL's own). Restores the proxy module's state and the rendering on exit."""


    def __init__(self, tokenizer: Any, engine: ServingEngine | None, record_dir: str | None = None):
        self.tokenizer = tokenizer
        self.engine = engine
        self.record_dir = record_dir
        """If set, the proxy records every rendered request there, as in training (`RecordedParity`)."""
        self.fake = _CapturingEngine()

    def __enter__(self) -> InProcessProxy:
        from areal.experimental.openai.client import ArealOpenAI
        from areal.experimental.openai.proxy import proxy_rollout_server as srv

        from examples.tau2.training.served_prompt import install_proxy_rendering

        self._srv = srv
        self._saved = (srv._openai_client, srv._admin_api_key, srv._capacity)
        srv._openai_client = ArealOpenAI(engine=self.fake, tokenizer=self.tokenizer, tool_call_parser="qwen",
                                         reasoning_parser="qwen3", chat_template_type="hf")
        srv._admin_api_key = ADMIN_KEY
        install_proxy_rendering(self.engine, self.record_dir, self.fake)
        self._loop = asyncio.new_event_loop()
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=srv.app), base_url="http://proxy")
        return self

    def __exit__(self, *exc: object) -> None:
        from examples.tau2.training.served_prompt import install_proxy_rendering

        self._loop.run_until_complete(self._client.aclose())
        self._loop.close()
        install_proxy_rendering(None)
        self._srv._openai_client, self._srv._admin_api_key, self._srv._capacity = self._saved

    def _post(self, path: str, body: dict[str, Any], key: str) -> dict[str, Any]:
        response = self._loop.run_until_complete(
            self._client.post(path, json=body, headers={"Authorization": f"Bearer {key}"}))
        if response.status_code != 200:
            raise RuntimeError(f"AReaL's proxy answered {path} with {response.status_code}: "
                               f"{response.text[:300]}")
        return response.json()

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], tool_choice: str,
                 reply_text: str = "OK") -> tuple[list[int], dict[str, Any]]:
        """(prompt ids the proxy rendered, the chat completion it returned for `reply_text`)."""
        self._post("/grant_capacity", {}, ADMIN_KEY)
        session = self._post("/rl/start_session", {"task_id": f"parity-{uuid.uuid4().hex[:8]}"}, ADMIN_KEY)
        self.fake.reply_ids = self.tokenizer.encode(reply_text) + [self.tokenizer.eos_token_id]
        body: dict[str, Any] = {"model": "policy", "messages": messages, "max_completion_tokens": 64,
                                "temperature": 1.0, "top_p": 1.0}
        if tools:
            body.update(tools=tools, tool_choice=tool_choice)
        completion = self._post("/chat/completions", body, session["api_key"])
        self._post("/rl/end_session", {}, session["api_key"])
        self._srv._session_cache.pop(session["session_id"], None)  # nobody exports it
        self._srv._remove_api_keys_for_session(session["session_id"])
        return self.fake.prompts[-1], completion


# ---------------------------------------------------------------------------------------------
# 3. The serving engines' renderings

START_VLLM = ("start one with `.venv-vllm/bin/python -m examples.tau2.cpu.vllm_cpu_server "
              "--model MODEL_DIR --port N` and pass --vllm-url http://127.0.0.1:N/v1 "
              f"({KNOWN_DIFFERENCES_DOC})")
"""How to get a server to check against, appended to every endpoint error."""


class ParityInputError(Exception):
    """A `--vllm-url` or `--vllm-python` the check cannot use, in one sentence."""


def _first_bytes(response: httpx.Response) -> str:
    return repr(response.content[:60].decode("utf-8", "replace"))


class VllmTokenizer:
    """A live vLLM server's own prompt ids for chat requests (`POST /tokenize`, the served model)."""

    def __init__(self, url: str, timeout_s: float = 120.0):
        self.url = url
        self.root = url.rstrip("/").removesuffix("/v1")
        self.client = httpx.Client(timeout=timeout_s)
        self._model = ""

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON answer of `path`; any other outcome is a `ParityInputError` naming the URL."""
        where = f"{self.root}{path}"
        server = f"the vLLM server at {self.url}"
        try:
            response = self.client.request(method, where, json=body)
        except httpx.ConnectError as e:
            reason = str(e) or "connection refused"
            raise ParityInputError(f"{server} is not reachable ({reason}); {START_VLLM}") from None
        except httpx.TimeoutException:
            raise ParityInputError(f"{server} did not answer {path} within {self.client.timeout.read:g} s; "
                                   f"{START_VLLM}") from None
        except httpx.HTTPError as e:
            raise ParityInputError(f"{server} could not be asked ({type(e).__name__}: {e}); "
                                   f"{START_VLLM}") from None
        if response.status_code != 200:
            raise ParityInputError(f"{self.url} is not a vLLM server: {method} {path} answered "
                                   f"{response.status_code} ({_first_bytes(response)}); {START_VLLM}")
        try:
            return response.json()
        except ValueError:
            raise ParityInputError(f"{self.url} is not a vLLM server: {method} {path} answered "
                                   f"{response.status_code} with no JSON ({_first_bytes(response)}); "
                                   f"{START_VLLM}") from None

    def model(self) -> str:
        """The served model's name (`/v1/models`)."""
        if not self._model:
            data = self._request("GET", "/v1/models")
            models = data.get("data") if isinstance(data, dict) else None
            if not models or not isinstance(models[0], dict) or "id" not in models[0]:
                raise ParityInputError(f"{self.url} is not a vLLM server: /v1/models lists no model "
                                       f"({json.dumps(data)[:60]!r}); {START_VLLM}")
            self._model = str(models[0]["id"])
        return self._model

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        body: dict[str, Any] = {"model": self.model(), "messages": messages, "add_generation_prompt": True}
        if tools:
            body["tools"] = tools
        data = self._request("POST", "/tokenize", body)
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list):
            raise ParityInputError(f"{self.url} is not a vLLM /tokenize endpoint: it answered "
                                   f"{json.dumps(data)[:60]!r} (no token list); {START_VLLM}")
        return list(tokens)

    def check(self) -> None:
        """Fails fast, before anything is recorded, unless `url` is a vLLM server that tokenizes chats."""
        self([{"role": "user", "content": "Hello."}], None)

    def close(self) -> None:
        self.client.close()


class RecordedParity:
    """The requests AReaL's proxy rendered during training (`training/served_prompt.RequestRecorder`),
    compared with the live vLLM server's rendering each time `check` is called (the smoke run: every
    step). Remembers how far each record file was read."""

    def __init__(self, folder: str | Path, url: str, tokenizer: Any = None):
        self.folder = Path(folder)
        self.tokenize = VllmTokenizer(url)
        self.tokenizer = tokenizer
        self._read: dict[Path, int] = {}
        self.first = ""

    def check(self) -> dict[str, float]:
        """New requests since the last call: `{tau2/parity/requests, tau2/parity/differing}`."""
        from examples.tau2.training.served_prompt import RECORD_PREFIX

        requests = differing = 0
        for path in sorted(self.folder.glob(f"{RECORD_PREFIX}*.jsonl")):
            with path.open("rb") as f:
                f.seek(self._read.get(path, 0))
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
            self._read[path] = self._read.get(path, 0) + len(complete)
            for line in complete.splitlines():
                record = json.loads(line)
                served = self.tokenize(record["messages"], record["tools"])
                requests += 1
                at = first_difference(record["prompt_ids"], served)
                if at is not None:
                    differing += 1
                    if not self.first and self.tokenizer is not None:
                        label = f"policy version {record['version']}"
                        trained = record["prompt_ids"]
                        self.first = describe_difference(self.tokenizer, label, trained, served, at)
        return {"tau2/parity/requests": float(requests), "tau2/parity/differing": float(differing)}


def compare_prompts(name: str, tokenizer: Any, cases: Sequence[ParityCase], trained: Sequence[list[int]],
                    served: Sequence[list[int]]) -> Comparison:
    result = Comparison(name)
    for case, a, b in zip(cases, trained, served, strict=True):
        result.requests += 1
        result.tokens += len(b)
        at = first_difference(a, b)
        if at is not None:
            result.differing += 1
            if not result.first:
                result.first = describe_difference(tokenizer, case.label, a, b, at)
    return result


# ---------------------------------------------------------------------------------------------
# 4. The reply side

_REPLY_PARAMETERS = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "string"},
                                                      "user_id": {"type": "string"}}}
REPLY_TOOLS = [{"type": "function", "function": {"name": n, "description": f"Tool {n}.",
                                                 "parameters": _REPLY_PARAMETERS}}
               for n in ("a", "b", "get_user_details")]


def _turn(content: str | None, calls: list[tuple[str, Any]]) -> dict[str, Any]:
    """What the workflow keeps of a reply: content without reasoning, and (name, parsed arguments)."""
    def args(raw: Any) -> Any:
        try:
            return json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError:
            return f"<malformed> {raw}"

    return {"content": strip_reasoning(content) or "", "tool_calls": [[n, args(a)] for n, a in calls]}


def proxy_turn(completion: dict[str, Any]) -> dict[str, Any]:
    message = completion["choices"][0]["message"]
    return _turn(message.get("content"), [(c["function"]["name"], c["function"]["arguments"])
                                          for c in message.get("tool_calls") or []])


def sglang_turn(text: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """SGLang 0.5.10.post1's server as the config's proxy parsers name it (`--tool-call-parser qwen
    --reasoning-parser qwen3`, `tool_choice: auto`), non-streaming: `serving_chat` separates the reasoning
    (`ReasoningParser`, not forced: Qwen3's template does not open `<think>` itself), then
    `_process_tool_calls` runs its `FunctionCallParser` on the rest."""
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    _, text = ReasoningParser(model_type="qwen3", stream_reasoning=False).parse_non_stream(text)
    text = text or ""
    parser = FunctionCallParser([Tool.model_validate(t) for t in tools], "qwen")
    if not parser.has_tool_call(text):
        return _turn(text, [])
    content, calls = parser.parse_non_stream(text)
    return _turn(content, [(c.name, c.parameters) for c in calls])


_VLLM_PARSE = """
import json, sys
from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
job = json.load(sys.stdin)
parser = Hermes2ProToolParser(AutoTokenizer.from_pretrained(job["tokenizer"]))
request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=job["tools"])
out = []
for text in job["texts"]:
    info = parser.extract_tool_calls(text, request)
    calls = [[c.function.name, c.function.arguments] for c in info.tool_calls]
    out.append({"content": info.content, "calls": calls})
print(json.dumps(out))
"""


_VLLM_VERSION = """
import importlib.metadata as m
dists = m.packages_distributions().get("vllm") or []
print(m.version(dists[0]) if dists else "none")
"""
"""The version of whichever distribution provides `vllm` (`vllm`, or `vllm-cpu` on CPU)."""


def check_vllm_python(python: str, timeout_s: float = 60.0) -> None:
    """Fails fast unless `python` is an interpreter with the vLLM release the parser comparison mirrors
    (read from its package metadata: importing vLLM takes seconds)."""
    from examples.tau2.cpu.vllm_cpu_server import VLLM_VERSION

    install = "run `bash scripts/install_vllm_cpu.sh` for .venv-vllm/bin/python"
    if not Path(python).is_file():
        raise ParityInputError(f"--vllm-python {python} does not exist; {install}")
    if not os.access(python, os.X_OK):
        raise ParityInputError(f"--vllm-python {python} is not executable; {install}")
    try:
        out = subprocess.run([python, "-c", _VLLM_VERSION], capture_output=True, text=True, timeout=timeout_s,
                             check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ParityInputError(f"--vllm-python {python} could not be run ({e}); {install}") from None
    lines = out.stdout.strip().splitlines()
    version = lines[-1] if out.returncode == 0 and lines else ""
    if not version:
        raise ParityInputError(f"--vllm-python {python} is not a working Python interpreter (exit "
                               f"{out.returncode}); {install}")
    if version == "none":
        raise ParityInputError(f"--vllm-python {python} has no vLLM installed; {install}")
    if version != VLLM_VERSION:
        raise ParityInputError(f"--vllm-python {python} has vLLM {version}, but the parser comparison is "
                               f"for vLLM {VLLM_VERSION}; {install}")


def vllm_turns(texts: list[str], tools: list[dict[str, Any]], tokenizer_dir: str,
               python: str) -> list[dict[str, Any]]:
    """vLLM's hermes tool parser (`--tool-call-parser hermes`), run by the vLLM venv's interpreter."""
    job = json.dumps({"texts": texts, "tools": tools, "tokenizer": tokenizer_dir})
    out = subprocess.run([python, "-c", _VLLM_PARSE], input=job, capture_output=True, text=True,
                         timeout=300, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"vLLM's parser failed: {out.stderr[-2000:]}")
    return [_turn(r["content"], r["calls"]) for r in json.loads(out.stdout.strip().splitlines()[-1])]


def compare_replies(name: str, proxied: dict[str, dict[str, Any]],
                    served: dict[str, dict[str, Any]]) -> Comparison:
    """The proxy's reading of each text against the server's; documented differences are named, not failed."""
    result = Comparison(name)
    for label, turn in proxied.items():
        result.requests += 1
        if turn != served[label]:
            result.differing += 1
            result.differing_labels.append(label)
            known = known_difference(name, label, turn, served[label])
            if known:
                result.known.append(f"known: {label!r}: proxy {turn} | server {served[label]}: {known.why}")
            elif not result.first:
                result.first = f"{label!r}: proxy {turn} | server {served[label]}"
    return result


# ---------------------------------------------------------------------------------------------
# The whole check


def default_tokenizer_dir() -> str:
    from examples.tau2.cpu.tiny_model import tokenizer_dir

    return str(tokenizer_dir())


def run_parity(cases: Sequence[ParityCase], tokenizer_dir: str, engine: ServingEngine | None,
               vllm_url: str = "", vllm_python: str = "", compare_sglang: bool | None = None) -> ParityReport:
    """Every case through the proxy rendering as `engine` (None: AReaL's own), against the engines: SGLang's
    rendering when the proxy renders for SGLang or as AReaL does (`compare_sglang` overrides), a live vLLM
    server's with `vllm_url`. Reply side: SGLang's parsers, and vLLM's with `vllm_python`."""
    if compare_sglang is None:
        compare_sglang = engine is not ServingEngine.VLLM
    if not (compare_sglang or vllm_url):
        raise ValueError("nothing to compare with: rendering for vLLM needs a live vLLM server (--vllm-url)")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    domains: dict[str, int] = {}
    for c in cases:
        domains[c.domain] = domains.get(c.domain, 0) + 1
    report = ParityReport(engine.value if engine else "areal", domains)
    with InProcessProxy(tokenizer, engine) as proxy:
        trained = [proxy.complete(c.messages, c.tools, c.tool_choice)[0] for c in cases]
        proxied = {label: proxy_turn(proxy.complete([{"role": "user", "content": "Help."}], REPLY_TOOLS,
                                                    "auto", text)[1])
                   for label, text in REPLY_TEXTS.items()}
    if compare_sglang:
        sglang = [render_prompt_ids(tokenizer, ServingEngine.SGLANG, c.messages, c.tools, c.tool_choice)
                  for c in cases]
        report.prompts.append(compare_prompts("SGLang 0.5.10.post1 (its request models)", tokenizer, cases,
                                              trained, sglang))
    report.replies.append(compare_replies("SGLang 0.5.10.post1 qwen parser", proxied,
                                          {k: sglang_turn(t, REPLY_TOOLS) for k, t in REPLY_TEXTS.items()}))
    if vllm_url:
        tokenize = VllmTokenizer(vllm_url)
        try:
            served = [tokenize(c.messages, c.tools) for c in cases]
        finally:
            tokenize.close()
        report.prompts.append(compare_prompts(f"vLLM at {vllm_url} (/tokenize)", tokenizer, cases, trained,
                                              served))
    if vllm_python:
        turns = vllm_turns(list(REPLY_TEXTS.values()), REPLY_TOOLS, tokenizer_dir, vllm_python)
        report.replies.append(compare_replies(VLLM_HERMES, proxied, dict(zip(REPLY_TEXTS, turns,
                                                                                     strict=True))))
    return report


HELP_EPILOG = f"""\
exit status: 0 parity (known differences are named, not failed), 1 a difference, 2 unusable input.

A vLLM server to check against, on CPU (the smoke run's launcher; .venv-vllm from
scripts/install_vllm_cpu.sh), with the tiny Qwen3 model (its tokenizer and chat template are Qwen3's):

  MODEL=$(.venv/bin/python -m examples.tau2.cpu.tiny_model)
  VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m examples.tau2.cpu.vllm_cpu_server --model $MODEL \\
      --dtype float32 --enforce-eager --block-size 32 --max-model-len 4096 \\
      --enable-auto-tool-choice --tool-call-parser hermes --host 127.0.0.1 --port 8765 &
  python -m examples.tau2.cpu.parity --engine vllm --vllm-url http://127.0.0.1:8765/v1 \\
      --vllm-python .venv-vllm/bin/python --tokenizer $MODEL

Known differences: {KNOWN_DIFFERENCES_DOC}.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.tau2.cpu.parity",
                                     description=__doc__.split("\n\n")[0], epilog=HELP_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=[*(e.value for e in ServingEngine), "areal"], default="sglang",
                        help="whose prompt the proxy renders (the training config's econfig.serving_engine); "
                             "`areal`: AReaL's own rendering")
    parser.add_argument("--vllm-url", default="", help="a live vLLM server (OpenAI base URL) to compare with")
    parser.add_argument("--vllm-python", default="",
                        help="a Python with vLLM 0.32 (e.g. .venv-vllm/bin/python): compare vLLM's reply "
                             "parser")
    parser.add_argument("--tokenizer", default="", help="the model directory (default: the Qwen3 tokenizer)")
    parser.add_argument("--domains", nargs="+", default=list(PARITY_DOMAINS), choices=PARITY_DOMAINS)
    parser.add_argument("--tasks", type=int, default=2, help="tasks per domain (default 2)")
    parser.add_argument("--output", default="", help="write the report as JSON here")
    args = parser.parse_args(argv)
    if args.tasks < 1:
        parser.error("--tasks must be at least 1")
    engine = None if args.engine == "areal" else ServingEngine(args.engine)
    if engine is ServingEngine.VLLM and not args.vllm_url:
        parser.error("--engine vllm is checked against a live vLLM server: give --vllm-url")
    url = urllib.parse.urlsplit(args.vllm_url)
    if args.vllm_url and (url.scheme not in ("http", "https") or not url.hostname):
        parser.error(f"--vllm-url {args.vllm_url} is not an http(s) URL (e.g. http://127.0.0.1:8765/v1)")
    if args.tokenizer and not Path(args.tokenizer, "tokenizer_config.json").is_file():
        parser.error(f"--tokenizer {args.tokenizer} is not a model directory with a tokenizer_config.json")
    try:  # the inputs first: recording takes a minute
        if args.vllm_python:
            check_vllm_python(args.vllm_python)
        if args.vllm_url:
            endpoint = VllmTokenizer(args.vllm_url, timeout_s=10.0)
            try:
                endpoint.check()
            finally:
                endpoint.close()
    except ParityInputError as e:
        print(f"parity: {e}", file=sys.stderr)
        return 2
    from examples.tau2.runtime.process import setup_runtime

    setup_runtime("ERROR")  # tau2's loguru: errors only
    cases = record_cases(args.domains, args.tasks)
    try:
        report = run_parity(cases, args.tokenizer or default_tokenizer_dir(), engine, args.vllm_url,
                            args.vllm_python)
    except ParityInputError as e:  # the server went away while the cases were compared
        print(f"parity: {e}", file=sys.stderr)
        return 2
    print(report.format())
    if args.output:
        Path(args.output).write_text(json.dumps(dataclasses.asdict(report), indent=2))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
