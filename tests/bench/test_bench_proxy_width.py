"""bench/bench_proxy_width.py's audit of recorded groups; the scripted server's load-dependent latency."""

from __future__ import annotations

import asyncio

import aiohttp

from bench.bench_proxy_width import audit
from bench.scripted_sglang import ScriptedSGLang


def episode(taken: list[str], rows: list[str], rejected: str | None = None) -> dict:
    return {"rejected": rejected, "taken": taken, "policy_failed_attempts": 0,
            "rows": [[cid, "digest", 0, 0] for cid in rows]}


def test_each_episode_is_scored_rejected_or_lost_and_a_second_row_of_an_id_is_a_duplicate():
    groups = [{"episodes": [episode(["a", "b"], ["a", "b"]),           # scored: its rows are its turns
                            episode([], [], rejected="user_endpoint"),  # rejected, nothing trained
                            episode(["c", "d"], ["c"])]},               # a turn without its row: lost
              {"episodes": [episode(["e"], ["e", "a"]),                 # a row it never took, and "a" again
                            episode([], ["f"], rejected="policy_endpoint")]}]  # rejected yet trained: lost
    assert audit(groups) == {"scored": 1, "rejected": 2, "lost": 3, "rows": 6, "duplicated_ids": 1}


def test_a_generation_waits_longer_the_more_are_in_flight():
    """5 at once at 0.1 s + 0.05 s per other in flight: the last to arrive waits 0.3 s."""
    with ScriptedSGLang(delay_s=0.1, delay_per_in_flight_s=0.05) as server:
        async def five() -> None:
            async with aiohttp.ClientSession() as session:
                async def one() -> None:
                    body = {"input_ids": server.reply_ids("Hello.")}
                    async with session.post(f"http://127.0.0.1:{server.port}/generate", json=body) as r:
                        assert r.status == 200
                await asyncio.gather(*(one() for _ in range(5)))

        asyncio.run(five())
    # All five overlapped, so the k-th to arrive found k - 1 in flight (a sleep never ends early).
    assert server.max_in_flight == 5 and server.in_flight == 0
    waits = sorted(server.served_s)
    assert all(w >= 0.1 + 0.05 * k for k, w in enumerate(waits)), waits
