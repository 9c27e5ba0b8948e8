"""The dynamic filter for GRPO groups, given to `PPOTrainer.train` as an import string.

AReaL calls it on the rollout workers with one group's trajectory: the exported rows of all its
episodes concatenated, with one reward per row (`rewards`). A group whose rows all carry the same
reward gives every row the same advantage under group-relative baselines and only noise under a
batch baseline, so it is dropped.

Which groups that is depends on `rollout.agent.turn_discount` (rows of one episode get
reward * discount**k, k = completions after it): all-failure groups (every row 0) always;
all-success groups (every episode 1) only when the discount is 1, because a smaller discount already
makes the rows of one episode differ.
"""

from __future__ import annotations

from typing import Any

import torch

TOLERANCE = 1e-6


def drop_uniform_groups(trajectory: dict[str, Any]) -> bool:
    """Accept the group unless all its rows carry the same reward (within TOLERANCE)."""
    rewards = torch.as_tensor(trajectory["rewards"], dtype=torch.float64).flatten()
    if rewards.numel() == 0:
        return False
    return bool((rewards.max() - rewards.min()).item() > TOLERANCE)
