"""Atomic file writes: a result is either complete or absent, never half-written."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

# A JSON object as a file, an HTTP body or a config section holds it: free-form until
# gridbench.util.codec reads it into a record, or once the codec has written a record as one.
# Elsewhere, signatures take typed records (tests/test_typed_signatures.py keeps it so).
JsonObject = dict[str, Any]

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; a result file is as readable as any other
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, data: Any) -> Path:
    """Strict JSON (NaN is refused: callers turn missing values into null)."""
    return atomic_write_text(path, json.dumps(data, indent=2, allow_nan=False) + "\n")


def read_json(path: Path) -> JsonObject | None:
    """The JSON object in ``path``; None where the file is absent or holds no JSON object (a
    torn or foreign file). Other errors, such as a file this user may not read, are raised."""
    try:
        data = json.loads(Path(path).read_text())
    except (FileNotFoundError, ValueError):  # ValueError: not JSON, or not even text
        return None
    return data if isinstance(data, dict) else None
