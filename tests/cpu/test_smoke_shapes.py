"""The smoke and learn runs on domains of every size a user may bring (tests/domain_shapes.py): the
pre-flight accepts exactly the runs that train their steps, each of which saves its last step, and refuses
the others naming the override that makes them run; an odd-sized domain end to end.

The expectations are counted here from each domain's task count, not read from the code under test: a run
trains `total_train_steps` steps when the domain gives at least one step per epoch (its epochs follow), and
an epoch has `tasks // batch` steps (`drop_last`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from examples.tau2.cpu.smoke import SUMMARY_FILE
from examples.tau2.cpu.smoke_config import MAIN_CONFIG, check_config, load_smoke_config
from examples.tau2.cpu.tiny_model import default_cache_dir
from tests.cpu.smoke_support import REPO, RUN_TIMEOUT_S, check_passing_run, free_port, smoke_command
from tests.domain_shapes import EXAMPLE, write_domain

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


def _run_guide_smoke(tmp_path: Path, domain_folder: Path, *overrides: str,
                     env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """docs/own_domain.md's smoke command at CI size, the domain's folder on PYTHONPATH, all under
    `tmp_path`, in `env` (else this process's environment)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(domain_folder), env.get("PYTHONPATH", "")) if p)
    cmd = smoke_command(tmp_path, "seed=9", *overrides)
    return subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True, timeout=RUN_TIMEOUT_S)


def test_the_smallest_domain_is_refused_before_anything_starts_naming_the_batch_that_fits(tmp_path):
    """One training task, through the guide's command: refused before anything starts, naming the batch
    size (which the pre-flight then accepts: the test above, for every size)."""
    folder = tmp_path / "domains"
    split = write_domain(folder, "tiny_desk", "tinydesk", 1)
    refused = _run_guide_smoke(tmp_path / "refused", folder, "econfig.domain=tinydesk",
                               "econfig.domain_modules=[tiny_desk]", f"econfig.train_split={split}")
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "set train_dataset.batch_size=1" in refused.stderr and "nothing was started" in refused.stderr


@pytest.mark.memory(gib=10)  # a whole smoke run (tests/conftest.py)
@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_an_odd_sized_domain_without_splits_trains_across_epochs_and_leaves_nothing_behind(tmp_path):
    """Five tasks and no splits: two steps an epoch in batches of two, so three steps take two epochs. The
    run has a home and a temporary folder of its own: it leaves nothing there (AReaL's trainer and stats
    logger, its workers, the vLLM server) but torch's compile cache. Its tasks are the example domain's, so
    its policy is the example's, which scripts/test.sh builds before the tests (a build of its own would
    cost two CPU-minutes and prove nothing that build does not)."""
    folder, home = tmp_path / "domains", tmp_path / "home"
    home.mkdir()
    split = write_domain(folder, "odd_desk", "odddesk", 5, n_test=0, splits=False)
    # short: vLLM's sockets go in the run's folder inside it, and a socket's path takes at most 107 bytes
    temp = Path(tempfile.mkdtemp(prefix="tau2-lt-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(EXAMPLE.parent), env.get("PYTHONPATH")) if p)
    try:
        done = _run_guide_smoke(tmp_path / "run", folder, "econfig.domain=odddesk",
                                "econfig.domain_modules=[odd_desk]", f"econfig.train_split={split}",
                                "total_train_steps=3", f"smoke.cache_dir={default_cache_dir()}",
                                "smoke.tiny_model.warmup_domain=library",
                                "smoke.tiny_model.warmup_domain_modules=[library_desk]",
                                env={**env, "HOME": str(home), "TMPDIR": str(temp)})
        left = {str(p.relative_to(temp)) for p in temp.rglob("*")}
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-6000:])
    summary = json.loads(next((tmp_path / "run").glob(f"**/{SUMMARY_FILE}")).read_text())
    check_passing_run(summary, tmp_path / "run")
    assert summary["steps"] == 3 and "globalstep2" in summary["checkpoint"], summary["checkpoint"]
    left = {p for p in left if not p.startswith("torchinductor_")}
    left |= {f"~/{p.relative_to(home)}" for p in home.rglob("*") if str(p.relative_to(home)).startswith(
        ".cache/swanlab/run-")}
    assert left == set(), sorted(left)[:20]
