"""The starter shipped as versioned data: the same weights on every machine, checked by a pinned digest.

The same seed builds different starter weights on different CPUs (kernels round
differently, and 431 warm-start steps compound it: one machine's build solved 44.1% of the
held-out mazes, another's 38.7%), so a README number could not be what a newcomer gets.
The embedded default therefore does not rebuild the starter: ``mazerl build-starter --ship``
built it once, into ``mazerl/starter/data/<name>/`` (installed as package data), and
:data:`SHIPPED_DIGEST` pins the SHA-256 of its files. :func:`shipped_starter` refuses a
directory whose files no longer hash to it, as ``envs.evalset`` refuses an edited eval set;
``ensure_starter`` copies it into the data root. ``tests/test_starter_full_build.py`` rebuilds
it from nothing and checks that the rebuild lands in the same band.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SHIPPED_NAME = "maze-starter-v6"
SHIPPED_DIR = Path(__file__).parent / "data" / SHIPPED_NAME
# SHA-256 over (file name, file SHA-256) of every file in SHIPPED_DIR, by name (directory_digest).
SHIPPED_DIGEST = "a1e0bc523425663c58033c3548bef3b60ac3d9353379b6416c4adf63b4862660"


class ShippedStarterError(ValueError):
    """The shipped starter is missing or its files do not match the pinned digest."""


def directory_digest(directory: str | os.PathLike) -> str:
    """SHA-256 over the sorted (relative name, file SHA-256) of every file under ``directory``."""
    directory = Path(directory)
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return digest.hexdigest()


def shipped_starter(directory: Path = SHIPPED_DIR, expected: str | None = None) -> Path:
    """The shipped starter directory, after checking its files against the pinned digest."""
    expected = SHIPPED_DIGEST if expected is None else expected
    if not (directory / "config.json").is_file():
        raise ShippedStarterError(
            f"the shipped starter {directory} is missing; reinstall mazerl (`pip install -e .` keeps package data) "
            "or build it: `mazerl build-starter`"
        )
    actual = directory_digest(directory)
    if actual != expected:
        raise ShippedStarterError(
            f"the shipped starter {directory} was changed: its files hash to {actual[:12]}... but mazerl pins "
            f"{expected[:12]}...; restore it with `git checkout {directory}`, or after a deliberate rebuild "
            "(`mazerl build-starter --ship`) pin the digest it prints in mazerl/starter/shipped.py"
        )
    return directory
