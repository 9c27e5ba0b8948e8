"""Prefix-shared (tree) training with AReaL 1.0.4's archon engine on a CPU.

AReaL's tree training packs a micro-batch's rows into a prefix trie, so a prompt shared by a GRPO
group (and every earlier turn of an episode, which each later row repeats) is computed once. As
shipped it attends with FlexAttention, which has no backward on CPU. This module keeps AReaL's trie,
packing, losses and result merging, and replaces only the three pieces that need a GPU or waste work:

1. Attention. `DenseTreeAttention` takes the trie's mask as a dense boolean matrix (AReaL's own
   `build_attention_mask_from_trie`) and runs PyTorch's `scaled_dot_product_attention`, which has a
   CPU backward. Padding rows attend to themselves only (a row with no key would be NaN, and NaN
   values poison the rows that mask them out). `DenseTreeRunner` builds that mask per micro-batch
   where AReaL's `SequentialRunner` builds a FlexAttention `BlockMask`.
2. Logprob gathering. AReaL slices the logits once per trie node and per transition (hundreds of
   slices, each of whose backward fills a logits-sized gradient). `gather_tree_logprobs` runs
   every position through AReaL's `gather_logprobs_entropy` once and regathers only the branch
   points, with exactly AReaL's order and conventions (checked against AReaL's function in tests).
3. Padding. AReaL pads every tree to `max_tokens_per_mb` (FlexAttention's block alignment); the
   dense path needs none, so `trim_tree_padding` cuts each tree back to its own size and
   `max_tokens_per_mb` only caps how many tokens one tree may hold.

Everything else (the trie, `build_packed_tree_batch`, PPO loss, `merge_packed_tree_results`) is
AReaL's. Tested in tests/cpu/test_archon_tree_cpu.py; measured in bench/bench_tree_training.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from areal.experimental.engine.archon_engine import ArchonPPOActor, ArchonTrainContext
from areal.experimental.engine.archon_runner import SequentialRunner
from areal.models.tree_attn.functional import gather_packed_tree_vocab_stats
from areal.models.tree_attn.module_archon import TreeAttentionWrapper
from areal.models.tree_attn.tree import TrieNode, build_attention_mask_from_trie
from areal.utils.data import MicroBatchList, concat_batch
from areal.utils.functional.vocab_parallel import gather_logprobs, gather_logprobs_entropy
from torch import nn

from examples.tau2.compat import require_areal


@dataclass(frozen=True)
class DenseTreeMask:
    """A micro-batch's tree mask as a dense boolean matrix (True: the query may attend to the key)."""

    mask: torch.Tensor

    @classmethod
    def from_trie(cls, trie: TrieNode, padded_size: int, device: torch.device) -> DenseTreeMask:
        mask = build_attention_mask_from_trie(trie, padded_size, device)
        mask.diagonal().fill_(True)  # padding rows: themselves only (real rows already see themselves)
        return cls(mask=mask)


class DenseTreeAttention(nn.Module):
    """Drop-in for AReaL's `TreeAttentionWrapper`: the same call, SDPA with a dense tree mask."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                cu_seqlens: torch.Tensor, max_seqlen: int,
                tree_attn_meta: DenseTreeMask | None = None) -> torch.Tensor:
        if not isinstance(tree_attn_meta, DenseTreeMask):
            raise TypeError("DenseTreeAttention needs a DenseTreeMask (built by DenseTreeRunner)")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=tree_attn_meta.mask, scale=scale,
                                              enable_gqa=q.shape[1] != k.shape[1])


class DenseTreeRunner(SequentialRunner):
    """AReaL's `SequentialRunner` for tree micro-batches, with a `DenseTreeMask` per micro-batch."""

    def run(self, mb_list, process_output_fn, forward_only: bool) -> list[Any]:
        results: list[Any] = []
        for mb_item in mb_list:
            inputs, ctx = self.prepare_inputs_fn(mb_item)
            if ctx.trie_node is None:
                raise ValueError("DenseTreeRunner runs tree micro-batches only (no trie in this one)")
            input_ids = inputs["input_ids"]
            size = int(mb_item.padded_to_length)
            meta = DenseTreeMask.from_trie(ctx.trie_node, size, input_ids.device)
            logits = self.model(
                input_ids, inputs["position_ids"],
                # Unused by tree attention; the model's interface wants them.
                cu_seqlens=torch.tensor([0, size], dtype=torch.int32, device=input_ids.device),
                max_seqlen=size, tree_attn_meta=meta,
            ).squeeze(0)
            result = process_output_fn(logits, ctx.to_dict())
            if result is None:
                continue
            if forward_only:
                results.append({k: t.detach() for k, t in result.items()} if isinstance(result, dict)
                               else result.detach())
            else:
                result.backward()
        return results


