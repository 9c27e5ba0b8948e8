"""Resuming a killed run: atomic recover saves, their repair at every point a kill can land, what a rerun
cleans up (stats lines, episode dumps), the watchdogs, and the `recover` checks of `--dry-run`."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from areal.api import FinetuneSpec, StepInfo
from areal.api.cli_args import RecoverConfig
from areal.utils.recover import RecoverHandler, RecoverInfo

from examples.tau2.lifecycle import recover as tau2_recover
from examples.tau2.lifecycle import watchdog as tau2_watchdog
from examples.tau2.lifecycle.recover import (
    JOURNAL,
    AtomicRecoverHandler,
    RecoverPaths,
    check_recover,
    commit,
    describe_recover,
    prepare_resume,
    previous,
    recover_paths,
    repair,
    saved_state,
    staged,
    supersede_dumps,
    trains_on,
    trim_stats,
)
from examples.tau2.lifecycle.validate import format_plan, survey
from examples.tau2.lifecycle.watchdog import CONTROL, InferenceServerDied, ServerWatchdog
from examples.tau2.training.trainer import Tau2PPOTrainer
from tests.tau2_train_support import clean_overrides, load, trainer_without_areal_init

REPO = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, *overrides: str):
    return load(f"cluster.fileroot={tmp_path / 'root'}",
                f"cluster.name_resolve.nfs_record_root={tmp_path}/nr", *overrides).config


def _write_state(paths: RecoverPaths, step: int, tag: str, per_epoch: int = 2) -> None:
    """A complete recover state as AReaL writes it, each file tagged so tests can tell states apart."""
    info = StepInfo(epoch=step // per_epoch, epoch_step=step % per_epoch, global_step=step,
                    steps_per_epoch=per_epoch)
    RecoverInfo(last_step_info=info,
                saver_info={"tag": tag}, evaluator_info={}, stats_logger_info={"last_commit_step": step},
                dataloader_info={"tag": tag}, checkpoint_info={}).dump(str(paths.info))
    for c in paths.checkpoints:
        c.mkdir(parents=True, exist_ok=True)
        (c / ".metadata").write_text(tag)


def _staged(paths: RecoverPaths) -> RecoverPaths:
    return RecoverPaths(paths.save_root, staged(paths.info), tuple(staged(c) for c in paths.checkpoints))


def _tag(paths: RecoverPaths) -> tuple[str, str]:
    return (json.loads((paths.info / "saver_info.json").read_text())["tag"],
            (paths.checkpoints[0] / ".metadata").read_text())


# ---------------------------------------------------------------------------------------------
# Atomic saves


@pytest.mark.parametrize("cut", range(7))
def test_a_kill_anywhere_in_a_save_leaves_the_old_or_the_new_state_never_a_mix(tmp_path, cut):
    """Each `cut` stops the save after that many of its file-system steps; `repair` then finds either
    step 1's state (save incomplete) or step 2's (swap begun after the journal), whole."""
    paths = recover_paths(_config(tmp_path))
    _write_state(paths, 0, "old")
    # the save of step 2, step by step: checkpoint and info to .next, journal, swap in, tidy up
    _write_state(_staged(paths), 1, "new")
    ops = [
        lambda: (staged(paths.info) / tau2_recover.SAVED_MARKER).write_text(
            json.dumps({"global_step": 1, "saved_at": time.time()})),
        lambda: (paths.save_root / JOURNAL).write_text(json.dumps({"global_step": 1})),
        lambda: paths.info.rename(previous(paths.info)),
        lambda: staged(paths.info).rename(paths.info),
        lambda: paths.checkpoints[0].rename(previous(paths.checkpoints[0])),
        lambda: staged(paths.checkpoints[0]).rename(paths.checkpoints[0]),
    ]
    for op in ops[:cut]:
        op()
    done = repair(paths)
    expected = "new" if cut >= 2 else "old"
    assert _tag(paths) == (expected, expected)
    assert saved_state(paths).global_step == (1 if expected == "new" else 0)
    assert ("completed" in done) == (expected == "new") and done
    leftovers = [p.name for p in paths.save_root.rglob("*") if p.name.endswith((".next", ".prev", JOURNAL))]
    assert leftovers == []
    assert repair(paths) == ""  # nothing left to do


def test_commit_swaps_in_the_staged_save_and_records_when(tmp_path):
    paths = recover_paths(_config(tmp_path))
    _write_state(paths, 0, "old")
    _write_state(_staged(paths), 1, "new")
    before = time.time()
    commit(paths, 1, {"domain": "mock"})
    state = saved_state(paths)
    assert _tag(paths) == ("new", "new") and state.global_step == 1
    assert before <= state.saved_at <= time.time() and state.trains_on == {"domain": "mock"}
    assert not staged(paths.info).exists() and not (paths.save_root / JOURNAL).exists()


def test_a_signal_anywhere_in_commit_sees_the_step_a_rerun_resumes_after(tmp_path, monkeypatch):
    """SIGTERM (`scontrol requeue`) may come anywhere in `commit`, and the SLURM journal notes the saved
    step at once: the previous one until the commit record is written (a rerun undoes the save), the new
    one from then on (a rerun completes it), also while the swap still runs."""
    control = tau2_watchdog.RunControl(saved_step=0)
    monkeypatch.setattr(tau2_recover, "CONTROL", control)
    paths = recover_paths(_config(tmp_path))
    _write_state(paths, 0, "old")
    _write_state(_staged(paths), 1, "new")
    seen: list[tuple[str, int | None]] = []
    write, roll_forward = tau2_recover.write_atomic, tau2_recover._roll_forward

    def noted_write(path: Path, text: str) -> None:
        seen.append((f"before {path.name}", control.last_saved()))
        write(path, text)
        seen.append((f"after {path.name}", control.last_saved()))

    monkeypatch.setattr(tau2_recover, "write_atomic", noted_write)
    monkeypatch.setattr(tau2_recover, "_roll_forward", lambda p: (seen.append(("swap", control.last_saved())),
                                                                  roll_forward(p)))
    commit(paths, 1, {"domain": "mock"})
    marker = tau2_recover.SAVED_MARKER
    assert seen == [(f"before {marker}", 0), (f"after {marker}", 0), (f"before {JOURNAL}", 0),
                    (f"after {JOURNAL}", 1), ("swap", 1)]
    assert control.last_saved() == 1 and control.committing is None and saved_state(paths).global_step == 1


def test_torn_info_is_no_saved_state(tmp_path):
    """AReaL would warn and start over from step 1; `saved_state` says there is nothing to resume."""
    paths = recover_paths(_config(tmp_path))
    assert saved_state(paths) is None
    _write_state(paths, 4, "x")
    assert saved_state(paths).global_step == 4
    (paths.info / "dataloader_info.pkl").unlink()
    assert saved_state(paths) is None


class _Engine:
    """Stands in for AReaL's train controller: `save` writes a DCP-like directory."""

    def __init__(self) -> None:
        self.saved: list[str] = []

    def save(self, meta) -> None:
        Path(meta.path).mkdir(parents=True, exist_ok=True)
        (Path(meta.path) / ".metadata").write_text(meta.path)
        self.saved.append((meta.path, meta.tokenizer))


