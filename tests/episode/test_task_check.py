"""The task check on the example domain and on a throw-away domain with one planted task of each kind: it
flags exactly the planted ones, names the task whose ground truth cannot score 1.0, and training leaves the
tasks that pay for nothing out while evaluation keeps them."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from examples.tau2.episode import domain as tau2_domain
from examples.tau2.episode import task_check
from examples.tau2.settings import dataset as tau2_dataset
from examples.tau2.settings.config import Tau2TrainEnvConfig
from tests.domain_shapes import EXAMPLE, write_domain

REPO = Path(__file__).resolve().parents[2]

PLANTED_TOOLS = '''

    @is_tool(ToolType.READ)
    def note_visit(self, member_id: str) -> str:
        """Look a member up at the desk (tagged READ, yet it writes: it adds a fine).

        Args:
            member_id: The member id.
        """
        self._member(member_id).fines_owed += 1.0
        return "noted"

    def assert_loan_renewed(self, loan_id: str) -> bool:
        """Environment assertion: the loan was renewed at least once."""
        return self.db.loans[loan_id].renewals_used > 0
'''


def _example_task(i: int) -> dict:
    return json.loads((EXAMPLE / "data" / "tasks.json").read_text())[i]


def planted_domain(folder: Path) -> tuple[str, str, dict[str, set[str]]]:
    """A domain whose tasks each plant one kind of defect; returns (module, domain, task id -> flags)."""
    suffix = uuid.uuid4().hex[:8]
    module, domain = f"planted_{suffix}", f"planted-{suffix}"
    write_domain(folder, module, domain, n_train=1, n_test=0)
    tools = folder / module / "tools.py"
    tools.write_text(tools.read_text() + PLANTED_TOOLS)

    def task(task_id: str, base: int, **criteria: object) -> dict:
        t = _example_task(base)
        t["id"] = task_id
        t["user_scenario"]["instructions"]["domain"] = domain
        t["evaluation_criteria"].update(criteria)
        for j, action in enumerate(t["evaluation_criteria"]["actions"] or []):
            action["action_id"] = f"{task_id}_{j}"
        return t

    renew = _example_task(0)["evaluation_criteria"]["actions"]  # get_member, then renew_loan M001/L001
    tasks = [
        task("sound", 0),
        task("nothing", 1),  # the right answer changes nothing, graded on the database alone
        task("partial", 0, communicate_info=["L001"], reward_basis=["COMMUNICATE"]),
        task("comma", 2, communicate_info=["6,25"]),
        task("read_writes", 1, actions=[renew[0], {"action_id": "x", "requestor": "assistant",
                                                   "name": "note_visit",
                                                   "arguments": {"member_id": "M002"}}]),
        task("failing", 0, actions=[renew[0], {**renew[1], "arguments": {"member_id": "M001",
                                                                           "loan_id": "L999"}}]),
        task("both_splits", 3),
        task("twin_a", 7), task("twin_b", 7),
        task("nothing_test", 5),  # pays for nothing too, in the test split only
        task("broken", 1, env_assertions=[{"env_type": "assistant", "func_name": "assert_loan_renewed",
                                           "arguments": {"loan_id": "L001"}, "assert_value": True}],
             reward_basis=["ENV_ASSERTION"]),
    ]
    data = folder / module / "data"
    (data / "tasks.json").write_text(json.dumps(tasks, indent=1))
    ids = [t["id"] for t in tasks]
    (data / "split_tasks.json").write_text(json.dumps(
        {"train": [i for i in ids if i not in ("broken", "nothing_test")],
         "test": ["both_splits", "broken", "nothing_test"], "base": ids}))
    expected = {"sound": set(), "nothing": {"rewards_nothing"}, "partial": {"rewards_partial"},
                "comma": {"unmatchable_info"}, "read_writes": {"write_tagged_read"},
                "failing": {"failing_write", "rewards_nothing"}, "both_splits": {"in_two_splits"},
                "twin_a": {"duplicate_task"}, "twin_b": {"duplicate_task"},
                "nothing_test": {"rewards_nothing"}, "broken": set()}
    return module, domain, expected


@pytest.fixture
def planted(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    module, domain, expected = planted_domain(tmp_path)
    tau2_domain.load_modules([module])
    return tmp_path, module, domain, expected


def test_the_check_flags_exactly_the_planted_tasks(planted):
    _, _, domain, expected = planted
    checks = {c.task_id: c for c in task_check.check_domain_tasks(domain)}
    assert {t: set(c.flags) for t, c in checks.items()} == expected
    assert {t for t, c in checks.items() if c.oracle_problems} == {"comma", "broken"}
    assert checks["broken"].oracle_problems == [
        "ENV_ASSERTION: assert_loan_renewed(loan_id='L001') is not True"]
    assert checks["sound"].oracle_reward == 1.0 and checks["sound"].nothing_reward == 0.0
    assert checks["sound"].partial_reward == 0.0  # without the renewal the database differs
    assert checks["nothing"].partial_reward is None  # no state-changing action to leave out
    assert checks["both_splits"].split == "train+test+base"


def test_the_example_domain_flags_its_two_tasks_that_pay_for_nothing():
    """docs/own_domain/library_desk: tasks 1 and 5 are right to change nothing and graded on the database
    alone; tests/domain_shapes.py builds its domains from the other eight."""
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        tau2_domain.load_modules(["library_desk"])
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    checks = task_check.check_domain_tasks("library")
    assert {c.task_id: c.flags for c in checks if c.flags} == {"1": ["rewards_nothing"],
                                                               "5": ["rewards_nothing"]}
    assert all(c.oracle_reward == 1.0 for c in checks)


def _check_tasks(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "examples.tau2.eval.check_tasks", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": f"{REPO}:{folder}", "PATH": "/usr/bin:/bin",
                               "HOME": str(folder)})


def test_the_command_writes_both_files_and_exits_1_naming_the_broken_tasks(planted, tmp_path):
    folder, module, domain, expected = planted
    out = tmp_path / "out"
    run = _check_tasks(folder, "--domain-modules", module, "--output-dir", str(out))
    assert run.returncode == 1, run.stderr
    assert f"{domain} task 'broken' (0.000): ENV_ASSERTION: assert_loan_renewed(loan_id='L001') is not True" \
        in run.stderr
    assert f"{domain} task 'comma'" in run.stderr and "drops commas" in run.stderr
    assert "rewards_nothing: 3 (nothing, failing, nothing_test)" in run.stdout
    written = json.loads((out / "check_tasks.json").read_text())
    assert {t["task_id"]: set(t["flags"]) for t in written["tasks"]} == expected
    assert set(written["tasks"][0]) == {"domain", "task_id", "split", "oracle_reward", "nothing_reward",
                                        "partial_reward", "flags", "oracle_problems"}
    table = (out / "check_tasks.md").read_text()
    assert f"| {domain} | train | 9 | 8 | 2 | 1 | 1 | 1 | 1 | 1 | 2 | 0 |" in table  # counts per split

    sound = _check_tasks(folder, "--domain-modules", module, "--split", "train", "--output-dir", str(out))
    assert sound.returncode == 1 and "'broken'" not in sound.stderr  # the train split lacks it; comma fails


def test_training_leaves_the_flagged_tasks_out_and_evaluation_keeps_them(planted, tmp_path):
    """Every batch AReaL's dataloader draws over two epochs lacks the flagged training tasks; the
    validation rows keep the flagged test task."""
    from areal.api.cli_args import TrainDatasetConfig
    from areal.utils.dataloader import create_dataloader

    _, module, domain, _ = planted
    econfig = Tau2TrainEnvConfig(domain=domain, domain_modules=[module])
    left = tau2_dataset.reasons_left_out(econfig, domain)["flagged"]
    assert left == {"nothing", "partial", "failing", "nothing_test"}
    loader = create_dataloader(tau2_dataset.to_dataset(tau2_dataset.train_rows(econfig, seed=1)), rank=0,
                               world_size=1, dataset_config=TrainDatasetConfig(path="tau2", type="rl",
                                                                               batch_size=2, shuffle=True))
    trained = {row["task_id"] for _ in range(2) for batch in loader for row in batch}
    assert trained == set(tau2_domain.task_ids(domain, "train")) - left
    valid = {r["task_id"] for r in tau2_dataset.valid_rows(econfig)}
    assert valid == {"both_splits", "broken", "nothing_test"}
    with_flagged = Tau2TrainEnvConfig(domain=domain, domain_modules=[module], train_on_flagged=True)
    assert {r["task_id"] for r in tau2_dataset.train_rows(with_flagged, seed=1)} >= left - {"nothing_test"}


def test_an_own_domain_is_checked_once_then_read_from_the_cache(planted, tmp_path, monkeypatch):
    _, _, domain, _ = planted
    cache = tmp_path / "cache"
    first = task_check.flagged_task_ids(domain, cache)
    monkeypatch.setattr(task_check, "check_domain_tasks", lambda *_: pytest.fail("checked again"))
    assert task_check.flagged_task_ids(domain, cache) == first == {"nothing", "partial", "failing",
                                                                    "nothing_test"}
    assert len(list(cache.iterdir())) == 1


def test_the_built_in_table_is_what_training_reads():
    """compat/flagged_tasks.json holds the built-in domains' flags per release (see docs/tau2_releases.md)."""
    from examples.tau2.compat.tau2_release import installed_release

    table = json.loads(task_check.TABLE.read_text())["releases"][installed_release().label]
    assert set(table) == {"mock", "airline", "retail", "telecom"}
    airline = set(table["airline"]["rewards_nothing"])
    assert task_check.flagged_task_ids("airline") == airline and len(airline) >= 10
    econfig = Tau2TrainEnvConfig(domain="airline", train_on_regraded_tasks=True)
    train = [r["task_id"] for r in tau2_dataset.train_rows(econfig, seed=1)]
    assert not set(train) & airline
    assert len(train) == len(set(tau2_domain.task_ids("airline", "train")) - airline)


def test_an_unknown_domain_or_split_is_refused_before_anything_is_checked(tmp_path):
    run = _check_tasks(tmp_path, "--domains", "nosuch", "--output-dir", str(tmp_path / "out"))
    assert run.returncode == 2 and "check-tasks: unknown tau2 domain 'nosuch'" in run.stderr, run.stderr
    out = str(tmp_path / "out")
    run = _check_tasks(tmp_path, "--domains", "mock", "--split", "train", "--output-dir", out)
    assert run.returncode == 2 and "has no split 'train'; available: all" in run.stderr, run.stderr
    assert not (tmp_path / "out").exists()
