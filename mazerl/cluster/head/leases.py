"""Leases on the embedded Ray head: which live processes use it.

One head serves every run of this user (and ``TMPDIR``) at once. Each process that uses it
holds a lease, a file ``<pid>-<start time>`` in the head's temp dir; a lease whose process
ended is dropped when the leases are next read. A head started by
:func:`~mazerl.cluster.head.local.local_ray_head` is stopped when the last lease is given up,
not when the run that started it ends, so two ``mazerl run`` side by side both finish.

Callers hold the head's registry lock (:mod:`mazerl.cluster.head.local`) around these.
"""

from __future__ import annotations

import os
from pathlib import Path

from mazerl.cluster.head.temp_dir import LEASES_NAME, PRIVATE_MODE, remove


def lease_name(pid: int) -> str | None:
    """``<pid>-<start time>``: a recycled pid is not mistaken for the process that took the lease."""
    import psutil  # a Ray dependency

    try:
        return f"{pid}-{int(psutil.Process(pid).create_time() * 1000)}"
    except psutil.Error:
        return None


def take_lease(temp: Path) -> None:
    """This process leases the head in ``temp``."""
    leases = temp / LEASES_NAME
    leases.mkdir(mode=PRIVATE_MODE, exist_ok=True)
    (leases / str(lease_name(os.getpid()))).touch()


def release_lease(temp: Path) -> None:
    """This process gives up its lease on the head in ``temp``."""
    remove(temp / LEASES_NAME / str(lease_name(os.getpid())))


def live_leases(temp: Path) -> list[str]:
    """Leases of processes that still run; those of processes that ended are removed."""
    live = []
    for lease in sorted((temp / LEASES_NAME).glob("*-*")):
        pid = lease.name.split("-", 1)[0]
        if pid.isdigit() and lease_name(int(pid)) == lease.name:
            live.append(lease.name)
        else:
            remove(lease)
    return live
