"""The domain door: tau2's built-in domains, and domains that a module registers with tau2's own registry.

Each test writes its own throw-away domain (tests/episode/domain_support.py: a parking garage, whose tools
differ from the example domain's), under a name of its own: tau2's registry is per process and refuses a
name twice.
"""

from __future__ import annotations

import logging
import re
import uuid

import pytest
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.registry import registry

from examples.tau2.compat import tau2_cache
from examples.tau2.episode import domain as tau2_domain
from tests.conftest import make_workflow, run_one
from tests.episode.domain_support import SPLITS, TASKS, task, write_domain


@pytest.fixture
def garage(tmp_path, monkeypatch) -> tuple[str, str]:
    """(module, domain) of a fresh throw-away domain on sys.path, not yet imported."""
    suffix = uuid.uuid4().hex[:8]
    module, domain = f"garage_{suffix}", f"garage-{suffix}"
    write_domain(tmp_path, module, domain)
    monkeypatch.syspath_prepend(str(tmp_path))
    return module, domain


def test_a_module_registers_a_domain_that_every_part_of_the_door_serves(garage, tmp_path):
    module, domain = garage
    assert domain not in tau2_domain.known_domains()
    [loaded] = tau2_domain.load_modules([module])
    assert (loaded.name, loaded.domains, loaded.root) == (module, (domain,), tmp_path.resolve())
    assert tau2_domain.load_modules([module]) == [loaded]  # once per process
    known = tau2_domain.known_domains()
    assert known[:4] == tau2_domain.BUILTIN_DOMAINS and domain in known
    assert tau2_domain.splits(domain) == SPLITS
    assert tau2_domain.task_ids(domain, "train") == ["1", "2"]
    assert tau2_domain.get_task(domain, "2").evaluation_criteria.actions[1].name == "reserve_spot"
    assert [t.name for t in tau2_domain.tools(domain).agent] == ["free_spots", "reserve_spot"]
    assert tau2_domain.tools(domain).user == ()
    assert tau2_domain.make_environment(domain).tools.db.spots["A1"].plate is None


def test_a_domain_from_a_module_is_graded_by_stock_tau2(garage, endpoint):
    """The evaluator cache mirrors only the built-in domains: the door grades any other through tau2's own
    `evaluate_simulation`, says so once, and builds no cache for it."""
    module, domain = garage
    wf = make_workflow(endpoint, "oracle", domain_modules=[module])
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # type: ignore[method-assign]
    tau2_domain.logger.addHandler(handler)  # AReaL's logging set-up can keep caplog's root handler away
    level = tau2_domain.logger.level
    tau2_domain.logger.setLevel(logging.INFO)
    try:
        results = {t: run_one(wf, endpoint, domain, t) for t in ("1", "2", "3")}
    finally:
        tau2_domain.logger.removeHandler(handler)
        tau2_domain.logger.setLevel(level)
    assert {t: r.tau2_reward for t, r in results.items()} == {"1": 1.0, "2": 1.0, "3": 1.0}
    said = [r.getMessage() for r in records if "graded by stock tau2" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"tau2 domain {domain} is graded by stock tau2")
    assert domain not in tau2_cache._caches
    noop = run_one(make_workflow(endpoint, "noop", domain_modules=[module]), endpoint, domain, "1")
    assert noop.tau2_reward == 0.0  # the spot was not reserved


def test_the_door_s_reward_is_stock_tau2_s(garage):
    from tau2.data_model.message import AssistantMessage, ToolCall
    from tau2.data_model.simulation import SimulationRun, TerminationReason

    module, domain = garage
    tau2_domain.load_modules([module])
    env, messages = tau2_domain.make_environment(domain), []
    for n, (name, args) in enumerate([("free_spots", {"level": 1}), ("reserve_spot", {"spot_id": "B1",
                                                                                     "plate": "Q-9"})]):
        call = ToolCall(id=f"c{n}", name=name, arguments=args)
        messages += [AssistantMessage(role="assistant", tool_calls=[call]), env.get_response(call)]
    simulation = SimulationRun(id="s", task_id="2", start_time="", end_time="", duration=0.0,
                               termination_reason=TerminationReason.AGENT_STOP, messages=messages)
    task_2 = tau2_domain.get_task(domain, "2")
    stock = evaluate_simulation(simulation=simulation, task=task_2, evaluation_type=EvaluationType.ALL,
                                solo_mode=False, domain=domain)
    door = tau2_domain.evaluate(simulation, task_2, domain, solo_mode=False)
    assert door.model_dump() == stock.model_dump()
    assert (door.reward, door.reward_breakdown, door.db_check.db_match) == (0.0, {"DB": 0.0}, False)  # plate