class _Stateful:
    def state_dict(self) -> dict:
        return {"n": 1}


def test_atomic_handler_saves_to_next_then_swaps_in(tmp_path, monkeypatch):
    config = _config(tmp_path, "recover.freq_steps=2")
    r = config.recover
    spec = FinetuneSpec(total_train_epochs=1, dataset_size=6, train_batch_size=1)
    handler = AtomicRecoverHandler.adopt(
        RecoverHandler(RecoverConfig(mode="auto", experiment_name=r.experiment_name, trial_name=r.trial_name,
                                     fileroot=r.fileroot, freq_steps=2), spec), config)
    engine, paths = _Engine(), recover_paths(config)
    monkeypatch.setattr(CONTROL, "saved_step", None)
    seen = []  # what a SIGTERM right after each dump would report saved (the journal's `saved_step`)
    for step in range(3):
        handler.dump(engine, StepInfo(epoch=0, epoch_step=step, global_step=step, steps_per_epoch=6),
                     _Stateful(), _Stateful(), _Stateful(), _Stateful(), tokenizer=object())
        seen.append(CONTROL.saved_step)
    assert seen == [None, 1, 1]  # set the moment the files are swapped in, not at the step's commit
    assert engine.saved == [(str(staged(paths.checkpoints[0])), None)]  # the second step only; no tokenizer
    state = saved_state(paths)
    assert state is not None and state.global_step == 1 and state.trains_on == trains_on(config)
    assert state.trains_on == {"domain": "airline", "domain_modules": [], "mix": None, "train_split": "train"}
    assert (paths.checkpoints[0] / ".metadata").is_file() and not staged(paths.checkpoints[0]).exists()


