"""A GRPO group through AReaL 1.0.4's proxy: run every episode, score the group once, then export.

AReaL's `GroupedRolloutWorkflow` fails the whole group on one rejected episode, and each episode hands its
reward to the proxy alone. Here `start_episode` runs an episode up to its raw reward (or rejection), leaving
the session open; `PartialGroupWorkflow` scores the group (`tau2_utils.score_group`), then `finish_episode`
sets each training reward and ends and exports the session.

The rows are the turns the episode took. AReaL's proxy records every completion it serves, also one whose
client gave up (a timeout, a reset connection, a 5xx or a malformed body on the way back) and asked again,
and 1.0.4 exports each as a row and a link of the reward's discount chain. An agent that says which
completions it received (`TurnTakingAgent`: `Tau2AgentWorkflow.run_turns`) trains on those alone
(`keep_taken`), their rewards chained over them alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from areal.experimental.openai import OpenAIProxyWorkflow
from areal.experimental.openai.proxy.client_session import OpenAIProxyClient
from areal.infra import workflow_context
from areal.infra.remote_inf_engine import GroupedRolloutWorkflow
from areal.utils.perf_tracer import session_context

from examples.tau2.runtime.process import record_stats
from examples.tau2.tau2_utils import (
    MIN_GROUP_EPISODES,
    DropReason,
    EpisodeRejected,
    EpisodeTurns,
    GroupRules,
    score_group,
    turn_rewards,
)

logger = logging.getLogger("tau2_areal.groups")

Rows = dict[str, Any]
"""{completion_id: interaction}, as the proxy exports a session."""
ROWS_RECORD_ENV = "TAU2_RECORD_ROWS"
"""A folder: each kept group's rows are appended to `rows-<pid>.jsonl` there (`record_group`), for the smoke
run's checks (`cpu/async_checks.py`)."""


@runtime_checkable
class RuledAgent(Protocol):
    """An agent that says how its groups are scored (`Tau2AgentWorkflow`)."""

    def group_rules(self) -> GroupRules: ...


@runtime_checkable
class TurnTakingAgent(Protocol):
    """An agent that says which of its session's completions it received (`Tau2AgentWorkflow`)."""

    async def run_turns(self, data: dict[str, Any], *, base_url: str, api_key: str,
                        http_client: Any = None) -> EpisodeTurns: ...


@runtime_checkable
class ClosingAgent(Protocol):
    """An agent with connections of its own to close (`Tau2AgentWorkflow`'s HTTP pools): AReaL makes one agent
    a submitted group, so its group closes it when it ends."""

    async def aclose(self) -> None: ...


@dataclass
class StartedEpisode:
    """An episode after phase 1: its agent returned a raw reward or rejected it; its session is open."""

    proxy: OpenAIProxyClient
    session: AsyncExitStack  # closing it ends the proxy session
    reward: float | None  # the agent's raw reward; None: rejected
    rejection: EpisodeRejected | None = None
    turns: EpisodeTurns | None = None
    """What a `TurnTakingAgent` says of its episode: the completions it received, in order; None (another
    agent, or a rejection): every completion of the session is a row, as in AReaL."""

    @property
    def taken(self) -> tuple[str, ...] | None:
        return self.turns.completion_ids if self.turns is not None else None


def row_digest(input_ids: Sequence[int]) -> str:
    """A row's identity across processes: a digest of its token ids (prompt and output)."""
    return hashlib.blake2b(json.dumps([int(t) for t in input_ids]).encode(), digest_size=12).hexdigest()


