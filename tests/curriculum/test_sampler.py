"""The curriculum: solve rates, the bucket policy, the sampler AReaL's dataloader draws from, its state
through AReaL's recover files, the training wiring, `--dry-run`, and real tau2 episodes driving it."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import Counter
from pathlib import Path

import pytest
from areal.api.io_struct import StepInfo
from areal.utils import stats_tracker
from areal.utils.data import cycle_dataloader
from areal.utils.dataloader import create_dataloader
from areal.utils.dynamic_import import import_from_string
from areal.utils.recover import RecoverInfo

from examples.tau2.cpu.curriculum_run import RunConfig, drive, task_skills
from examples.tau2.curriculum import addon
from examples.tau2.curriculum.addon import CURRICULUM_WORKFLOW, CurriculumAgentWorkflow, check_curriculum
from examples.tau2.curriculum.sampler import (
    CurriculumSampler,
    Outcome,
    OutcomeReader,
    SolveRates,
    append_outcome,
    curriculum_dataloader,
    row_probabilities,
    weighted_sample,
)
from examples.tau2.curriculum.sampler import logger as curriculum_logger
from examples.tau2.settings import dataset as tau2_dataset
from examples.tau2.settings.config import BUCKETS, BucketWeights, CurriculumConfig, curriculum_outcomes_dir
from examples.tau2.tau2_train import WORKFLOW, main, train_call
from examples.tau2.training.trainer import Tau2PPOTrainer
from tests.tau2_train_support import CONFIG, clean_overrides, load

SMALL = CurriculumConfig(enabled=True, window=4, min_attempts=2, retire_after=2, unsolved_floor=0.1,
                         weights=BucketWeights(new=1.0, unsolved=0.5, partial=2.0, solved=0.5, retired=0.0))


@pytest.fixture(scope="module")
def airline_rows() -> list[dict]:
    """The 30 tasks of tau2's airline train split, as the training dataset has them."""
    return tau2_dataset.split_rows("airline", "train")


def record(directory: Path, rows: list[dict], solved_by_task: dict[str, list[bool]]) -> None:
    """Outcome lines as the workers write them: one per episode."""
    for row in rows:
        for solved in solved_by_task[row["task_id"]]:
            append_outcome(directory, Outcome("airline", row["task_id"], float(solved), float(solved)))


def skill_outcomes(rows: list[dict]) -> dict[str, list[bool]]:
    """A fixed skill per task: easy always solved, medium half the time, hard never (two episodes)."""
    by_skill = {"easy": [True, True], "medium": [True, False], "hard": [False, False]}
    return {t: by_skill[s] for t, s in task_skills([r["task_id"] for r in rows]).items()}


def test_buckets_follow_the_recent_window():
    rates = SolveRates(window=4)
    cases = {
        "new": [True],                                  # below min_attempts=2
        "unsolved": [False, False, False],
        "partial": [True, False],
        "solved": [False, False, True],                 # window 4: the early failures count ...
        "retired": [False, True, True],                 # ... but the last retire_after=2 were solved
        "old_failures_fall_out": [False] * 2 + [True, False, True, False],  # window keeps T F T F
    }
    for key, outcomes in cases.items():
        for solved in outcomes:
            rates.add(key, solved)
    no_retire = CurriculumConfig(enabled=True, window=4, min_attempts=2, retire_after=0)
    assert [rates.bucket(k, SMALL) for k in cases] == ["new", "unsolved", "partial", "partial", "retired",
                                                       "partial"]
    assert rates.bucket("solved", CurriculumConfig(enabled=True, window=4, min_attempts=2, retire_after=3)) \
        == "partial"
    rates.add("all", True)
    rates.add("all", True)
    assert (rates.bucket("all", SMALL), rates.bucket("all", no_retire)) == ("retired", "solved")
    assert rates.rate("old_failures_fall_out") == 0.5 and rates.attempts["old_failures_fall_out"] == 6
    assert rates.bucket("never_seen", SMALL) == "new" and rates.rate("never_seen") is None


def test_success_threshold_decides_what_counts_as_solved(tmp_path):
    for outcome in (0.5, 0.5, 1.0):
        append_outcome(tmp_path, Outcome("airline", "4", tau2_reward=outcome, reward=outcome))

    def bucket(threshold: float) -> str:
        config = CurriculumConfig(enabled=True, window=4, min_attempts=2, retire_after=0,
                                  success_threshold=threshold)
        sampler = CurriculumSampler(["airline/4"], config, 1, reader=OutcomeReader(tmp_path), seed=0)
        assert sampler.refresh() == 3
        return sampler.buckets()[0]

    assert (bucket(1.0), bucket(0.5)) == ("partial", "solved")


