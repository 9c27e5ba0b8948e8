"""pass^k / pass@k, their bootstrap intervals and episode statistics, against hand-computed values and
brute-force enumeration."""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from examples.tau2.eval.metrics import (
    SUCCESS_THRESHOLD,
    BootstrapConfig,
    Interval,
    TaskCounts,
    TaskTrust,
    TrialRecord,
    compute_report,
    final_trials,
    format_markdown,
    is_success,
    pass_at_k,
    pass_hat_k,
    percentile_interval,
    resampled_means,
    stall_warning,
    task_counts,
    task_values,
)
from tests.bootstrap_support import (
    brute_force_means,
    check_against_exact,
    distribution_quantile,
    exact_bootstrap_distribution,
    inverse_cdf,
)


def scored(domain: str, task: str, trial: int, reward: float, **kw) -> TrialRecord:
    kw.setdefault("termination", "user_stop")
    return TrialRecord(domain=domain, task_id=task, trial=trial, seed=trial, tau2_reward=reward,
                       reward=kw.pop("shaped", reward), **kw)


def rejected(domain: str, task: str, trial: int, reason: str = "policy_endpoint") -> TrialRecord:
    return TrialRecord(domain=domain, task_id=task, trial=trial, seed=trial, rejection=reason,
                       rejection_detail="HTTP 500")


def test_estimators_equal_enumeration_over_all_k_subsets():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 8)
        outcomes = [rng.random() < 0.5 for _ in range(n)]
        c = sum(outcomes)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            assert pass_hat_k(n, c, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))
            assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


