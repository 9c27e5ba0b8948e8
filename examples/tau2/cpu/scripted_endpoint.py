"""A scripted OpenAI-compatible chat server for tests, benchmarks and offline smoke runs.

No model: each reply is computed from the request, so any number of episodes can run against one
server. The policy learns which tau2 task it is playing from the `X-Tau2-Task` header the workflow
sends with every request ("<domain>/<task_id>", URL-quoted).

Policies (the request's `model`, optionally `@<ms>` for added latency, e.g. `oracle@200`):
  oracle        replays the task's ground-truth actions; asks the user to run user-side actions with
                `PLEASE_RUN {json}`, then states the task's communicate info and `DONE_ALL`.
  noop          never acts; says it cannot help.
  badjson       a tool call whose arguments are not JSON.
  rawtoolcall   `<tool_call>` text the server could not parse (as AReaL's proxy returns it).
  empty         no content, no tool calls.
  huge          a reply cut at the token limit (finish_reason "length").
  unknowntool   calls a tool that does not exist, then behaves like oracle.
  usertool      calls a user-side tool (telecom) as the agent, then behaves like oracle.
  think         calls `think` once per turn before behaving like oracle.
  think:<kind>  the same with a misused `think` call, `THINK_MISUSES[kind]`: `extra` (an argument it
                does not take), `missing` (no `thought`), `notstring` (a number), `array` (arguments
                not an object).
  error500      HTTP 500 on every request.
  flaky<N>      HTTP 503 on the first N requests of each episode, then oracle.
  hang          never answers (until the client gives up).
  malformed:<kind>     HTTP 200 with a body that is not a chat completion, `MALFORMED_BODIES[kind]`.
  malformed<N>:<kind>  that body for the first N requests of each episode, then oracle.
  raw           answers with the request's own `x_raw_reply`: {"body_b64", "status" (200),
                "content_type", "headers"} (any bytes, status and headers: for fuzz tests).
  judge         tau2 1.0.x's NL-assertion judge: every expected outcome of the request is met
                (`judge-deny`: none is; `judge-prose`: a reply that is not the verdict JSON).
  route:<rules> a policy per trial. Rules `<task_id>.<seed>=<policy>` separated by `;`, the first
                match wins, `*` matches any task or seed, no match plays `empty`; e.g.
                `route:7.0=oracle;7.1=oracle;*.2=error500`.
  coin<P>       oracle on about P% of trials and `empty` on the rest, by a hash of (task, seed).
  stall<P>      the same with `noop` for the rest: a policy that mostly stalls, so that it passes the
                tasks a do-nothing agent passes and few others.
                `route:`, `coin<P>` and `stall<P>` learn the trial's seed from the user simulator's
                request in the same episode (tau2 sends `seed` to the user only); without one they
                answer 400.
User simulators:
  user          scripted: greets, runs PLEASE_RUN tool calls, stops on DONE_ALL or a refusal.
  user-scenario like `user`, but opens with the task's own instructions (read from the user
                simulator's system prompt), so a policy can tell tasks apart without an LLM user.
  user-error500 / user-flaky<N> / user-hang / user-empty / user-malformed[<N>]:<kind>
                failure modes of the above.
  user-flakyempty<N>  HTTP 503 on N requests, then an empty reply, over and over within an episode:
                with `llm_retries` = N, every ask of a user turn succeeds on its last HTTP try.
Outages of whole episodes, in front of any policy or user simulator above:
  faulty<P>:<model>     HTTP 503 on every request of about P per mille of episodes (chosen by a hash of
                        the episode's arrival order at this model name), `<model>` for the others.
  failfirst<N>:<model>  HTTP 503 on every request of the first N episodes to reach this model name,
                        `<model>` for the later ones.

Run: `python -m examples.tau2.cpu.scripted_endpoint --port 8000 [--domain-modules MOD ...]` (OpenAI base URL:
http://127.0.0.1:8000/v1).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import hashlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from aiohttp import web

from examples.tau2.compat import tau2_judge
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.tau2_agent import EPISODE_HEADER, TASK_HEADER

PLEASE_RUN = "PLEASE_RUN "
DONE_ALL = "DONE_ALL"
REFUSAL = "Sorry, I cannot help with that. Goodbye."
FAULT_ID = "fault_"  # id prefix of tool calls injected by fault modes; the oracle does not count them


def _completion(model: str, content: str | None = None, tool_calls: list[dict] | None = None,
                finish_reason: str | None = None, id_prefix: str = "call_") -> dict[str, Any]:
    calls = [
        {"id": f"{id_prefix}{uuid.uuid4().hex[:12]}", "type": "function",
         "function": {"name": c["name"], "arguments": c["arguments"]
                      if isinstance(c["arguments"], str) else json.dumps(c["arguments"])}}
        for c in tool_calls or []
    ]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "tool_calls": calls or None},
            "finish_reason": finish_reason or ("tool_calls" if calls else "stop"),
        }],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


THINK_MISUSES: dict[str, dict[str, Any] | str] = {
    "extra": {"thought": "Check the policy.", "urgency": "high"},
    "missing": {"idea": "Check the policy."},
    "notstring": {"thought": 42},
    "array": '["Check the policy."]',
}
"""Arguments of the `think:<kind>` policies' think calls."""

