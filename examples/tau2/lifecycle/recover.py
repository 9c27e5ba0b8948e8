"""Kill-safe saves, and what a rerun of a killed run's command finds, checks and cleans up.

AReaL 1.0.4 overwrites its recover state in place, and a kill mid-save leaves a torn state from which it
starts over at step 1 without a word; so saves go to `<dir>.next` and are swapped in behind a journal
(`AtomicRecoverHandler`). A rerun (`prepare_resume`) stops the trial's leftover workers, finishes or undoes
an interrupted save (`repair`), and drops what the steps that run again wrote. `check_recover` refuses a
state saved for other tasks (`trains_on`).
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from areal.api import SaveLoadMeta
from areal.utils.recover import RecoverHandler
from areal.utils.saver import Saver

from examples.tau2.episode import record as episode_record
from examples.tau2.lifecycle.reaper import alive, cancel_jobs, stop_process_trees, worker_processes
from examples.tau2.lifecycle.watchdog import CONTROL
from examples.tau2.runtime.files import write_atomic

logger = logging.getLogger("tau2_areal.recover")

ENABLED_MODES = ("auto", "on")
JOURNAL = "recover_commit.json"
"""Written once a save is complete in `.next`; removed once it is swapped in."""
SAVED_MARKER = "tau2_saved.json"
"""In `recover_info/`: the saved step, when the save was committed and what the run trains on."""
UNRECORDED = "saved without a record of what it was trained on: its domain and split are not checked"
INFO_FILES = ("step_info.json", "saver_info.json", "evaluator_info.json", "stats_logger_info.json",
              "checkpoint_info.json", "dataloader_info.pkl")
"""What AReaL's `RecoverInfo.load` reads; one missing or torn and AReaL starts over from step 1."""


def enabled(config: Any) -> bool:
    return config.recover.mode in ENABLED_MODES


@dataclass(frozen=True)
class RecoverPaths:
    """Where AReaL keeps a trial's recover state (`Saver.get_save_root`, without creating anything)."""

    save_root: Path
    info: Path
    checkpoints: tuple[Path, ...]
    """`<save_root>/<engine>/recover_checkpoint`: `default` (the actor) and `critic` when there is one."""

    @property
    def journal(self) -> Path:
        return self.save_root / JOURNAL

    @property
    def controller_file(self) -> Path:
        """The pid, start time, host and command of the trial's controller."""
        return self.save_root / "controller.json"

    @property
    def swapped(self) -> tuple[Path, ...]:
        """The directories a save replaces together."""
        return (self.info, *self.checkpoints)


def recover_paths(config: Any) -> RecoverPaths:
    r = config.recover
    root = Path(r.fileroot) / "checkpoints" / getpass.getuser() / r.experiment_name / r.trial_name
    engines = ["default"] + (["critic"] if getattr(config, "critic", None) is not None else [])
    return RecoverPaths(root, root / "recover_info", tuple(root / e / "recover_checkpoint" for e in engines))


def staged(path: Path) -> Path:
    return path.with_name(path.name + ".next")


def previous(path: Path) -> Path:
    return path.with_name(path.name + ".prev")


def trains_on(config: Any) -> dict[str, Any]:
    """What a run trains on, recorded with each save, as plain JSON (compared as loaded)."""
    e = config.econfig
    record = {"domain": e.domain, "mix": e.mix or None, "train_split": e.train_split,
              "domain_modules": sorted(e.domain_modules)}
    return json.loads(json.dumps(record, sort_keys=True, default=str))


def commit(paths: RecoverPaths, global_step: int, trained_on: dict[str, Any]) -> None:
    """Swap the complete save in `.next` in (called once every `.next` directory is written)."""
    write_atomic(staged(paths.info) / SAVED_MARKER, json.dumps(
        {"global_step": global_step, "saved_at": time.time(), "trains_on": trained_on}))
    CONTROL.committing = (global_step, paths.journal)
    write_atomic(paths.journal, json.dumps({"global_step": global_step}))
    CONTROL.saved_step, CONTROL.committing = global_step, None
    _roll_forward(paths)


def _roll_forward(paths: RecoverPaths) -> None:
    for live in paths.swapped:
        if staged(live).exists():
            if live.exists():
                shutil.rmtree(previous(live), ignore_errors=True)
                live.rename(previous(live))
            staged(live).rename(live)
    for live in paths.swapped:
        shutil.rmtree(previous(live), ignore_errors=True)
    paths.journal.unlink(missing_ok=True)