def test_row_probabilities_weights_and_unsolved_floor():
    buckets = ["new", "partial", "partial", "unsolved", "retired", "solved"]
    no_floor = CurriculumConfig(enabled=True, unsolved_floor=0.0, weights=BucketWeights(
        new=1, unsolved=0.5, partial=2, solved=0.5, retired=0))
    assert row_probabilities(buckets, no_floor) == pytest.approx([1 / 6, 2 / 6, 2 / 6, 0.5 / 6, 0, 0.5 / 6])
    # The floor lifts the unsolved mass from 1/12 to 0.3 and scales the rest down in proportion.
    floored = row_probabilities(buckets, CurriculumConfig(enabled=True, unsolved_floor=0.3,
                                                          weights=no_floor.weights))
    assert floored[3] == pytest.approx(0.3) and sum(floored) == pytest.approx(1)
    assert floored[1] / floored[0] == pytest.approx(2) and floored[4] == 0
    # Weight 0 for unsolved: the floor alone keeps them sampled.
    zero = CurriculumConfig(enabled=True, unsolved_floor=0.2, weights=BucketWeights(unsolved=0))
    assert row_probabilities(["unsolved", "unsolved", "new"], zero) == pytest.approx([0.1, 0.1, 0.8])
    # Everything retired: uniform rather than nothing to train on.
    assert row_probabilities(["retired"] * 4, SMALL) == [0.25] * 4


def test_weighted_sample_is_without_replacement_while_it_can_be():
    rng = random.Random(0)
    assert sorted(weighted_sample(rng, [0.5, 0.25, 0.25, 0.0], 3)) == [0, 1, 2]
    repeated = weighted_sample(rng, [0.0, 1.0, 0.0], 3)
    assert repeated == [1, 1, 1]  # one sampleable row fills the batch
    # Small probabilities keep their order (no underflow to ties): row 0 first far more often.
    firsts = Counter(weighted_sample(rng, [1e-4, 1e-5, 1e-5], 1)[0] for _ in range(2000))
    assert firsts[0] > 1500


@pytest.mark.parametrize("overrides, message", [
    ({"window": 0, "min_attempts": 1, "retire_after": 0}, "curriculum.window must be at least 1"),
    ({"min_attempts": 20}, "curriculum.min_attempts must be between 1 and curriculum.window=16"),
    ({"retire_after": 17}, "curriculum.retire_after must be between 0 (never) and curriculum.window=16"),
    ({"success_threshold": 0.0}, "curriculum.success_threshold must be in (0, 1]"),
    ({"unsolved_floor": 1.0}, "curriculum.unsolved_floor must be in [0, 1)"),
    ({"weights": BucketWeights(partial=-1)},
     "curriculum.weights must be finite and non-negative, got partial=-1"),
    ({"weights": BucketWeights(new=0)}, "curriculum.weights.new must be positive"),
])
def test_config_refusals(overrides, message):
    errors = addon.setting_problems(CurriculumConfig(enabled=True, **overrides))
    assert len(errors) == 1 and errors[0].startswith(message), errors
    assert addon.setting_problems(CurriculumConfig(enabled=False, **overrides)) == []  # off: nothing to check


def test_curriculum_changes_what_the_trainer_samples(airline_rows, tmp_path):
    """The same airline rows through AReaL's own dataloader and through the curriculum's, iterated the
    way AReaL's rollout controller iterates them (`cycle_dataloader`), after every task was played once:
    easy tasks (always solved) disappear, medium ones (half solved) dominate."""
    dataset = tau2_dataset.to_dataset(airline_rows)
    config = load("curriculum.enabled=true").config
    skills = task_skills([r["task_id"] for r in airline_rows])
    plain = cycle_dataloader(create_dataloader(dataset, rank=0, world_size=1,
                                               dataset_config=config.train_dataset))
    loader = curriculum_dataloader(dataset, SMALL, batch_size=8, drop_last=True, seed=3,
                                   outcomes=tmp_path / "outcomes")
    record(tmp_path / "outcomes", airline_rows, skill_outcomes(airline_rows))
    curriculum = cycle_dataloader(loader)

    def shares(batches) -> dict[str, float]:
        counts = Counter(skills[row["task_id"]] for _ in range(300) for row in next(batches))
        return {s: counts[s] / 2400 for s in ("easy", "medium", "hard")}

    before, after = shares(plain), shares(curriculum)
    assert all(0.28 < share < 0.39 for share in before.values()), before  # 10 tasks of 30 each
    assert after["easy"] == 0  # retired: solved in both latest episodes
    assert after["medium"] > 0.6 and 0.1 < after["hard"] < 0.4, after  # partial x2 over unsolved x0.5
    assert loader.sampler.draws == 300 and loader.sampler.epoch == 99  # 3 batches of 8 per epoch; the
    # 100th epoch ends when the next batch is asked for
    assert len(loader) == 3  # AReaL's steps per epoch are unchanged