def record_group(episodes: Sequence[tuple[StartedEpisode, Rows | None]], kept: bool) -> None:
    """With `ROWS_RECORD_ENV` set, one line for a scored group (`kept`: handed on to train): per episode, why
    it was rejected, the turns it took, its failed policy requests and its rows (completion id,
    `row_digest`, the oldest and newest version of its generated tokens)."""
    folder = os.environ.get(ROWS_RECORD_ENV)
    if not folder:
        return
    described = []
    for episode, rows in episodes:
        turns = episode.turns
        described.append({"rejected": episode.rejection.reason.value if episode.rejection else None,
                          "taken": list(turns.completion_ids) if turns else [],
                          "policy_failed_attempts": turns.policy_failed_attempts if turns else 0, "rows": []})
        for cid, row in (rows or {}).items():
            tensors = row.to_tensor_dict()
            versions = tensors["versions"][0][tensors["loss_mask"][0].bool()]
            described[-1]["rows"].append([cid, row_digest(tensors["input_ids"][0].tolist()),
                                          int(versions.min()), int(versions.max())])
    path = Path(folder) / f"rows-{os.getpid()}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"group": workflow_context.get().task_id, "kept": kept, "time": time.time(),
                            "episodes": described}) + "\n")


@dataclass(frozen=True)
class TakenRows:
    """An episode's exported rows split by the turns it took (`keep_taken`)."""

    rows: Rows
    """The rows of the turns taken, in the session's order."""
    not_taken: tuple[str, ...]
    """Completions the proxy recorded that the episode never received (their client gave up): dropped."""
    missing: tuple[str, ...]
    """Turns the episode took that the proxy did not export: the episode cannot be trained as it ran."""


def keep_taken(rows: Rows, taken: Sequence[str], reward: float | None, discount: float) -> TakenRows:
    """The rows of the turns `taken`, each carrying its reward in the chain over those turns alone
    (`tau2_utils.turn_rewards`; `reward` None: the rewards stay as exported)."""
    wanted = set(taken)
    kept = {cid: row for cid, row in rows.items() if cid in wanted}
    if reward is not None:
        for row, value in zip(kept.values(), turn_rewards(len(kept), reward, discount), strict=True):
            row.reward = value
            row.to_tensor_dict()["rewards"] = torch.tensor([value])  # the exported row's tensors
    return TakenRows(kept, tuple(cid for cid in rows if cid not in wanted),
                     tuple(cid for cid in taken if cid not in rows))


class DropRejectedProxyWorkflow(OpenAIProxyWorkflow):
    """AReaL's proxy workflow in inline mode, in two phases; a rejected episode returns None."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.mode != "inline":
            raise ValueError(f"DropRejectedProxyWorkflow runs agents inline, not in {self.mode!r} mode")

    def group_rules(self) -> GroupRules:
        """The agent's rules for its groups; defaults (raw rewards, no uniform drop) when it has none."""
        return self.agent.group_rules() if isinstance(self.agent, RuledAgent) else GroupRules()

    @session_context()
    async def start_episode(self, data: dict[str, Any]) -> StartedEpisode:
        """Phase 1: run the agent. Any exception but a rejection ends the session and is raised."""
        http_session = await workflow_context.get_aiohttp_session()
        await self._grant_capacity(http_session)  # as AReaL: staleness is the controller's business
        proxy = OpenAIProxyClient(session=http_session, base_url=self.proxy_addr,
                                  task_id=str(workflow_context.get().task_id),
                                  admin_api_key=self._admin_api_key)
        session = AsyncExitStack()
        await session.enter_async_context(proxy)
        turns: EpisodeTurns | None = None
        try:
            if isinstance(self.agent, TurnTakingAgent):  # inline mode, as AReaL's `_run_agent` calls `run`
                # Not AReaL's shared httpx client: the agent's own aiohttp pool costs a twentieth of the CPU
                # a request (bench/RESULTS.md "Episodes in flight").
                turns = await self.agent.run_turns(data, base_url=self.proxy_addr,
                                                   api_key=proxy.session_api_key)
                reward = turns.reward
            else:
                reward = await self._run_agent(proxy.session_api_key, data)
            if not isinstance(reward, float):
                raise ValueError(f"the agent must return a float reward, got {type(reward).__name__}")
        except EpisodeRejected as e:
            return StartedEpisode(proxy, session, None, e)
        except BaseException:
            await session.aclose()
            raise
        return StartedEpisode(proxy, session, reward, turns=turns)

    async def finish_episode(self, episode: StartedEpisode, reward: float | None) -> Rows | None:
        """Phase 2: `reward` (None: none) to the last completion, then end and export the session.
        Returns the rows, or None for a rejected episode."""
        async with episode.session:
            if reward is not None and episode.taken is None:
                await episode.proxy.set_last_reward(reward)
            elif reward is not None and episode.taken:  # its last turn, which may not be the last recorded
                await episode.proxy.set_reward(episode.taken[-1], reward)
        # Exporting also deletes the session on the proxy: a discarded episode's turns are freed now.
        rows = await episode.proxy.export_interactions(discount=self.discount, style=self.export_style)
        if episode.rejection is not None:
            logger.info("episode dropped alone (%s); %d recorded turn(s) discarded",
                        episode.rejection.reason.value, len(rows))
            return None
        if episode.taken is not None:
            split = keep_taken(rows, episode.taken, reward, self.discount)
            record_stats({"rows/not_taken": float(len(split.not_taken)),
                          "rows/missing": float(len(split.missing))})
            if split.not_taken:
                logger.info("%d recorded completion(s) the episode never received (its client gave up and "
                            "asked again) are not trained", len(split.not_taken))
            if split.missing:
                logger.warning("episode dropped: %d of its %d turn(s) have no row in the proxy's export",
                               len(split.missing), len(episode.taken))
                return None
            rows = split.rows
        if rows and reward is not None:
            record_stats({"reward": rows[next(reversed(rows))].reward}, prefix="")
        return rows

    async def close_agent(self) -> None:
        """Close the agent's own connections; else each submitted group would leave a pool open."""
        if isinstance(self.agent, ClosingAgent):
            await self.agent.aclose()

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> Rows | None:
        """A group of one: trained on its raw reward."""
        try:
            episode = await self.start_episode(data)
            rows = await self.finish_episode(episode, episode.reward)
        finally:
            await self.close_agent()
        record_group([(episode, rows)], kept=bool(rows))
        return rows