def test_unknown_domain_names_the_known_ones_and_the_modules(garage):
    module, domain = garage
    with pytest.raises(tau2_domain.DomainError) as e:
        tau2_domain.splits("banking")
    assert str(e.value).startswith("unknown tau2 domain 'banking'; known: airline, retail, telecom, mock")
    [problem] = tau2_domain.problems([], ["banking"], ["train"])
    assert problem.endswith("(econfig.domain_modules is empty: name the module that registers it, e.g. "
                            "econfig.domain_modules=[my_pkg.my_domain])")
    tau2_domain.load_modules([module])
    assert tau2_domain.problems([module], ["banking"], ["train"]) == [
        f"unknown tau2 domain 'banking'; known: {', '.join(tau2_domain.known_domains())} "
        f"(econfig.domain_modules {[module]} register no such domain)"]


def test_refusals_of_modules_are_one_sentence_each(tmp_path, monkeypatch):
    """Each names the fix: the file and line a module fails at, the PYTHONPATH line for one not found."""
    monkeypatch.syspath_prepend(str(tmp_path))
    suffix = uuid.uuid4().hex[:8]
    broken, typo = tmp_path / f"broken_{suffix}.py", tmp_path / f"typo_{suffix}.py"
    broken.write_text("import json\nraise RuntimeError('no database file')\n")
    typo.write_text("import json\nTOOLS = (\n")
    (tmp_path / f"needs_{suffix}.py").write_text(f"import no_such_dependency_{suffix}\n")
    (tmp_path / f"silent_{suffix}.py").write_text("VALUE = 1\n")
    write_domain(tmp_path, f"clash_{suffix}", "airline")
    assert tau2_domain.problems([f"broken_{suffix}"], [], []) == [
        f"domain module 'broken_{suffix}' does not import ({broken}, line 2: RuntimeError: no database file)"]
    assert tau2_domain.problems([f"typo_{suffix}"], [], []) == [
        f"domain module 'typo_{suffix}' does not import ({typo}, line 2: SyntaxError: '(' was never closed)"]
    assert tau2_domain.problems([f"needs_{suffix}"], [], []) == [
        f"domain module 'needs_{suffix}' does not import ({tmp_path / f'needs_{suffix}.py'}, line 1: "
        f"ModuleNotFoundError: No module named 'no_such_dependency_{suffix}')"]
    assert tau2_domain.problems([f"missing_{suffix}.tools"], [], []) == [
        f"domain module 'missing_{suffix}.tools' is not on the Python path: add the folder that holds "
        f"'missing_{suffix}' (PYTHONPATH=/path/to/that/folder:$PYTHONPATH) or install it"]
    package = tmp_path / f"pkg_{suffix}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    assert tau2_domain.problems([f"pkg_{suffix}.desk"], [], []) == [
        f"domain module 'pkg_{suffix}.desk' is not found: package 'pkg_{suffix}' ({package}) has no 'desk'"]
    assert tau2_domain.problems(["my_domain/tools.py"], [], []) == [
        "domain module 'my_domain/tools.py' is not a module name: name it as Python imports it, e.g. "
        "econfig.domain_modules=[my_pkg.my_domain], with its folder on PYTHONPATH"]
    assert tau2_domain.problems([f"silent_{suffix}"], [], []) == [
        f"domain module 'silent_{suffix}' registers no tau2 domain with tasks (it must call "
        "registry.register_domain and registry.register_tasks for one name)"]
    assert tau2_domain.problems([f"clash_{suffix}"], [], []) == [
        f"domain module 'clash_{suffix}' registers 'airline', the name of a built-in tau2 domain; give its "
        "domain another name"]


@pytest.mark.parametrize("name", ["../../x", "a/b", "my domain", "lib.desk", ""])
def test_a_domain_name_that_is_not_plain_is_refused_where_it_is_looked_up(name):
    """Names become folders and file names (evaluation writes `<output>/<domain>/...`): no path, ever."""
    sentence = f"tau2 domain name {name!r} is not a plain name: use only letters, digits, '_' and '-'"
    with pytest.raises(tau2_domain.DomainError, match=f"^{re.escape(sentence)}$"):
        tau2_domain.get_task(name, "1")
    assert tau2_domain.problems([], [name], ["test"]) == [sentence]


