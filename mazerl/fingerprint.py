"""Cheap, stable fingerprints of model directories.

Used as cache keys (the baseline eval of a model is never repeated) and to refuse resuming
a checkpoint on a different base model. Small files are hashed whole; weight files larger
than ``WHOLE_FILE_LIMIT`` contribute their size and first and last megabyte, so an 8B
checkpoint is fingerprinted in milliseconds rather than minutes while any re-save still
changes the value.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

WHOLE_FILE_LIMIT = 64 * 2**20
EDGE_BYTES = 2**20


def model_fingerprint(model_dir: str | os.PathLike) -> str:
    """SHA-256 over the relative names and contents (or size + edges) of a model directory's files."""
    root = Path(model_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"model directory {root} does not exist")
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(".") or "/." in relative:
            continue
        size = path.stat().st_size
        digest.update(f"{relative}\0{size}\0".encode())
        with open(path, "rb") as handle:
            if size <= WHOLE_FILE_LIMIT:
                digest.update(handle.read())
            else:
                digest.update(handle.read(EDGE_BYTES))
                handle.seek(size - EDGE_BYTES)
                digest.update(handle.read(EDGE_BYTES))
    return digest.hexdigest()


def mismatch(recorded: str, model: str, actual: str) -> str:
    """The shared part of every "trained on another base model" refusal (fingerprints shortened)."""
    return f"a base model with fingerprint {recorded[:16]}..., but {model} has {actual[:16]}..."
