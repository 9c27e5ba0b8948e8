"""The AReaL 1.0.4 internals the training entry reads, checked against the installed AReaL."""

from __future__ import annotations

import pytest

from examples.tau2.compat import UnsupportedVersion, areal_api, require


def test_archon_model_types_match_areal():
    from areal.experimental.models.archon import get_supported_model_types

    assert frozenset(get_supported_model_types()) == areal_api.archon_model_types()


def test_combined_allocation_is_parsed_by_areal():
    parsed = areal_api.parse_combined_allocation("sglang:d4t2+archon:d4p2t1")
    assert [a.backend for a in parsed.allocations] == ["sglang", "archon"]


def test_another_release_fails_with_one_sentence(monkeypatch):
    from examples.tau2 import compat

    monkeypatch.setattr(compat, "installed_version", lambda package: "9.9.9")
    with pytest.raises(UnsupportedVersion) as info:
        areal_api.archon_model_types()
    assert str(info.value).startswith("the archon model list (examples/tau2/compat/areal_api.py) mirrors "
                                      "areal 1.0.4, but areal 9.9.9 is installed")
    with pytest.raises(UnsupportedVersion, match="not installed"):
        monkeypatch.undo()
        require("no-such-package-here", "1.0", "a test")


def test_tree_block_size_is_areals():
    from areal.models.tree_attn.constants import BLOCK_SIZE

    assert areal_api.tree_block_size() == BLOCK_SIZE