def test_a_module_registering_a_name_that_is_not_plain_is_refused(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    suffix = uuid.uuid4().hex[:8]
    path = write_domain(tmp_path, f"slash_{suffix}", f"slash_{suffix}")
    path.write_text(path.read_text().replace(f', "slash_{suffix}"', f', "desk/slash_{suffix}"'))  # registers
    assert tau2_domain.problems([f"slash_{suffix}"], [f"desk/slash_{suffix}"], ["train"]) == [
        f"domain module 'slash_{suffix}' registers 'desk/slash_{suffix}', which is not a plain name: rename "
        "it with only letters, digits, '_' and '-'"]


def test_a_second_module_with_a_taken_name_is_refused(garage, tmp_path):
    module, domain = garage
    tau2_domain.load_modules([module])
    write_domain(tmp_path / "other", f"{module}_again", domain)
    import sys

    sys.path.insert(0, str(tmp_path / "other"))
    try:
        assert tau2_domain.problems([f"{module}_again"], [], []) == [
            f"domain module '{module}_again' registers '{domain}', which {module} registers already; give "
            "its domain another name"]
    finally:
        sys.path.remove(str(tmp_path / "other"))


def test_a_module_imported_before_it_is_named_still_counts(garage):
    """A domain module someone imported first (a notebook, a test) is found by where its registrations
    come from."""
    import importlib

    module, domain = garage
    importlib.import_module(module)
    assert domain in registry.get_domains()
    assert tau2_domain.load_modules([module])[0].domains == (domain,)


def test_tasks_that_cannot_be_graded_are_named(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    suffix = uuid.uuid4().hex[:8]
    module, domain = f"bad_{suffix}", f"bad-{suffix}"
    tasks = [*TASKS, task("4", None), task("5", [("tow_car", {"plate": "P-7"})]),
             task("6", [("free_spots", {"level": 0}), ("reserve_spot", {"spot_id": "A2", "plate": "P-7"})])]
    write_domain(tmp_path, module, domain, tasks=tasks, splits={"train": ["1", "4", "5", "6"], "test": ["3"]})
    assert tau2_domain.problems([module], [domain], ["train", "test", "valid"]) == [
        f"tau2 domain '{domain}' has no split 'valid' (available: test, train)",
        f"tau2 domain '{domain}' task '4' has no evaluation criteria, so every episode would score 1.0; give "
        "it actions, communicate_info or assertions",
        f"tau2 domain '{domain}' task '5': action '5_0' calls 'tow_car', which is not a tool of the "
        "assistant there",
        # A2 is taken in the garage's database: tau2 would only log this, and grade against a gold state
        # without the reservation.
        f"tau2 domain '{domain}' task '6': action '6_1' (reserve_spot) fails when the ground truth is "
        "replayed (ValueError: spot A2 is not free)",
    ]
    assert tau2_domain.problems([module], [domain], ["test"]) == []  # the bad tasks are not in it


def test_a_domain_whose_own_code_or_data_fails_is_one_sentence(tmp_path, monkeypatch):
    """A task file that does not parse, a task whose initial state does not load, a module that raises after
    registering (asked for again): each a sentence, never a traceback."""
    monkeypatch.syspath_prepend(str(tmp_path))
    suffix = uuid.uuid4().hex[:8]
    unparsed = f"unparsed-{suffix}"
    write_domain(tmp_path, f"unparsed_{suffix}", unparsed, tasks=[{"id": "1", "user_scenario": 3}])
    [problem] = tau2_domain.problems([f"unparsed_{suffix}"], [unparsed], ["train"])
    assert problem.startswith(f"tau2 domain '{unparsed}' fails to load its tasks, splits or tools ("), problem
    no_such_call = {"env_type": "assistant", "func_name": "nope", "arguments": {}}
    broken_start = {**task("1", [("free_spots", {"level": 0})]),
                    "initial_state": {"initialization_actions": [no_such_call]}}
    write_domain(tmp_path, f"start_{suffix}", f"start-{suffix}", tasks=[broken_start],
                 splits={"train": ["1"]})
    [problem] = tau2_domain.problems([f"start_{suffix}"], [f"start-{suffix}"], ["train"])
    assert problem.startswith(f"tau2 domain 'start-{suffix}' task '1': its initial state fails to load ("), \
        problem
    half = write_domain(tmp_path, f"half_{suffix}", f"half-{suffix}")
    half.write_text(half.read_text() + "\nraise RuntimeError('after registering')\n")
    first = tau2_domain.problems([f"half_{suffix}"], [], [])
    assert first == [f"domain module 'half_{suffix}' does not import ({half}, line "
                     f"{half.read_text().count(chr(10))}: RuntimeError: after registering)"]
    assert tau2_domain.problems([f"half_{suffix}"], [], []) == first  # not "registers ... already"


def test_solo_mode_is_the_domain_s_to_allow(garage, tmp_path):
    module, domain = garage
    assert tau2_domain.problems([module], [domain, "airline", "telecom"], ["train"], solo_mode=True) == [
        f"tau2 domain '{domain}' does not build in solo mode (ValueError: the garage has no solo mode)",
        "solo mode needs a domain with tickets (telecom, mock or one from a module); airline has none",
    ]
    write_domain(tmp_path, f"{module}_solo", f"{domain}-solo", solo=True)  # builds; its tasks lack tickets
    assert tau2_domain.problems([f"{module}_solo"], [f"{domain}-solo"], ["test"], solo_mode=True) == [
        f"tau2 domain '{domain}-solo' task '3' has no ticket, which solo mode gives the agent instead of a "
        "user"]