def repair(paths: RecoverPaths) -> str:
    """Finish a save whose swap a kill interrupted, or undo one that was not complete; '' if neither."""
    if paths.journal.exists():
        step = json.loads(paths.journal.read_text())["global_step"]  # written whole (write_atomic)
        _roll_forward(paths)
        return f"completed the swap-in of the state saved at step {step + 1}"
    if not any(p.exists() for live in paths.swapped for p in (staged(live), previous(live))):
        return ""
    for live in paths.swapped:
        shutil.rmtree(staged(live), ignore_errors=True)
        if not live.exists() and previous(live).exists():
            previous(live).rename(live)
        shutil.rmtree(previous(live), ignore_errors=True)
    return "discarded a save that a kill interrupted before it was complete"


@dataclass(frozen=True)
class SavedState:
    global_step: int
    """The last step whose state was saved (0-based, as AReaL counts); a rerun starts at the next."""
    steps_per_epoch: int
    saved_at: float
    """When the save was committed (Unix time): later episode dumps were never trained on."""
    trains_on: dict[str, Any] | None = None
    """What the saving run trained on (`trains_on`); None for a state saved without that record."""


def saved_state(paths: RecoverPaths) -> SavedState | None:
    """The state a rerun resumes from, or None when there is none (AReaL then starts at step 1)."""
    if not all((paths.info / f).is_file() for f in INFO_FILES):
        return None
    try:
        step = json.loads((paths.info / "step_info.json").read_text())
        global_step, per_epoch = int(step["global_step"]), int(step["steps_per_epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if global_step < 0:
        return None
    try:
        marker = json.loads((paths.info / SAVED_MARKER).read_text())
        saved_at = float(marker["saved_at"])
    except (OSError, ValueError, KeyError, TypeError):  # saved by AReaL's own handler
        return SavedState(global_step, per_epoch, (paths.info / "step_info.json").stat().st_mtime)
    record = marker.get("trains_on")
    return SavedState(global_step, per_epoch, saved_at, record if isinstance(record, dict) else None)


def live_controller(config: Any, paths: RecoverPaths) -> str:
    """One sentence if another controller of this trial runs on this machine (it would take over its
    files), else ''."""
    try:
        rec = json.loads(paths.controller_file.read_text())
        pid, started = int(rec["pid"]), float(rec["create_time"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    if rec.get("host") != os.uname().nodename or pid == os.getpid() or not alive(pid, started):
        return ""
    command = " ".join(rec.get("argv") or [])[:200]
    return (f"another controller of {config.experiment_name}/{config.trial_name} is running "
            f"(pid {pid}: {command}) with its files in {config.cluster.fileroot}; "
            "stop it first, or give this run its own trial_name or cluster.fileroot")


class SaveWhenAsked:
    """AReaL's save frequency (`EpochStepTimeFreqCtl`), plus one save when asked: a run told to stop saves
    the step it ends (`Tau2PPOTrainer._export_and_commit_stats`) whatever `recover.freq_*` say."""

    def __init__(self, inner: Any):
        self.inner, self.asked = inner, False

    def save_next(self) -> None:
        self.asked = True

    def check(self, epochs: int, steps: int) -> bool:
        due = self.inner.check(epochs=epochs, steps=steps)  # keeps AReaL's counters going either way
        asked, self.asked = self.asked, False
        return due or asked

    def __getattr__(self, name: str) -> Any:  # the rest (state_dict, load_state_dict): AReaL's
        return getattr(self.inner, name)


class AtomicRecoverHandler(RecoverHandler):
    """AReaL's recover handler writing each save (checkpoint and info files) to `.next` directories, which
    `commit` swaps in behind a journal; a rerun finishes or undoes an interrupted swap (`repair`) before
    AReaL looks."""

    def __init__(self, config: Any, ft_spec: Any, paths: RecoverPaths, run_config: Any):
        super().__init__(config, ft_spec)
        self.paths, self.run_config = paths, run_config

    @classmethod
    def adopt(cls, handler: RecoverHandler, run_config: Any) -> AtomicRecoverHandler:
        """The same handler state (frequency timers, last step) with atomic saves of `run_config`'s run."""
        new = cls(handler.config, handler.ft_spec, recover_paths(run_config), run_config)
        new.freq_ctl, new.last_step_info = SaveWhenAsked(handler.freq_ctl), handler.last_step_info
        return new

    def recover_info_path(self, *_: Any) -> str:  # type: ignore[override]
        """Where `dump` writes the info files: the staging directory (`load` ran before adoption)."""
        return str(staged(self.paths.info))

    def _save_checkpoint(self, engine: Any, name: str = "default", tokenizer: Any = None,
                         processor: Any = None, base_model_path: str | None = None) -> None:
        live = Saver.get_recover_checkpoint_path(self.config.experiment_name, self.config.trial_name,
                                                 self.config.fileroot, name=name)
        path = staged(Path(live))
        shutil.rmtree(path, ignore_errors=True)
        # DCP ignores the tokenizer, which AReaL would archive, send and rebuild in each worker every save
        engine.save(SaveLoadMeta(path=str(path), weight_format="dcp", base_model_path=base_model_path,
                                 with_optim=not self.config.no_save_optim))

    def dump(self, engine: Any, step_info: Any, *args: Any, **kwargs: Any) -> None:
        shutil.rmtree(staged(self.paths.info), ignore_errors=True)
        start = time.perf_counter()
        super().dump(engine, step_info, *args, **kwargs)
        if self.last_step_info is not step_info:  # not due at this step
            return
        commit(self.paths, step_info.global_step, trains_on(self.run_config))
        logger.info("saved the recover state of step %d in %.1f s (%s)", step_info.global_step + 1,
                    time.perf_counter() - start, self.paths.save_root)


def trim_stats(path: Path, last_step: int | None) -> int:
    """Keep the lines of `stats.jsonl` up to global step `last_step` (None: none), each step once,
    and no torn line; returns how many lines were dropped."""
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept, seen = [], set()
    for line in lines:
        try:
            step = int(json.loads(line)["global_step"])
        except (ValueError, KeyError, TypeError):
            continue
        if last_step is not None and step <= last_step and step not in seen:
            seen.add(step)
            kept.append(line)
    if len(kept) != len(lines):
        write_atomic(path, "".join(f"{x}\n" for x in kept))
    return len(lines) - len(kept)


def supersede_dumps(dump_dir: Path, since: float) -> tuple[int, Path | None]:
    """Move episode dumps written after `since` (Unix time) to `<dump_dir>.superseded/<time>/`, and delete
    half-written temporary files; (files moved, where to)."""
    target = dump_dir.with_name(dump_dir.name + ".superseded") / time.strftime("%Y%m%d-%H%M%S")
    moved = episode_record.supersede_dumps(dump_dir, target, lambda f: f.stat().st_mtime > since)
    return moved, (target if moved else None)


def steps_per_epoch(config: Any, train_rows: int) -> int:
    """Training steps in one epoch of `train_rows` rows, as AReaL's dataloader makes them."""
    batch = config.train_dataset.batch_size
    if batch < 1:  # check_values
        return 0
    return train_rows // batch if config.train_dataset.drop_last else -(-train_rows // batch)


def prepare_resume(config: Any, stats_path: Path | None = None) -> SavedState | None:
    """Before `PPOTrainer` starts: stop leftover workers and jobs, repair an interrupted save, and drop the
    stats lines and episode dumps of steps that run again, logging each; returns the state it resumes from."""
    paths = recover_paths(config)
    if other := live_controller(config, paths):
        raise RuntimeError(other)
    if config.scheduler.type == "local" and (stopped := stop_process_trees(worker_processes(
            config.experiment_name, config.trial_name, config.cluster.fileroot))):
        logger.warning("stopped %d leftover process(es) of a previous controller of this trial: %s",
                       len(stopped), stopped)
    cancel_jobs(config, logger)  # a previous controller's jobs (it is not running: checked above)
    if paths.save_root.is_dir() and (repaired := repair(paths)):
        logger.warning("recover state: %s", repaired)
    state = saved_state(paths) if enabled(config) else None
    if state is not None:
        logger.info("resuming: the state saved after step %d is in %s; training continues at step %d",
                    state.global_step + 1, paths.save_root, state.global_step + 2)
        if state.trains_on is None:
            logger.warning("the saved state in %s: %s", paths.info, UNRECORDED)
        if stats_path is not None and (dropped := trim_stats(stats_path, state.global_step)):
            logger.info("dropped %d line(s) of %s after step %d (those steps run again)", dropped,
                        stats_path, state.global_step + 1)
    dump_dir = getattr(config.econfig, "dump_dir", "")
    if dump_dir and enabled(config):
        # Resuming: dumps after the save were never trained on. Starting over (no saved state): every
        # dump is from an earlier run of this trial (killed before its first save, or finished).
        moved, moved_to = supersede_dumps(Path(dump_dir), state.saved_at if state else float("-inf"))
        if moved:
            logger.info("moved %d episode dump file(s) of rollouts this run does not continue (written "
                        "after the saved state, or by an earlier run of the trial) to %s", moved, moved_to)
    write_atomic(paths.controller_file, json.dumps({
        "pid": os.getpid(), "create_time": psutil.Process().create_time(), "host": os.uname().nodename,
        "argv": sys.argv}))
    CONTROL.resumed_from = CONTROL.saved_step = state.global_step if state is not None else None
    return state


def check_recover(config: Any, check_state: bool = True) -> list[str]:
    """Problems with the `recover` section and (`check_state`) the saved state a run resumes from."""
    r = config.recover
    errors: list[str] = []  # recover.mode itself AReaL checks (RecoverConfig.__post_init__)
    if not enabled(config):
        return errors
    if not any(f is not None for f in (r.freq_steps, r.freq_epochs, r.freq_secs)):
        errors.append("recover.mode=auto saves nothing without recover.freq_steps, freq_epochs or freq_secs, "
                      "so a rerun would start over")
    for name in ("freq_steps", "freq_epochs", "freq_secs"):
        if (value := getattr(r, name)) is not None and value < 1:
            errors.append(f"recover.{name}={value} must be at least 1 (or null)")
    for name, own, top in (("experiment_name", r.experiment_name, config.experiment_name),
                           ("trial_name", r.trial_name, config.trial_name),
                           ("fileroot", r.fileroot, config.cluster.fileroot)):
        if own != top:
            key = "cluster.fileroot" if name == "fileroot" else name
            errors.append(f"recover.{name}={own} differs from {key}={top}: a rerun of this trial would not "
                          "find its saved state")
    if getattr(config.rollout, "_version", "v1") == "v2":
        errors.append("recover.mode=auto does not work with rollout._version=v2 (AReaL 1.0.4 refuses it)")
    paths = recover_paths(config)
    if other := live_controller(config, paths):
        errors.append(other)
    if paths.journal.exists() or any(staged(p).exists() for p in paths.swapped):
        return errors  # an interrupted save: the run repairs it before it looks at the state
    state = saved_state(paths)
    if state is None or not check_state:
        return errors
    if missing := [c for c in paths.checkpoints if not (c / ".metadata").is_file()]:
        errors.append(f"the saved state in {paths.info} has no checkpoint in {missing[0]}; delete "
                      f"{paths.save_root} to start over")
    rows = train_row_count(config)
    per_epoch = steps_per_epoch(config, rows) if rows is not None else None
    if per_epoch is not None and per_epoch != state.steps_per_epoch:
        errors.append(f"the saved state in {paths.info} is from a run with {state.steps_per_epoch} steps "
                      f"per epoch, this config has {per_epoch}; use another trial_name or delete "
                      f"{paths.save_root}")
    ours = trains_on(config)
    if state.trains_on is not None and (keys := sorted(k for k in set(state.trains_on) | set(ours)
                                                       if state.trains_on.get(k) != ours.get(k))):
        theirs, mine = (", ".join(f"econfig.{k}={_override(rec.get(k))}" for k in keys)
                        for rec in (state.trains_on, ours))
        errors.append(f"the saved state in {paths.info} was saved by a run with {theirs}, this config has "
                      f"{mine}; use another trial_name or experiment_name, or delete {paths.save_root}")
    return errors


def _override(value: Any) -> str:
    """A recorded value as a command line would give it: null, [a,b], {a:1,b:2}."""
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(_override(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_override(v)}" for k, v in value.items()) + "}"
    return str(value)


def train_row_count(config: Any) -> int | None:
    try:
        from examples.tau2.settings import dataset as tau2_dataset

        return len(tau2_dataset.train_rows(config.econfig, config.seed))
    except Exception:  # an unknown domain or split: validate() reports it
        return None


def describe_recover(config: Any) -> str:
    """The plan's `recover` line: how often state is saved, where, and where a rerun would start."""
    if not enabled(config):
        return "disabled: a killed run starts over from step 1 when rerun"
    r = config.recover
    every = ", ".join(f"{v} {unit}" for v, unit in ((r.freq_steps, "step(s)"), (r.freq_epochs, "epoch(s)"),
                                                   (r.freq_secs, "s")) if v is not None) or "never"
    paths = recover_paths(config)
    state = saved_state(paths)
    where = ("no saved state: starts at step 1" if state is None else
             f"state saved after step {state.global_step + 1}: a run resumes at step {state.global_step + 2}"
             + ("" if state.trains_on is not None else f" ({UNRECORDED})"))
    return f"{r.mode}, every {every}, in {paths.save_root}; {where}"
