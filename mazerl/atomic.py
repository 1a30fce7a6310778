"""Atomic writes: the one home of "write to a temporary name, then rename".

A crash (or a kill) mid-write must never leave a file or directory that a later run takes
as complete, so every artifact the pipeline writes goes through here: the content lands
under a temporary name in the same directory (same filesystem, so the rename is atomic)
and only a finished file is renamed into place. Temporary names carry the process id, so
two writers of the same path never share one.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def temporary_sibling(path: Path, suffix: str = "tmp") -> Path:
    """A hidden name next to ``path`` for this process (``.name.tmp-<pid>``)."""
    return path.with_name(f".{path.name}.{suffix}-{os.getpid()}")


def write_bytes(path: Path, data: bytes, fsync: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically; ``fsync`` also survives a power loss (markers)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    with open(tmp, "wb") as handle:
        handle.write(data)
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path


def write_text(path: Path, text: str, fsync: bool = False) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return write_bytes(path, text.encode("utf-8"), fsync=fsync)


def write_json(path: Path, content: Any, indent: int | None = 2) -> Path:
    """Write ``content`` as JSON (newline-terminated) atomically."""
    return write_text(path, json.dumps(content, indent=indent) + "\n")


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    """Write one JSON object per line atomically."""
    return write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


def install_dir(tmp: Path, out_dir: Path) -> Path:
    """Rename the finished directory ``tmp`` to ``out_dir``, replacing an older one only once the new one is complete."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        old = temporary_sibling(out_dir, "old")
        os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out_dir)
    return out_dir
