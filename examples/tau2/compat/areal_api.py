"""AReaL 1.0.4 internals that the training entry reads to check a run before it starts.

Each function checks the installed AReaL first (`require_areal`), so a different release fails with one
sentence instead of a check that silently tests the wrong thing.
"""

from __future__ import annotations

import os

from examples.tau2.compat import require_areal

ARCHON_MODEL_TYPES = frozenset(
    {"qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}
)
"""areal 1.0.4's archon model registry (`areal.experimental.models.archon.get_supported_model_types()`,
which takes ~10 s to import); tests/compat/test_areal_api.py keeps the two equal."""


def archon_model_types() -> frozenset[str]:
    """The model types archon can build (`model_type` in a checkpoint's config.json)."""
    require_areal("the archon model list (examples/tau2/compat/areal_api.py)")
    return ARCHON_MODEL_TYPES


def parse_combined_allocation(mode: str):
    """AReaL's parser of the deprecated combined `allocation_mode` (`_AllocationMode`, private).

    Returns its parsed form (`.allocations`: one `ModelAllocation` per engine); raises what the parser
    raises on a malformed string.
    """
    require_areal("the allocation_mode translation (examples/tau2/compat/areal_api.py)")
    from areal.api.alloc_mode import _AllocationMode

    return _AllocationMode.from_str(mode)


def tree_block_size() -> int:
    """The token block a packed tree's size must be a multiple of (`AREAL_FLEX_ATTENTION_BLOCK_SIZE`,
    default 128, read by `areal.models.tree_attn.constants` at import)."""
    require_areal("the tree training checks (examples/tau2/compat/areal_api.py)")
    return int(os.environ.get("AREAL_FLEX_ATTENTION_BLOCK_SIZE", "128"))