@dataclass(frozen=True)
class TreeLabels:
    """Where each logprob of a packed tree comes from, in the order AReaL's tree gather returns them.

    For every sequence of `trie.all_sequence_ids`, for every trie node it passes through: the
    predictions inside the node, then the transition to the next node's first token (after the last
    node: to position 0, AReaL's wrap-around convention, masked out by the loss like a rolled label).
    """

    pred: torch.Tensor  # positions whose logits predict
    label: torch.Tensor  # positions of the predicted tokens
    lengths: list[int]  # logprobs per sequence
    sequence_ids: list[int]

    @classmethod
    def of(cls, trie: TrieNode, device: torch.device) -> TreeLabels:
        pred: list[int] = []
        label: list[int] = []
        lengths: list[int] = []
        for seq_id in trie.all_sequence_ids:
            n = len(pred)
            indices = trie.get_sequence_tree_indices(seq_id)
            for i, (start, end) in enumerate(indices):
                pred.extend(range(start, end))
                label.extend(range(start + 1, end + 1))
                pred.append(end)
                label.append(indices[i + 1][0] if i + 1 < len(indices) else 0)
            lengths.append(len(pred) - n)
        as_tensor = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
        return cls(as_tensor(pred), as_tensor(label), lengths, list(trie.all_sequence_ids))


def gather_tree_logprobs(logits: torch.Tensor, trie: TrieNode, input_ids: torch.Tensor,
                         temperature: float = 1.0, tp_group=None, with_entropy: bool = True,
                         ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor] | None]:
    """Per-sequence logprobs (and entropies) of a packed tree, each distinct pair computed once.

    Same values and order as AReaL's `_gather_packed_tree_logprobs(_entropy)`. Every position's
    logits go through AReaL's `gather_logprobs(_entropy)` once, with the position's first label;
    only the few positions where the tree branches (one position, several next tokens) are gathered
    again for their other labels. No logits slice per node, no logits-sized copy.
    """
    input_ids = input_ids.reshape(-1)
    where = TreeLabels.of(trie, logits.device)
    if not where.sequence_ids:
        return {}, {} if with_entropy else None
    size = logits.shape[0]
    pairs, inverse = torch.unique(where.pred * size + where.label, return_inverse=True)
    pred, label = pairs // size, input_ids[pairs % size]
    first = torch.ones_like(pred, dtype=torch.bool)
    first[1:] = pred[1:] != pred[:-1]  # pairs are sorted by prediction position
    labels = torch.zeros(size, dtype=input_ids.dtype, device=logits.device)
    labels[pred[first]] = label[first]
    if with_entropy:
        logprob_at, entropy_at = gather_logprobs_entropy(logits, labels, temperature, tp_group=tp_group)
    else:
        logprob_at = gather_logprobs(logits, labels, temperature, tp_group=tp_group)
    logprob = logprob_at[pred]
    if not bool(first.all()):
        branch = ~first
        logprob = logprob.clone()
        logprob[branch] = gather_logprobs(logits.index_select(0, pred[branch]), label[branch],
                                          temperature, tp_group=tp_group)

    def per_sequence(values: torch.Tensor) -> dict[int, torch.Tensor]:
        return dict(zip(where.sequence_ids, values[inverse].split(where.lengths), strict=True))

    return per_sequence(logprob), per_sequence(entropy_at[pred]) if with_entropy else None


def trim_tree_padding(mb_list: MicroBatchList) -> MicroBatchList:
    """Cut each packed tree back to its own token count (AReaL pads it to `max_tokens_per_mb`)."""
    assert mb_list.padded_mbs is not None and mb_list.padded_to_lengths is not None
    assert mb_list.padding_lengths is not None
    for i, (mb, n_tokens) in enumerate(zip(mb_list.padded_mbs, mb_list.group_lens, strict=True)):
        size = max(int(n_tokens), 1)  # a dummy (empty) tree keeps one padding token
        for key in ("input_ids", "position_ids"):
            mb[key] = mb[key][..., :size]
        mb_list.padding_lengths[i] = size - int(n_tokens)
        mb_list.padded_to_lengths[i] = size
    mb_list._max_seqlen = max(mb_list.padded_to_lengths)
    return mb_list


