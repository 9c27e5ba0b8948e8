"""bench/bench_bytecode.py's two modes, on a module of the standard library: with an empty `pycache_prefix`
Python looks for bytecode only in that folder (finding none, it compiles from source) and, not allowed to
write, leaves it empty."""

from __future__ import annotations

import subprocess
import sys

from bench import bench_bytecode

PROBE = "import json.decoder; print(json.decoder.__cached__)"


def test_from_source_mode_looks_in_an_empty_folder_and_writes_nothing(tmp_path):
    wall, cpu = bench_bytecode.timed_import(sys.executable, "import json.decoder", str(tmp_path))
    assert wall > 0 and cpu > 0
    assert not list(tmp_path.iterdir())
    looked = subprocess.run([sys.executable, "-X", f"pycache_prefix={tmp_path}", "-c", PROBE],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert looked.startswith(str(tmp_path))
    default = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                             check=True).stdout.strip()
    assert "__pycache__" in default and not default.startswith(str(tmp_path))
