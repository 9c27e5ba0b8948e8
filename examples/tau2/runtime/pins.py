"""Versions that must never be installed, checked against the lock and the environment.

`scripts/install.sh` runs `python -m examples.tau2.runtime.pins requirements/cpu.lock` after installing, so a
lock edited to a bad version fails the install instead of running it; the test suite checks the same.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import re
import sys
from pathlib import Path

LITELLM_MALICIOUS = frozenset({"1.82.7", "1.82.8", "1.107.0"})
"""litellm releases published with credential-stealing malware (1.82.7, 1.82.8; 1.107.0 reported)."""
LITELLM_FIRST_INCOMPATIBLE = (1, 105)
"""From here on litellm removes `litellm.llms.anthropic.experimental_pass_through`, which AReaL 1.0.4's
proxy imports."""


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def check_litellm_version(version: str) -> None:
    """Raise RuntimeError if this litellm version is known malicious or breaks AReaL's proxy."""
    if version in LITELLM_MALICIOUS:
        raise RuntimeError(f"litellm {version} is a known-malicious release; pin litellm==1.83.7")
    if _version_tuple(version)[:2] >= LITELLM_FIRST_INCOMPATIBLE:
        raise RuntimeError(f"litellm {version} breaks AReaL 1.0.4's proxy (needs < 1.105)")


def read_lock(path: Path) -> dict[str, str]:
    """Package -> version of an exactly pinned lock (`name==version` lines; comments ignored).
    Raises ValueError on a line that is not an exact pin."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise ValueError(f"unpinned requirement in {path.name}: {line}")
        pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def main(argv: list[str] | None = None) -> int:
    """Check a lock's litellm pin and the installed litellm; exit 1 with the reason."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m examples.tau2.runtime.pins LOCK_FILE", file=sys.stderr)
        return 2
    try:
        pins = read_lock(Path(argv[0]))
        if "litellm" in pins:
            check_litellm_version(pins["litellm"])
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):  # a lock checked before install
            check_litellm_version(importlib.metadata.version("litellm"))
    except (OSError, ValueError, RuntimeError) as e:
        print(f"runtime.pins: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
