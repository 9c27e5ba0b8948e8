"""Group-relative rewards: the arithmetic, rejected and cancelled episodes, the workflow over real HTTP."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from examples.tau2.tau2_group_baseline import GroupBaseline
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


def test_an_episode_waits_for_its_group_and_a_cancelled_group_is_forgotten():
    async def go() -> None:
        baseline = GroupBaseline(2)
        waiting = asyncio.ensure_future(baseline.center("g", 1.0))
        await asyncio.sleep(0.05)
        assert not waiting.done() and baseline.pending == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
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