_VALID = json.dumps(_completion("m", content="Hello")).encode()
MALFORMED_BODIES: dict[str, tuple[str, bytes]] = {
    "html": ("text/html", b"<html><body><h1>502 Bad Gateway</h1></body></html>"),
    "text": ("text/plain", b"upstream connect error or disconnect/reset before headers"),
    "empty": ("application/json", b""),
    "truncated": ("application/json", _VALID[: len(_VALID) // 2]),
    "array": ("application/json", b"[]"),
    "error": ("application/json", b'{"error": {"message": "overloaded", "code": 503}}'),
    "nochoices": ("application/json", json.dumps({"id": "x", "object": "chat.completion"}).encode()),
    "emptychoices": ("application/json", json.dumps({"id": "x", "choices": []}).encode()),
    "nomessage": ("application/json", json.dumps({"choices": [{"finish_reason": "stop"}]}).encode()),
    "badcontent": ("application/json",
                   json.dumps({"choices": [{"message": {"content": {"text": "hi"}}}]}).encode()),
    "badtoolcalls": ("application/json",
                     json.dumps({"choices": [{"message": {"tool_calls": "get_user"}}]}).encode()),
}
"""Bodies of the `malformed:<kind>` modes, each sent with HTTP 200 and its content type."""


def raw_response(spec: dict[str, Any]) -> web.Response:
    """The `raw` mode: exactly the bytes, status, content type and headers the request asked for."""
    headers = dict(spec.get("headers") or {})
    if spec.get("content_type") is not None:
        headers["Content-Type"] = spec["content_type"]
    return web.Response(body=base64.b64decode(spec.get("body_b64", "")), status=int(spec.get("status", 200)),
                        headers=headers)


def _task_from_header(request: web.Request):
    raw = request.headers.get(TASK_HEADER)
    if not raw:
        return None
    domain, _, task_id = urllib.parse.unquote(raw).partition("/")
    return tau2_domain.get_task(domain, task_id)


def _emitted_actions(messages: list[dict]) -> int:
    """Ground-truth actions already taken: tool calls (except injected faults) and PLEASE_RUN requests."""
    n = 0
    for m in messages:
        if m.get("role") != "assistant":
            continue
        calls = [c for c in m.get("tool_calls") or []
                 if c["function"]["name"] != "think" and not str(c.get("id", "")).startswith(FAULT_ID)]
        if calls:
            n += len(calls)
        elif (m.get("content") or "").startswith(PLEASE_RUN):
            n += 1
    return n


def _history_actions(task) -> int:
    """Tool calls the task's scripted message history already holds: the episode starts after them, so
    they are context the oracle reads, not actions it took."""
    history = task.initial_state.message_history if task.initial_state else None
    return sum(len(m.tool_calls or []) for m in history or [] if m.role == "assistant")


def oracle_reply(task, messages: list[dict], tool_names: set[str]) -> dict[str, Any]:
    """Next turn of the ground-truth policy: one action per turn, then the closing statement."""
    solo = "done" in tool_names
    actions = list(task.evaluation_criteria.actions or []) if task.evaluation_criteria else []
    i = _emitted_actions(messages) - _history_actions(task)
    if i < len(actions):
        a = actions[i]
        if a.requestor == "assistant" or solo:
            return {"tool_calls": [{"name": a.name, "arguments": a.arguments}]}
        return {"content": PLEASE_RUN + json.dumps({"name": a.name, "arguments": a.arguments})}
    if solo:
        return {"tool_calls": [{"name": "done", "arguments": {}}]}
    info = task.evaluation_criteria.communicate_info if task.evaluation_criteria else []
    return {"content": " ".join([DONE_ALL, *(info or [])])}


def scripted_user_reply(messages: list[dict]) -> dict[str, Any]:
    """The scripted user. Sees tau2's flipped view: the agent's text arrives as role `user`."""
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return {"content": "I did that. What next?"}
    text = last.get("content") or "" if last.get("role") == "user" else ""
    if not any(m.get("role") == "assistant" for m in messages):
        return {"content": "Hi, I need help with my request."}
    if text.startswith(PLEASE_RUN):
        call = json.loads(text[len(PLEASE_RUN):])
        return {"tool_calls": [{"name": call["name"], "arguments": call["arguments"]}]}
    if DONE_ALL in text or "Goodbye" in text:
        return {"content": "Thanks, that is all. ###STOP###"}
    if sum(m.get("role") == "assistant" for m in messages) > 30:
        return {"content": "###STOP###"}
    return {"content": "Okay, please go on."}


@dataclass
class RecordedRequest:
    """One request as received, for tests that check what the workflow sends."""

    model: str
    headers: Mapping[str, str]  # case-insensitive, as HTTP's are: clients differ in the case they send
    body: dict[str, Any]


_SCENARIO_RE = re.compile(r"<scenario>(.*?)</scenario>", re.DOTALL)


def scenario_opening(messages: list[dict]) -> str:
    """The task's instructions from tau2's user-simulator system prompt, as one plain sentence block.

    tau2 renders the scenario as `Persona: ... Instructions: ...` inside `<scenario>` tags; the
    persona is dropped and whitespace collapsed, so the opening is short and deterministic.
    """
    system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
    found = _SCENARIO_RE.search(system)
    if not found:
        return "Hi, I need help with my request."
    scenario = found.group(1)
    _, sep, instructions = scenario.partition("Instructions:")
    return " ".join((instructions if sep else scenario).split())


def scenario_user_reply(messages: list[dict]) -> dict[str, Any]:
    """`user-scenario`: its first own turn states the task's instructions, then the scripted user.

    "First own turn" is the first one in which the user has not said them yet (its own messages are
    role `assistant` in its view): a task that starts from a scripted message history already holds
    user turns, and the user simulator still has to say what it wants now.
    """
    opening = scenario_opening(messages)
    if not any(m.get("role") == "assistant" and m.get("content") == opening for m in messages):
        return {"content": opening}
    return scripted_user_reply(messages)


ROUTE_PREFIX = "route:"
COIN = r"(coin|stall)(\d+)"
"""`coin<P>` and `stall<P>`: the ground truth on about P% of trials, `empty` or `noop` on the rest."""


def judge_reply(messages: list[dict], met: bool) -> str:
    """The scripted judge's reply: every outcome the prompt lists, `met` or not."""
    return tau2_judge.uniform_verdicts(messages, met, "scripted")


def trial_policy(model: str, task: str, seed: int) -> str:
    """The policy a `route:`, `coin<P>` or `stall<P>` model plays in one trial (`task` is
    "<domain>/<task_id>")."""
    coin = re.fullmatch(COIN, model)
    if coin:
        digest = hashlib.blake2b(f"{task}#{seed}".encode(), digest_size=8).digest()
        works = int.from_bytes(digest, "big") % 100 < int(coin.group(2))
        return "oracle" if works else "empty" if coin.group(1) == "coin" else "noop"
    task_id = task.partition("/")[2]
    for rule in model.removeprefix(ROUTE_PREFIX).split(";"):
        lhs, eq, policy = rule.rpartition("=")
        rule_task, dot, rule_seed = ("*", ".", "*") if lhs == "*" else lhs.rpartition(".")
        if not (eq and dot and policy):
            raise ValueError(f"route rule {rule!r} is not <task_id>.<seed>=<policy>")
        if rule_task in ("*", task_id) and rule_seed in ("*", str(seed)):
            return policy
    return "empty"


class ScriptedEndpoint:
    """The aiohttp app plus per-episode counters for the flaky modes."""

    def __init__(self) -> None:
        self.requests = collections.Counter()  # model -> count
        self.recent: collections.deque[RecordedRequest] = collections.deque(maxlen=2000)
        self._per_episode: collections.Counter[tuple[str, str]] = collections.Counter()
        self._seeds: dict[str, int] = {}  # episode id -> the seed its user-simulator requests carry
        self._hangs: set[asyncio.Task] = set()  # "hang" handlers, cancelled when the server shuts down
        self._down: dict[tuple[str, str], bool] = {}  # (outage model, episode) -> down?
        self._arrived: collections.Counter[str] = collections.Counter()  # outage model -> episodes seen

    def reset(self) -> None:
        """Forget every request and outage so far: the next episode is the first again (a test's own
        `failfirst<N>:` outage does not depend on which tests ran before it on this server)."""
        self.requests.clear()
        self.recent.clear()
        self._per_episode.clear()
        self._seeds.clear()
        self._down.clear()
        self._arrived.clear()

    def _episode_down(self, model: str, episode: str, kind: str, n: int) -> bool:
        """Whether `episode` is in the outage of `model` (`faulty<P>:` / `failfirst<N>:`), decided on
        its first request by its arrival index at that model name."""
        key = (model, episode)
        if key not in self._down:
            index = self._arrived[model]
            self._arrived[model] += 1
            if kind == "failfirst":
                self._down[key] = index < n
            else:
                digest = hashlib.blake2b(f"{model}#{index}".encode(), digest_size=8).digest()
                self._down[key] = int.from_bytes(digest, "big") % 1000 < n
        return self._down[key]

    def outage(self, model: str) -> tuple[int, int]:
        """(episodes that reached the outage model `model`, how many of them it took down)."""
        downs = [down for (m, _), down in self._down.items() if m == model]
        return len(downs), sum(downs)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for path in ("/v1/chat/completions", "/chat/completions"):
            app.router.add_post(path, self.chat)
        app.router.add_get("/health", lambda _: web.json_response({"status": "ok"}))
        app.on_shutdown.append(self._release_hangs)
        return app

    async def _release_hangs(self, _app: web.Application) -> None:
        for task in list(self._hangs):
            task.cancel()

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        model, _, delay = str(body.get("model", "")).partition("@")
        self.requests[model] += 1
        self.recent.append(RecordedRequest(model, request.headers.copy(), body))
        if delay:
            await asyncio.sleep(float(delay) / 1000.0)
        messages = body.get("messages", [])
        tool_names = {t["function"]["name"] for t in body.get("tools") or []}
        episode = request.headers.get(EPISODE_HEADER, "")
        if body.get("seed") is not None and episode:
            self._seeds[episode] = int(body["seed"])
        if model.startswith(ROUTE_PREFIX) or re.fullmatch(COIN, model):
            seed = self._seeds.get(episode)
            if seed is None:
                return web.json_response(
                    {"error": {"message": f"{model!r} needs a user-simulator request with a seed first"}},
                    status=400)
            try:
                model = trial_policy(model, urllib.parse.unquote(request.headers.get(TASK_HEADER, "")), seed)
            except ValueError as e:
                return web.json_response({"error": {"message": str(e)}}, status=400)
        outage = re.fullmatch(r"(faulty|failfirst)(\d+):(.+)", model)
        if outage:
            if self._episode_down(model, episode, outage.group(1), int(outage.group(2))):
                return web.json_response({"error": {"message": "scripted outage"}}, status=503)
            model = outage.group(3)
        flaky = re.fullmatch(r"(user-)?flaky(\d+)", model)
        if flaky:
            self._per_episode[(model, episode)] += 1
            if self._per_episode[(model, episode)] <= int(flaky.group(2)):
                return web.json_response({"error": {"message": "flaky"}}, status=503)
            model = "user" if flaky.group(1) else "oracle"
        flaky_empty = re.fullmatch(r"user-flakyempty(\d+)", model)
        if flaky_empty:
            self._per_episode[(model, episode)] += 1
            if self._per_episode[(model, episode)] % (int(flaky_empty.group(1)) + 1):
                return web.json_response({"error": {"message": "flaky"}}, status=503)
            return web.json_response(_completion(model, content=""))
        malformed = re.fullmatch(r"(user-)?malformed(\d*):(\w+)", model)
        if malformed:
            self._per_episode[(model, episode)] += 1
            if not malformed.group(2) or self._per_episode[(model, episode)] <= int(malformed.group(2)):
                content_type, payload = MALFORMED_BODIES[malformed.group(3)]
                return web.Response(body=payload, headers={"Content-Type": content_type})
            model = "user" if malformed.group(1) else "oracle"
        if model == "raw":
            return raw_response(body.get("x_raw_reply") or {})
        if model in ("error500", "user-error500"):
            return web.json_response({"error": {"message": "scripted failure"}}, status=500)
        if model in ("hang", "user-hang"):
            task = asyncio.current_task()
            assert task is not None
            self._hangs.add(task)
            try:
                await asyncio.sleep(3600)
            finally:
                self._hangs.discard(task)
        if model == "user":
            return web.json_response(_completion(model, **scripted_user_reply(messages)))
        if model == "user-scenario":
            return web.json_response(_completion(model, **scenario_user_reply(messages)))
        if model == "user-empty":
            return web.json_response(_completion(model, content=""))
        if model in ("judge", "judge-deny"):
            return web.json_response(_completion(model, content=judge_reply(messages, model == "judge")))
        if model == "judge-prose":
            return web.json_response(_completion(model, content="The agent did fine overall."))
        return web.json_response(self._policy(model, request, messages, tool_names))

    def _policy(self, model: str, request: web.Request, messages: list[dict],
                tool_names: set[str]) -> dict[str, Any]:
        if model == "noop":
            return _completion(model, content=REFUSAL)
        if model == "badjson":
            return _completion(model, tool_calls=[{"name": next(iter(sorted(tool_names)), "x"),
                                                   "arguments": '{"user_id": '}])
        if model == "rawtoolcall":
            return _completion(model, content='<tool_call>\n{"name": "x", "arguments": {\n</tool_call>')
        if model == "empty":
            return _completion(model, content="")
        if model == "huge":
            return _completion(model, content="blah " * 5000, finish_reason="length")
        called = [c["function"]["name"] for m in messages if m.get("role") == "assistant"
                  for c in m.get("tool_calls") or []]
        if model == "unknowntool" and "no_such_tool" not in called:
            return _completion(model, tool_calls=[{"name": "no_such_tool", "arguments": {}}],
                               id_prefix=FAULT_ID)
        if model == "usertool" and "toggle_airplane_mode" not in called:
            return _completion(model, tool_calls=[{"name": "toggle_airplane_mode", "arguments": {}}],
                               id_prefix=FAULT_ID)
        misuse = model.partition(":")[2] if model.startswith("think:") else ""
        if model.startswith("think") and not (messages[-1].get("role") == "tool" and called
                                              and called[-1] == "think"):
            arguments = THINK_MISUSES[misuse] if misuse else {"thought": "Check the policy."}
            return _completion(model, tool_calls=[{"name": "think", "arguments": arguments}])
        task = _task_from_header(request)
        if task is None:
            return _completion(model, content=REFUSAL)
        return _completion(model, **oracle_reply(task, messages, tool_names))


class EndpointProcess:
    """Runs the endpoint in its own process on 127.0.0.1 (benchmarks: its CPU is not counted). `env`:
    that process's environment (e.g. another tau2 release in front, whose ground truth the oracle plays)."""

    def __init__(self, start_timeout_s: float = 120.0, env: dict[str, str] | None = None):
        self.start_timeout_s = start_timeout_s
        self.env = env
        self.port = 0
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> EndpointProcess:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "examples.tau2.cpu.scripted_endpoint", "--port", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env,
        )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"scripted endpoint did not start within {self.start_timeout_s:.0f} s")

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


class EndpointThread:
    """Runs a ScriptedEndpoint on 127.0.0.1 in a background thread (for tests)."""

    def __init__(self, port: int = 0):
        self.endpoint = ScriptedEndpoint()
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="scripted-endpoint")
        self.port = 0

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        # A short shutdown timeout: "hang" handlers never finish, and closing must not wait for them.
        runner = web.AppRunner(self.endpoint.app(), access_log=None, shutdown_timeout=1.0)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", self._port)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._runner = runner
        self._started.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def __enter__(self) -> EndpointThread:
        self._thread.start()
        if not self._started.wait(30):
            raise RuntimeError("scripted endpoint did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--domain-modules", nargs="+", default=[], metavar="MOD",
                        help="modules that register the domains of your own the oracle plays "
                             "(docs/own_domain.md)")
    args = parser.parse_args()
    from examples.tau2.runtime.process import setup_runtime

    setup_runtime()
    tau2_domain.load_modules(args.domain_modules)
    web.run_app(ScriptedEndpoint().app(), host=args.host, port=args.port, access_log=None,
                print=lambda *_: print(f"scripted endpoint on http://{args.host}:{args.port}/v1",
                                       flush=True))


if __name__ == "__main__":
    main()
