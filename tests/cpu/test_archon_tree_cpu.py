"""The CPU tree path against AReaL's own tree functions and against one-sequence training."""

from __future__ import annotations

import random

import pytest
import torch
from areal.api.cli_args import MicroBatchSpec
from areal.models.tree_attn.functional import _gather_packed_tree_logprobs_entropy
from areal.models.tree_attn.tree import build_attention_mask_from_trie, build_packed_tree_batch
from areal.utils import stats_tracker

from bench.standalone_actor import Layout, Row, batch_of, build_actor, single_process_group
from examples.tau2.cpu.archon_tree_cpu import (
    DenseTreeMask,
    TreeLabels,
    gather_tree_logprobs,
    trim_tree_padding,
)
from examples.tau2.cpu.tiny_model import TinyModelRecipe, ensure_tiny_model


def episode_rows(n_episodes: int, n_turns: int, prompt: int, gen: int, obs: int, vocab: int,
                 seed: int = 0) -> list[Row]:
    """Rows shaped like `export_style: individual` episodes sharing one prompt."""
    rng = random.Random(seed)
    tokens = lambda n: [rng.randrange(10, vocab) for _ in range(n)]  # noqa: E731
    shared = tokens(prompt)
    rows = []
    for _ in range(n_episodes):
        history = shared + tokens(obs)
        for _ in range(n_turns):
            generated = tokens(gen)
            rows.append(Row(history + generated, gen))
            history = history + generated + tokens(obs)
    return rows


def packed(rows: list[Row], max_tokens: int = 1024):
    n = max(len(r.input_ids) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long)
    mask = torch.zeros(len(rows), n, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :len(r.input_ids)] = torch.tensor(r.input_ids)
        mask[i, :len(r.input_ids)] = True
    return build_packed_tree_batch({"input_ids": ids, "attention_mask": mask},
                                   MicroBatchSpec(max_tokens_per_mb=max_tokens))


def test_tree_gather_equals_areals_values_and_gradients():
    rows = episode_rows(3, 3, prompt=40, gen=5, obs=7, vocab=50)
    mb = packed(rows).mbs[0]
    trie, input_ids = mb["trie_node"], mb["input_ids"]
    torch.manual_seed(0)
    logits = torch.randn(input_ids.numel(), 50, dtype=torch.float64)
    weights = {s: torch.randn(len(r.input_ids), dtype=torch.float64) for s, r in enumerate(rows)}

    def run(fn):
        x = logits.clone().requires_grad_(True)
        logprobs, entropies = fn(x)
        loss = sum((logprobs[s] * weights[s][:logprobs[s].numel()]).sum() + entropies[s].sum()
                   for s in logprobs)
        loss.backward()
        return logprobs, entropies, x.grad

    ours = run(lambda x: gather_tree_logprobs(x, trie, input_ids, temperature=0.7))
    theirs = run(lambda x: _gather_packed_tree_logprobs_entropy(x, trie, input_ids, temperature=0.7))
    assert sorted(ours[0]) == sorted(theirs[0]) == list(range(len(rows)))
    for s in theirs[0]:
        assert ours[0][s].shape == theirs[0][s].shape == (len(rows[s].input_ids),)
        torch.testing.assert_close(ours[0][s], theirs[0][s], rtol=0, atol=1e-12)
        torch.testing.assert_close(ours[1][s], theirs[1][s], rtol=0, atol=1e-12)
    # AReaL's backward accumulates per-slice gradients in another order: float32 rounding apart.
    torch.testing.assert_close(ours[2], theirs[2], rtol=1e-4, atol=1e-6)


def test_tree_labels_follow_each_sequence_through_the_trie():
    rows = [Row([1, 2, 3, 4], 2), Row([1, 2, 5], 1)]
    mb = packed(rows).mbs[0]
    ids = mb["input_ids"].reshape(-1)
    where = TreeLabels.of(mb["trie_node"], torch.device("cpu"))
    assert where.lengths == [4, 3]
    first, second = where.label.split(where.lengths)
    # Each sequence's labels are its own next tokens, then AReaL's wrap-around to position 0.
    assert ids[first].tolist() == [2, 3, 4, 1]
    assert ids[second].tolist() == [2, 5, 1]


