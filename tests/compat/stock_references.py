"""Stock tau2's results on every test task, committed per release, so that the whole-split equivalence
tests score only the cached side of each case and still compare it with stock.

Stock tau2 evaluates an airline trajectory in ~0.7 s and the cache in milliseconds, so scoring every
test task's ground truth and failing variants both ways cost minutes per release. Here stock's side
is done once, by

    .venv/bin/python -m tests.compat.stock_references              # the installed release (26.3)
    .venv/bin/python -m tests.compat.stock_references --upstream   # the vendored tau2 1.0.1

which writes `stock_rewards/<release>.json`: per domain, a digest of the domain's data files and, for
every `task/variant` (`equivalence.variants`, the kinds in `KINDS`), stock's reward and a digest of
what `equivalence.compare` compares (the whole `RewardInfo`, or the text of an on-purpose tau2 error).
The trajectories are built as the test builds them (`equivalence.simulate`, the cache on), scored with
`tau2_cache.enabled(False)`.

`check_whole_test_split` scores every case through the cache and requires its digest to be the
reference's; a differing case is scored by stock again, so that the failure shows `compare`'s diff (or
says that the reference is stale). So that a stale reference cannot pass silently, every run also
scores a sample of cases with stock, drawn afresh from the OS's randomness (`SAMPLE_SEED_VARIABLE`
repeats a draw), and requires stock to give the reference's result; a reference made with another
release or other data files fails with the command that regenerates it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from examples.tau2.runtime.process import setup_runtime

setup_runtime()  # before tau2 is imported, as every entry point does

from tau2.data_model.simulation import RewardInfo, SimulationRun  # noqa: E402
from tau2.data_model.tasks import Task  # noqa: E402

from examples.tau2.compat import tau2_cache  # noqa: E402
from examples.tau2.compat.tau2_release import installed_release  # noqa: E402
from examples.tau2.episode import domain as tau2_domain  # noqa: E402
from examples.tau2.releases.upstream import REPO, VENDORED_ARCHIVE, overlay_env, source_tree  # noqa: E402
from tests.compat.equivalence import (  # noqa: E402
    agreeing_judge,
    compare,
    is_on_purpose,
    outcome_text,
    simulate,
    variants,
)

DOMAINS = ("airline", "retail", "telecom")
KINDS = ("ground_truth", "drop_last", "alter_last", "max_steps")
"""The variants of each test task in the references: the ground truth and three ways to fail it."""
LIVE_SAMPLE = 6
"""Cases per domain that every run also scores with stock tau2 (~0.7 s each on airline)."""
SAMPLE_SEED_VARIABLE = "STOCK_SAMPLE_SEED"
REFERENCE_DIR = Path(__file__).resolve().parent / "stock_rewards"
COMMAND = ".venv/bin/python -m tests.compat.stock_references"


def reference_path(release: str) -> Path:
    return REFERENCE_DIR / f"{release.replace(' ', '-')}.json"


def regenerate_command(release: str) -> str:
    return f"{COMMAND} --upstream" if release.startswith("tau2 ") else COMMAND


@dataclass(frozen=True)
class Case:
    """One trajectory of a test task, scored by the cache and looked up in the reference by `key`."""

    key: str
    """`task_id/variant`."""
    task: Task
    sim: SimulationRun


def cases(domain: str, task_ids: list[str]) -> Iterator[Case]:
    """The trajectories of the references: every kind in `KINDS` that the task has."""
    for task_id in task_ids:
        task = tau2_domain.get_task(domain, task_id)
        for name, (actions, termination) in variants(task).items():
            if name in KINDS:
                sim = simulate(domain, task, actions, termination=termination)
                yield Case(f"{task_id}/{name}", task, sim)


def score(domain: str, case: Case, stock: bool) -> RewardInfo | Exception:
    """The case scored cached or stock, with the agreeing judge for tau2 1.0.x's judged tasks."""
    try:
        with tau2_cache.enabled(False) if stock else contextlib.nullcontext():
            return tau2_domain.evaluate(case.sim, case.task, domain, False, judge=agreeing_judge)
    except Exception as e:  # an on-purpose tau2 error is a result (see `equivalence.compare`)
        return e


def entry(result: RewardInfo | Exception) -> str:
    """`<reward> <digest>` (`raised <digest>` for an error): the digest covers what `compare` compares,
    the whole `RewardInfo` (canonical JSON) or the error's text."""
    if isinstance(result, Exception):
        text, reward = "raised " + outcome_text(result), "raised"
    else:
        text, reward = json.dumps(result.model_dump(mode="json"), sort_keys=True), repr(result.reward)
    return f"{reward} {hashlib.sha256(text.encode()).hexdigest()[:16]}"


def data_digest(domain: str) -> str:
    """Of every file of the domain's data (tasks, databases, splits, policies)."""
    return tree_digest(tau2_cache.domain_data_dir(domain))


