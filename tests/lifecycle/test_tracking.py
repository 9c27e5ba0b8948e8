"""Experiment tracking through AReaL's own `StatsLogger`, offline: TensorBoard event files and a W&B
offline run directory, read back; the WANDB_MODE trap; the pre-flight checks and the `--dry-run` line."""

from __future__ import annotations

import os
import struct
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import wandb
from areal.api import FinetuneSpec
from areal.utils.stats_logger import StatsLogger

from examples.tau2.lifecycle.tracking import apply_tracking_env, check_tracking, describe_tracking, wandb_dir
from examples.tau2.tau2_train import main
from tests.tau2_train_support import CONFIG, clean_overrides, load

SPEC = FinetuneSpec(total_train_epochs=1, dataset_size=24, train_batch_size=8)


@pytest.fixture
def offline(monkeypatch, tmp_path) -> Iterator[None]:
    """No W&B credentials and no WANDB_MODE; W&B's own files under tmp_path; a fresh W&B singleton."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.setenv(name, "x")  # recorded, so that teardown restores whatever was there
        monkeypatch.delenv(name)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()
    yield
    wandb.teardown()


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from TensorBoard event files (TFRecord framing, tensorboardX's protos)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4  # length, its crc, the event, its crc
            for value in event.summary.value:
                out[value.tag].append((event.step, value.simple_value))
    return dict(out)


def wandb_history(run_dir: Path) -> list[dict[str, str]]:
    """The logged rows of a W&B offline run (its `.wandb` record file)."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    [path] = run_dir.glob("run-*.wandb")
    store = datastore.DataStore()
    store.open_for_scan(str(path))
    rows = []
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append({item.key or "/".join(item.nested_key): item.value_json for item in items})
    return rows


def test_tensorboard_and_wandb_offline_through_areal_stats_logger(offline, tmp_path):
    config = load(f"cluster.fileroot={tmp_path / 'fileroot'}", "stats_logger.wandb.mode=offline",
                  f"stats_logger.tensorboard.path={tmp_path / 'tb'}").config
    assert check_tracking(config) == []
    apply_tracking_env(config)
    assert os.environ["WANDB_MODE"] == "offline"
    logger = StatsLogger(config, SPEC)  # what PPOTrainer builds in the controller
    for step in range(3):
        logger.commit(epoch=0, step=step, global_step=step, data={
            "rollout/tau2/tau2_reward": 0.25 * step, "curriculum/bucket/partial": float(step),
            "rollout/tau2/tau2_reward__count": 8.0})
    logger.close()

    scalars = tensorboard_scalars(tmp_path / "tb")
    assert scalars["rollout/tau2/tau2_reward"] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert scalars["curriculum/bucket/partial"] == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert not any(tag.endswith("__count") for tag in scalars)  # AReaL drops the counters

    [run_dir] = Path(wandb_dir(config)).glob("offline-run-*")
    assert run_dir.name.endswith(f"{config.experiment_name}_{config.trial_name}_train")
    history = wandb_history(run_dir)
    assert [(row["_step"], row["rollout/tau2/tau2_reward"], row["curriculum/bucket/partial"])
            for row in history] == [("0", "0", "0"), ("1", "0.25", "1"), ("2", "0.5", "2")]


def test_offline_wandb_without_wandb_mode_fails_in_areal(offline, tmp_path):
    """Why `apply_tracking_env` exists: AReaL calls `wandb.login()` for any mode but disabled, which asks
    for an API key unless WANDB_MODE=offline is set, even when the config says offline."""
    config = load(f"cluster.fileroot={tmp_path / 'fileroot'}", "stats_logger.wandb.mode=offline").config
    with pytest.raises(wandb.errors.UsageError, match="No API key configured"):
        StatsLogger(config, SPEC)


def test_checks_and_plan_line(tmp_path):
    default = load().config
    assert (check_tracking(default, environ={}), describe_tracking(default)) == ([], "console")
    assert check_tracking(default, environ={"WANDB_MODE": "online"}) == []  # W&B off: no matter

    offline = load("stats_logger.wandb.mode=offline", "stats_logger.tensorboard.path=/runs/tb",
                   "++stats_logger.trackio.mode=local").config
    assert check_tracking(offline, environ={"WANDB_MODE": "offline"}) == []
    assert check_tracking(offline, environ={"WANDB_MODE": "online"}) == [
        "stats_logger.wandb.mode=offline but WANDB_MODE=online in the environment; unset WANDB_MODE or make "
        "them agree"]
    assert describe_tracking(offline) == (
        "console, TensorBoard in /runs/tb, W&B offline (project tau2-airline, files in "
        f"{wandb_dir(offline)}), trackio local")
    assert check_tracking(load("stats_logger.tensorboard.path=''").config, environ={}) == [
        "stats_logger.tensorboard.path is empty; give a directory or null (no TensorBoard)"]

    env: dict[str, str] = {}
    apply_tracking_env(default, env)
    assert env == {}
    apply_tracking_env(offline, env)
    assert env == {"WANDB_MODE": "offline"}
    mine = {"WANDB_MODE": "disabled"}
    apply_tracking_env(offline, mine)
    assert mine == {"WANDB_MODE": "disabled"}  # the user's own setting stays (and check_tracking says so)


def test_dry_run_shows_tracking(capsys, tmp_path, endpoint, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    overrides = [*clean_overrides(tmp_path, endpoint.url), f"stats_logger.tensorboard.path={tmp_path / 'tb'}",
                 "stats_logger.wandb.mode=offline"]
    rc = main(["--config", str(CONFIG), *overrides, "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0, out
    files = wandb_dir(load(*overrides).config)
    assert (f"  tracking        console, TensorBoard in {tmp_path / 'tb'}, W&B offline (project "
            f"tau2-airline, files in {files})") in out.splitlines()
    assert files.startswith(f"{tmp_path}/fileroot/logs/")
    assert not (tmp_path / "tb").exists() and not (tmp_path / "fileroot").exists()  # nothing created
