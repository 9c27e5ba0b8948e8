"""The workers' apptainer image installs what TRAINING.md's "Install" says, at the lock's versions."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFINITION = REPO / "examples" / "tau2" / "slurm" / "areal-tau2.def"
GUIDE = REPO / "examples" / "tau2" / "TRAINING.md"


def pip_lines(text: str, prefix: str) -> list[list[str]]:
    """The arguments of each `pip install` line starting with `prefix`, options kept, cache flag dropped."""
    return [[a for a in line.split()[len(prefix.split()):] if a != "--no-cache-dir"]
            for line in (raw.strip() for raw in text.splitlines()) if line.startswith(prefix)]


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements" / "cpu.lock").read_text().splitlines():
        name, _, version = line.partition("==")
        if version and not line.startswith("#"):
            pins[re.sub(r"[-_.]+", "-", name.lower())] = version.split()[0]
    return pins


def test_the_image_runs_the_guides_pip_lines_at_the_locks_versions():
    image = pip_lines(DEFINITION.read_text(), "python3 -m pip install")
    guide = pip_lines(GUIDE.read_text().split("## Install", 1)[1].split("\n## ", 1)[0], "pip install")
    assert image == guide and len(image) == 2, (image, guide)
    pins, wrong = lock_pins(), {}
    for requirement in (a for line in image for a in line if not a.startswith("-")):
        name, _, version = requirement.partition("==")
        locked = pins.get(re.sub(r"[-_.]+", "-", name.lower()))
        if not version or version != locked:
            wrong[requirement] = locked
    assert wrong == {}, "pinned otherwise than requirements/cpu.lock (or not pinned)"


def test_the_image_starts_from_areals_runtime_image_and_checks_the_workers_imports():
    text = DEFINITION.read_text()
    assert re.search(r"^From: ghcr\.io/inclusionai/areal-runtime:v\d", text, re.MULTILINE)
    test_section = text.split("%test", 1)[1]
    assert all(module in test_section for module in ("areal", "sglang", "sgl_kernel", "tau2.registry"))
