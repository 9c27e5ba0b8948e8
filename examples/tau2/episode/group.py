"""One GRPO group's finished episodes become training rewards: `score_group`, a pure function.

The group workflow (`training/group_workflow.py`) runs a group's `n_samples` episodes of one task to
their end, then calls `score_group` once with each episode's raw reward (None: rejected) and the
rules its agent asks for (`Tau2AgentWorkflow.group_rules`). In order:

1. Minimum size: fewer than `min_episodes` finished episodes drop the group (`too_few`); a single
   episode has no sibling to be compared with. A rejected episode drops only itself.
2. Baseline: `group_mean` subtracts the mean raw reward of the finished episodes. With
   `export_style: individual` an episode is as many rows as it has policy turns, so AReaL cannot
   normalise per group and the configs normalise over the batch, which compares episodes of different
   tasks: a task the policy always solves pushes all its rows up and a task it always fails pushes
   them down, with no better and worse episode of one task in between (measured in docs/learn: the
   policy drifts toward what the easy task rewards). Centering on the group first leaves only
   within-task comparisons, as GRPO intends; AReaL's batch normalisation then only rescales.
3. Uniform groups: with `drop_uniform`, a group whose finished episodes all train on one reward
   (within `UNIFORM_TOLERANCE`) is dropped (`uniform`): it would teach nothing under a group baseline
   and only noise under a batch one. This is decided per episode; the proxy then gives an episode's
   earlier rows its reward times `turn_discount**k`. With `turn_discount: 1` (every shipped config)
   that equals deciding on the rows. With a smaller discount and baseline `none`, a group whose
   episodes all scored 1 is dropped here, where a filter on rows (1, d, d², ...) would keep it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from examples.tau2.tau2_utils import RewardBaseline

MIN_GROUP_EPISODES = 2
UNIFORM_TOLERANCE = 1e-6


@dataclass(frozen=True)
class GroupRules:
    """How a group's episodes become training rewards. The defaults keep raw rewards and every group
    of at least two episodes (what evaluation and agents without rules get)."""

    min_episodes: int = MIN_GROUP_EPISODES
    baseline: RewardBaseline = RewardBaseline.none
    drop_uniform: bool = False

    def __post_init__(self) -> None:
        if self.min_episodes < 1:
            raise ValueError(f"min_episodes must be >= 1, got {self.min_episodes}")
        if problem := RewardBaseline.problem("baseline", self.baseline):
            raise ValueError(problem)


class DropReason(enum.StrEnum):
    """Why nothing of a group is trained."""

    TOO_FEW = "too_few"
    """Fewer than `min_episodes` episodes finished."""
    UNIFORM = "uniform"
    """Every finished episode trains on the same reward."""


@dataclass(frozen=True)
class GroupOutcome:
    """What a group trains on."""

    rewards: tuple[float | None, ...]
    """Per episode, in order: the reward its rows carry (None: rejected). Set also in a dropped group,
    whose episodes still hand it to the proxy before their sessions are freed."""
    dropped: DropReason | None = None

    @property
    def kept(self) -> int:
        return sum(r is not None for r in self.rewards)

    @property
    def rejected(self) -> int:
        return sum(r is None for r in self.rewards)

    def stats(self) -> dict[str, float]:
        """AReaL stats for the group. `dropped` counts groups with too few episodes, as it always did;
        `dropped_uniform` the uniform ones."""
        return {"tau2/group/kept_episodes": float(self.kept),
                "tau2/group/rejected_episodes": float(self.rejected),
                "tau2/group/dropped": float(self.dropped is DropReason.TOO_FEW),
                "tau2/group/dropped_uniform": float(self.dropped is DropReason.UNIFORM)}


def score_group(raw_rewards: Sequence[float | None], rules: GroupRules) -> GroupOutcome:
    """The training rewards of a group's episodes, from their raw rewards (None: rejected)."""
    finished = [r for r in raw_rewards if r is not None]
    centered = rules.baseline == RewardBaseline.group_mean and finished
    offset = sum(finished) / len(finished) if centered else 0.0
    rewards = tuple(None if r is None else r - offset for r in raw_rewards)
    trained = [r for r in rewards if r is not None]
    if len(trained) < rules.min_episodes:
        return GroupOutcome(rewards, DropReason.TOO_FEW)
    if rules.drop_uniform and max(trained) - min(trained) <= UNIFORM_TOLERANCE:
        return GroupOutcome(rewards, DropReason.UNIFORM)
    return GroupOutcome(rewards)
