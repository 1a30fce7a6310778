"""One trainer per run directory: the training entries hold ``<run dir>/trainer.lock`` while they train.

Two trainers on one checkpoint directory would overwrite each other's checkpoints and log
every step twice. It happens when a training job's process is orphaned (its job was marked
failed while the trainer kept running) and a retry starts a second one, or when a second
flow run re-attaches to the same training by another path. Both entries
(``local_entry``, ``skyrl_entry``) therefore take this lock before they read a checkpoint
and keep it until they exit (:mod:`mazerl.process_lock`: the kernel releases it however the
process ends).

A second trainer **waits** for the first: it is the same training, so once the first one
ends the second resumes after its checkpoint marker (and finds the work done if the first
finished it). While it waits it says, once a minute, which process holds the directory, and
how to stop that one. The stage's hang watchdog still bounds the wait: the holder writes
checkpoints (progress), a wedged holder does not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from mazerl.process_lock import Holder, LockUnsupported, ProcessLock

LOCK_FILE = "trainer.lock"
WAIT_REPORT_S = 60.0


def lock_path(run_dir: Path) -> Path:
    return Path(run_dir) / LOCK_FILE


@contextlib.contextmanager
def one_trainer(run_dir: Path, log: Callable[[str], None], *, wait_s: float | None = None) -> Iterator[None]:
    """Hold the run directory's trainer lock for the body, waiting for another trainer that holds it."""
    lock = ProcessLock(lock_path(run_dir), f"training {Path(run_dir).name}")

    def waiting(holder: Holder | None, waited_s: float) -> None:
        who = holder.describe() if holder is not None else "another process"
        stop = f"; stop it with: kill {holder.pid} (on {holder.host})" if holder is not None else ""
        log(
            f"waiting for the trainer that holds {lock.path}: {who}, for {waited_s:.0f} s so far. It trains this "
            f"same run; this one resumes after its last checkpoint once it ends{stop}"
        )

    try:
        lock.acquire(wait_s, on_wait=waiting, report_every_s=WAIT_REPORT_S)
    except LockUnsupported as exc:
        log(f"warning: no trainer lock ({exc}); make sure no other trainer writes {run_dir}")
    try:
        yield
    finally:
        lock.release()