def _trainer_saving_and_committing(monkeypatch, calls: list[str], steps: int = 4) -> object:
    """A trainer whose AReaL save and commit only record the call; the run has `steps` steps."""
    from areal import PPOTrainer

    monkeypatch.setattr(PPOTrainer, "_save_recover_checkpoint",
                        lambda self, epoch, epoch_step, global_step: calls.append(
                            f"save {global_step}" if self.recover_handler.freq_ctl.check(epochs=0, steps=1)
                            else f"no save {global_step}"))
    monkeypatch.setattr(PPOTrainer, "_export_and_commit_stats",
                        lambda self, epoch, epoch_step, global_step: calls.append(f"stats {global_step}"))
    config = SimpleNamespace(recover=SimpleNamespace(fileroot="/x", experiment_name="e", trial_name="t"),
                             total_train_epochs=1, total_train_steps=None)
    trainer = trainer_without_areal_init(monkeypatch, config, train_dataloader=[None] * steps)
    assert isinstance(trainer.recover_handler, AtomicRecoverHandler)
    return trainer


def test_recover_save_runs_after_the_stats_commit(monkeypatch):
    """AReaL's `train` saves, evaluates, then commits the stats; the save moves after the commit."""
    calls: list[str] = []
    trainer = _trainer_saving_and_committing(monkeypatch, calls)
    for g in range(2):  # PPOTrainer.train's order (rl_trainer.py:797, :854)
        trainer._save_recover_checkpoint(0, g, g)
        calls.append(f"eval {g}")
        trainer._export_and_commit_stats(0, g, g)
    assert calls == ["eval 0", "stats 0", "save 0", "eval 1", "stats 1", "save 1"]


def test_a_stop_request_saves_the_step_whatever_the_frequency_and_stops(monkeypatch):
    """Asked to stop (SLURM's warning: slurm/requeue.py), the run saves the step it ends although
    `recover.freq_steps` would not, and raises `StopRequested`; at the last step it just finishes."""
    from examples.tau2.lifecycle import watchdog

    control = watchdog.RunControl()
    monkeypatch.setattr(watchdog, "CONTROL", control)
    calls: list[str] = []
    trainer = _trainer_saving_and_committing(monkeypatch, calls, steps=3)
    never = SimpleNamespace(check=lambda epochs, steps: False, state_dict=dict, load_state_dict=print)
    trainer.recover_handler.freq_ctl.inner = never  # recover.freq_steps: not due at any step
    trainer._save_recover_checkpoint(0, 0, 0)
    trainer._export_and_commit_stats(0, 0, 0)
    assert calls == ["stats 0", "no save 0"] and control.last_step == 0 and control.first_step == 0
    control.stop_reason = "SLURM's warning signal, 300 s before the time limit"
    trainer._save_recover_checkpoint(0, 1, 1)
    with pytest.raises(watchdog.StopRequested, match="300 s before the time limit; stopped after step 2, its "
                                                     "state saved"):
        trainer._export_and_commit_stats(0, 1, 1)
    assert calls[2:] == ["stats 1", "save 1"] and control.last_step == 1
    trainer._save_recover_checkpoint(0, 2, 2)
    trainer._export_and_commit_stats(0, 2, 2)  # the last step: nothing left to stop for
    assert calls[4:] == ["stats 2", "no save 2"] and control.finished


