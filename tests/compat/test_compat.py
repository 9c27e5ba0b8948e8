"""The compat package: its docstring is the audit list for an upgrade, and the AReaL 1.0.4 internals the
training entry reads, checked against the installed AReaL."""

from __future__ import annotations

import pkgutil
import re

import pytest

import examples.tau2.compat as compat
from examples.tau2.compat import UnsupportedVersion, require


def test_the_package_docstring_lists_every_compat_module():
    listed = set(re.findall(r"^- (.+?)(?: \(|:)", compat.__doc__ or "", re.MULTILINE))
    named = {name for line in listed for name in re.findall(r"`(\w+)`", line)}
    modules = {m.name for m in pkgutil.iter_modules(compat.__path__)}
    assert named == modules, (sorted(modules - named), sorted(named - modules))


def test_archon_model_types_match_areal():
    from areal.experimental.models.archon import get_supported_model_types

    assert frozenset(get_supported_model_types()) == compat.archon_model_types()


def test_combined_allocation_is_parsed_by_areal():
    parsed = compat.parse_combined_allocation("sglang:d4t2+archon:d4p2t1")
    assert [a.backend for a in parsed.allocations] == ["sglang", "archon"]


def test_another_release_fails_with_one_sentence(monkeypatch):
    monkeypatch.setattr(compat, "installed_version", lambda package: "9.9.9")
    with pytest.raises(UnsupportedVersion) as info:
        compat.archon_model_types()
    assert str(info.value).startswith("the archon model list (examples/tau2/compat/__init__.py) mirrors "
                                      "areal 1.0.4, but areal 9.9.9 is installed")
    with pytest.raises(UnsupportedVersion, match="not installed"):
        monkeypatch.undo()
        require("no-such-package-here", "1.0", "a test")


def test_tree_block_size_is_areals():
    from areal.models.tree_attn.constants import BLOCK_SIZE

    assert compat.tree_block_size() == BLOCK_SIZE