class PartialGroupWorkflow(GroupedRolloutWorkflow):
    """AReaL's group of `group_size` episodes, scored as a whole by `tau2_utils.score_group`."""

    workflow: DropRejectedProxyWorkflow

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> Rows | None:
        try:
            return await self._run_group(data)
        finally:
            await self.workflow.close_agent()

    async def _run_group(self, data: dict[str, Any]) -> Rows | None:
        starts = [asyncio.ensure_future(self.workflow.start_episode(data)) for _ in range(self.group_size)]
        try:
            results = await asyncio.gather(*starts, return_exceptions=True)
        except BaseException:  # cancelled: the episodes that had started must not keep their sessions
            await self._discard([t.result() for t in starts
                                 if t.done() and not t.cancelled() and t.exception() is None])
            raise
        episodes = [r for r in results if isinstance(r, StartedEpisode)]
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            await self._discard(episodes)
            raise failure
        rules = self.workflow.group_rules()
        outcome = score_group([e.reward for e in episodes], rules)
        record_stats(outcome.stats(), prefix="")
        ends = await asyncio.gather(*(self.workflow.finish_episode(e, r)
                                      for e, r in zip(episodes, outcome.rewards, strict=True)),
                                    return_exceptions=True)
        failure = next((end for end in ends if isinstance(end, BaseException)), None)
        if failure is not None:  # raised once every other session has ended
            raise failure
        rows = [end if isinstance(end, dict) else None for end in ends]  # None: rejected, or dropped alone
        merged = {k: row for end in rows if end for k, row in end.items()}
        record_group(list(zip(episodes, rows, strict=True)), kept=outcome.dropped is None and bool(merged))
        if outcome.dropped is DropReason.TOO_FEW:
            logger.warning("group dropped: %d of %d episodes remain (fewer than %d)", outcome.kept,
                           self.group_size, MIN_GROUP_EPISODES)
        if outcome.dropped is not None:  # uniform groups are common (all failed): not worth a warning
            return None
        return merged or None

    async def _discard(self, episodes: Sequence[StartedEpisode]) -> None:
        """End and export the sessions of episodes that will not train (errors only logged)."""
        ends = await asyncio.gather(*(self.workflow.finish_episode(e, None) for e in episodes),
                                    return_exceptions=True)
        for end in ends:
            if isinstance(end, BaseException):
                logger.warning("a discarded episode's proxy session did not end cleanly: %s", end)
