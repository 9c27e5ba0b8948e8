"""The CPU smoke run: config checks and result checks.

The whole RL loop at CI size (`python -m examples.tau2.cpu.smoke` with `smoke_support.CI_OVERRIDES`:
AReaL's PPOTrainer with a vLLM CPU server, archon on CPU and the scripted user, two optimizer steps) runs
in `test_smoke_faults.py`, once killed mid-step and resumed, and must then pass every check a smoke run
promises (`smoke_support.check_passing_run`); one run serves both, since each costs minutes on 2 cores.
"""

from __future__ import annotations

import math
import shutil
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from examples.tau2.cpu.async_checks import AsyncReport, StepFacts
from examples.tau2.cpu.smoke import (
    compare_weights,
    evaluate_run,
    forget_finished_run,
    format_result,
    plot_curves,
)
from examples.tau2.cpu.smoke_config import (
    VLLM_PYTHON_ENV,
    SmokeConfigError,
    check_config,
    finished_state,
    load_smoke_config,
    total_steps,
    vllm_python,
)
from examples.tau2.lifecycle.recover import recover_paths, saved_state
from tests.cpu.smoke_support import free_port
from tests.lifecycle.test_recover import _write_state

REPO = Path(__file__).resolve().parents[2]


def _load(tmp_path, *overrides):
    """The shipped config in tmp_path, its user simulator on a free port (another run may hold 18765)."""
    config, _, _ = load_smoke_config([
        f"cluster.fileroot={tmp_path}",
        f"cluster.name_resolve.nfs_record_root={tmp_path}/nr",
        f"econfig.user_base_url=http://127.0.0.1:{free_port()}/v1", *overrides,
    ])
    return config


def test_missing_vllm_venv_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "nope" / "python"))
    with pytest.raises(FileNotFoundError, match="install_vllm_cpu.sh"):
        vllm_python()


def test_the_shipped_config_has_no_problems(tmp_path, vllm_env):
    config = _load(tmp_path)
    assert check_config(config) == []
    # config.yaml with the smoke variant over it: shared settings come from config.yaml
    assert config.actor.eps_clip == 0.2 and config.rollout.agent.export_style == "individual"
    assert config.rollout.backend == "vllm:d1" and config.actor.backend == "archon:d1"
    assert config.actor.enable_tree_training and not config.actor.archon.enable_compile
    assert config.econfig.domain == "mock" and config.econfig.user_model == "user-scenario"


def test_bad_configs_are_reported_before_anything_starts(tmp_path, vllm_env):
    errors = check_config(_load(
        tmp_path, "rollout.backend=sglang:d1", "actor.backend=megatron:d1",
        "econfig.user_base_url=http://10.0.0.1:8000/v1", "total_train_steps=1",
        "smoke.logprob_ratio_tolerance=2", "+smoke.tiny_model.hidden=3", "actor.use_decoupled_loss=false",
    ))
    text = "\n".join(errors)
    for fragment in ("SGLang has no CPU build", "trains with archon (or fsdp)", "must be http://127.0.0.1",
                     "fewer than smoke.min_optimizer_steps", "logprob_ratio_tolerance must be in (0, 1)",
                     "unknown tiny model recipe keys: hidden", "use_decoupled_loss must be true"):
        assert fragment in text, text
    with pytest.raises(SmokeConfigError, match="does not exist"):
        load_smoke_config(["--config", str(tmp_path / "missing.yaml")])


def test_archon_without_tree_training_needs_sdpa_on_a_cpu(tmp_path, vllm_env):
    errors = check_config(_load(tmp_path, "actor.enable_tree_training=false",
                                "actor.archon.attn_type=varlen"))
    assert any("needs sdpa" in e for e in errors), errors
    assert check_config(_load(tmp_path, "actor.enable_tree_training=false")) == []


def test_a_busy_user_simulator_port_is_a_config_problem(tmp_path, vllm_env):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        errors = check_config(_load(tmp_path, f"econfig.user_base_url=http://127.0.0.1:{port}/v1"))
    assert any(f"port {port} of econfig.user_base_url is in use" in e for e in errors), errors


def test_a_live_smoke_run_of_the_same_seed_is_a_config_problem(tmp_path, vllm_env, monkeypatch):
    from examples.tau2.lifecycle import reaper

    monkeypatch.setenv(reaper.LIVE_RUNS_DIR_ENV, str(tmp_path / "live-runs"))
    first = _load(tmp_path / "first")
    with reaper.registered(first):
        monkeypatch.setattr(reaper.os, "getpid", lambda: 1)  # check as another process would
        errors = check_config(_load(tmp_path / "second"))
        assert check_config(_load(tmp_path / "second", f"seed={first.seed + 1}")) == []
    assert [e for e in errors if e.startswith(f"seed={first.seed}: the run tau2-smoke-cpu/run (pid ")], errors


