"""τ²'s verdict in an episode's record: the database difference names the rows and fields an agent got wrong,
on the stock path (a domain from a module) and the evaluator cache's (a built-in domain) alike, bounded.
The record's files themselves are tested with the workflow that writes them (tests/test_tau2_agent.py)."""

from __future__ import annotations

import sys

import pytest

from examples.tau2.compat import tau2_cache
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.episode import record, task_check
from tests.domain_shapes import EXAMPLE


@pytest.fixture(scope="module")
def library():
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        tau2_domain.load_modules(["library_desk"])
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    return "library"


def _messages_without_last_write(domain: str, task_id: str) -> list:
    """An agent that made every ground-truth call but the last one that changed the database."""
    task = tau2_domain.get_task(domain, task_id)
    calls = record.gold_calls(task)
    oracle = task_check.replay(domain, task, calls)
    last = max(i for i, changed in enumerate(oracle.changed) if changed)
    return task_check.replay(domain, task, [c for i, c in enumerate(calls) if i != last]).messages


def test_the_difference_names_the_loan_the_agent_did_not_renew(library):
    task = tau2_domain.get_task(library, "0")  # renew loan L001 of member M001 (due 2025-06-10)
    diff = record.db_difference(library, task, _messages_without_last_write(library, "0"))
    assert diff == {"more": 0, "rows": [
        {"db": "agent", "table": "loans", "key": "L001", "field": "due_date", "got": "2025-06-10",
         "expected": "2025-06-24"},
        {"db": "agent", "table": "loans", "key": "L001", "field": "renewals_used", "got": 0, "expected": 1}]}
    oracle = task_check.replay(library, task, record.gold_calls(task)).messages
    assert record.db_difference(library, task, oracle) == {"rows": [], "more": 0}


def test_the_cache_and_stock_tau2_give_the_same_difference(monkeypatch):
    """airline task 0 without its last write, through the evaluator cache's environments and stock τ²'s."""
    def writes(task_id: str) -> bool:
        task = tau2_domain.get_task("airline", task_id)
        return any(task_check.replay("airline", task, record.gold_calls(task)).changed)

    task_id = next(t for t in tau2_domain.task_ids("airline", "test") if writes(t))
    messages = _messages_without_last_write("airline", task_id)
    assert tau2_cache.is_enabled()
    cached = record.db_difference("airline", tau2_domain.get_task("airline", task_id), messages)
    monkeypatch.setattr(tau2_cache, "_enabled", False)
    stock = record.db_difference("airline", tau2_domain.get_task("airline", task_id), messages)
    assert cached == stock and cached["rows"], cached


def test_a_large_difference_is_cut_and_counted(library, monkeypatch):
    monkeypatch.setattr(record, "DB_DIFF_LIMIT", 1)
    task = tau2_domain.get_task(library, "0")
    diff = record.db_difference(library, task, _messages_without_last_write(library, "0"))
    assert len(diff["rows"]) == 1 and diff["more"] == 1
    long = record._short("x" * 500)
    assert long.startswith("x" * 200) and long.endswith("... (500 chars)")


def test_each_action_and_fact_is_placed_at_the_turn_that_met_it(library):
    """Task 2 looks member ben.okafor up and must say 6.25 (his fines); an agent that said nothing
    leaves the fact missing, and the ground truth's messages meet both."""
    task = tau2_domain.get_task(library, "2")
    oracle = task_check.replay(library, task, record.gold_calls(task)).messages
    said = [*oracle, task_check.say("You owe 6.25 in fines.")]
    for i, m in enumerate(said):
        m.turn_idx = i
    met = record.where_met(task, said)
    assert met == {"actions": [{"action_id": "2_0", "name": "get_member", "turn": 2}],
                   "communicate": [{"info": "6.25", "turn": len(said) - 1}]}
    assert record.where_met(task, oracle)["communicate"] == [{"info": "6.25", "turn": None}]