def test_a_clean_up_that_fails_during_an_exception_does_not_hide_its_cause(monkeypatch, caplog):
    """A worker job cancelled mid-run: the watchdog raises `WorkerJobEnded`, then AReaL's `close` calls the
    dead workers and fails too; the caller sees the first cause (slurm/requeue.py classifies it)."""
    from areal import PPOTrainer

    def close(self):
        raise RuntimeError("Worker 'rollout/*' failed with exit code -1\nStderr output: ...")

    from examples.tau2.training import trainer as trainer_module

    monkeypatch.setattr(PPOTrainer, "close", close)
    trainer_module.logger.addHandler(caplog.handler)  # AReaL replaces the root logger caplog listens on
    config = SimpleNamespace(recover=SimpleNamespace(fileroot="/x", experiment_name="e", trial_name="t"))
    trainer = trainer_without_areal_init(monkeypatch, config)
    with pytest.raises(tau2_watchdog.WorkerJobEnded, match="SLURM job 9"), trainer:
        raise tau2_watchdog.WorkerJobEnded("SLURM job 9 (e_t:rollout) is CANCELLED on n1")
    assert ("the clean-up after WorkerJobEnded failed too: RuntimeError: Worker 'rollout/*' failed with exit "
            "code -1") in caplog.text
    with pytest.raises(RuntimeError, match="exit code -1"), trainer:  # no exception: the failure is raised
        pass
    trainer_module.logger.removeHandler(caplog.handler)


def test_a_failed_call_to_a_worker_whose_job_ended_is_that_job_ending(monkeypatch):
    """A cancelled rollout job: AReaL's next call to its worker may fail before the job watchdog polls; the
    run then stops with the watchdog's sentence (`WorkerJobEnded`), as slurm/requeue.py counts it."""
    from areal import PPOTrainer

    def train(self, *args, **kwargs):
        raise ConnectionError("Failed to call method 'save_perf_tracer' on worker 'rollout/0'")

    monkeypatch.setattr(PPOTrainer, "train", train)
    config = SimpleNamespace(recover=SimpleNamespace(fileroot="/x", experiment_name="e", trial_name="t"))
    ended = "SLURM job 9 (e_t:rollout) is CANCELLED on n1: the rollout workers are gone"
    scheduler = SimpleNamespace(ended_job=lambda: ended)
    trainer = trainer_without_areal_init(monkeypatch, config, scheduler=scheduler)
    monkeypatch.setattr(type(trainer), "job_poll_s", 60.0)
    with pytest.raises(tau2_watchdog.WorkerJobEnded, match="is CANCELLED on n1") as raised:
        trainer.train()
    assert isinstance(raised.value.__cause__, ConnectionError)
    scheduler.ended_job = lambda: ""  # no job ended: the failure is the run's own
    with pytest.raises(ConnectionError):
        trainer.train()


def test_run_control_knows_the_steps_it_committed():
    from examples.tau2.lifecycle.watchdog import RunControl

    control, seen = RunControl(resumed_from=1), []
    control.on_first_step = lambda: seen.append(control.first_step)
    control.committed(2)
    control.committed(3)
    assert seen == [2] and control.last_step == 3 and control.last_saved() is None


