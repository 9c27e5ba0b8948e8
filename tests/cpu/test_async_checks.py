"""cpu/async_checks.py on records written here: two real (random, tiny) Qwen3 policies as versions 0 and 1,
rows whose tokens one or the other sampled, and the rollout workers' group records. Each check passes on
an honest record and fails on the flaw it exists for: a wrong version label, a token too stale, a row no
turn took, a trainer that disagrees, a run that was asynchronous in name only, a request that failed."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from examples.tau2.cpu.async_checks import BATCHES, ROWS, WEIGHTS, check_run, format_report
from examples.tau2.training.group_workflow import row_digest

PROMPT = [5, 17, 42, 9, 77, 3]
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Qwen3ForCausalLM]]:
    """Version 0 (the initial policy, its own folder) and version 1 (kept as the controller keeps it)."""
    root = tmp_path_factory.mktemp("async-records")
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=256, tie_word_embeddings=True)
    v0 = Qwen3ForCausalLM(config).eval()
    v1 = copy.deepcopy(v0)
    with torch.no_grad():
        for p in v1.parameters():
            p.add_(0.2 * torch.randn_like(p))  # a training step's worth of change, and more
    v0.save_pretrained(root / "initial")
    v1.save_pretrained(root / WEIGHTS / "v1")
    return root, [v0, v1]


def sample(models: list[Qwen3ForCausalLM], versions: list[int], prompt: list[int]) -> tuple[list[int],
                                                                                             list[float]]:
    """Tokens after `prompt`, the i-th drawn from `models[versions[i]]`, and their logprobs (a rollout)."""
    ids, logprobs = list(prompt), []
    gen = torch.Generator().manual_seed(len(versions) + sum(versions))
    with torch.no_grad():
        for v in versions:
            dist = torch.log_softmax(models[v](torch.tensor([ids])).logits[0, -1].double(), dim=-1)
            token = int(torch.multinomial(dist.exp(), 1, generator=gen))
            ids.append(token)
            logprobs.append(float(dist[token]))
    return ids, logprobs


def batch_record(models: list[Qwen3ForCausalLM], version: int, rows: list[list[int]],
                 group_rows: list[int]) -> dict[str, Any]:
    """A trained batch as the actor records it, each row's tokens drawn by the versions listed; the
    trainer's `prox_logp` is the batch version's (the last model's past them), in AReaL's shifted layout."""
    samples = [sample(models, r, PROMPT + [i]) for i, r in enumerate(rows)]
    width = max(len(ids) for ids, _ in samples)
    record: dict[str, Any] = {k: torch.zeros(len(rows), width, dtype=dtype) for k, dtype in (
        ("input_ids", torch.long), ("attention_mask", torch.bool), ("loss_mask", torch.long),
        ("versions", torch.long), ("logprobs", torch.float), ("prox_logp", torch.float))}
    for i, ((ids, logprobs), labels) in enumerate(zip(samples, rows, strict=True)):
        n, out = len(ids), len(labels)
        record["input_ids"][i, :n] = torch.tensor(ids)
        record["attention_mask"][i, :n] = True
        record["loss_mask"][i, n - out:n] = 1
        record["versions"][i, :n] = torch.tensor([-1] * (n - out) + labels)
        record["logprobs"][i, n - out:n] = torch.tensor(logprobs)
        with torch.no_grad():
            trainer = models[min(version, len(models) - 1)]
            own = torch.log_softmax(trainer(torch.tensor([ids])).logits[0].double(), dim=-1)
        record["prox_logp"][i, : n - 1] = own[:-1].gather(1, torch.tensor(ids[1:]).unsqueeze(1))[:, 0].float()
    record.update(group_rows=group_rows, version=version)
    return record


def group_line(record: dict[str, Any], start: int, episodes: list[int], group: int, **episode: Any) -> dict:
    """The rollout worker's record of the group whose rows start at `start` (`episodes`: rows per episode)."""
    described = []
    for size in episodes:
        rows = []
        for i in range(start, start + size):
            n = int(record["attention_mask"][i].sum())
            labels = record["versions"][i][record["loss_mask"][i].bool()]
            rows.append([f"c{group}-{i}", row_digest(record["input_ids"][i, :n].tolist()), int(labels.min()),
                         int(labels.max())])
        described.append({"rejected": None, "taken": [r[0] for r in rows], "policy_failed_attempts": 0,
                          "rows": rows, **episode})
        start += size
    return {"group": group, "kept": True, "time": 100.0 + group, "episodes": described}


def write(root: Path, batches: list[dict[str, Any]], groups: list[dict[str, Any]]) -> Path:
    folder = root / f"run{len(list(root.glob('run*')))}"
    (folder / BATCHES).mkdir(parents=True)
    (folder / ROWS).mkdir()
    (folder / WEIGHTS).symlink_to(root / WEIGHTS)
    for b in batches:
        torch.save(b, folder / BATCHES / f"batch-{b['version']:05d}.pt")
    (folder / ROWS / "rows-1.jsonl").write_text("".join(json.dumps(g) + "\n" for g in groups))
    return folder


def honest_run(root: Path, models: list[Qwen3ForCausalLM]) -> tuple[list[dict], list[dict]]:
    """Batch 0 trains version 0's tokens; batch 1 a group whose episode spans the swap (its second row: a
    completion the swap interrupted, 3 tokens of v0 then 3 of v1) beside a fresh group of v1."""
    b0 = batch_record(models, 0, [[0, 0, 0], [0, 0]], [2])
    b1 = batch_record(models, 1, [[0, 0], [0, 0, 0, 1, 1, 1], [1, 1, 1], [1, 1]], [2, 2])
    return [b0, b1], [group_line(b0, 0, [1, 1], 0), group_line(b1, 0, [2], 1), group_line(b1, 2, [1, 1], 2)]


def check(root: Path, batches: list[dict], groups: list[dict], limit: int = 1) -> Any:
    return check_run(write(root, batches, groups), root / "initial", max_head_offpolicyness=limit,
                     temperature=1.0, tolerance=TOLERANCE)


def test_an_honest_asynchronous_run_passes_every_check_and_counts_what_happened(policies):
    root, models = policies
    batches, groups = honest_run(root, models)
    queued = batch_record(models, 2, [[1, 1]], [1])  # scored when the run ended, never trained: no flaw
    report = check(root, batches, [*groups, group_line(queued, 0, [1], 3)])
    assert report.problems == []
    assert (report.groups_trained, report.groups) == (3, 4)
    assert (report.episodes_across_swaps, report.interrupted, report.mixed_batches) == (1, 1, 1)
    assert report.rows_matched == report.rows_trained == 6 and report.staleness_max == 1
    v0, v1 = report.versions
    assert (v0.version, v0.tokens, v1.tokens) == (0, 10, 8)
    assert v0.max_gap < 1e-4 and v1.max_gap < 1e-4  # the same forward computed them: float noise
    assert v0.later_tokens == 5 and v0.later_fail > 0  # v1's weights would fail some of v0's tokens
    text = "\n".join(format_report(report, TOLERANCE))
    assert "1 of 6 episodes span a swap, 1 completions interrupted and resumed, 1 of 2 batches" in text
    assert "6 of 6 trained rows are turns their episodes took (3 of 4 kept groups trained" in text


def test_a_token_labelled_with_another_version_fails(policies):
    root, models = policies
    batches, groups = honest_run(root, models)
    wrong = batches[1]["versions"].clone()
    wrong[2][wrong[2] == 1] = 0  # a v1 completion labelled v0: what 1.0.4's proxies do after a swap
    batches[1]["versions"] = wrong
    report = check(root, batches, groups)
    assert any("labelled version 0 in batch 1 (row 2) are not of that version's weights" in p
               for p in report.problems), report.problems


def test_a_token_older_than_the_limit_fails_and_a_trainer_that_disagrees_fails(policies):
    root, models = policies
    batches, groups = honest_run(root, models)
    stale = batch_record(models, 3, [[0, 0, 0]], [1])  # version 0's tokens trained at version 3
    report = check(root, [*batches, stale], [*groups, group_line(stale, 0, [1], 3)])
    assert "a trained token is 3 versions old, more than rollout.max_head_offpolicyness=1" in report.problems
    batches[0]["prox_logp"] = batches[0]["prox_logp"] + 0.2
    report = check(root, batches, groups)
    assert any(p.startswith("the trainer's logprobs of the tokens of the version it trains differ") and
               "step 1" in p for p in report.problems), report.problems


def test_a_row_no_turn_took_and_a_turn_with_no_row_fail(policies):
    root, models = policies
    batches, groups = honest_run(root, models)
    orphan = copy.deepcopy(groups)
    orphan[1]["episodes"][0]["taken"] = orphan[1]["episodes"][0]["taken"][1:]  # its first row: an orphan
    report = check(root, batches, orphan)
    assert any("are not the turns it took" in p for p in report.problems), report.problems
    report = check(root, batches, groups[:2])  # a batch group no rollout worker recorded
    assert any("a group of 2 rows that is no kept group's turns" in p for p in report.problems)
    assert report.rows_matched == 4


def test_an_asynchronous_run_in_name_only_fails_and_a_synchronous_one_need_not_interleave(policies):
    root, models = policies
    b0, b1 = batch_record(models, 0, [[0, 0]], [1]), batch_record(models, 1, [[1, 1]], [1])
    groups = [group_line(b0, 0, [1], 0), group_line(b1, 0, [1], 1)]
    report = check(root, [b0, b1], groups)
    assert report.problems == ["the run was asynchronous in name only: no episode that spans a weight swap, "
                               "no completion interrupted by a swap and resumed, no batch training rows of "
                               "two versions"]
    assert check(root, [b0, b1], groups, limit=0).problems == []


def test_a_failed_policy_request_or_a_policy_rejection_fails(policies):
    root, models = policies
    batches, groups = honest_run(root, models)
    groups[0]["episodes"][0]["policy_failed_attempts"] = 1
    groups.append({"group": 9, "kept": False, "time": 109.0, "episodes": [
        {"rejected": "policy_endpoint", "taken": [], "policy_failed_attempts": 0, "rows": []}]})
    report = check(root, batches, groups)
    assert ("1 policy request(s) failed and 1 episode(s) were rejected for the policy endpoint"
            in report.problems)
    # a resumed run: the failures of the run it resumes (the groups recorded before it started) are not its
    resumed = check_run(write(root, batches, groups), root / "initial", max_head_offpolicyness=1,
                        temperature=1.0, tolerance=TOLERANCE, since=101.0)
    assert (resumed.policy_failed_attempts, resumed.policy_rejections) == (0, 1)