def test_dense_mask_is_areals_with_padding_rows_on_their_diagonal():
    mb_list = packed(episode_rows(2, 2, prompt=10, gen=3, obs=4, vocab=30), max_tokens=128)
    trie, size = mb_list.mbs[0]["trie_node"], mb_list.padded_to_lengths[0]
    n_tokens = mb_list.group_lens[0]
    dense = DenseTreeMask.from_trie(trie, size, torch.device("cpu")).mask
    areal = build_attention_mask_from_trie(trie, size, torch.device("cpu"))
    assert torch.equal(dense[:n_tokens, :n_tokens], areal[:n_tokens, :n_tokens])
    assert dense[n_tokens:].sum(-1).eq(1).all() and dense[n_tokens:].diagonal(n_tokens).all()


def test_trim_cuts_each_tree_back_to_its_tokens():
    mb_list = packed(episode_rows(2, 2, prompt=10, gen=3, obs=4, vocab=30), max_tokens=256)
    assert mb_list.padded_to_lengths == [256]
    n_tokens = mb_list.group_lens[0]
    trim_tree_padding(mb_list)
    assert mb_list.padded_to_lengths == [n_tokens] and mb_list.padding_lengths == [0]
    assert mb_list.padded_mbs[0]["input_ids"].shape[-1] == n_tokens
    assert mb_list.padded_mbs[0]["position_ids"].shape[-1] == n_tokens


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return ensure_tiny_model(TinyModelRecipe(), tmp_path_factory.mktemp("tiny"))


def train_once(layout: Layout, model, rows: list[Row]) -> tuple[list[torch.Tensor], dict, list]:
    # SGD: the update is the gradient itself (Adam's first step is ±lr for any gradient's sign).
    with single_process_group():
        return _train_once(layout, model, rows)


def _train_once(layout: Layout, model, rows: list[Row]) -> tuple[list[torch.Tensor], dict, list]:
    actor = build_actor(layout, model, max_tokens_per_mb=4096, optimizer="sgd", lr=1.0)
    try:
        before = actor.compute_logp(batch_of(rows))
        stats_tracker.export(reset=True)
        actor.ppo_update(batch_of(rows))
        stats = stats_tracker.export(reset=True)
        after = actor.compute_logp(batch_of(rows))
    finally:
        actor.destroy()
    return before, stats, after


@pytest.mark.slow
def test_tree_training_equals_one_sequence_training_in_float32(tiny_model):
    """Same logprobs, loss, gradient norm and updated weights (seen through logprobs) as FSDP."""
    rows = episode_rows(2, 3, prompt=300, gen=20, obs=30, vocab=150000)
    reference = train_once(Layout.fsdp_one_sequence, tiny_model, rows)
    tree = train_once(Layout.archon_tree, tiny_model, rows)
    for ours, theirs in ((tree[0], reference[0]), (tree[2], reference[2])):
        for row, a, b in zip(rows, ours, theirs, strict=True):
            n = len(row.input_ids) - 1  # the last position predicts past the row
            torch.testing.assert_close(a.reshape(-1)[:n], b.reshape(-1)[:n], rtol=1e-4, atol=1e-5)
    for key in ("ppo_actor/update/actor_loss/avg", "ppo_actor/update/grad_norm",
                "ppo_actor/update/entropy/avg"):
        assert tree[1][key] == pytest.approx(reference[1][key], rel=1e-4), key


@pytest.mark.slow
def test_recorded_batches_give_back_the_rows(tiny_model, tmp_path, monkeypatch):
    from bench.standalone_actor import rows_from_batch_file
    from examples.tau2.cpu.archon_tree_cpu import RECORD_BATCHES_ENV

    monkeypatch.setenv(RECORD_BATCHES_ENV, str(tmp_path / "batches"))
    rows = episode_rows(2, 2, prompt=50, gen=5, obs=7, vocab=150000)
    with single_process_group():
        actor = build_actor(Layout.archon_tree, tiny_model, max_tokens_per_mb=4096)
        try:
            actor.compute_logp(batch_of(rows))
        finally:
            actor.destroy()
    recorded = rows_from_batch_file(tmp_path / "batches" / "batch-00000.pt")  # the actor's version 0
    # batch_of's loss mask covers the positions before the generated tokens (as after compute_advantages)
    assert recorded == rows
