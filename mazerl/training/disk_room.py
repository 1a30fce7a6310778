"""Room on disk for the next checkpoint: a full disk pauses a run, it does not crash it.

A run that meets a full disk mid-training must end with one message (the path, the space it
needs, what to do) and stay resumable by the same command once space is freed. Two things
make that possible:

- before training and before each checkpoint the trainer checks that the file system holds
  the checkpoint it is about to write plus :data:`RECORDS_HEADROOM_BYTES`: the run still has
  to close its records on the same disk (the MLflow store's and Prefect's SQLite databases
  under the data root, the job's log), and SQLite cannot even mark a run failed on a disk with
  no byte left;
- a write that fails anyway (another process filled the disk meanwhile) is recognised by its
  ``ENOSPC`` (:func:`is_no_space`) and reported the same way.

Either way the trainer raises :class:`StorageFullError`; its entry point turns it into exit
code 3, which the orchestrator never retries (a retry minutes later meets the same disk).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

RECORDS_HEADROOM_BYTES = 64 * 2**20
MIB = 2**20


class StorageFullError(RuntimeError):
    """The disk has no room for the next checkpoint (or a write failed with ENOSPC): the run pauses."""


def is_no_space(exc: BaseException | None) -> bool:
    """Whether ``exc`` or an exception it came from is a full disk (``ENOSPC``, or a quota)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc):  # torch's writers re-raise it as a RuntimeError
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system of ``path`` (or of its nearest existing parent); None if unknown."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def dir_bytes(path: Path) -> int:
    """The bytes of the files under ``path`` (0 if it does not exist)."""
    return sum(entry.stat().st_size for entry in Path(path).rglob("*") if entry.is_file())


def checkpoint_need(model: Any, optimizer: Any) -> int:
    """Bytes a local checkpoint of ``model`` takes: its trainable weights (the adapter), AdamW's two
    moments of each, and a megabyte for the trainer and RNG state."""
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    moments = 2 * sum(p.numel() * 4 for group in optimizer.param_groups for p in group["params"])
    return trainable + moments + MIB


def has_room(path: Path, need_bytes: int) -> bool:
    """Whether ``path``'s file system holds ``need_bytes`` plus the records' headroom (True if unknown)."""
    free = free_bytes(path)
    return free is None or free >= need_bytes + RECORDS_HEADROOM_BYTES


def check_room(path: Path, need_bytes: int, what: str, resume_note: str) -> None:
    """Raise :class:`StorageFullError` unless :func:`has_room`; ``what`` names the write, ``resume_note``
    where a rerun resumes."""
    if not has_room(path, need_bytes):
        raise StorageFullError(full_message(path, what, resume_note, need_bytes=need_bytes))


def full_message(
    path: Path, what: str, resume_note: str, *, need_bytes: int | None = None, free: int | None = None
) -> str:
    """The one line a paused run prints: where, how much room there is and is needed, and what to do."""
    free = free_bytes(path) if free is None else free
    have = f"{free / MIB:.0f} MiB free" if free is not None else "its free space cannot be read"
    need = (
        f"; it needs about {need_bytes / MIB:.0f} MiB, plus {RECORDS_HEADROOM_BYTES / MIB:.0f} MiB kept for the run's records"
        if need_bytes is not None
        else ""
    )
    return (
        f"the disk under {path} is full for {what} ({have}{need}); free space there (or move the data root to a "
        f"larger disk), then run the same command again: {resume_note}"
    )
