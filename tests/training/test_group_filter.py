"""The GRPO group filter: drop groups whose rows all carry the same reward."""

from __future__ import annotations

import pytest
import torch
from areal.utils.dynamic_import import import_from_string

from examples.tau2.tau2_train import GROUP_FILTER
from examples.tau2.training.group_filter import drop_uniform_groups


@pytest.mark.parametrize(("rewards", "accepted"), [
    ([0.0, 0.0, 0.0, 0.0], False),              # every episode failed
    ([1.0, 1.0, 1.0, 1.0], False),              # every episode succeeded, turn_discount 1
    ([-0.1, -0.1, -0.1], False),                # every episode penalised alike
    ([0.0, 0.0, 1.0, 1.0], True),               # some succeeded: signal
    ([0.5, 1.0, 0.5, 1.0], True),               # all succeeded, turn_discount 0.5: rows differ
    ([1.0, 1.0 + 1e-9], False),                 # float noise is not signal
    ([], False),
])
def test_filter(rewards, accepted):
    assert drop_uniform_groups({"rewards": torch.tensor(rewards)}) is accepted
    assert drop_uniform_groups({"rewards": rewards}) is accepted  # plain lists too


def test_import_string_resolves_to_the_filter():
    assert import_from_string(GROUP_FILTER) is drop_uniform_groups