@pytest.mark.parametrize("n,c,k", [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_estimators_reject_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="need 0 <= c <= n"):
        pass_hat_k(n, c, k)
    with pytest.raises(ValueError, match="need 0 <= c <= n"):
        pass_at_k(n, c, k)


def test_success_threshold_tolerates_round_off_only():
    assert SUCCESS_THRESHOLD == 1.0 - 1e-6
    assert is_success(1.0) and is_success(1.0 - 1e-7)
    assert not is_success(1.0 - 1e-5) and not is_success(0.5)


def test_hand_computed_report_with_three_tasks():
    # a: 3/3 successes, b: 1/3, c: 0/3 (one of c's trials has partial reward 0.5: still a failure).
    records = [scored("airline", "a", t, 1.0) for t in range(3)]
    records += [scored("airline", "b", t, r) for t, r in enumerate([1.0, 0.0, 0.0])]
    records += [scored("airline", "c", t, r) for t, r in enumerate([0.5, 0.0, 0.0])]
    g = compute_report(records, max_k=3).domains["airline"]
    assert g.pass_hat_k == pytest.approx({1: 4 / 9, 2: 1 / 3, 3: 1 / 3})
    assert g.pass_at_k == pytest.approx({1: 4 / 9, 2: (1 + 2 / 3) / 3, 3: 2 / 3})
    assert g.tasks_at_k == {1: 3, 2: 3, 3: 3}
    assert (g.num_tasks, g.num_valid_trials, g.num_successes, g.num_rejected_trials) == (3, 9, 4, 0)
    assert g.success_rate == pytest.approx(4 / 9)
    assert g.mean_tau2_reward == pytest.approx(4.5 / 9)


def test_rejected_trials_are_excluded_and_tasks_with_fewer_trials_use_their_own_n():
    records = [
        # task a: trial 1 rejected, then retried and scored; trial 2 rejected twice -> n=2, c=2
        scored("retail", "a", 0, 1.0), rejected("retail", "a", 1), scored("retail", "a", 1, 1.0),
        rejected("retail", "a", 2), rejected("retail", "a", 2, "timeout"),
        # task b: all three valid, one success -> n=3, c=1
        scored("retail", "b", 0, 0.0), scored("retail", "b", 1, 1.0), scored("retail", "b", 2, 0.0),
        # task c: never scored
        rejected("retail", "c", 0, "user_endpoint"),
    ]
    g = compute_report(records, max_k=3).domains["retail"]
    assert g.num_tasks == 3 and g.tasks_without_valid_trial == 1
    assert g.num_valid_trials == 5 and g.num_rejected_trials == 2  # a#2 and c#0
    assert g.rejected_attempts == {"policy_endpoint": 2, "timeout": 1, "user_endpoint": 1}
    assert g.tasks_at_k == {1: 2, 2: 2, 3: 1}
    assert g.pass_hat_k == pytest.approx({1: (1 + 1 / 3) / 2, 2: (1 + 0) / 2, 3: 0.0})
    assert g.pass_at_k == pytest.approx({1: (1 + 1 / 3) / 2, 2: (1 + 2 / 3) / 2, 3: 1.0})
    assert g.success_rate == pytest.approx(3 / 5)  # rejected trials are not failures


def test_a_value_with_no_eligible_task_is_none_not_zero():
    g = compute_report([scored("mock", "a", 0, 1.0), rejected("mock", "a", 1)], max_k=2).overall
    assert g.pass_hat_k == {1: 1.0, 2: None} and g.pass_at_k == {1: 1.0, 2: None}
    assert g.tasks_at_k == {1: 1, 2: 0}


def test_scored_record_wins_over_rejections_in_any_order():
    late_reject = [scored("mock", "a", 0, 1.0), rejected("mock", "a", 0)]
    assert final_trials(late_reject)[("mock", "a", 0)].scored
    assert not final_trials([rejected("mock", "a", 0), rejected("mock", "a", 0, "timeout")])[
        ("mock", "a", 0)].scored


def test_overall_weighs_tasks_and_domain_mean_weighs_domains():
    records = [scored("airline", "a", 0, 1.0)]  # airline: 1 task, pass^1 = 1
    records += [scored("retail", str(i), 0, 0.0) for i in range(3)]  # retail: 3 tasks, pass^1 = 0
    report = compute_report(records, max_k=1)
    assert report.overall.pass_hat_k[1] == pytest.approx(0.25)
    assert report.domain_mean_pass_hat_k[1] == pytest.approx(0.5)
    assert report.overall.num_tasks == 4


def test_episode_statistics():
    records = [
        scored("telecom", "a", 0, 1.0, shaped=0.9, num_agent_turns=4, num_tool_calls=2,
               reward_breakdown={"DB": 1.0, "COMMUNICATE": 1.0}),
        scored("telecom", "a", 1, 0.0, shaped=-0.1, termination="max_steps", num_agent_turns=10,
               num_tool_calls=6, reward_breakdown={"DB": 0.0, "ENV_ASSERTION": 1.0}),
        scored("telecom", "b", 0, 0.0, termination="invalid_output", num_agent_turns=1),
        rejected("telecom", "b", 1),
    ]
    g = compute_report(records, max_k=2).domains["telecom"]
    assert g.terminations == {"invalid_output": 1, "max_steps": 1, "user_stop": 1}
    assert g.mean_agent_turns == pytest.approx(5.0) and g.mean_tool_calls == pytest.approx(8 / 3)
    assert g.mean_reward == pytest.approx(0.8 / 3) and g.mean_tau2_reward == pytest.approx(1 / 3)
    comps = {k: (v.mean, v.count) for k, v in g.reward_components.items()}
    assert comps == {"COMMUNICATE": (1.0, 1), "DB": (0.5, 2), "ENV_ASSERTION": (1.0, 1)}


def test_record_needs_exactly_one_of_reward_and_rejection_and_round_trips_json():
    with pytest.raises(ValueError, match="exactly one"):
        TrialRecord(domain="mock", task_id="a", trial=0, seed=0)
    with pytest.raises(ValueError, match="exactly one"):
        TrialRecord(domain="mock", task_id="a", trial=0, seed=0, tau2_reward=1.0, rejection="timeout")
    r = scored("mock", "a", 2, 1.0, reward_breakdown={"DB": 1.0}, dump_path="/x.json")
    assert TrialRecord.from_json(json.loads(json.dumps(r.to_json()))) == r


def test_max_k_must_be_positive():
    with pytest.raises(ValueError, match="max_k"):
        compute_report([], max_k=0)


def test_markdown_shows_every_group_and_marks_values_over_fewer_tasks():
    records = [scored("airline", "a", t, 1.0) for t in range(2)]
    records += [scored("retail", "b", 0, 1.0), rejected("retail", "b", 1), scored("retail", "c", 0, 0.0),
                scored("retail", "c", 1, 0.0)]
    md = format_markdown(compute_report(records, max_k=2))
    lines = md.splitlines()
    assert "| domain | tasks | pass^1 | pass^2 |" in lines
    assert "| airline | 1 | 1.000 [1.000, 1.000] | 1.000 [1.000, 1.000] |" in lines
    assert "| retail | 2 | 0.500 [0.000, 1.000] | 0.000 [0.000, 0.000] (1 tasks) |" in lines
    # Stratified: airline's one task is always drawn, only retail's tasks vary.
    assert "| overall | 3 | 0.667 [0.333, 1.000] | 0.500 [0.500, 0.500] (2 tasks) |" in lines
    assert "| mean of domains |  | 0.750 | 0.500 |" in lines
    assert any(line.startswith("| retail | 3 | 1 | policy_endpoint: 1 | 0 |") for line in lines)
    assert f">= {SUCCESS_THRESHOLD!r}" in md
    assert "Intervals: 95% percentile bootstrap over tasks" in md and "10000 resamples, seed 0" in md
    plain = format_markdown(compute_report(records, max_k=2, bootstrap=None)).splitlines()
    assert "| airline | 1 | 1.000 | 1.000 |" in plain and not any("Intervals" in line for line in plain)


TRUST = TaskTrust(rewards_nothing={"airline": frozenset({"free"})},
                  rewards_partial={"airline": frozenset({"half"}), "retail": frozenset({"x"})})


def test_trusted_pass_hat_k_leaves_out_the_tasks_that_pay_for_less_than_the_job():
    """airline: `free` 2/2 (a do-nothing agent passes it), `half` 2/2 (pays for half the job), `work` 1/2,
    `hard` 0/2; retail: `r` 2/2. Officially airline's pass^1 is (1 + 1 + 1/2 + 0)/4; trusted (1/2 + 0)/2."""
    records = [scored("airline", t, i, r) for t, rs in (("free", (1, 1)), ("half", (1, 1)), ("work", (1, 0)),
                                                      ("hard", (0, 0))) for i, r in enumerate(rs)]
    records += [scored("retail", "r", i, 1.0) for i in range(2)] + [rejected("airline", "hard", 2)]
    report = compute_report(records, max_k=2, trust=TRUST)
    airline, overall = report.domains["airline"], report.overall
    assert airline.pass_hat_k == {1: 0.625, 2: 0.5}
    assert airline.trusted.tasks == 2 and airline.trusted.pass_hat_k == {1: 0.25, 2: 0.0}
    t = airline.trusted
    assert (t.free_tasks, t.free_successes, t.successes) == (1, 2, 5)
    assert airline.trusted.stall_share == 0.4
    assert overall.trusted.tasks == 3 and overall.trusted.pass_hat_k[1] == pytest.approx(0.5)
    assert overall.trusted.stall_share == pytest.approx(2 / 7)
    assert report.domains["retail"].trusted.stall_share == 0.0
    # Its intervals come from the trusted tasks alone: airline's two give means 0, 1/4 and 1/2 only.
    assert airline.trusted.pass_hat_k_ci[1] == Interval(0.0, 0.5)
    assert report.to_json()["domains"]["airline"]["trusted"]["stall_share"] == 0.4
    md = format_markdown(report).splitlines()
    assert "| airline | 2 | 0.250 [0.000, 0.500] | 0.000 [0.000, 0.000] | 2 of 5 (40 %) |" in md
    # airline's trusted pass^1 is under half its official one: named; overall's (0.5 of 0.7) is not.
    assert [line.split()[1] for line in md if line.startswith("**Stalling:**")] == ["airline:"]
    assert compute_report(records, max_k=2).domains["airline"].trusted is None  # not known: not guessed


def test_a_stalling_policy_is_named_and_a_working_one_is_not():
    """A policy that passes only the task a do-nothing agent passes scores 1/3 officially, 0 on the
    trusted tasks, and every success is a stall: the report says so. One that does the work does not."""
    stalls = [scored("airline", t, 0, 1.0 if t == "free" else 0.0) for t in ("free", "work", "hard")]
    works = [scored("airline", t, 0, 1.0) for t in ("free", "work", "hard")]
    stalling = compute_report(stalls, max_k=1, trust=TRUST)
    assert stalling.overall.pass_hat_k[1] == pytest.approx(1 / 3)
    assert stalling.overall.trusted.pass_hat_k[1] == 0
    assert stalling.overall.trusted.stall_share == 1.0
    assert stall_warning(stalling.overall) == (
        "overall: pass^1 is 0.333 on all tasks but 0.000 on the 2 trusted ones, and 1 of its 1 successes "
        "(100 %) came from tasks a do-nothing agent passes: the policy stalls more than it works")
    assert "**Stalling:** airline: pass^1 is 0.333" in format_markdown(stalling)
    working = compute_report(works, max_k=1, trust=TRUST)
    assert working.overall.trusted.stall_share == pytest.approx(1 / 3)
    assert stall_warning(working.overall) == ""
    assert compute_report([scored("airline", "work", 0, 0.0)], max_k=1, trust=TRUST).overall.trusted \
        .stall_share is None


def test_task_trust_round_trips_through_json():
    assert TaskTrust.from_json(json.loads(json.dumps(TRUST.to_json()))) == TRUST
    assert TRUST.trusted("airline", "work") and not TRUST.trusted("airline", "half")
    assert TRUST.free("airline", "free") and not TRUST.free("retail", "x") and TRUST.trusted("mock", "free")


# ---------------------------------------------------------------- bootstrap intervals


def fractions_of(counts: list[tuple[int, int]], k: int, at: bool = False) -> list[Fraction]:
    f = pass_at_k if at else pass_hat_k
    return [Fraction(f(n, c, k)).limit_denominator(1000) for n, c in counts if n >= k]


@pytest.mark.parametrize("strata", [
    [[Fraction(1), Fraction(3, 4), Fraction(1, 4), Fraction(0)]],
    [[Fraction(1), Fraction(1, 3), Fraction(1, 3), Fraction(0), Fraction(1, 2)]],
    [[Fraction(1), Fraction(1, 2), Fraction(0)], [Fraction(1, 6), Fraction(1)]],
    [[Fraction(2, 3)], [Fraction(1), Fraction(0)], [Fraction(1, 4), Fraction(1, 2), Fraction(0)]],
])
def test_exact_bootstrap_distribution_equals_brute_force_enumeration(strata):
    means = brute_force_means(strata)
    expected = {m: Fraction(c, len(means)) for m, c in Counter(means).items()}
    dist = exact_bootstrap_distribution(strata)
    assert dist == expected  # exact rational equality, probabilities and values
    for confidence in (0.5, 0.9, 0.95, 0.99):
        alpha = (1 - Fraction(str(confidence))) / 2
        assert (distribution_quantile(dist, alpha), distribution_quantile(dist, 1 - alpha)) == (
            inverse_cdf(means, alpha), inverse_cdf(means, 1 - alpha))


def test_report_intervals_agree_with_the_exact_bootstrap_over_every_resample():
    # airline: 4 tasks x 4 trials with 4, 3, 1, 0 successes; retail: 3 tasks with 3, 2, 0 of 3 valid
    # trials (one more trial rejected). Overall resamples within each domain: 4^4 x 3^3 resamples.
    counts = {"airline": [(4, 4), (4, 3), (4, 1), (4, 0)], "retail": [(3, 3), (3, 2), (3, 0)]}
    records = []
    for domain, tasks in counts.items():
        for t, (n, c) in enumerate(tasks):
            records += [scored(domain, f"t{t}", i, float(i < c)) for i in range(n)]
            if n == 3:
                records.append(rejected(domain, f"t{t}", 3))
    config = BootstrapConfig(resamples=20_000, confidence=0.95, seed=7)
    report = compute_report(records, max_k=4, bootstrap=config)
    equal_checks = nontrivial = 0
    for k in range(1, 5):
        for at in (False, True):
            strata = [fractions_of(counts[d], k, at) for d in counts]
            cases = [(report.domains[d], [s]) for d, s in zip(counts, strata, strict=True) if s]
            cases.append((report.overall, [s for s in strata if s]))
            for group, group_strata in cases:
                mc = (group.pass_at_k_ci if at else group.pass_hat_k_ci)[k]
                point = (group.pass_at_k if at else group.pass_hat_k)[k]
                means = brute_force_means(group_strata)
                assert point == pytest.approx(float(sum(means) / len(means)))  # the bootstrap mean
                equal_checks += check_against_exact(mc, means, config.confidence, config.resamples)
                nontrivial += mc.low < point < mc.high
        assert report.domains["retail"].pass_hat_k_ci[4] is None  # no retail task has 4 valid trials
    # 44 endpoints in 22 intervals: most have no atom near their quantile and must match exactly.
    assert equal_checks >= 30 and nontrivial >= 20


def test_intervals_of_all_success_or_all_failure_have_zero_width():
    ok = [scored("airline", str(t), i, 1.0) for t in range(5) for i in range(3)]
    bad = [scored("retail", str(t), i, 0.0) for t in range(4) for i in range(3)]
    report = compute_report(ok + bad, max_k=3)
    for k in (1, 2, 3):
        for ci in (report.domains["airline"].pass_hat_k_ci[k], report.domains["airline"].pass_at_k_ci[k]):
            assert (ci.low, ci.high) == (1.0, 1.0)
        for ci in (report.domains["retail"].pass_hat_k_ci[k], report.domains["retail"].pass_at_k_ci[k]):
            assert (ci.low, ci.high) == (0.0, 0.0)
        assert report.overall.pass_hat_k_ci[k] == Interval(5 / 9, 5 / 9)  # stratified: sizes are kept


def test_intervals_contain_the_point_estimate_and_are_reproducible():
    rng = random.Random(3)
    records = []
    for domain, tasks in (("airline", 12), ("retail", 25), ("telecom", 7)):
        p_task = [rng.random() for _ in range(tasks)]
        for t in range(tasks):
            for i in range(4):
                records.append(rejected(domain, str(t), i) if rng.random() < 0.1
                               else scored(domain, str(t), i, float(rng.random() < p_task[t])))
    report = compute_report(records, max_k=4)
    for g in report.groups():
        for k in range(1, 5):
            assert g.pass_hat_k_ci[k].contains(g.pass_hat_k[k]), (g.name, k)
            assert g.pass_at_k_ci[k].contains(g.pass_at_k[k]), (g.name, k)
    assert report.overall.pass_hat_k_ci[1].high - report.overall.pass_hat_k_ci[1].low > 0
    assert compute_report(records, max_k=4).to_json() == report.to_json()
    other_seed = compute_report(records, max_k=4, bootstrap=BootstrapConfig(seed=1))
    assert other_seed.overall.pass_hat_k_ci != report.overall.pass_hat_k_ci
    at_99 = compute_report(records, max_k=4, bootstrap=BootstrapConfig(confidence=0.99)).overall
    wide, narrow = at_99.pass_hat_k_ci[1], report.overall.pass_hat_k_ci[1]
    assert wide.low <= narrow.low and wide.high >= narrow.high
    single = compute_report([r for r in records if r.domain == "retail"], max_k=4)
    assert single.overall.pass_hat_k_ci == single.domains["retail"].pass_hat_k_ci
    saved = json.loads(json.dumps(report.to_json()))
    assert saved["overall"]["pass_hat_k_ci"]["1"] == dataclasses_dict(report.overall.pass_hat_k_ci[1])
    assert saved["bootstrap"] == {"resamples": 10000, "confidence": 0.95, "seed": 0}
    assert "stratified" in saved["interval_method"]


def test_report_does_not_depend_on_the_order_trials_finished_in():
    rng = random.Random(5)
    records = [scored(d, str(t), i, float(rng.random() < 0.6), shaped=rng.random())
               for d in ("airline", "retail") for t in range(13) for i in range(3)]
    expected = compute_report(records, max_k=3).to_json()
    for _ in range(3):
        rng.shuffle(records)
        assert compute_report(records, max_k=3).to_json() == expected  # bit for bit


def dataclasses_dict(ci: Interval) -> dict:
    return {"low": ci.low, "high": ci.high}


def test_bootstrap_coverage_is_near_nominal():
    # 400 evaluations of 30 tasks drawn from a known population, 4 trials each: the 95% interval of
    # pass^1 and pass^2 should contain the population value in about 95% of them.
    rng = np.random.default_rng(11)
    population = rng.beta(2.0, 1.5, size=10_000)
    truth = {1: population.mean(), 2: (population**2).mean()}
    config = BootstrapConfig(resamples=2_000)
    covered = Counter()
    runs = 400
    for run in range(runs):
        p = rng.choice(population, size=30)
        counts = [TaskCounts(4, int(c)) for c in rng.binomial(4, p)]
        for k in (1, 2):
            (samples,), _ = resampled_means([task_values(counts, k)], config, (run, k))
            covered[k] += percentile_interval(samples[:, 0], config.confidence).contains(truth[k])
    for k in (1, 2):
        assert 0.89 <= covered[k] / runs <= 0.99, (k, covered[k] / runs)


def test_task_counts_use_final_trials_and_keep_tasks_without_a_valid_trial():
    records = [scored("mock", "a", 0, 1.0), rejected("mock", "a", 1), scored("mock", "a", 1, 0.0),
               rejected("mock", "b", 0)]
    assert task_counts(records) == {"mock": {"a": TaskCounts(2, 1), "b": TaskCounts(0, 0)}}
    assert task_values(task_counts(records)["mock"].values(), 2).tolist() == [[0.0, 1.0]]


@pytest.mark.parametrize("kwargs,message", [
    ({"resamples": 0}, "resamples must be >= 1"),
    ({"confidence": 1.0}, r"confidence must be in \(0, 1\)"),
    ({"confidence": 0.0}, r"confidence must be in \(0, 1\)"),
    ({"seed": -1}, "seed must be >= 0"),
])
def test_bootstrap_config_is_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BootstrapConfig(**kwargs)


def test_exact_enumeration_refuses_too_many_resamples():
    with pytest.raises(ValueError, match="too many resamples"):
        exact_bootstrap_distribution([[Fraction(i % 2) for i in range(20)]])
    with pytest.raises(ValueError, match="no values"):
        exact_bootstrap_distribution([[]])
