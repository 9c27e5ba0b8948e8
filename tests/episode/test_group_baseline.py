"""Group-relative rewards: the arithmetic, rejected and cancelled episodes, the workflow over real HTTP."""

from __future__ import annotations

import asyncio
import gc

import httpx
import pytest

from examples.tau2 import tau2_agent
from examples.tau2.episode.group_baseline import GroupBaseline
from examples.tau2.tau2_utils import EpisodeRejected, RejectReason, Tau2EnvConfig
from tests.conftest import make_workflow


def _center_all(baseline: GroupBaseline, reports: list[tuple[object, float | None]]) -> list[float | None]:
    async def go() -> list[float | None]:
        return list(await asyncio.gather(*[baseline.center(k, r) for k, r in reports]))

    return asyncio.run(go())


def test_each_episode_gets_its_reward_minus_its_own_groups_mean():
    baseline = GroupBaseline(group_size=3)
    # Two groups interleaved, as concurrent groups of a step arrive.
    out = _center_all(baseline, [("a", 1.0), ("b", 0.0), ("a", 0.0), ("b", 0.0), ("a", 0.5), ("b", 0.3)])
    assert out == pytest.approx([0.5, -0.1, -0.5, -0.1, 0.0, 0.2])
    assert baseline.pending == 0


def test_a_uniform_group_contributes_nothing():
    assert _center_all(GroupBaseline(4), [("g", 1.0)] * 4) == [0.0] * 4
    assert _center_all(GroupBaseline(4), [("g", -0.1)] * 4) == pytest.approx([0.0] * 4)


def test_rejected_episodes_are_left_out_of_the_mean():
    out = _center_all(GroupBaseline(4), [("g", 1.0), ("g", None), ("g", 0.0), ("g", None)])
    assert out == [0.5, None, -0.5, None]
    assert _center_all(GroupBaseline(2), [("g", None), ("g", None)]) == [None, None]


def test_an_episode_waits_for_its_group_and_a_cancelled_waiter_does_not_strand_its_siblings():
    async def go() -> None:
        baseline = GroupBaseline(2)
        group = object()
        waiting = asyncio.ensure_future(baseline.center(group, 1.0))
        await asyncio.sleep(0.05)
        assert not waiting.done() and baseline.pending == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # The cancelled episode had reported its reward: the sibling that reports next is not left waiting.
        assert await asyncio.wait_for(baseline.center(group, 0.0), 30) == -0.5
        assert baseline.pending == 0

    asyncio.run(go())


def test_an_episode_that_leaves_settles_its_group():
    async def go() -> list[float | None]:
        baseline = GroupBaseline(3)
        group = object()
        waiters = [asyncio.ensure_future(baseline.center(group, r)) for r in (1.0, 0.0)]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiters)
        baseline.leave(group)  # synchronous: usable from an `except BaseException` of a cancelled task
        out = await asyncio.wait_for(asyncio.gather(*waiters), 30)
        assert baseline.pending == 0
        return out

    assert asyncio.run(go()) == [0.5, -0.5]


def test_groups_are_named_by_the_object_and_an_open_group_keeps_it_alive():
    """AReaL's rows are plain dicts: two equal rows are two groups, and an open group holds its row, so
    that no new row can take over its `id` while the group waits."""
    async def go() -> None:
        baseline = GroupBaseline(2)
        first, second = {"task_id": "7"}, {"task_id": "7"}
        a = asyncio.ensure_future(baseline.center(first, 1.0))
        b = asyncio.ensure_future(baseline.center(second, 0.0))
        await asyncio.sleep(0.05)
        assert baseline.pending == 2 and not a.done() and not b.done()
        first_id = id(first)
        del first
        gc.collect()
        (owner,) = [g.owner for g in baseline._groups.values() if id(g.owner) == first_id]
        baseline.leave(owner)
        baseline.leave(second)
        assert await asyncio.wait_for(asyncio.gather(a, b), 30) == [0.0, 0.0]
        assert baseline.pending == 0

    asyncio.run(go())


def test_group_size_and_baseline_are_validated():
    assert GroupBaseline(1).group_size == 1
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        GroupBaseline(0)
    assert "reward_baseline 'mean' is not one of none, group_mean" in Tau2EnvConfig(
        user_base_url="u", user_model="m", reward_baseline="mean").validate()
    assert any("at least 2 episodes" in e for e in Tau2EnvConfig(
        user_base_url="u", user_model="m", reward_baseline="group_mean", group_size=1).validate())