def test_state_round_trip_through_areal_recover_files(airline_rows, tmp_path):
    """A run interrupted after 4 steps and resumed from AReaL's recover files draws exactly what the
    uninterrupted run draws, and does not count an outcome twice."""
    dataset = tau2_dataset.to_dataset(airline_rows)
    outcomes = skill_outcomes(airline_rows)

    def steps(loader, directory: Path, n: int) -> list[list[str]]:
        batches, drawn = cycle_dataloader(loader), []
        for _ in range(n):
            batch = next(batches)
            drawn.append([row["task_id"] for row in batch])
            record(directory, batch, outcomes)
        return drawn

    def new_loader(directory: Path):
        return curriculum_dataloader(dataset, SMALL, batch_size=8, drop_last=True, seed=11,
                                     outcomes=directory)

    uninterrupted = new_loader(tmp_path / "a")
    straight = steps(uninterrupted, tmp_path / "a", 8)

    first = new_loader(tmp_path / "b")
    drawn = steps(first, tmp_path / "b", 4)
    info = RecoverInfo(last_step_info=StepInfo(epoch=1, epoch_step=0, global_step=3, steps_per_epoch=3),
                       saver_info={}, evaluator_info={}, stats_logger_info={}, checkpoint_info={},
                       dataloader_info=first.state_dict())
    info.dump(str(tmp_path / "recover_info"))
    resumed = new_loader(tmp_path / "b")  # a new controller: skips the lines on disk until the state loads
    resumed.load_state_dict(RecoverInfo.load(str(tmp_path / "recover_info")).dataloader_info)
    assert resumed.state_dict() == info.dataloader_info  # saving again before any draw loses nothing
    drawn += steps(resumed, tmp_path / "b", 4)

    assert drawn == straight
    # Same windows, offsets (one file per process, same name in both directories), generator, position.
    assert resumed.sampler.state_dict() == uninterrupted.sampler.state_dict()
    assert resumed.sampler.outcomes_read == 7 * 16  # every batch but the last, each read once
    assert sum(resumed.sampler.rates.attempts.values()) == 7 * 16


def test_outcome_reader_whole_lines_and_fresh_start(tmp_path):
    directory = tmp_path / "outcomes"
    path = append_outcome(directory, Outcome("airline", "1", 1.0, 0.9, time=5.0))
    reader = OutcomeReader(directory)
    reader.skip_existing()  # a fresh run: an earlier run's lines do not count
    assert reader.read_new() == []
    append_outcome(directory, Outcome("airline", "2", 0.0, -0.1))
    with open(path, "a") as f:
        f.write('{"domain": "airline", "task_id": "3", "tau2_re')  # a line being written
    assert [o.task_id for o in reader.read_new()] == ["2"]
    with open(path, "a") as f:
        f.write('ward": 1.0, "reward": 1.0}\nnot json\n')
    assert [(o.task_id, o.tau2_reward) for o in reader.read_new()] == [("3", 1.0)]  # and skips the junk
    other = append_outcome(directory / "elsewhere", Outcome("retail", "9", 1.0, 1.0))
    assert other.name.startswith("outcomes-") and json.loads(other.read_text())["task_id"] == "9"


