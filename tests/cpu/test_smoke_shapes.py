"""The smoke and learn runs on domains of every size a user may bring (tests/domain_shapes.py): the
pre-flight accepts exactly the runs that train their steps, each of which saves its last step, and refuses
the others naming the override that makes them run. An odd-sized domain (five tasks, no splits) trains end
to end through SLURM, across a requeue at the epoch's end (tests/slurm/test_smoke_on_slurm.py).

The expectations are counted here from each domain's task count, not read from the code under test: a run
trains `total_train_steps` steps when the domain gives at least one step per epoch (its epochs follow), and
an epoch has `tasks // batch` steps (`drop_last`).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.tau2.cpu.smoke_config import MAIN_CONFIG, check_config, load_smoke_config
from tests.cpu.smoke_support import REPO, RUN_TIMEOUT_S, free_port, smoke_command
from tests.domain_shapes import write_domain

SIZES = range(1, 13)
"""Training tasks per generated domain."""


@pytest.fixture(scope="module")
def domains(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, bool], list[str]]:
    """(training tasks, has splits) -> the guide's overrides for that domain; one module per domain, on
    sys.path for this process (tau2's registry takes a name once per process)."""
    folder = tmp_path_factory.mktemp("shapes")
    sys.path.insert(0, str(folder))
    shaped = {}
    for n in SIZES:
        for splits in (True, False):
            name = f"shape{n}{'s' if splits else 'n'}"
            split = write_domain(folder, f"{name}_mod", name, n, n_test=2 if splits else 0, splits=splits)
            shaped[(n, splits)] = [f"econfig.domain={name}", f"econfig.domain_modules=[{name}_mod]",
                                   f"econfig.train_split={split}", f"experiment_name={name}"]
    yield shaped
    sys.path.remove(str(folder))


def _checked(tmp_path: Path, *overrides: str) -> tuple[object, list[str]]:
    config, _, _ = load_smoke_config([
        f"cluster.fileroot={tmp_path}", f"cluster.name_resolve.nfs_record_root={tmp_path}/nr",
        f"econfig.user_base_url=http://127.0.0.1:{free_port()}/v1", *overrides])
    return config, check_config(config)


@pytest.mark.parametrize("variant,batch,steps", [("smoke", 2, 3), ("learn", 3, 36)])
def test_the_preflight_accepts_the_runs_that_train_their_steps_and_names_the_fix_for_the_others(
        tmp_path, domains, vllm_env, variant, batch, steps):
    variant_args = ["--config", str(MAIN_CONFIG), "+configs=learn_cpu"] if variant == "learn" else []
    for (n, splits), overrides in domains.items():
        config, errors = _checked(tmp_path, *variant_args, *overrides)
        if n < batch:  # an epoch would have no step: refused, naming the batch that fits
            fix = f"train_dataset.batch_size={n}"
            assert [e for e in errors if e.endswith(f"set {fix}")], (n, splits, errors)
            config, errors = _checked(tmp_path, *variant_args, *overrides, fix)
        per_epoch = n // config.train_dataset.batch_size
        assert errors == [], (n, splits, errors)
        assert config.total_train_steps == steps
        assert config.total_train_epochs == math.ceil(steps / per_epoch), (n, splits)


def test_epochs_set_on_the_command_line_stand_and_too_few_steps_are_refused(tmp_path, domains, vllm_env):
    overrides = domains[(2, True)]  # one step an epoch
    _, errors = _checked(tmp_path, *overrides, "total_train_epochs=1")
    assert [e for e in errors if e.startswith("the run trains 1 step(s)") and e.endswith(
        "fewer than smoke.min_optimizer_steps=2; set total_train_epochs=2")], errors
    config, errors = _checked(tmp_path, *overrides, "total_train_epochs=2")
    assert errors == [] and config.total_train_epochs == 2
    _, errors = _checked(tmp_path, *overrides, "total_train_steps=1")
    assert [e for e in errors if e.endswith("set total_train_steps=2")], errors


def _run_guide_smoke(tmp_path: Path, domain_folder: Path, *overrides: str) -> subprocess.CompletedProcess:
    """docs/own_domain.md's smoke command at CI size, the domain's folder on PYTHONPATH, all under
    `tmp_path`."""
    path = os.pathsep.join(p for p in (str(domain_folder), os.environ.get("PYTHONPATH", "")) if p)
    cmd = smoke_command(tmp_path, "seed=9", *overrides)
    return subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": path}, text=True,
                          capture_output=True, timeout=RUN_TIMEOUT_S)


def test_the_smallest_domain_is_refused_before_anything_starts_naming_the_batch_that_fits(tmp_path):
    """One training task, through the guide's command: refused before anything starts, naming the batch
    size (which the pre-flight then accepts: the test above, for every size)."""
    folder = tmp_path / "domains"
    split = write_domain(folder, "tiny_desk", "tinydesk", 1)
    refused = _run_guide_smoke(tmp_path / "refused", folder, "econfig.domain=tinydesk",
                               "econfig.domain_modules=[tiny_desk]", f"econfig.train_split={split}")
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "set train_dataset.batch_size=1" in refused.stderr and "nothing was started" in refused.stderr
    assert "tau2.registry" not in refused.stderr  # tau2 logs at import (DEBUG): quieted before it is imported
