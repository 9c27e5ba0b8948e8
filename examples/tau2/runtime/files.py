"""Files that readers never see half-written (every output goes through `write_bytes_atomic`: a killed
run leaves the old file or the new one), and canonical hashes."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write a file so that readers never see it half-written (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path, text: str) -> None:
    """`write_bytes_atomic` for UTF-8 text."""
    write_bytes_atomic(path, text.encode("utf-8"))


def dump_json(path: Path, obj: Any) -> None:
    """Indented JSON, written atomically; values JSON does not know become their `str`."""
    write_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str))


def fingerprint(value: Any) -> str:
    """sha256 hex of a string, or of any other JSON value in canonical form (sorted keys)."""
    text = value if isinstance(value, str) else json.dumps(
        value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
