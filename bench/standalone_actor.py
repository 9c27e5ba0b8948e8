"""AReaL's PPO actors driven directly, outside `PPOTrainer`, in one CPU process.

The benchmark (bench/bench_tree_training.py) and the equivalence tests run the trainer's three
layouts on the same rows: FSDP with one sequence per micro-batch (the embedded default before
archon), archon packing rows side by side, and archon with prefix sharing (a packed trie). This
module builds those actors and the rows: synthetic airline-shaped episodes rendered with the real
Qwen3 chat template and τ²'s airline policy and tools, or batches recorded from a smoke run.
"""

from __future__ import annotations

import contextlib
import enum
import os
import random
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROW_KEYS = ("input_ids", "loss_mask", "logprobs", "advantages", "prox_logp")


class Layout(enum.Enum):
    """How the trainer lays a batch's rows out in micro-batches."""

    fsdp_one_sequence = "fsdp-one-seq"
    """FSDP, one row per micro-batch (`cpu.trainer.OneSequencePerMicroBatchActor`)."""
    archon_packed = "archon-packed"
    """Archon, rows packed side by side with a block-diagonal causal mask (`attn_type: sdpa`)."""
    archon_tree = "archon-tree"
    """Archon, rows packed into a prefix trie (`cpu.archon_tree_cpu.CpuArchonPPOActor`)."""


@dataclass(frozen=True)
class Row:
    """One training row: a completion's whole context, the sampled tokens at its end."""

    input_ids: list[int]
    n_generated: int


DISTRIBUTED_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
"""The variables torch.distributed's env:// rendezvous reads (and every process started later inherits)."""


@contextlib.contextmanager
def single_process_group(backend: str = "gloo") -> Iterator[None]:
    """A one-process group (gloo; nccl on a GPU), as AReaL's workers have (the engines need
    torch.distributed), for the duration of the block: afterwards the group is destroyed and
    `DISTRIBUTED_ENV` is as before, so a later process this one starts is not told it is rank 0 of a
    finished group."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialized in this process")
    saved = {key: os.environ.get(key) for key in DISTRIBUTED_ENV}
    with socket.socket() as probe:  # a port free now: one derived from the pid may be any process's
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    defaults = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                "LOCAL_RANK": "0"}
    try:
        for key, value in defaults.items():
            os.environ.setdefault(key, value)
        dist.init_process_group(backend=backend, world_size=1, rank=0)
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def build_actor(layout: Layout, model_path: str | Path, *, max_tokens_per_mb: int = 16384,
                dtype: str = "float32", optimizer: str = "adam", lr: float = 1e-4,
                temperature: float = 1.0):
    """An initialized actor for `layout` on the CPU, loading `model_path` (Hugging Face format); call it
    inside `single_process_group()`."""
    from areal.api import FinetuneSpec
    from areal.api.cli_args import ArchonEngineConfig, MicroBatchSpec, OptimizerConfig, PPOActorConfig

    config = PPOActorConfig(
        experiment_name="standalone", trial_name="cpu", path=str(model_path), dtype=dtype,
        backend="fsdp:d1" if layout is Layout.fsdp_one_sequence else "archon:d1",
        temperature=temperature, enable_tree_training=layout is Layout.archon_tree,
        mb_spec=MicroBatchSpec(max_tokens_per_mb=max_tokens_per_mb),
        optimizer=OptimizerConfig(type=optimizer, lr=lr, lr_scheduler_type="constant",
                                  gradient_clipping=1.0),
        attn_impl="sdpa", archon=ArchonEngineConfig(attn_type="sdpa"), gradient_checkpointing=False,
        ppo_n_minibatches=1, prox_logp_method="recompute", use_decoupled_loss=True,
    )
    if layout is Layout.fsdp_one_sequence:
        from examples.tau2.cpu.trainer import OneSequencePerMicroBatchActor as actor_cls
    else:
        from examples.tau2.cpu.archon_tree_cpu import CpuArchonPPOActor as actor_cls
    actor = actor_cls(config)
    actor.create_process_group()
    actor.initialize(addr=None, ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=64,
                                                     train_batch_size=8))
    return actor


def count_computed_tokens(actor: Any) -> list[int]:
    """A list that gets, for each batch the actor lays out in micro-batches, the tokens the model runs over
    (padding included): the actor's `_prepare_mb_list`, counted."""
    computed: list[int] = []
    prepare = actor._prepare_mb_list

    def counting(input_: Any) -> Any:
        mb_list = prepare(input_)
        computed.append(sum(mb_list.padded_to_lengths or mb_list.group_lens))
        return mb_list

    actor._prepare_mb_list = counting
    return computed


