"""Atomic writes, canonical hashes and the newest saved model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from examples.tau2.runtime.files import (
    dump_json,
    fingerprint,
    latest_saved_model,
    write_atomic,
    write_bytes_atomic,
)


def test_write_atomic_replaces_whole_file(tmp_path):
    p = tmp_path / "a" / "b.txt"
    write_atomic(p, "one")
    write_atomic(p, "two")
    assert p.read_text() == "two" and [f.name for f in p.parent.iterdir()] == ["b.txt"]
    umask = os.umask(0)
    os.umask(umask)
    assert p.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    p = tmp_path / "results.json"
    dump_json(p, {"a": 1})

    def fail(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_bytes_atomic(p, b"{}")
    assert json.loads(p.read_text()) == {"a": 1} and [f.name for f in tmp_path.iterdir()] == ["results.json"]


def test_fingerprint_is_canonical():
    assert fingerprint({"b": 1, "a": [1, "é"]}) == fingerprint({"a": [1, "é"], "b": 1})
    assert fingerprint("x") != fingerprint(["x"]) and len(fingerprint("x")) == 64


def test_latest_saved_model_is_the_newest_model_dir(tmp_path):
    from areal.utils.saver import Saver

    saver = SimpleNamespace(experiment_name="e", trial_name="t", fileroot=str(tmp_path))
    assert latest_saved_model(saver) is None
    root = Path(Saver.get_save_root(saver.experiment_name, saver.trial_name, saver.fileroot))
    for i, step in enumerate(("globalstep1", "globalstep2")):
        (root / step).mkdir(parents=True)
        (root / step / "config.json").write_text("{}")
        os.utime(root / step / "config.json", (1000 + i, 1000 + i))
    assert latest_saved_model(saver) == root / "globalstep2"