def tree_digest(root: Path) -> str:
    """Of every file under `root` by relative path, bytecode left out: pip compiles the `.py` files it
    installs (telecom ships one), and each `.pyc` records its source's install time, so it differs
    between two installs of the same wheel."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not is_bytecode(p.relative_to(root))):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def is_bytecode(relative: Path) -> bool:
    return relative.suffix == ".pyc" or "__pycache__" in relative.parts


def load(domain: str) -> dict[str, str]:
    """The installed release's stock entries of the domain by case; fails, naming the command that
    regenerates them, when there are none or they were made with another release or other data."""
    release = installed_release().label
    path = reference_path(release)
    redo = f"regenerate with `{regenerate_command(release)}`"
    assert path.is_file(), f"no stock reference for {release} ({path.name}): {redo}"
    reference = json.loads(path.read_text())
    assert reference["release"] == release, (f"{path.name} was made with {reference['release']}, not the "
                                             f"installed {release}: {redo}")
    made = reference["domains"].get(domain)
    assert made is not None, f"{path.name} has no {domain}: {redo}"
    assert made["data"] == data_digest(domain), (f"{path.name} was made from other {domain} data files than "
                                                 f"{tau2_cache.domain_data_dir(domain)}: {redo}")
    return made["cases"]


def generate(domain: str) -> dict[str, str | dict[str, str]]:
    """Stock tau2's entries for every case of the domain's test split; only on-purpose errors count."""
    made = {}
    for case in cases(domain, tau2_domain.task_ids(domain, "test")):
        result = score(domain, case, stock=True)
        if isinstance(result, Exception) and not is_on_purpose(result):
            raise RuntimeError(f"{domain} {case.key}: stock raised {outcome_text(result)}") from result
        made[case.key] = entry(result)
    return {"data": data_digest(domain), "cases": made}


def sample_seed() -> int:
    chosen = os.environ.get(SAMPLE_SEED_VARIABLE)
    return int(chosen) if chosen else random.SystemRandom().randrange(2**32)


def check_whole_test_split(domain: str, reference: dict[str, str] | None = None,
                           task_ids: list[str] | None = None,
                           live: int = LIVE_SAMPLE) -> dict[str, float | str]:
    """Every case of the test split (or of `task_ids`) scored through the cache equals the reference,
    and `live` of them drawn at random score the reference's result with stock tau2; the snapshots
    come out intact. Returns the cached rewards by case (an on-purpose error's text where one was raised)."""
    release = installed_release().label
    redo = f"regenerate with `{regenerate_command(release)}`"
    reference = load(domain) if reference is None else reference
    built = list(cases(domain, tau2_domain.task_ids(domain, "test") if task_ids is None else task_ids))
    keys = [c.key for c in built]
    if task_ids is None:
        missing, extra = sorted(set(keys) - set(reference)), sorted(set(reference) - set(keys))
        assert not missing and not extra, (f"the reference lacks {domain} cases {missing[:5]} and has cases "
                                           f"{extra[:5]} the test split lacks: {redo}")
    cached = {c.key: score(domain, c, stock=False) for c in built}
    differing = [c for c in built if entry(cached[c.key]) != reference.get(c.key)]
    if differing:
        first = differing[0]
        head = (f"{len(differing)} of {len(built)} {domain} cases scored through the cache differ from "
                f"stock {release}'s reference ({[c.key for c in differing[:8]]}); {first.key} scored again "
                "by stock: ")
        stock = score(domain, first, stock=True)
        try:
            compare(cached[first.key], stock)
        except AssertionError as e:
            raise AssertionError(head + str(e)) from None
        raise AssertionError(head + f"stock now gives what the cache gives ({entry(stock)}), not the "
                                    f"reference's {reference.get(first.key)}: the reference is stale, {redo}")
    seed = sample_seed()
    for case in random.Random(seed).sample(built, min(live, len(built))):
        stock = score(domain, case, stock=True)
        where = f"{domain} {case.key}, drawn with {SAMPLE_SEED_VARIABLE}={seed}"
        try:
            compare(cached[case.key], stock)
        except AssertionError as e:
            raise AssertionError(f"{where}: {e}") from None
        assert entry(stock) == reference[case.key], (f"{where}: stock {release} gives {entry(stock)}, "
                                                     f"the reference {reference[case.key]}: the reference is "
                                                     f"stale, {redo}")
    for snapshot in tau2_cache.domain_cache(domain).snapshots():
        assert snapshot is None or snapshot.intact()
    return {k: r.reward if isinstance(r, RewardInfo) else outcome_text(r) for k, r in cached.items()}


def write(domains: list[str]) -> Path:
    """Regenerates the installed release's reference for `domains`, keeping its other domains."""
    release = installed_release().label
    path = reference_path(release)
    reference = json.loads(path.read_text()) if path.is_file() else {}
    if reference.get("release") != release:
        reference = {}
    made = {**reference.get("domains", {}), **{d: generate(d) for d in domains}}
    reference = {"release": release, "command": regenerate_command(release), "kinds": list(KINDS),
                 "domains": {d: made[d] for d in DOMAINS if d in made}}
    REFERENCE_DIR.mkdir(exist_ok=True)
    path.write_text(json.dumps(reference, indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", action="store_true",
                        help=f"in a child process under the vendored tau2 1.0.1 ({VENDORED_ARCHIVE.name})")
    parser.add_argument("--domains", nargs="+", choices=DOMAINS, default=list(DOMAINS))
    args = parser.parse_args(argv)
    if args.upstream:
        env = overlay_env(source_tree(VENDORED_ARCHIVE))
        cmd = [sys.executable, "-m", "tests.compat.stock_references", "--domains", *args.domains]
        return subprocess.run(cmd, cwd=REPO, env=env).returncode
    print(f"wrote {write(args.domains)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
