"""The old combined allocation_mode, split into AReaL 1.0.4's per-engine backends by AReaL's parser."""

from __future__ import annotations

import pytest
from areal.api.alloc_mode import ModelAllocation

from examples.tau2.settings.config import (
    EngineBackends,
    parse_backend,
    same_allocation,
    split_allocation_mode,
)

TRANSLATIONS = [
    # combined, rollout.backend, actor.backend (== ref.backend), GPUs of each
    ("sglang:d4t2+archon:d4p2t1", "sglang:d4t2", "archon:d4p2t1", 8, 8),
    ("sglang:d1+archon:d1", "sglang:d1", "archon:d1", 1, 1),
    ("sglang:d6+archon:d2", "sglang:d6", "archon:d2", 6, 2),
    ("archon:d2+sglang:d6", "sglang:d6", "archon:d2", 6, 2),  # order does not matter
    ("vllm:d2t2+fsdp:d4", "vllm:d2t2", "fsdp:d4", 4, 4),
    ("sglang:d8t4+megatron:(attn:d4p4t2|ffn:d2p4e4)", "sglang:d8t4",
     "megatron:(attn:d4p4t2|ffn:d2p4e4)", 32, 32),
    ("sglang:d4t8+megatron:(attn:d1p12t4c1|ffn:d1p12t1e4)", "sglang:d4t8",
     "megatron:(attn:d1p12t4c1|ffn:d1p12t1e4)", 32, 48),
    ("sglang:d8t4+megatron:attn:d4p4t2|ffn:d2p4e4", "sglang:d8t4", "megatron:attn:d4p4t2|ffn:d2p4e4", 32, 32),
    ("sglang[gen]:d2+archon[actor]:d2c2", "sglang[gen]:d2", "archon[actor]:d2c2", 2, 4),
]


@pytest.mark.parametrize(("combined", "rollout", "train", "rollout_gpus", "train_gpus"), TRANSLATIONS)
def test_translation_table(combined, rollout, train, rollout_gpus, train_gpus):
    backends = split_allocation_mode(combined)
    assert backends == EngineBackends(rollout=rollout, train=train)
    # Each per-engine string parses on its own (what PPOTrainer does) to the same world size.
    assert ModelAllocation.from_str(backends.rollout).world_size == rollout_gpus
    assert ModelAllocation.from_str(backends.train).world_size == train_gpus


def test_moe_hybrid_keeps_expert_parallelism():
    train = parse_backend(split_allocation_mode("sglang:d8t4+megatron:(attn:d4p4t2|ffn:d2p4e4)").train)
    assert (train.backend, train.parallel.tp_size, train.parallel.pp_size, train.parallel.ep_size) == (
        "megatron", 2, 4, 4)


@pytest.mark.parametrize(("combined", "message"), [
    ("sglang[r]:d2+fsdp[a]:d4|fsdp[c]:d4", "colocates engines"),
    ("sglang:d2+vllm:d2", "one inference engine"),
    ("sglang:d4", "one inference engine"),
    ("archon:d4", "one inference engine"),
    ("sglang:d6+d2", "Backend must be explicitly specified"),
    ("sglang:d4+fsdp:d2p2", "FSDP backend only supports"),
    ("sglang:d4+archon:d4+fsdp:d2", "all must have names"),
    ("gpus:8", "does not parse"),
])
def test_bad_combined_strings_are_one_sentence(combined, message):
    with pytest.raises(ValueError, match="allocation_mode") as info:
        split_allocation_mode(combined)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_same_allocation_ignores_spelling_but_not_degrees():
    assert same_allocation(parse_backend("archon:d4p2t1"), parse_backend("archon:p2d4"))
    assert not same_allocation(parse_backend("archon:d4p2"), parse_backend("archon:d8"))
    assert not same_allocation(parse_backend("fsdp:d4"), parse_backend("archon:d4"))
    with pytest.raises(ValueError, match="does not parse"):
        parse_backend("archon:x4")
