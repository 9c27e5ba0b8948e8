"""AReaL 1.0.4's GRPO groups, changed so that a rejected episode drops only itself.

In AReaL 1.0.4 a group of `n_samples` episodes is `GroupedRolloutWorkflow`, an `asyncio.gather` over
`OpenAIProxyWorkflow.arun_episode` calls without `return_exceptions` (`areal/infra/remote_inf_engine.py`),
and the proxy workflow re-raises whatever the agent raised (`areal/experimental/openai/proxy/workflow.py`).
So one `EpisodeRejected` (a user simulator that stayed down, a timeout) fails the whole group: the
executor counts it rejected and the group's other episodes run to their end and are thrown away. With a
user simulator that fails 2 % of episodes, 15 % of groups of 8 are lost that way (5 %: 34 %).

Here instead:
- `DropRejectedProxyWorkflow` runs one episode as AReaL's inline proxy workflow does (grant capacity,
  session, agent, reward, export), except that an `EpisodeRejected` out of the agent ends the session,
  exports it (so that the proxy frees its recorded turns at once instead of after its session timeout)
  and returns None: the episode is not trained and records no reward. Any other exception is raised,
  as AReaL does.
- `PartialGroupWorkflow` runs the group's episodes to their end and keeps those that returned; it drops
  the group (returns None) only when fewer than `MIN_GROUP_EPISODES` remain, since one episode has no
  sibling to be compared with. An episode that raised anything else still fails the group.
- `PartialGroupInfEngine` is AReaL's `RemoteInfEngine` building those two instead of AReaL's, and
  `PartialGroupEngine` the mixin that puts it behind `RemoteSGLangEngine` / `RemotevLLMEngine`
  (the rollout engines of `training/served_prompt.py`, created in the rollout workers).

The episodes that remain keep their rewards; with `reward_baseline: group_mean` each is centered on the
mean of the episodes that finished (`episode.group_baseline`). Per group, `tau2/group/kept_episodes`,
`tau2/group/rejected_episodes` and `tau2/group/dropped` go to AReaL's stats tracker.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from areal.experimental.openai import OpenAIProxyWorkflow
from areal.experimental.openai.proxy.client_session import OpenAIProxyClient
from areal.infra import workflow_context
from areal.infra.remote_inf_engine import GroupedRolloutWorkflow
from areal.utils import stats_tracker
from areal.utils.perf_tracer import session_context

from examples.tau2.compat import require
from examples.tau2.tau2_utils import EpisodeRejected

logger = logging.getLogger("tau2_areal.groups")

MIN_GROUP_EPISODES = 2
"""A group with fewer remaining episodes is dropped: a single episode has nothing to be compared with."""


def _record(**values: float) -> None:
    """Scalars into AReaL's stats tracker (rollout/ or eval-rollout/); nothing outside a rollout."""
    try:
        stats_tracker.get(workflow_context.stat_scope()).scalar(**values)
    except Exception as e:  # not inside an AReaL rollout task
        logger.debug("stats not recorded: %s", e)


class DropRejectedProxyWorkflow(OpenAIProxyWorkflow):
    """AReaL's proxy workflow in inline mode; an episode the agent rejects returns None (not trained)."""

    def __init__(self, *args: Any, **kwargs: Any):
        require("areal", "1.0.4", "DropRejectedProxyWorkflow (examples/tau2/compat/areal_groups.py)")
        super().__init__(*args, **kwargs)
        if self.mode != "inline":
            raise ValueError(f"DropRejectedProxyWorkflow runs agents inline, not in {self.mode!r} mode")

    @session_context()
    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, Any] | None:
        http_session = await workflow_context.get_aiohttp_session()
        await self._grant_capacity(http_session)  # as AReaL: staleness is the controller's business
        proxy = OpenAIProxyClient(session=http_session, base_url=self.proxy_addr,
                                  task_id=str(workflow_context.get().task_id),
                                  admin_api_key=self._admin_api_key)
        rejected: EpisodeRejected | None = None
        async with proxy:  # ends the session on every way out
            try:
                reward = await self._run_agent(proxy.session_api_key, data)
            except EpisodeRejected as e:
                rejected = e
            else:
                if not isinstance(reward, float):
                    raise ValueError(f"the agent must return a float reward, got {type(reward).__name__}")
                await proxy.set_last_reward(reward)
        # Exporting also deletes the session on the proxy: a rejected episode's turns are freed now.
        interactions = await proxy.export_interactions(discount=self.discount, style=self.export_style)
        if rejected is not None:
            logger.info("episode dropped alone (%s); %d recorded turn(s) discarded", rejected.reason.value,
                        len(interactions))
            return None
        if interactions:
            _record(reward=interactions[next(reversed(interactions))].reward)
        return interactions


class PartialGroupWorkflow(GroupedRolloutWorkflow):
    """AReaL's group of `group_size` episodes, keeping every episode that returned (at least two)."""

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, Any] | None:
        # Every episode runs to its end; a failure other than a rejection fails the group afterwards.
        results = await asyncio.gather(
            *(self.workflow.arun_episode(engine, data) for _ in range(self.group_size)),
            return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        rejected = sum(r is None for r in results)
        kept = [r for r in results if r]  # an episode that made no policy call has no rows to train
        dropped = len(kept) < MIN_GROUP_EPISODES
        _record(**{"tau2/group/kept_episodes": float(len(kept)),
                   "tau2/group/rejected_episodes": float(rejected),
                   "tau2/group/dropped": float(dropped)})
        if dropped:
            logger.warning("group dropped: %d of %d episodes remain (fewer than %d)", len(kept),
                           self.group_size, MIN_GROUP_EPISODES)
            return None
        merged: dict[str, Any] = {}
        for result in kept:  # {completion_id: interaction}, as the proxy workflow exports them
            merged.update(result)
        return merged or None
