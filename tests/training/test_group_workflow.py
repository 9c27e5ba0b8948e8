"""training/group_workflow.py: a GRPO group runs every episode, is scored once, then every session ends.

In-process, with scripted episodes in place of AReaL's proxy sessions. The whole path (controller,
rollout worker, AReaL's proxy, tau2 episodes with a user simulator that is down for some of them) is in
tests/test_proxy_integration.py.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from typing import Any

import pytest
import torch
from areal.experimental.openai.proxy.client_session import OpenAIProxyClient
from areal.experimental.openai.proxy.server import deserialize_interactions
from areal.infra.rpc.serialization import serialize_value
from areal.utils import stats_tracker

from examples.tau2.tau2_utils import EpisodeRejected, GroupRules, RejectReason
from examples.tau2.training.group_workflow import (
    DropRejectedProxyWorkflow,
    PartialGroupWorkflow,
    StartedEpisode,
    keep_taken,
)
from tests.conftest import make_workflow

LOG = logging.getLogger("test")
ROWS_PER_EPISODE = 2
HANGS = object()
"""An episode still running when its group is cancelled."""


def rejected() -> EpisodeRejected:
    return EpisodeRejected(RejectReason.USER_ENDPOINT, "user simulator down")


class ScriptedEpisodes:
    """The two phases of `DropRejectedProxyWorkflow`, scripted: episode i ends in `outcomes[i]` (a raw
    reward, a rejection, an exception to raise, or HANGS) after `delay_s`; when its session ended and
    the reward it was finished with are recorded, and its rows carry that reward."""

    def __init__(self, outcomes: list[Any], rules: GroupRules | None = None, delay_s: float = 0.0):
        self.outcomes, self.rules, self.delay_s = list(outcomes), rules or GroupRules(), delay_s
        self.started = 0
        self.ended: dict[int, float] = {}
        """Episode -> when its phase 1 ended (loop time)."""
        self.finished: dict[int, float | None] = {}
        """Episode -> the reward it was finished with; every session ends through here or in phase 1."""
        self.closed: set[int] = set()
        self.agent_closed = 0

    async def close_agent(self) -> None:
        self.agent_closed += 1

    def group_rules(self) -> GroupRules:
        return self.rules

    async def start_episode(self, data: dict[str, Any]) -> StartedEpisode:
        index, self.started = self.started, self.started + 1
        outcome = self.outcomes[index]
        session = AsyncExitStack()
        session.callback(self.closed.add, index)
        fails = isinstance(outcome, BaseException) and not isinstance(outcome, EpisodeRejected)
        try:
            await asyncio.sleep(3600 if outcome is HANGS else 0.0 if fails else self.delay_s)
            self.ended[index] = asyncio.get_running_loop().time()
            if fails:
                raise outcome
        except BaseException:  # as the real phase 1: the episode's own session ends with it
            await session.aclose()
            raise
        proxy = OpenAIProxyClient(session=None, base_url="http://proxy.invalid",  # type: ignore[arg-type]
                                  task_id=str(index), admin_api_key="k")
        if isinstance(outcome, EpisodeRejected):
            return StartedEpisode(proxy, session, None, outcome)
        return StartedEpisode(proxy, session, outcome)

    async def finish_episode(self, episode: StartedEpisode, reward: float | None) -> dict[str, Any] | None:
        index = int(episode.proxy.task_id)
        self.finished[index] = reward
        await episode.session.aclose()
        if episode.rejection is not None:
            return None
        return {f"{index}.{turn}": (reward, turn) for turn in range(ROWS_PER_EPISODE)}


def rows_of(*trained: tuple[int, float]) -> dict[str, Any]:
    """The merged rows of episodes (index, training reward)."""
    return {f"{i}.{turn}": (reward, turn) for i, reward in trained for turn in range(ROWS_PER_EPISODE)}


def run_group(member: ScriptedEpisodes) -> tuple[dict[str, Any] | None, dict[str, float]]:
    """The group's rows and the group stats it recorded."""
    stats_tracker.get("rollout").export(reset=True)
    group = PartialGroupWorkflow(member, len(member.outcomes), LOG)  # type: ignore[arg-type]
    rows = asyncio.run(group.arun_episode(None, {}))
    stats = {k.removeprefix("rollout/"): v for k, v in stats_tracker.get("rollout").export(reset=True).items()
             if k.startswith("rollout/tau2/group/") and not k.endswith("__count")}
    return rows, stats


def test_a_rejected_episode_leaves_the_rest_of_its_group():
    member = ScriptedEpisodes([1.0, rejected(), 0.0, 1.0])
    rows, stats = run_group(member)
    assert rows == rows_of((0, 1.0), (2, 0.0), (3, 1.0))
    assert member.finished == {0: 1.0, 1: None, 2: 0.0, 3: 1.0}  # the rejected one is exported too
    assert member.closed == {0, 1, 2, 3} and member.agent_closed == 1
    assert stats == {"tau2/group/kept_episodes": 3.0, "tau2/group/rejected_episodes": 1.0,
                     "tau2/group/dropped": 0.0, "tau2/group/dropped_uniform": 0.0}


def test_group_mean_centers_on_the_finished_episodes():
    member = ScriptedEpisodes([1.0, rejected(), 0.0, rejected()], GroupRules(baseline="group_mean"))
    assert run_group(member)[0] == rows_of((0, 0.5), (2, -0.5))
    assert member.finished == {0: 0.5, 1: None, 2: -0.5, 3: None}


