"""Group-relative rewards: each episode's reward minus the mean reward of its GRPO group.

Why here and not in AReaL's advantage normalisation: with `export_style: individual` an episode
becomes as many training rows as it has policy turns, so AReaL's group-level normalisation (fixed
`group_size` contiguous rows) cannot find the groups, and the configs normalise over the whole batch.
Batch-level centering compares episodes of *different tasks*: in a batch holding one task the policy
always solves (say, by answering in plain text) and two it always fails, every row of the solved task
gets a positive advantage and every row of the failed ones a negative one, although no group held a
better and a worse episode of the same task. Measured on the CPU learning run (docs/learn/README.md):
the policy drifts toward what the easy task rewards. Centering each episode's reward on its own
group's mean first makes a uniform group contribute nothing and leaves only within-task comparisons,
as GRPO intends; AReaL's batch normalisation then only rescales.

AReaL 1.0.4 runs a group as `n_samples` concurrent calls of the agent's `run(data)` with the same
`data` object (`GroupedRolloutWorkflow.arun_episode` -> `OpenAIProxyWorkflow._run_agent`, inline
mode), so the object's identity names the group while it runs. Each episode waits for the others of
its group before returning. An episode that ends without a reward (rejected, failed, cancelled)
reports itself absent (`leave`), so that its siblings never wait for it; it is left out of the mean.

What is then trained: the rollout engines build groups from `compat/areal_groups.py`, so a rejected
episode drops only itself and the group's other episodes are trained with the mean computed here over
the episodes that finished; the group is dropped when fewer than 2 remain. (AReaL 1.0.4's own group
gathers its episodes without `return_exceptions`, so there one rejection fails the whole group.)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import overload


@dataclass
class _Group:
    owner: object
    """The object that names the group; held so that its `id` cannot be reused while the group is open."""
    rewards: list[float | None] = field(default_factory=list)
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    mean: float = 0.0


class GroupBaseline:
    """Collects the rewards of each group of `group_size` episodes and centers them on the group mean.

    One instance per workflow object; it must live in a single event loop (AReaL's rollout loop).
    Every episode must report exactly once: `center` with its reward, or `leave` when it has none.
    """

    def __init__(self, group_size: int):
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.group_size = group_size
        self._groups: dict[int, _Group] = {}

    @property
    def pending(self) -> int:
        """Groups still waiting for some of their episodes."""
        return len(self._groups)

    def _report(self, owner: object, reward: float | None) -> _Group:
        group = self._groups.get(id(owner))
        if group is None:
            group = self._groups[id(owner)] = _Group(owner)
        group.rewards.append(reward)
        if len(group.rewards) >= self.group_size:
            del self._groups[id(owner)]
            valid = [r for r in group.rewards if r is not None]
            group.mean = sum(valid) / len(valid) if valid else 0.0
            group.settled.set()
        return group

    def leave(self, owner: object) -> None:
        """Report an episode of `owner`'s group that ends without a reward (rejected, failed, cancelled):
        it is left out of the mean, and the group settles without waiting for it. Never blocks."""
        self._report(owner, None)

    @overload
    async def center(self, owner: object, reward: float) -> float: ...

    @overload
    async def center(self, owner: object, reward: None) -> None: ...

    async def center(self, owner: object, reward: float | None) -> float | None:
        """`reward` minus its group's mean, once every episode of the group has reported.

        `owner` is the object every episode of the group shares (AReaL's `data` row). `reward=None`
        reports a rejected episode: it is left out of the mean and gets None back. A group whose
        episodes were all rejected has mean 0. An episode cancelled while it waits has reported its
        reward already; the group still settles when the others report.
        """
        group = self._report(owner, reward)
        await group.settled.wait()
        return None if reward is None else reward - group.mean