def test_a_temporary_folder_too_long_for_vllm_s_sockets_is_a_config_problem(tmp_path, vllm_env, monkeypatch):
    long = tmp_path / ("t" * 80)
    long.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(long))
    errors = check_config(_load(tmp_path))
    assert any(e.startswith(f"the temporary folder {long} is too long for the vLLM server's sockets")
               and e.endswith("set TMPDIR to a shorter folder, e.g. TMPDIR=/tmp") for e in errors), errors
    monkeypatch.setattr("tempfile.tempdir", "/tmp")
    assert check_config(_load(tmp_path)) == []


def test_missing_vllm_venv_is_a_config_problem(tmp_path, monkeypatch):
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "python"))
    assert any("install_vllm_cpu.sh" in e for e in check_config(_load(tmp_path)))


def _checkpoint(folder: Path, scale: float) -> Path:
    folder.mkdir(parents=True)
    torch.manual_seed(0)
    save_file({"a": torch.randn(4, 4) * scale, "b": torch.ones(3)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    return folder


def test_a_finished_runs_saved_state_is_not_checked_and_is_dropped_before_the_run(tmp_path, vllm_env):
    """A smoke or learning run always trains: the pre-flight does not check the saved state of a run that
    trained all its steps, and the run removes it (AReaL would resume it and train nothing). An unfinished
    run's state is checked, and stays."""
    config = _load(tmp_path)
    total, paths = total_steps(config), recover_paths(config)
    mismatch = "steps per epoch, this config has"
    _write_state(paths, total - 2, "s", per_epoch=99)  # not this config's steps per epoch
    assert not finished_state(config) and any(mismatch in e for e in check_config(config))
    forget_finished_run(config)
    assert saved_state(paths).global_step == total - 2
    _write_state(paths, total - 1, "s", per_epoch=99)
    assert finished_state(config) and not any(mismatch in e for e in check_config(config))
    forget_finished_run(config)
    assert saved_state(paths) is None and not any(p.exists() for p in paths.swapped)


TRAINING = AsyncReport(max_head_offpolicyness=0)
"""What a run whose records passed every check of cpu/async_checks.py reports (tested there)."""


def test_result_checks_fail_on_frozen_weights_and_name_the_records_problems(tmp_path, vllm_env):
    config = _load(tmp_path)
    initial = _checkpoint(tmp_path / "initial", 1.0)
    assert compare_weights(initial, initial)[0] == 0
    stats = [{"global_step": 0, "ppo_actor/n_seqs": 10.0}, {"global_step": 1, "ppo_actor/n_seqs": 12.0}]
    records = AsyncReport(1, problems=["the run was asynchronous in name only: no episode that spans a "
                                       "weight swap"])
    result = evaluate_run(config, stats, initial, {"total": 1.0}, {}, records)
    assert "no checkpoint was saved" in result.problems
    assert records.problems[0] in result.problems
    assert result.rows_trained == [10, 12] and not result.ok

    final = _checkpoint(tmp_path / "final", 1.5)
    changed, total, rel = compare_weights(initial, final)
    assert (changed, total) == (1, 2) and math.isclose(rel, 0.5 * 4 / math.sqrt(16 + 3), rel_tol=0.2)


def test_the_weights_change_exactly_when_some_step_trained_on_a_nonzero_advantage(tmp_path, vllm_env):
    """Every group uniform (advantages all 0) means no gradient: with weight decay 0 the weights must stay,
    and the run may pass; a nonzero advantage must move them."""
    from areal.utils.saver import Saver

    from examples.tau2.cpu.smoke import ADVANTAGE_MAX, ADVANTAGE_MIN

    config = _load(tmp_path)
    initial = _checkpoint(tmp_path / "initial", 1.0)
    saved = Path(Saver.get_model_save_path(config.saver.experiment_name, config.saver.trial_name,
                                           config.saver.fileroot, 0, 1, 1, "default"))
    flat = [{"global_step": i, ADVANTAGE_MIN: 0.0, ADVANTAGE_MAX: 0.0} for i in range(2)]
    mixed = [flat[0], {**flat[1], ADVANTAGE_MIN: -0.7, ADVANTAGE_MAX: 0.7}]

    def weight_problems(stats):
        result = evaluate_run(config, stats, initial, {"total": 1.0}, {}, TRAINING)
        return [p for p in result.problems if "weights" in p], format_result(result, 0.05)

    saved.rmdir()  # made by AReaL's path function
    _checkpoint(saved, 1.0)  # equal to the initial weights
    problems, text = weight_problems(flat)
    assert problems == [] and "no step had a reward signal" in text
    assert weight_problems(mixed)[0] == ["the trained weights equal the initial weights, though step(s) [2] "
                                         "trained on nonzero advantages"]
    shutil.rmtree(saved)
    _checkpoint(saved, 1.5)
    assert weight_problems(mixed)[0] == []
    assert weight_problems(flat)[0][0].startswith("the weights changed though every advantage was 0")


def test_parity_checks_fail_on_a_differing_prompt_and_on_a_step_without_comparisons(tmp_path, vllm_env):
    from examples.tau2.cpu.smoke import PARITY_DIFFERING, PARITY_FIRST_FILE, PARITY_REQUESTS

    config = _load(tmp_path)
    initial = _checkpoint(tmp_path / "initial", 1.0)
    (tmp_path / "parity").mkdir()
    (tmp_path / "parity" / PARITY_FIRST_FILE).write_text("policy version 1: first difference at token 187")
    stats = [{"global_step": 0, PARITY_REQUESTS: 12.0, PARITY_DIFFERING: 0.0},
             {"global_step": 1, PARITY_REQUESTS: 11.0, PARITY_DIFFERING: 2.0},
             {"global_step": 2, PARITY_REQUESTS: 0.0, PARITY_DIFFERING: 0.0}]
    result = evaluate_run(config, stats, initial, {"total": 1.0}, {"parity": str(tmp_path / "parity")},
                          TRAINING)
    assert result.parity_requests == [12, 11, 0] and result.parity_differing == [0, 2, 0]
    problems = " | ".join(result.problems)
    assert "no policy prompt was compared with the vLLM server's at step(s) [3]" in problems
    assert ("the proxy's prompt differs from the vLLM server's in 2 of 23 requests; first: policy version 1: "
            "first difference at token 187") in problems
    # with the check off, neither is a problem
    off = _load(tmp_path, "smoke.check_parity=false")
    assert not any("parity" in p or "vLLM server's" in p
                   for p in evaluate_run(off, stats, initial, {"total": 1.0}, {}, TRAINING).problems)


def test_plot_and_report_are_written(tmp_path):
    stats = [{"global_step": i, "ppo_actor/task_reward/avg": 0.1 * i,
              "ppo_actor/update/actor_loss/avg": -0.01 * i, "ppo_actor/update/entropy/avg": 2.0}
             for i in range(3)]
    steps = [StepFacts(version=i, rows=3, versions={i: 30}, rows_of_two_versions=0, on_policy_tokens=30,
                       trainer_max_gap=2e-6) for i in range(3)]
    plot_curves(stats, AsyncReport(0, steps=steps), tmp_path / "curves.png", 0.05)
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_format_result_names_every_problem_and_each_step_s_versions():
    from examples.tau2.cpu.smoke import SmokeResult

    step = StepFacts(version=0, rows=3, versions={0: 12, 1: 28}, rows_of_two_versions=1, on_policy_tokens=28,
                     trainer_max_gap=3e-6)
    r = SmokeResult(steps=1, training=AsyncReport(2, steps=[step]), parity_requests=[3], parity_differing=[1],
                    rows_trained=[3], tokens_trained=[40], tokens_in_rows=[900], tokens_computed=[300],
                    trainer="archon, prefix sharing (tree training) on",
                    reward=[0.0], weights_changed=0, weights_total=5, advantage_max_abs=[0.5],
                    weight_rel_change=0.0, checkpoint="", episode_dumps=0, timings_s={"total": 3.0},
                    paths={"logs": "/x"}, problems=["the trained weights equal the initial weights"])
    text = format_result(r, 0.05)
    assert "FAILED" in text and "PROBLEM: the trained weights equal the initial weights" in text
    row = text.splitlines()[6].split()
    assert row[:6] == ["1", "0.000", "3", "40", "900", "300"] and row[-1] == "2/3"  # 2 of 3 prompts equal
    assert "v0 12, v1 28" in text.splitlines()[6] and row[-3:-1] == ["1", "3.0e-06"]
    assert "training: asynchronous (rollout.max_head_offpolicyness 2)" in text


def test_an_unreachable_slurm_is_refused_before_the_checks_that_take_seconds(monkeypatch, capsys):
    """Before tau2 and AReaL's trainer code are imported for the other checks (a bad domain here)."""
    from examples.tau2.cpu import smoke

    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    assert smoke.main(["scheduler.type=slurm", "econfig.domain=nosuch"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("smoke: scheduler.type=slurm but ") and "slurm-local up" in line
