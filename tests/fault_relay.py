"""A loopback HTTP relay between an agent and AReaL's proxy that fails a chat completion on its way back.

Every request goes through to the proxy unchanged. For a chat completion, the relay first waits for the
proxy's whole answer (so the proxy has recorded the completion, as it would have before a network or
gateway failure between the two), then, if a fault is queued, hands the agent that fault instead:

  reset      the connection is dropped without an answer
  502        a bad-gateway error
  malformed  the first half of the proxy's JSON body

The agent never receives that completion; it asks again, and the proxy records a second one. Also here:
`SdkRetryAgent`, an agent whose retries are the OpenAI SDK's own.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import aiohttp
import httpx
from aiohttp import web
from openai import AsyncOpenAI

from examples.tau2.tau2_utils import EpisodeTurns

FAULTS = ("reset", "502", "malformed")


class FaultRelay:
    """The relay on 127.0.0.1 in a background thread, to `upstream` (the proxy's address). `faults` is
    consumed one per chat completion, in arrival order ('' passes one through); `faulted` lists the
    faults handed out."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults: list[str] = []
        self.faulted: list[str] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="fault-relay")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        async with aiohttp.ClientSession() as session, session.request(
                request.method, f"{self.upstream}{request.path_qs}", data=body, headers=headers,
                timeout=aiohttp.ClientTimeout(total=600)) as upstream:
            status, payload = upstream.status, await upstream.read()
            content_type = upstream.headers.get("Content-Type", "application/json")
        fault = self.faults.pop(0) if request.path.endswith("/chat/completions") and self.faults else ""
        if fault:
            self.faulted.append(fault)
        if fault == "reset":
            assert request.transport is not None
            request.transport.abort()  # the agent's connection closes with no answer at all
            raise asyncio.CancelledError
        if fault == "502":
            return web.Response(status=502, text="bad gateway")
        if fault == "malformed":
            return web.Response(status=200, body=payload[: len(payload) // 2],
                                content_type="application/json")
        return web.Response(status=status, body=payload, headers={"Content-Type": content_type})

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> FaultRelay:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the fault relay did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


class SdkRetryAgent:
    """A two-turn agent whose retries are the OpenAI SDK's (`max_retries`), reporting the completions it
    received (`TurnTakingAgent`); the reward is 1.0. Imported by AReaL's rollout worker by name."""

    async def run(self, data: dict[str, Any], **kwargs: Any) -> float:
        return (await self.run_turns(data, **kwargs)).reward

    async def run_turns(self, data: dict[str, Any], *, base_url: str, api_key: str,
                        http_client: httpx.AsyncClient | None = None) -> EpisodeTurns:
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=2)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Hello."}]
        ids = []
        for follow_up in ("Thanks.", None):
            completion = await client.chat.completions.create(model="default", messages=messages,  # type: ignore[arg-type]
                                                              max_completion_tokens=64)
            ids.append(completion.id)
            if follow_up:
                messages += [{"role": "assistant", "content": completion.choices[0].message.content or ""},
                             {"role": "user", "content": follow_up}]
        return EpisodeTurns(1.0, tuple(ids))