def test_workflow_run_centers_a_group_through_real_http(endpoint, closed_port):
    """Four concurrent `run(data)` calls with one `data` object, as AReaL runs a group: two oracle episodes
    (reward 1) and two whose policy endpoint refuses connections (rejected). The rejected ones raise and
    are left out; the others get 1 - mean(1, 1) = 0, and nothing is left waiting."""
    wf = make_workflow(endpoint, "oracle", reward_baseline="group_mean", group_size=4, llm_retries=0)
    data = {"domain": "airline", "task_id": "7"}
    dead = f"http://127.0.0.1:{closed_port}/v1"

    async def go() -> list[object]:
        async with httpx.AsyncClient() as client:
            calls = [wf.run(data, base_url=url, api_key="k", http_client=client)
                     for url in (endpoint.url, dead, endpoint.url, dead)]
            out = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 120)
        await wf.aclose()
        return out

    out = asyncio.run(go())
    assert out[0] == 0.0 and out[2] == 0.0
    for rejected in (out[1], out[3]):
        assert isinstance(rejected, EpisodeRejected) and rejected.reason is RejectReason.POLICY_ENDPOINT
    assert wf._baseline is not None and wf._baseline.pending == 0


VICTIM_URL = "http://victim.invalid/v1"
"""The base_url the failing episode of a group is called with (the injected failures key on it)."""


@pytest.mark.parametrize("way", ["rejected", "dump_failed", "no_base_url", "policy_seed", "exception",
                                 "cancelled"])
def test_every_way_an_episode_ends_settles_its_group(endpoint, closed_port, monkeypatch, tmp_path, way):
    """A group of 4 with `group_mean`: three oracle episodes (reward 1) and one that ends in `way` —
    rejected (its policy endpoint refuses connections), its dump write failing, no base_url (ValueError),
    the `policy_seed` check raising for its row, an unexpected exception, or cancelled mid-episode.
    The three finish without waiting for the fourth (the timeout is generous; a stranded episode would
    wait forever), and nothing is left open."""
    monkeypatch.setattr(tau2_agent, "_log_stats", lambda values: None)  # importing AReaL takes ~15 s
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    wf = make_workflow(endpoint, "oracle@50", reward_baseline="group_mean", group_size=4, llm_retries=0,
                       policy_seed=way == "policy_seed",
                       dump_dir=str(tmp_path / "dumps") if way == "dump_failed" else "")
    data = {"domain": "airline", "task_id": "7", "seed": 0}
    victim_url = {"rejected": f"http://127.0.0.1:{closed_port}/v1", "no_base_url": "",
                  "dump_failed": endpoint.url, "cancelled": endpoint.url}.get(way, VICTIM_URL)
    real_run_episode, real_dump = wf.run_episode, tau2_agent.write_episode_dump

    async def run_episode(row, *, base_url, **kw):
        if base_url != VICTIM_URL:
            return await real_run_episode(row, base_url=base_url, **kw)
        if way == "policy_seed":  # the real check, on a row without the seed policy_seed needs
            return await real_run_episode({k: v for k, v in row.items() if k != "seed"},
                                          base_url=endpoint.url, **kw)
        raise RuntimeError("injected failure")

    dumps: list[str] = []

    def dump_failing_once(dump_dir, result):
        dumps.append(result.task_id)
        if len(dumps) == 1:
            raise PermissionError(13, "Permission denied", dump_dir)
        return real_dump(dump_dir, result)

    monkeypatch.setattr(wf, "run_episode", run_episode)
    monkeypatch.setattr(tau2_agent, "write_episode_dump", dump_failing_once)

    async def go() -> tuple[list[object], BaseException | float]:
        async with httpx.AsyncClient() as client:
            victim = asyncio.ensure_future(wf.run(data, base_url=victim_url, api_key="k", http_client=client))
            siblings = [asyncio.ensure_future(wf.run(data, base_url=endpoint.url, api_key="k",
                                                     http_client=client)) for _ in range(3)]
            if way == "cancelled":
                await asyncio.sleep(0.3)  # mid-episode: an airline/7 oracle episode at 50 ms a reply
                victim.cancel()
            out = await asyncio.wait_for(asyncio.gather(*siblings, return_exceptions=True), 120)
            try:
                victim_out: BaseException | float = await asyncio.wait_for(victim, 120)
            except BaseException as e:  # noqa: BLE001 -- the victim's way out is what is checked
                victim_out = e
        await wf.aclose()
        return out, victim_out

    siblings, victim = asyncio.run(go())
    assert siblings == [0.0, 0.0, 0.0]  # 1 - mean of the rewards that were reported (all 1)
    expected: dict[str, type[BaseException] | float] = {
        "rejected": EpisodeRejected, "no_base_url": ValueError, "policy_seed": ValueError,
        "exception": RuntimeError, "cancelled": asyncio.CancelledError, "dump_failed": 0.0}
    if isinstance(expected[way], float):
        assert victim == expected[way]  # a failed dump keeps the episode: scored like its siblings
        assert len(dumps) == 4 and len(list((tmp_path / "dumps").rglob("*.json"))) == 3
    else:
        assert isinstance(victim, expected[way]), repr(victim)
    if way == "policy_seed":
        assert "policy_seed is set" in str(victim)
    assert wf._baseline is not None and wf._baseline.pending == 0
