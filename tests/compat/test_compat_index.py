"""The compat package's docstring is the audit list for an upgrade: it must name every module in it."""

from __future__ import annotations

import pkgutil
import re

import examples.tau2.compat as compat


def test_the_package_docstring_lists_every_compat_module():
    listed = set(re.findall(r"^- (.+?)(?: \(|:)", compat.__doc__ or "", re.MULTILINE))
    named = {name for line in listed for name in re.findall(r"`(\w+)`", line)}
    modules = {m.name for m in pkgutil.iter_modules(compat.__path__)}
    assert named == modules, (sorted(modules - named), sorted(named - modules))