def batch_of(rows: list[Row], seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """The rows as AReaL's workflows hand them to the actor (one dict per row, batch dimension 1).

    Advantages and rollout logprobs are seeded random values on the generated tokens, so every
    layout trains on the same targets; `prox_logp` equals the rollout logprobs (on-policy). As after
    AReaL's `compute_advantages`, position i holds what predicts token i + 1: the mask covers the
    positions before each generated token, never a row's last position (whose label each layout
    takes from a different neighbour).
    """
    g = torch.Generator().manual_seed(seed)
    batch = []
    for row in rows:
        n = len(row.input_ids)
        loss_mask = torch.zeros(1, n, dtype=torch.int32)
        loss_mask[0, n - 1 - row.n_generated:n - 1] = 1
        logprobs = -torch.rand(1, n, generator=g) * 3 * loss_mask
        batch.append(dict(
            input_ids=torch.tensor([row.input_ids]), attention_mask=torch.ones(1, n, dtype=torch.bool),
            loss_mask=loss_mask, logprobs=logprobs, prox_logp=logprobs.clone(),
            versions=torch.where(loss_mask.bool(), 0, -1),  # version 0 made the generated tokens
            advantages=torch.randn(1, n, generator=g) * loss_mask,
            kl_rewards=torch.zeros(1, n), tot_rewards=torch.zeros(1, n),
            rewards=torch.tensor([float(len(batch) % 2)]),
        ))
    return batch


def rows_from_batch_file(path: str | Path) -> list[Row]:
    """Rows of a batch recorded by `cpu.trainer.BatchRecorder` (a smoke run's real rows)."""
    recorded = torch.load(path, weights_only=True)
    rows = []
    for ids, mask, loss_mask in zip(recorded["input_ids"], recorded["attention_mask"],
                                    recorded["loss_mask"], strict=True):
        n = int(mask.sum())
        rows.append(Row(input_ids=ids[:n].tolist(), n_generated=int(loss_mask[:n].sum())))
    return rows


def airline_rows(tokenizer: Any, *, n_episodes: int = 8, n_turns: int = 6, seed: int = 0,
                 generated_words: int = 60, observation_words: int = 80, policy_words: int = 0,
                 n_tools: int = 0) -> list[Row]:
    """A GRPO group of airline-shaped episodes rendered with the real Qwen3 chat template.

    Every episode starts with τ²'s airline policy as the system prompt and its 14 tools, as the
    agent sees them; each policy turn is one row (`export_style: individual`): the rendered
    conversation so far plus the generated reply. Replies and observations are random words.
    `policy_words` / `n_tools` (0: all) shorten the system prompt, for runs that only check the code.
    """
    from tau2.domains.airline.environment import get_environment

    env = get_environment()
    tools = [tool.openai_schema for tool in env.get_tools()][:n_tools or None]
    policy = " ".join(env.get_policy().split()[:policy_words]) if policy_words else env.get_policy()
    words = [w for w in env.get_policy().split() if w.isalpha()]
    rng = random.Random(seed)
    text = lambda n: " ".join(rng.choice(words) for _ in range(n))  # noqa: E731
    rows = []
    for _ in range(n_episodes):
        messages = [{"role": "system", "content": policy},
                    {"role": "user", "content": text(observation_words)}]
        for _ in range(n_turns):
            prompt = tokenizer.encode(tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False), add_special_tokens=False)
            reply = text(generated_words)
            generated = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
            rows.append(Row(input_ids=list(prompt) + generated, n_generated=len(generated)))
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": text(observation_words)}]
    return rows
