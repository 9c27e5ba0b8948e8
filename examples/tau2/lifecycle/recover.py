"""Resuming a killed training run: what a rerun of the same command finds, checks and cleans up.

AReaL 1.0.4 saves the trainer's state every `recover.freq_steps` steps when `recover.mode` is `auto`
(or `on`: the same) -- weights and optimizer as a DCP checkpoint in
`<fileroot>/checkpoints/<user>/<experiment>/<trial>/default/recover_checkpoint`, and the step, the
dataloader, saver, evaluator and stats-logger states in `.../recover_info/` -- and `PPOTrainer` loads
them when a rerun with the same experiment, trial and fileroot finds them. A `kill -9` can land
anywhere, so a rerun (`prepare_resume`, before `PPOTrainer` starts) first:

1. stops leftover workers of the trial, which do not notice that their controller died
   (`lifecycle/reaper.py`, whose watcher does the same while the controller lives);
2. finishes or undoes a save the kill interrupted (`repair`): saves go to `<dir>.next` first and are
   swapped in after a journal is written (`AtomicRecoverHandler`, below), because AReaL
   overwrites its one checkpoint in place and a torn info file makes it start over from step 1 without a word;
3. drops the lines of `stats.jsonl` after the saved step (those steps run again: `trim_stats`), and moves
   episode dumps written after the save, whose rollouts were never trained, to
   `<dump_dir>.superseded/<time>/` (`supersede_dumps`), removing half-written temporary files.

`check_recover` (in `--dry-run` and before every run) and `describe_recover` (the plan's line) say what
a rerun would do. Each save records what the run trains on (`trains_on`: domain or mix, split, domain
modules), and `check_recover` refuses a state saved for other tasks, whatever its step count.
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

from areal.api import SaveLoadMeta
from areal.utils.recover import RecoverHandler
from areal.utils.saver import Saver

from examples.tau2.lifecycle.reaper import cancel_jobs, stop_leftover_workers
from examples.tau2.lifecycle.watchdog import CONTROL
from examples.tau2.runtime.files import write_atomic

logger = logging.getLogger("tau2_areal.recover")

ENABLED_MODES = ("auto", "on")
STAGED, PREVIOUS = ".next", ".prev"
JOURNAL = "recover_commit.json"
"""Written (atomically) once a save is complete in `.next`; removed once it is swapped in."""
SAVED_MARKER = "tau2_saved.json"
"""In `recover_info/`: the saved step, the time the save was committed and what the run trains on."""
CONTROLLER_FILE = "controller.json"
"""In the save root: pid, start time and host of the controller that runs (or ran) the trial."""
SUPERSEDED = ".superseded"
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
        return self.save_root / CONTROLLER_FILE

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
    return path.with_name(path.name + STAGED)


def previous(path: Path) -> Path:
    return path.with_name(path.name + PREVIOUS)


# ---------------------------------------------------------------------------------------------
# Atomic saves: swap `.next` in after a journal, and finish or undo an interrupted swap


def trains_on(config: Any) -> dict[str, Any]:
    """What a run trains on, recorded with each save: a state saved for other tasks must not be resumed
    (`check_recover`), whatever its step count."""
    e = config.econfig
    record = {"domain": e.domain, "mix": e.mix or None, "train_split": e.train_split,
              "domain_modules": sorted(e.domain_modules)}
    return json.loads(json.dumps(record, sort_keys=True, default=str))  # plain JSON: compared as loaded


def commit(paths: RecoverPaths, global_step: int, trained_on: dict[str, Any]) -> None:
    """Swap the complete save in `.next` in (called once every `.next` directory is written)."""
    write_atomic(staged(paths.info) / SAVED_MARKER, json.dumps(
        {"global_step": global_step, "saved_at": time.time(), "trains_on": trained_on}))
    write_atomic(paths.journal, json.dumps({"global_step": global_step}))
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


def _roll_back(paths: RecoverPaths) -> None:
    for live in paths.swapped:
        shutil.rmtree(staged(live), ignore_errors=True)
        if not live.exists() and previous(live).exists():
            previous(live).rename(live)
        shutil.rmtree(previous(live), ignore_errors=True)


def repair(paths: RecoverPaths) -> str:
    """Finish a save whose swap a kill interrupted, or undo one that was not complete; '' if neither."""
    if paths.journal.exists():
        step = json.loads(paths.journal.read_text() or "{}").get("global_step", "?")
        _roll_forward(paths)
        shown = step + 1 if isinstance(step, int) else step
        return f"completed the swap-in of the state saved at step {shown}"
    leftovers = [p for live in paths.swapped for p in (staged(live), previous(live)) if p.exists()]
    if leftovers:
        _roll_back(paths)
        return "discarded a save that a kill interrupted before it was complete"
    return ""


# ---------------------------------------------------------------------------------------------
# The saved state


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


def missing_checkpoints(paths: RecoverPaths) -> list[Path]:
    """Recover checkpoints that a resume would need but that hold no DCP checkpoint."""
    return [c for c in paths.checkpoints if not (c / ".metadata").is_file()]


def clear_saved_state(paths: RecoverPaths) -> None:
    """Forget the saved state (the next run starts at step 1)."""
    for live in paths.swapped:
        for p in (live, staged(live), previous(live)):
            shutil.rmtree(p, ignore_errors=True)
    paths.journal.unlink(missing_ok=True)


def live_controller(paths: RecoverPaths) -> dict[str, Any] | None:
    """The recorded controller of this trial if it still runs on this machine (not this process)."""
    import psutil

    try:
        rec = json.loads(paths.controller_file.read_text())
        pid, started = int(rec["pid"]), float(rec["create_time"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if rec.get("host") != os.uname().nodename or pid == os.getpid():
        return None
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - started) > 1e-3 or p.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    return rec


def another_controller(config: Any, other: dict[str, Any]) -> str:
    """One sentence on a live controller of this trial: a second one would take over its files."""
    command = " ".join(other.get("argv") or [])[:200]
    return (f"another controller of {config.experiment_name}/{config.trial_name} is running "
            f"(pid {other['pid']}: {command}) with its files in {config.cluster.fileroot}; "
            "stop it first, or give this run its own trial_name or cluster.fileroot")


def record_controller(paths: RecoverPaths) -> None:
    import psutil

    paths.save_root.mkdir(parents=True, exist_ok=True)
    write_atomic(paths.controller_file, json.dumps({
        "pid": os.getpid(), "create_time": psutil.Process().create_time(), "host": os.uname().nodename,
        "argv": sys.argv}))


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

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


class AtomicRecoverHandler(RecoverHandler):
    """AReaL's recover handler writing each save to `.next` directories and swapping them in at once.

    AReaL's `dump` overwrites `default/recover_checkpoint` (DCP) and the files of `recover_info/` in place:
    a kill during a save leaves a checkpoint of one step with the info of another, or a torn info file, and
    then `RecoverHandler.load` logs a warning and trains from step 1 over the old run. Here both go to
    `<dir>.next` and `commit` swaps them in behind a journal; a rerun finishes or undoes an
    interrupted swap (`repair`) before AReaL looks.
    """

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
        engine.save(SaveLoadMeta(path=str(path), weight_format="dcp",
                                 with_optim=not self.config.no_save_optim, tokenizer=tokenizer,
                                 processor=processor, base_model_path=base_model_path))

    def dump(self, engine: Any, step_info: Any, *args: Any, **kwargs: Any) -> None:
        shutil.rmtree(staged(self.paths.info), ignore_errors=True)
        start = time.perf_counter()
        super().dump(engine, step_info, *args, **kwargs)
        if self.last_step_info is not step_info:  # not due at this step
            return
        commit(self.paths, step_info.global_step, trains_on(self.run_config))
        CONTROL.saved_step = step_info.global_step  # at once: a SIGTERM from here on reports this step saved
        logger.info("saved the recover state of step %d in %.1f s (%s)", step_info.global_step + 1,
                    time.perf_counter() - start, self.paths.save_root)


# ---------------------------------------------------------------------------------------------
# What a resumed run cleans up: stats lines and episode dumps after the saved step


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
    """Move episode dumps written after `since` (Unix time) to `<dump_dir>.superseded/<time>/`, keeping
    their relative paths, and delete half-written temporary files; (files moved, where to)."""
    from examples.tau2.episode.dump import supersede_dumps as move_aside

    target = dump_dir.with_name(dump_dir.name + SUPERSEDED) / time.strftime("%Y%m%d-%H%M%S")
    moved = move_aside(dump_dir, target, lambda f: f.stat().st_mtime > since)
    return moved, (target if moved else None)


@dataclass(frozen=True)
class ResumePlan:
    """What `prepare_resume` found and did."""

    state: SavedState | None
    stopped_workers: list[int]
    repaired: str
    stats_lines_dropped: int
    dumps_moved: int
    dumps_moved_to: Path | None

    @property
    def start_step(self) -> int:
        """The first step this run trains (1-based)."""
        return self.state.global_step + 2 if self.state else 1


def steps_per_epoch(config: Any, train_rows: int) -> int:
    """Training steps in one epoch of `train_rows` rows, as AReaL's dataloader makes them."""
    batch = config.train_dataset.batch_size
    if batch < 1:  # check_values
        return 0
    return train_rows // batch if config.train_dataset.drop_last else -(-train_rows // batch)


