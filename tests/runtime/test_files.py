"""Atomic writes and canonical hashes."""

from __future__ import annotations

import json
import os

import pytest

from examples.tau2.runtime.files import dump_json, fingerprint, write_atomic, write_bytes_atomic


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