def test_a_group_with_fewer_than_two_remaining_episodes_is_dropped_and_every_session_freed():
    member = ScriptedEpisodes([rejected(), 1.0, rejected(), rejected()], GroupRules(baseline="group_mean"))
    rows, stats = run_group(member)
    assert rows is None
    assert member.finished == {0: None, 1: 0.0, 2: None, 3: None} and member.closed == {0, 1, 2, 3}
    assert stats == {"tau2/group/kept_episodes": 1.0, "tau2/group/rejected_episodes": 3.0,
                     "tau2/group/dropped": 1.0, "tau2/group/dropped_uniform": 0.0}
    assert run_group(ScriptedEpisodes([rejected(), 1.0, rejected(), 0.0]))[0] == rows_of((1, 1.0), (3, 0.0))


@pytest.mark.parametrize("reward", [0.0, 1.0])
def test_a_uniform_group_is_dropped_when_its_agent_asks(reward):
    member = ScriptedEpisodes([reward, rejected(), reward, reward], GroupRules(drop_uniform=True))
    rows, stats = run_group(member)
    assert rows is None and member.closed == {0, 1, 2, 3}
    assert stats["tau2/group/dropped_uniform"] == 1.0 and stats["tau2/group/dropped"] == 0.0
    assert run_group(ScriptedEpisodes([reward, reward]))[0] == rows_of((0, reward), (1, reward))  # off


def test_any_other_failure_still_fails_the_group_after_every_session_ends():
    member = ScriptedEpisodes([1.0, ValueError("a bug"), rejected(), 0.0], delay_s=0.2)

    async def go() -> float:
        with pytest.raises(ValueError, match="a bug"):
            await PartialGroupWorkflow(member, 4, LOG).arun_episode(None, {})  # type: ignore[arg-type]
        return asyncio.get_running_loop().time()

    returned = asyncio.run(go())
    assert len(member.ended) == 4 and returned >= max(member.ended.values())  # no sibling left running
    assert member.closed == {0, 1, 2, 3} and member.agent_closed == 1
    assert member.finished == {0: None, 2: None, 3: None}  # ended and exported, trained on nothing


def test_a_cancelled_group_ends_the_sessions_its_episodes_opened():
    member = ScriptedEpisodes([1.0, rejected(), HANGS])

    async def go() -> None:
        task = asyncio.ensure_future(PartialGroupWorkflow(member, 3, LOG).arun_episode(None, {}))  # type: ignore[arg-type]
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert member.finished == {0: None, 1: None} and member.closed == {0, 1, 2} and member.agent_closed == 1


def test_the_proxy_workflow_takes_its_agent_s_rules(endpoint):
    def proxy_workflow(agent: Any) -> DropRejectedProxyWorkflow:
        return DropRejectedProxyWorkflow(mode="inline", agent=agent, proxy_addr="http://127.0.0.1:1")

    centered = make_workflow(endpoint, reward_baseline="group_mean")
    assert proxy_workflow(centered).group_rules() == GroupRules(baseline="group_mean", drop_uniform=True)
    raw = make_workflow(endpoint, drop_uniform_groups=False)
    assert proxy_workflow(raw).group_rules() == GroupRules()

    class RulelessAgent:
        async def run(self, data: dict[str, Any], **extra: Any) -> float:
            return 1.0

    assert proxy_workflow(RulelessAgent()).group_rules() == GroupRules()
    asyncio.run(proxy_workflow(RulelessAgent()).close_agent())  # nothing of its own to close
    with pytest.raises(ValueError, match="runs agents inline, not in 'subproc' mode"):
        DropRejectedProxyWorkflow(mode="subproc", agent=RulelessAgent())


def test_a_group_closes_its_agent_s_own_http_pool(endpoint):
    """AReaL makes an agent per submitted group: the pool it opened for its episodes' requests must close
    with the group, or each group leaves one open (aiohttp's "Unclosed client session")."""
    agent = make_workflow(endpoint)

    async def go() -> Any:
        client = agent._own_client()
        group = DropRejectedProxyWorkflow(mode="inline", agent=agent, proxy_addr="http://127.0.0.1:1")
        await group.close_agent()
        return client

    assert asyncio.run(go()).is_closed


def exported(*ids: str, reward: float = 1.0) -> dict[str, Any]:
    """Rows as AReaL's proxy exports a session (`/export_trajectories`, deserialized): every completion it
    recorded, in order, each with its tensors and the reward its discount chain gave it."""
    payload = {cid: {"tensor_dict": {"input_ids": torch.tensor([[i, i + 1]]),
                                     "rewards": torch.tensor([reward])},
                     "reward": reward, "interaction_id": cid} for i, cid in enumerate(ids)}
    return deserialize_interactions(serialize_value(payload))


def test_rows_are_the_turns_taken_with_the_discount_chained_over_them_alone():
    """The proxy recorded an orphan (`a0`: its client timed out and asked again, `a1`): it is no row, and
    the two turns taken chain the reward as if it had never been (AReaL 1.0.4: 0.25, 0.5, 1.0)."""
    split = keep_taken(exported("a0", "a1", "b"), ["a1", "b"], reward=1.0, discount=0.5)
    assert list(split.rows) == ["a1", "b"] and split.not_taken == ("a0",) and split.missing == ()
    assert [row.reward for row in split.rows.values()] == [0.5, 1.0]
    assert [row.to_tensor_dict()["rewards"].tolist() for row in split.rows.values()] == [[0.5], [1.0]]
    assert split.rows["a1"].to_tensor_dict()["input_ids"].tolist() == [[1, 2]]  # the row's own tokens


def test_a_turn_without_a_row_is_missing_and_no_reward_leaves_the_export_as_it_was():
    split = keep_taken(exported("a", "b", reward=0.3), ["a", "x", "b"], reward=None, discount=0.5)
    assert list(split.rows) == ["a", "b"] and split.missing == ("x",) and split.not_taken == ()
    assert [row.reward for row in split.rows.values()] == [0.3, 0.3]