RECORD_BATCHES_ENV = "TAU2_RECORD_BATCHES"
"""A directory: the actor saves every batch it recomputes logprobs for (`batch-<version>.pt`: input_ids,
attention_mask, loss_mask, the rollout's logprobs and versions, the recomputed `prox_logp`, the rows of each
GRPO group in order and the actor's `version`): the real rows bench/bench_tree_training.py trains on, and
what the smoke run's asynchronous checks read (`cpu/async_checks.py`)."""
RECORDED_KEYS = ("input_ids", "attention_mask", "loss_mask", "logprobs", "versions")


class CpuArchonPPOActor(ArchonPPOActor):
    """AReaL's archon PPO actor; with `enable_tree_training`, the CPU tree path described above.

    Without tree training it is AReaL's actor unchanged (use `archon.attn_type: sdpa` on a CPU: its
    block-diagonal causal mask keeps packed sequences apart).
    """

    def __init__(self, config):
        require_areal("the CPU tree path (examples/tau2/cpu/archon_tree_cpu.py)")
        super().__init__(config)

    def compute_logp(self, *args, **kwargs):
        logp = super().compute_logp(*args, **kwargs)
        if folder := os.environ.get(RECORD_BATCHES_ENV):
            self._record_batch(Path(folder), args[0] if args else kwargs["data"], logp)
        return logp

    def _record_batch(self, folder: Path, data, prox_logp) -> None:
        groups = data if isinstance(data, list) else [data]  # one trajectory per GRPO group
        logps = prox_logp if isinstance(prox_logp, list) else [prox_logp]
        batch, _ = concat_batch([{**{k: g[k] for k in RECORDED_KEYS}, "prox_logp": lp}
                                 for g, lp in zip(groups, logps, strict=True)])
        record = {k: v.detach().cpu() for k, v in batch.items()}
        record.update(group_rows=[int(g["input_ids"].shape[0]) for g in groups], version=self.get_version())
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(record, folder / f"batch-{record['version']:05d}.pt")  # a resumed run's step replaces it

    def _create_model_structure(self) -> nn.Module:
        model = super()._create_model_structure()
        if self.enable_tree_training:
            for module in list(model.modules()):
                for name, child in list(module.named_children()):
                    if isinstance(child, TreeAttentionWrapper):
                        setattr(module, name, DenseTreeAttention())
        return model

    def _prepare_mb_list(self, input_: dict[str, Any]) -> MicroBatchList:
        mb_list = super()._prepare_mb_list(input_)
        return trim_tree_padding(mb_list) if self.enable_tree_training else mb_list

    def initialize(self, *args, **kwargs):
        result = super().initialize(*args, **kwargs)
        if self.enable_tree_training:  # pp > 1 with tree training is refused by AReaL's initialize
            self.runner = DenseTreeRunner(model_parts=self.model_parts,
                                          prepare_inputs_fn=self._prepare_mb_inputs)
        return result

    def _gather_actor_train_outputs(self, logits: torch.Tensor, ctx: ArchonTrainContext):
        if not self.enable_tree_training:
            return super()._gather_actor_train_outputs(logits, ctx)
        if ctx.trie_node is None or not ctx.trie_node.all_sequence_ids:
            return None  # a dummy tree (data-parallel padding), as in AReaL
        vocab_min, vocab_max = gather_packed_tree_vocab_stats(logits, ctx.trie_node)
        logprobs, entropies = gather_tree_logprobs(
            logits, ctx.trie_node, ctx.mb_input["input_ids"], self.config.temperature, self._tp_group)
        assert entropies is not None
        order = ctx.trie_node.all_sequence_ids
        return (torch.cat([logprobs[s] for s in order]), torch.cat([entropies[s] for s in order]),
                vocab_min, vocab_max)

    def _gather_actor_forward_output(self, logits: torch.Tensor, ctx: ArchonTrainContext):
        if not self.enable_tree_training:
            return super()._gather_actor_forward_output(logits, ctx)
        assert ctx.trie_node is not None
        logprobs, _ = gather_tree_logprobs(logits, ctx.trie_node, ctx.mb_input["input_ids"],
                                           self.config.temperature, self._tp_group, with_entropy=False)
        return logprobs