def run_steps(config: Any, train_rows: int) -> int:
    """The steps a run trains, as AReaL's loop counts them: `total_train_epochs` x steps per epoch, stopped
    at `total_train_steps`."""
    total = config.total_train_epochs * steps_per_epoch(config, train_rows)
    return total if config.total_train_steps is None else min(total, config.total_train_steps)


def total_steps(config: Any) -> int | None:
    """Steps the run trains in all (`run_steps`), if known: `total_train_steps` when the data is not."""
    rows = _train_rows(config)
    return config.total_train_steps if rows is None else run_steps(config, rows)


def finished(config: Any, state: SavedState) -> bool:
    """Whether `state` is that of a run that trained all of `config`'s steps."""
    total = total_steps(config)
    return total is not None and state.global_step + 1 >= total


def prepare_resume(config: Any, stats_path: Path | None = None, restart_finished: bool = False) -> ResumePlan:
    """Before `PPOTrainer` starts: stop leftover workers, repair an interrupted save, and drop the stats
    lines and episode dumps of steps that will run again. Logs one line per thing it did.

    `restart_finished`: a saved state of a run that trained all its steps is forgotten, so the run starts
    over (the smoke run; AReaL itself would resume it and train nothing)."""
    paths = recover_paths(config)
    other = live_controller(paths)
    if other is not None:
        raise RuntimeError(another_controller(config, other))
    stopped = stop_leftover_workers(config)
    if stopped:
        logger.warning("stopped %d leftover process(es) of a previous controller of this trial: %s",
                       len(stopped), stopped)
    cancel_jobs(config, logger)  # a previous controller's jobs (it is not running: checked above)
    repaired = repair(paths) if paths.save_root.is_dir() else ""
    if repaired:
        logger.warning("recover state: %s", repaired)
    state = saved_state(paths) if enabled(config) else None
    if state is not None and restart_finished and finished(config, state):
        logger.info("the run saved in %s had finished (%d steps): starting a new one", paths.save_root,
                    state.global_step + 1)
        clear_saved_state(paths)
        state = None
    dropped = moved = 0
    moved_to = None
    dump_dir = getattr(config.econfig, "dump_dir", "")
    if state is not None:
        logger.info("resuming: the state saved after step %d is in %s; training continues at step %d",
                    state.global_step + 1, paths.save_root, state.global_step + 2)
        if state.trains_on is None:
            logger.warning("the saved state in %s: %s", paths.info, UNRECORDED)
        if stats_path is not None:
            dropped = trim_stats(stats_path, state.global_step)
        if dropped:
            logger.info("dropped %d line(s) of %s after step %d (those steps run again)", dropped,
                        stats_path, state.global_step + 1)
    if dump_dir and enabled(config):
        # Resuming: dumps after the save were never trained on. Starting over (no saved state): every
        # dump is from an earlier run of this trial (killed before its first save, or finished).
        moved, moved_to = supersede_dumps(Path(dump_dir), state.saved_at if state else float("-inf"))
        if moved:
            logger.info("moved %d episode dump file(s) of rollouts this run does not continue (written "
                        "after the saved state, or by an earlier run of the trial) to %s", moved, moved_to)
    record_controller(paths)
    CONTROL.resumed_from = CONTROL.saved_step = state.global_step if state is not None else None
    return ResumePlan(state, stopped, repaired, dropped, moved, moved_to)


