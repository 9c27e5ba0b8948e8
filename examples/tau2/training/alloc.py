"""The old combined `allocation_mode` (`<inference>+<training>`) as AReaL 1.0.4's per-engine backends.

AReaL 1.0.4 reads `rollout.backend`, `actor.backend` and `ref.backend`; the combined string
(`sglang:d4t2+archon:d4p2t1`, `sglang:d8t4+megatron:(attn:d4p4t2|ffn:d2p4e4)`) is deprecated and only
its legacy SPMD launchers read it, and those refuse agent workflows. AReaL's own parser
(`areal.api.alloc_mode`, through `compat.areal_api`) checks the string; the per-engine strings are its
two components verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal.api.alloc_mode import ModelAllocation
from areal.api.cli_args import SchedulingStrategyType

from examples.tau2.compat.areal_api import parse_combined_allocation
from examples.tau2.tau2_utils import first_line

INFERENCE_BACKENDS = ("sglang", "vllm")
TRAIN_BACKENDS = ("fsdp", "megatron", "archon")


@dataclass(frozen=True)
class EngineBackends:
    """Per-engine backend strings, as `rollout.backend` and `actor.backend` (== `ref.backend`) take them."""

    rollout: str
    train: str


def _split_components(mode: str) -> list[str]:
    """Split at `+` outside parentheses (the MoE hybrid syntax nests `|` in parentheses)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(mode):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "+" and depth == 0:
            parts.append(mode[start:i].strip())
            start = i + 1
    parts.append(mode[start:].strip())
    return parts


def same_allocation(a: ModelAllocation, b: ModelAllocation) -> bool:
    """Same backend and the same parallel degrees (names and spelling aside)."""
    return a.backend == b.backend and bool(a.parallel.parallelism_eq(a.parallel, b.parallel))


def parse_backend(spec: str) -> ModelAllocation:
    """One engine's backend string, parsed by AReaL; ValueError with one sentence if it does not parse."""
    try:
        return ModelAllocation.from_str(spec)
    except Exception as e:  # lark and AReaL raise several types, all meaning "bad string"
        raise ValueError(f"backend {spec!r} does not parse: {first_line(e)}") from None


def split_allocation_mode(mode: str) -> EngineBackends:
    """`<inference>+<training>` -> per-engine backends. ValueError with one sentence on anything else."""
    try:
        parsed = parse_combined_allocation(mode)
    except Exception as e:
        raise ValueError(f"allocation_mode {mode!r} does not parse: {first_line(e)}") from None
    if any(a.scheduling_strategy.type == SchedulingStrategyType.colocation for a in parsed.allocations):
        raise ValueError(
            f"allocation_mode {mode!r} colocates engines with '|', which this training entry does not "
            "support; give the inference and the training engine their own GPUs (`<inference>+<training>`)"
        )
    inference = [a for a in parsed.allocations if a.backend in INFERENCE_BACKENDS]
    train = [a for a in parsed.allocations if a.backend in TRAIN_BACKENDS]
    if len(inference) != 1 or len(train) != 1 or len(parsed.allocations) != 2:
        raise ValueError(
            f"allocation_mode {mode!r} must name one inference engine ({'/'.join(INFERENCE_BACKENDS)}) "
            f"and one training engine ({'/'.join(TRAIN_BACKENDS)}), e.g. sglang:d4t2+archon:d4p2t1"
        )
    components = _split_components(mode)
    by_role: dict[str, str] = {}
    for component in components:
        alloc = parse_backend(component)
        role = "rollout" if same_allocation(alloc, inference[0]) else "train"
        if role == "train" and not same_allocation(alloc, train[0]):
            raise ValueError(f"allocation_mode component {component!r} matches neither engine of {mode!r}")
        by_role[role] = component
    if set(by_role) != {"rollout", "train"}:
        raise ValueError(f"allocation_mode {mode!r} does not split into one inference and one training part")
    return EngineBackends(rollout=by_role["rollout"], train=by_role["train"])