def test_watchdog_interrupts_once_a_server_has_refused_for_long_enough(monkeypatch, closed_port):
    calls: list[float] = []
    monkeypatch.setattr(tau2_watchdog, "interrupt_main_thread", lambda: calls.append(time.monotonic()))
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen()
        up = ("127.0.0.1", live.getsockname()[1])
        with ServerWatchdog([up], dead_after_s=0.3, poll_s=0.05) as watchdog:
            time.sleep(1.0)
        assert calls == [] and watchdog.failure == ""
        start = time.monotonic()
        with ServerWatchdog([up, ("127.0.0.1", closed_port)], dead_after_s=0.3, poll_s=0.05) as watchdog:
            while not calls and time.monotonic() - start < 60:
                time.sleep(0.05)
    assert len(calls) == 1 and 0.3 <= calls[0] - start < 30  # after dead_after_s, not at once
    assert f"127.0.0.1:{closed_port} has refused connections for" in watchdog.failure


def test_watchdog_exits_the_process_when_the_interrupt_does_not_stop_the_run(closed_port):
    """The main thread ignores SIGINT (as a job started with `&` by a non-interactive shell does): the
    watchdog stops the children and exits with status 1 `exit_after_s` later."""
    script = textwrap.dedent(f"""
        import signal, subprocess, sys, time
        from examples.tau2.lifecycle.watchdog import ServerWatchdog
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("child", child.pid, flush=True)
        with ServerWatchdog([("127.0.0.1", {closed_port})], dead_after_s=0.2, poll_s=0.05, exit_after_s=1):
            time.sleep(600)
        print("not reached", flush=True)
    """)
    # Without the exit the script would sleep 600 s and the run's timeout would fail the test; how long
    # the fresh interpreter takes to import is not this test's business.
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert done.returncode == 1
    assert "not reached" not in done.stdout
    assert "the run did not stop within 1 s of the interrupt; exiting: the inference server at" in done.stderr
    child = int(done.stdout.split()[1])
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_dead_inference_server_stops_training_with_a_message(monkeypatch, closed_port):
    from areal import PPOTrainer

    monkeypatch.setattr(PPOTrainer, "train", lambda self: time.sleep(600))  # a rollout waiting on the server
    config = SimpleNamespace(recover=SimpleNamespace(fileroot="/x", experiment_name="e", trial_name="t"))
    trainer = trainer_without_areal_init(monkeypatch, config, rollout=SimpleNamespace(
        server_infos=[SimpleNamespace(host="127.0.0.1", port=closed_port)]))
    trainer.server_dead_after_s = 0.5  # checked every 5 s: stops after 5-10 s
    assert Tau2PPOTrainer.server_dead_after_s == 15.0
    with pytest.raises(InferenceServerDied, match=f"127.0.0.1:{closed_port} has refused connections"):
        trainer.train()  # the watchdog's error: train() itself would only sleep


# ---------------------------------------------------------------------------------------------
# What a rerun cleans up