class Lines(logging.Handler):
    """Collects the messages of one logger (AReaL's `getLogger` replaces the root logger, so pytest's
    caplog, attached to the current root, misses loggers created before)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_each_draw_logs_a_line_and_records_step_stats(airline_rows, tmp_path):
    reader = OutcomeReader(tmp_path)
    sampler = CurriculumSampler([f"airline/{r['task_id']}" for r in airline_rows], SMALL, 8, reader=reader,
                                seed=0)
    record(tmp_path, airline_rows[:3], {r["task_id"]: [True, True] for r in airline_rows[:3]})
    stats_tracker.export_all()  # start clean
    lines, level = Lines(), curriculum_logger.level
    curriculum_logger.addHandler(lines)
    curriculum_logger.setLevel(logging.INFO)
    try:
        draw = sampler.draw(8)
    finally:
        curriculum_logger.removeHandler(lines)
        curriculum_logger.setLevel(level)
    stats = stats_tracker.export_all()
    assert lines.messages == [(
        "curriculum draw 1 (epoch 0): +6 outcomes; tasks new 27, unsolved 0, partial 0, solved 0, retired 3; "
        f"sampled 8: new {draw.sampled_per_bucket['new']}")]
    assert {k: stats[f"curriculum/bucket/{k}"] for k in BUCKETS} == {
        "new": 27, "unsolved": 0, "partial": 0, "solved": 0, "retired": 3}
    assert stats["curriculum/sampled/new"] == 8 and stats["curriculum/outcomes"] == 6


def test_the_trainer_replaces_only_the_training_sampler(airline_rows, tmp_path):
    """The hook AReaL 1.0.4's PPOTrainer builds both dataloaders through: with the curriculum on, training
    gets the curriculum and validation keeps AReaL's own sampler; with it off, both are AReaL's."""
    config = load(f"cluster.fileroot={tmp_path}", "curriculum.enabled=true").config
    trainer = Tau2PPOTrainer.__new__(Tau2PPOTrainer)  # __init__ would start a cluster
    trainer.config = config
    train = trainer._create_dataloader(tau2_dataset.to_dataset(airline_rows), config.train_dataset, 0, 1)
    valid = trainer._create_dataloader(tau2_dataset.to_dataset(airline_rows[:5]), config.valid_dataset, 0, 1)
    assert isinstance(train.sampler, CurriculumSampler) and len(train) == 3
    assert type(valid.sampler).__name__ == "EvalDistributedSampler"
    assert train.sampler.reader.directory == Path(curriculum_outcomes_dir(config)) == \
        tmp_path / "tau2_curriculum" / config.experiment_name / config.trial_name
    assert train.sampler.reader.directory.is_dir()
    with pytest.raises(RuntimeError, match="data-parallel"):
        trainer._create_dataloader(tau2_dataset.to_dataset(airline_rows), config.train_dataset, 0, 2)
    trainer.config = load(f"cluster.fileroot={tmp_path}").config
    rows = tau2_dataset.to_dataset(airline_rows)
    off = trainer._create_dataloader(rows, trainer.config.train_dataset, 0, 1)
    assert not isinstance(off.sampler, CurriculumSampler)


def test_training_workflow_records_outcomes(endpoint, tmp_path):
    base = ["econfig.user_base_url=http://127.0.0.1:9/v1", "econfig.user_model=user"]
    config = load(*base, "curriculum.enabled=true", f"curriculum.outcomes_dir={tmp_path}").config
    call = train_call(config, with_validation=True)
    assert (call["workflow"], call["eval_workflow"]) == (CURRICULUM_WORKFLOW, WORKFLOW)
    assert import_from_string(CURRICULUM_WORKFLOW) is CurriculumAgentWorkflow
    train = dict(call["workflow_kwargs"])
    assert train.pop("curriculum_outcomes_dir") == str(tmp_path)
    plain = train_call(load(*base).config, with_validation=True)
    assert (train, call["eval_workflow_kwargs"]) == (plain["workflow_kwargs"], plain["eval_workflow_kwargs"])
    kwargs = {**call["workflow_kwargs"], "user_base_url": endpoint.url, "agent_model": "oracle",
              "dump_dir": ""}
    wf = CurriculumAgentWorkflow(**kwargs)

    async def play() -> float:
        try:
            return await wf.run({"domain": "airline", "task_id": "0"}, base_url=endpoint.url, api_key="k")
        finally:
            await wf.aclose()

    reward = asyncio.run(play())
    [line] = [json.loads(x) for f in tmp_path.glob("outcomes-*.jsonl") for x in f.read_text().splitlines()]
    assert (line["domain"], line["task_id"], line["reward"]) == ("airline", "0", reward)
    assert line["tau2_reward"] == 1.0
    with pytest.raises(ValueError, match="curriculum_outcomes_dir"):
        CurriculumAgentWorkflow(curriculum_outcomes_dir="", **{k: v for k, v in kwargs.items()
                                                                if k != "curriculum_outcomes_dir"})


def test_dry_run_shows_the_curriculum_and_refuses_bad_settings(capsys, tmp_path, endpoint):
    clean = clean_overrides(tmp_path, endpoint.url)
    rc = main(["--config", str(CONFIG), *clean, "curriculum.enabled=true", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert ("  curriculum      solve rates over the last 16 episodes (new below 4; solved: tau2 reward "
            ">= 1); weights new 1 / unsolved 0.5 / partial 2 / solved 0.5 / retired 0; retire after 16 "
            "solved in a row; unsolved floor 0.1; outcomes in "
            f"{tmp_path}/fileroot/tau2_curriculum/tau2-airline/qwen3-1.7b") in out.splitlines()
    assert not (tmp_path / "fileroot").exists()  # a dry run creates nothing

    rc = main(["--config", str(CONFIG), *clean, "curriculum.enabled=true", "curriculum.window=4",
               "curriculum.weights.new=0", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "problems (2):" in out
    assert "  - curriculum.retire_after must be between 0 (never) and curriculum.window=4, got 16" in out
    assert "  - curriculum.weights.new must be positive: every task starts new, so nothing could be sampled" \
        in out

    assert main(["--config", str(CONFIG), *clean, "--dry-run"]) == 0
    off = "  curriculum      off (every task once per epoch, shuffled)"
    assert off in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("overrides, message", [
    (["++train_dataset.num_workers=2"], "curriculum needs train_dataset.num_workers=0"),
    (["curriculum.outcomes_dir={file}/outcomes"], "curriculum outcomes directory {file}/outcomes cannot be "
     "created ({file} is not a directory)"),
])
def test_run_level_refusals(overrides, message, tmp_path):
    file = tmp_path / "a-file"
    file.write_text("")
    overrides = [o.format(file=file) for o in overrides]
    errors = check_curriculum(load("curriculum.enabled=true", *overrides).config)
    assert [e for e in errors if e.startswith(message.format(file=file))], errors
    assert check_curriculum(load(*overrides).config) == []  # off: nothing checked


def test_real_episodes_drive_the_buckets(endpoint, tmp_path):
    """Real tau2 airline episodes (scripted policy of fixed skill per task) feed the sampler through the
    outcome files: the buckets follow the skills, and a retired task is never drawn again."""
    run = RunConfig(steps=6, batch=6, samples=2, seed=2, curriculum=SMALL)
    reports = asyncio.run(drive(run, endpoint.url, tmp_path / "outcomes"))
    rows = tau2_dataset.split_rows("airline", "train")
    skills = task_skills([r["task_id"] for r in rows])
    played = sum(r.episodes for r in reports)
    lines = [json.loads(x) for f in (tmp_path / "outcomes").glob("outcomes-*.jsonl")
             for x in f.read_text().splitlines()]
    assert len(lines) == played == 6 * 6 * 2
    assert reports[0].draw.tasks_per_bucket["new"] == 30 and reports[0].draw.new_outcomes == 0
    assert all(r.draw.new_outcomes == 12 for r in reports[1:])  # the previous step's episodes
    final = reports[-1].draw
    seen = {line["task_id"] for line in lines[:-12]}  # read by the last draw
    by_skill = Counter(skills[t] for t in seen)
    assert final.tasks_per_bucket["retired"] == by_skill["easy"]
    assert final.tasks_per_bucket["partial"] == by_skill["medium"]
    assert final.tasks_per_bucket["unsolved"] == by_skill["hard"]
    assert by_skill["easy"] > 0 and all(r.draw.sampled_per_bucket["retired"] == 0 for r in reports)
    for r in reports:  # what each draw chose is what was played
        assert sum(r.skills.values()) == sum(r.draw.sampled_per_bucket.values()) == 6


def test_the_curriculum_samples_a_domain_from_a_module(endpoint, tmp_path, monkeypatch):
    """The example domain of docs/own_domain.md through the same sampling path: every row is one of its
    training tasks, and the outcome lines name it."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples" / "tau2" / "docs"
                                    / "own_domain"))
    run = RunConfig(domain="library", domain_modules=("library_desk",), steps=3, batch=3, samples=2, seed=2,
                    curriculum=SMALL)
    reports = asyncio.run(drive(run, endpoint.url, tmp_path / "outcomes"))
    lines = [json.loads(x) for f in (tmp_path / "outcomes").glob("outcomes-*.jsonl")
             for x in f.read_text().splitlines()]
    assert len(lines) == sum(r.episodes for r in reports) == 3 * 3 * 2
    assert {line["domain"] for line in lines} == {"library"}
    train = {r["task_id"] for r in tau2_dataset.split_rows("library", "train")}
    assert {line["task_id"] for line in lines} <= train
    assert reports[0].draw.tasks_per_bucket["new"] == 6 and reports[1].draw.new_outcomes == 6

