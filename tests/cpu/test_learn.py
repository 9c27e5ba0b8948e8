"""The CPU learning run's pieces: its config, its evaluation, progress lines, the table and the curves.

The run itself (RL between two evaluations, ~12 min a seed) is a benchmark, not a test: its measured
results are in examples/tau2/docs/learn/README.md. Its evaluation (vLLM + eval.evaluate, seeded) is tested
here end to end, because the before/after comparison rests on it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from examples.tau2.cpu import learn
from examples.tau2.cpu.smoke_config import MAIN_CONFIG, check_config, load_smoke_config
from examples.tau2.cpu.tiny_model import TinyModelRecipe, ensure_tiny_model


def _config(*overrides: str):
    return load_smoke_config(["--config", str(MAIN_CONFIG), learn.LEARN_VARIANT, *overrides])[0]


def test_learn_variant_layers_over_the_smoke_variant_and_passes_the_checks():
    port = learn.free_port()  # the default port may be serving a learning run right now
    user = f"econfig.user_base_url=http://127.0.0.1:{port}/v1"
    config = _config("seed=3", "trial_name=seed3", user)
    smoke_config = load_smoke_config([])[0]
    assert check_config(config) == []
    assert config.experiment_name == "tau2-learn-cpu" != smoke_config.experiment_name
    assert config.total_train_steps > 10 * smoke_config.total_train_steps
    assert config.gconfig.n_samples > smoke_config.gconfig.n_samples
    # Everything the learning run does not change is the smoke run's (same trainer, same checks).
    assert config.actor.backend == smoke_config.actor.backend
    assert config.actor.enable_tree_training and config.econfig.domain == "mock"
    assert config.smoke.logprob_ratio_tolerance == smoke_config.smoke.logprob_ratio_tolerance
    assert config.seed == 3 and config.trial_name == "seed3"
    # The learning run's own choices: a start that often ends before acting, sampled (in training and in
    # both evaluations) at one temperature the trainer also uses to recompute logprobs.
    assert config.smoke.tiny_model["warmup_early_stops"] > 0
    assert config.gconfig.temperature == config.econfig.temperature == config.actor.temperature < 1.0
    # The learning rate decays to 0 over exactly the run's steps (check_config refuses another length).
    assert config.actor.optimizer.lr_scheduler_type == "cosine"
    assert config.total_train_epochs * 3 == config.total_train_steps == 36
    (error,) = check_config(_config(user, "total_train_epochs=100"))
    assert "decays over total_train_epochs x steps per epoch = 100 x 3 = 300 steps" in error


def _stats_row(step: int, success: float, entropy: float) -> dict[str, float]:
    return {"global_step": step, learn.SUCCESS: success, learn.ENTROPY: entropy, learn.REWARD: success - 0.1}


class _ScriptedPolls:
    """Stands in for the printer's stop event: each `wait(5)` (one poll) runs the next step of a script
    and advances a fake clock by the interval; the script ending stops the printer. No real waiting."""

    def __init__(self, steps: list, clock: list[float]):
        self.steps, self.clock = list(steps), clock

    def wait(self, timeout: float) -> bool:
        if not self.steps:
            return True
        self.clock[0] += timeout
        self.steps.pop(0)()
        return False

    def set(self) -> None:
        self.steps.clear()


def test_progress_prints_one_line_per_finished_step(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch):
    stats = tmp_path / "stats.jsonl"
    clock = [1000.0]
    monkeypatch.setattr(learn.time, "monotonic", lambda: clock[0])

    def finish(step: int, success: float):
        def write() -> None:
            with stats.open("a") as f:
                f.write(json.dumps(_stats_row(step, success, 2.0)) + "\n")
        return write

    printer = learn.ProgressPrinter(stats, total_steps=4, seed=7)
    # Polls 5 s apart: step 0 ends before the first poll, step 1 before the second, then one idle poll.
    printer._stop = _ScriptedPolls([finish(0, 0.1), finish(1, 0.4), lambda: None], clock)  # type: ignore[assignment]
    printer._run()
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[learn")]
    assert len(lines) == 2
    # The first step's time holds the trainer's start-up: the estimate starts from the second.
    assert lines[0] == ("[learn seed 7] step 1/4: success 0.10, reward +0.000, entropy 2.00, "
                        "time left after the next step")
    # One step in 5 s (fake clock), 2 steps left: 10 s = 0.2 min.
    assert lines[1] == "[learn seed 7] step 2/4: success 0.40, reward +0.300, entropy 2.00, ~0.2 min left"


def test_progress_printer_thread_stops_when_the_run_ends(tmp_path: Path):
    with learn.ProgressPrinter(tmp_path / "stats.jsonl", total_steps=4, seed=7) as printer:
        assert printer._thread.is_alive()
    assert not printer._thread.is_alive()  # the exit wakes the 5 s poll at once


def _seed_result(tmp_path: Path, seed: int, before: float, after: float) -> learn.SeedResult:
    rows = [_stats_row(i, before + (after - before) * i / 2, 3.0 - i) for i in range(3)]
    (tmp_path / f"seed{seed}").mkdir()
    (tmp_path / f"seed{seed}" / "stats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def score(rate: float) -> learn.PolicyScore:
        return learn.PolicyScore(eval_dir="x", success_rate=rate, interval=(rate - 0.1, rate + 0.1),
                                 episodes=36, tasks=9)

    return learn.SeedResult(seed=seed, before=score(before), after=score(after), steps=3, train_s=600,
                            total_s=720, entropy=[3.0, 2.0, 1.0], step_success=[before, 0.3, after],
                            trainer_gap=[2e-6, 3e-6, float("nan")])


def test_table_and_curves_cover_every_seed(tmp_path: Path):
    results = [_seed_result(tmp_path, 1, 0.1, 0.6), _seed_result(tmp_path, 2, 0.2, 0.3)]
    text = learn.table(results, trials=4)
    rows = [x for x in text.splitlines() if x.startswith("| 1 ") or x.startswith("| 2 ")]
    assert rows[0] == ("| 1 | 0.100 [0.00, 0.20] | 0.600 [0.50, 0.70] | +0.500 | 3 | 10.0 | 12.0 | "
                       "3.00 → 1.00 (3.00) | passed |")
    assert "| +0.100 |" in rows[1]
    # a seed whose training broke one of the smoke run's checks says so, with the reason
    results[1].smoke_problems = ["the run was asynchronous in name only: no episode that spans a weight swap"]
    text = learn.table(results, trials=4)
    assert "| FAILED |" in text and "- seed 2: the run was asynchronous in name only" in text
    assert "9 mock tasks x 4 trials" in text
    own = [dataclasses.replace(r, domain="library") for r in results]  # the domain the run trained on
    assert "9 library tasks x 4 trials" in learn.table(own, trials=4)
    assert "tasks no do-nothing" not in text  # every task needs work: nothing to report apart
    flagged = dataclasses.replace(results[0], before=dataclasses.replace(
        results[0].before, trusted_pass1=0.0, trusted_tasks=8), after=dataclasses.replace(
        results[0].after, trusted_pass1=0.55, trusted_tasks=8))
    assert ("- seed 1, on the 8 tasks no do-nothing or half-done agent passes (tau2_rl.sh check-tasks): "
            "0.000 → 0.550 (+0.550)") in learn.table([flagged], trials=4)
    png = learn.plot(tmp_path, results)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert math.isclose(results[0].gain, 0.5)


def test_arguments_that_are_not_overrides_are_refused(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as e:
        learn.main(["bogus", "--trials", "2"])
    assert e.value.code == 2
    assert "overrides are key=value" in capsys.readouterr().err


def _episodes(eval_dir: str) -> dict[tuple[str, int], tuple[float, str]]:
    """(task, trial) -> (tau2 reward, the conversation as text) of one evaluation."""
    out = {}
    for line in (Path(eval_dir) / "trials.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert not row["rejection"], row  # every trial scored, none rejected
        messages = json.loads(Path(row["dump_path"]).read_text())["messages"]
        out[row["task_id"], row["trial"]] = (row["tau2_reward"], json.dumps(
            [(m["role"], m.get("content"), m.get("tool_calls")) for m in messages], sort_keys=True))
    return out


@pytest.mark.memory(gib=4.5)  # two vLLM CPU servers, one at a time (4.2 GiB measured)
@pytest.mark.slow
def test_evaluating_one_policy_twice_replays_the_same_episodes(tmp_path: Path):
    """Seeded policy requests: two evaluations (two vLLM servers) of one policy give identical episodes,
    while different trials of a task still sample differently, and another learning seed (on the first
    server) samples its own. Run at temperature 1 on the smoke run's weakly trained policy, whose replies
    vary a lot, so that agreement cannot come from a peaked policy."""
    config = _config("gconfig.temperature=1.0")  # each evaluation starts its own user simulator
    model = ensure_tiny_model(TinyModelRecipe.from_dict(load_smoke_config([])[0].smoke.tiny_model))
    with learn.serve_policy(model, "p", tmp_path / "a.vllm.log", config.vllm.max_model_len) as url:
        first = learn.evaluate_served_policy(url, "p", tmp_path / "a", config, trials=2, seed=1)
        other = learn.evaluate_served_policy(url, "p", tmp_path / "c", config, trials=2, seed=2)
    second = learn.evaluate_policy(model, "p", tmp_path / "b", config, trials=2, seed=1)
    assert first.episodes == second.episodes == 18
    a, b = _episodes(first.eval_dir), _episodes(second.eval_dir)
    assert a == b
    tasks = {task for task, _ in a}
    assert any(a[task, 0][1] != a[task, 1][1] for task in tasks)
    settings = json.loads((tmp_path / "a" / "run.json").read_text())["settings"]
    assert settings["episode"]["policy_seed"] is True and settings["seeds"] == "1000 + trial index"
    c = _episodes(other.eval_dir)
    assert any(c[key][1] != a[key][1] for key in a)


def test_training_outcomes_count_the_seeds_own_episodes_per_task(tmp_path: Path):
    import os

    def dump(task: str, reward: float, mtime: float, name: str) -> None:
        path = tmp_path / "mock" / task / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"task_id": task, "tau2_reward": reward}))
        os.utime(path, (mtime, mtime))

    dump("create_task_1", 1.0, 100, "a")
    dump("create_task_1", 0.0, 150, "b")
    dump("impossible_task_1", 0.0, 160, "c")
    dump("create_task_1", 1.0, 300, "d")  # the next seed's run
    first = learn.training_outcomes(tmp_path, 90, 200)
    assert first == {"create_task_1": [1, 2], "impossible_task_1": [0, 1]}
    results = [_seed_result(tmp_path, 1, 0.1, 0.6), _seed_result(tmp_path, 2, 0.2, 0.3)]
    results[0].train_tasks = first
    results[1].train_tasks = learn.training_outcomes(tmp_path, 250, 350)
    text = learn.table(results, trials=4)
    assert "| create_task_1 | 1/2 | 1/1 |" in text and "| impossible_task_1 | 0/1 | – |" in text