def test_stats_keep_each_saved_step_once_and_no_torn_line(tmp_path):
    path = tmp_path / "stats.jsonl"
    rows = [{"global_step": s, "x": s} for s in (0, 1, 1, 2, 3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"global_st')
    assert trim_stats(path, 2) == 3  # the duplicate of step 2, step 4 and the torn line
    assert [json.loads(x)["global_step"] for x in path.read_text().splitlines()] == [0, 1, 2]
    assert trim_stats(path, 2) == 0
    assert trim_stats(path, None) == 3 and path.read_text() == ""


def test_dumps_after_the_saved_state_are_moved_aside_and_temp_files_removed(tmp_path):
    dumps = tmp_path / "tau2_dumps"
    old, new = dumps / "mock" / "t1" / "a.json", dumps / "mock" / "t2" / "b.json"
    torn = dumps / "mock" / "t2" / ".c.json.x.tmp"
    for f in (old, new, torn):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("{}")
    os.utime(old, (1000.0, 1000.0))
    moved, where = supersede_dumps(dumps, since=2000.0)
    assert moved == 1 and where is not None and where.parent == tmp_path / "tau2_dumps.superseded"
    assert (where / "mock" / "t2" / "b.json").is_file() and old.is_file()
    assert not new.exists() and not torn.exists()
    assert supersede_dumps(dumps, since=2000.0) == (0, None)


def test_prepare_resume_trims_a_resumed_run_and_leaves_a_fresh_one(tmp_path):
    config = _config(tmp_path, "econfig.domain=mock", "econfig.train_split=all", "econfig.valid_split=null",
                     "valid_dataset=null", "train_dataset.batch_size=2", "++total_train_steps=3")
    paths = recover_paths(config)
    stats = tmp_path / "stats.jsonl"
    stats.write_text("".join(json.dumps({"global_step": s}) + "\n" for s in range(3)))
    assert prepare_resume(config, stats) is None and trim_stats(stats, 5) == 0  # untouched
    assert json.loads(paths.controller_file.read_text())["pid"] == os.getpid()

    _write_state(paths, 0, "s", per_epoch=4)
    (paths.info / tau2_recover.SAVED_MARKER).write_text(json.dumps({"global_step": 0, "saved_at": 2000.0}))
    dump = Path(config.econfig.dump_dir) / "mock" / "t" / "late.json"
    dump.parent.mkdir(parents=True)
    dump.write_text("{}")
    assert prepare_resume(config, stats).global_step == 0 and not dump.exists()
    assert [json.loads(x)["global_step"] for x in stats.read_text().splitlines()] == [0]  # step 2 runs again
    # starting over, every dump is from an earlier run of the trial (here: killed before its first save)
    for live in paths.swapped:
        shutil.rmtree(live)
    dump.write_text("{}")
    os.utime(dump, (1000.0, 1000.0))
    assert prepare_resume(config, stats) is None and not dump.exists()


# ---------------------------------------------------------------------------------------------
# Checks and the plan


def test_shipped_configs_resume_and_pass_the_checks(tmp_path, endpoint):
    clean = clean_overrides(tmp_path, endpoint.url)
    for variant in ([], ["+configs=debug_2gpu"]):
        config = load(*clean, *variant).config
        assert config.recover.mode == "auto" and config.recover.freq_steps == 1
        assert check_recover(config) == []
    slurm = load("+configs=slurm_2node").config
    assert slurm.recover.mode == "auto" and slurm.recover.freq_steps == 5
    plan = format_plan(survey(load(*clean)), [])
    assert re.search(r"^  recover +auto, every 1 step\(s\), in \S+/checkpoints/\S+/tau2-airline/qwen3-1.7b; "
                     r"no saved state: starts at step 1$", plan, re.M), plan
    assert not (tmp_path / "fileroot").exists()  # the checks and the plan create nothing


@pytest.mark.parametrize(("overrides", "fragment"), [
    (["recover.freq_steps=null"], "saves nothing without recover.freq_steps"),
    (["recover.freq_steps=0"], "recover.freq_steps=0 must be at least 1"),
    (["recover.trial_name=other"], "recover.trial_name=other differs from trial_name=qwen3-1.7b"),
    (["recover.fileroot=/elsewhere"], "recover.fileroot=/elsewhere differs from cluster.fileroot="),
])
def test_recover_problems_are_one_sentence_each(tmp_path, endpoint, overrides, fragment):
    errors = survey(load(*clean_overrides(tmp_path, endpoint.url), *overrides)).problems
    assert len(errors) == 1 and fragment in errors[0] and "\n" not in errors[0], errors


def test_a_saved_state_the_config_cannot_resume_is_a_problem(tmp_path):
    config = _config(tmp_path)  # airline less its regraded and flagged tasks: 10 rows / 8 = 1 step per epoch
    paths = recover_paths(config)
    assert check_recover(load("recover.mode=disabled").config) == []
    _write_state(paths, 4, "s", per_epoch=5)
    assert any("from a run with 5 steps per epoch, this config has 1" in e for e in check_recover(config))
    _write_state(paths, 4, "s", per_epoch=1)
    assert check_recover(config) == []
    assert describe_recover(config).endswith(f"state saved after step 5: a run resumes at step 6 "
                                             f"({tau2_recover.UNRECORDED})")
    (paths.checkpoints[0] / ".metadata").unlink()
    assert any("has no checkpoint" in e for e in check_recover(config))


def test_the_default_experiment_name_follows_the_domain(tmp_path):
    """Runs on other domains keep their saved states apart without an `experiment_name` of their own."""
    assert recover_paths(_config(tmp_path)).save_root.parent.name == "tau2-airline"
    assert recover_paths(_config(tmp_path, "econfig.domain=mock")).save_root.parent.name == "tau2-mock"
    mix = ["econfig.domain=null", "econfig.mix={airline:1,retail@train:1}"]
    config = _config(tmp_path, *mix)
    assert config.experiment_name == config.recover.experiment_name == "tau2-mix-airline-retail"
    assert _config(tmp_path, *mix, "experiment_name=mine").recover.experiment_name == "mine"


@pytest.mark.parametrize(("saved", "theirs", "ours"), [
    ({"domain": "mock", "train_split": "all"}, "domain=mock, econfig.train_split=all",
     "domain=airline, econfig.train_split=train"),
    ({"domain": None, "mix": {"airline": 1, "retail": 1}}, "domain=null, econfig.mix={airline:1,retail:1}",
     "domain=airline, econfig.mix=null"),
    ({"domain_modules": ["library_desk"]}, "domain_modules=[library_desk]", "domain_modules=[]"),
])
def test_a_state_saved_for_other_tasks_is_refused_naming_both(tmp_path, saved, theirs, ours):
    """Same steps per epoch, other tasks: resuming would train this config from another run's state."""
    config = _config(tmp_path)
    paths = recover_paths(config)
    _write_state(paths, 4, "s", per_epoch=1)
    marker = paths.info / tau2_recover.SAVED_MARKER
    marker.write_text(json.dumps({"global_step": 4, "saved_at": 1.0, "trains_on": trains_on(config)}))
    assert check_recover(config) == [] and describe_recover(config).endswith("resumes at step 6")
    record = {**trains_on(config), **saved}
    marker.write_text(json.dumps({"global_step": 4, "saved_at": 1.0, "trains_on": record}))
    assert check_recover(config) == [
        f"the saved state in {paths.info} was saved by a run with econfig.{theirs}, this config has "
        f"econfig.{ours}; use another trial_name or experiment_name, or delete {paths.save_root}"]
    assert check_recover(config, check_state=False) == []  # e.g. a finished smoke run's, which it drops


# ---------------------------------------------------------------------------------------------
# A second controller


def test_a_second_controller_of_a_live_trial_is_refused_before_it_touches_the_first_ones_files(tmp_path):
    config = _config(tmp_path, "econfig.domain=mock", "econfig.train_split=all", "econfig.valid_split=null",
                     "valid_dataset=null", "train_dataset.batch_size=2", "++total_train_steps=3")
    paths = recover_paths(config)
    dump = Path(config.econfig.dump_dir) / "mock" / "t1" / "a.json"
    dump.parent.mkdir(parents=True)
    dump.write_text("{}")
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        paths.save_root.mkdir(parents=True)
        paths.controller_file.write_text(json.dumps({
            "pid": first.pid, "create_time": psutil.Process(first.pid).create_time(),
            "host": os.uname().nodename, "argv": ["tau2_train.py", "seed=1"]}))
        expected = (f"another controller of {config.experiment_name}/{config.trial_name} is running "
                    f"(pid {first.pid}: tau2_train.py seed=1) with its files in {config.cluster.fileroot}; "
                    "stop it first, or give this run its own trial_name or cluster.fileroot")
        assert expected in check_recover(config)
        with pytest.raises(RuntimeError) as refused:
            prepare_resume(config)
        assert str(refused.value) == expected
        assert dump.is_file() and json.loads(paths.controller_file.read_text())["pid"] == first.pid
    finally:
        first.kill()
        first.wait()
    assert prepare_resume(config) is None  # the first one ended: this run may go on