# ---------------------------------------------------------------------------------------------
# Checks and the plan's line


def check_recover(config: Any, restart_finished: bool = False) -> list[str]:
    """Problems with the `recover` section or the saved state a run would resume from, one sentence each
    (`restart_finished`: as `prepare_resume`'s, the state of a finished run is no problem: it is dropped)."""
    r = config.recover
    errors = []
    if r.mode not in (*ENABLED_MODES, "disabled", "off"):
        errors.append(f"recover.mode={r.mode!r} must be auto (resume a rerun) or disabled")
    if not enabled(config):
        return errors
    if not any(f is not None for f in (r.freq_steps, r.freq_epochs, r.freq_secs)):
        errors.append("recover.mode=auto saves nothing without recover.freq_steps, freq_epochs or freq_secs, "
                      "so a rerun would start over")
    freqs = (("freq_steps", r.freq_steps), ("freq_epochs", r.freq_epochs), ("freq_secs", r.freq_secs))
    for name, value in freqs:
        if value is not None and value < 1:
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
    other = live_controller(paths)
    if other is not None:
        errors.append(another_controller(config, other))
    if paths.journal.exists() or any(staged(p).exists() for p in paths.swapped):
        return errors  # an interrupted save: the run repairs it before it looks at the state
    state = saved_state(paths)
    if state is None or (restart_finished and finished(config, state)):
        return errors
    missing = missing_checkpoints(paths)
    if missing:
        errors.append(f"the saved state in {paths.info} has no checkpoint in {missing[0]}; delete "
                      f"{paths.save_root} to start over")
    rows = _train_rows(config)
    per_epoch = steps_per_epoch(config, rows) if rows is not None else None
    if per_epoch is not None and per_epoch != state.steps_per_epoch:
        errors.append(f"the saved state in {paths.info} is from a run with {state.steps_per_epoch} steps "
                      f"per epoch, this config has {per_epoch}; use another trial_name or delete "
                      f"{paths.save_root}")
    if state.trains_on is not None and (differ := _differences(state.trains_on, trains_on(config))):
        errors.append(f"the saved state in {paths.info} was saved by a run with {differ[0]}, this config has "
                      f"{differ[1]}; use another trial_name or experiment_name, or delete {paths.save_root}")
    return errors


def _differences(saved: dict[str, Any], ours: dict[str, Any]) -> tuple[str, str] | None:
    """The settings in which two `trains_on` records differ, as overrides: (saved, ours); None if none."""
    keys = [k for k in sorted(set(saved) | set(ours)) if saved.get(k) != ours.get(k)]
    if not keys:
        return None
    theirs, mine = (", ".join(f"econfig.{k}={_override(record.get(k))}" for k in keys)
                    for record in (saved, ours))
    return theirs, mine


def _override(value: Any) -> str:
    """A recorded value as a command line would give it: null, [a,b], {a:1,b:2}."""
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(_override(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_override(v)}" for k, v in value.items()) + "}"
    return str(value)


def _train_rows(config: Any) -> int | None:
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
