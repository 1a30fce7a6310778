"""An exclusive lock that a process holds for as long as it runs, and that names its holder.

One trainer per run directory, one ``mazerl run`` per pipeline run: both need a lock that can
never outlive the process holding it, however that process ends. ``flock`` on a file gives
exactly that: the kernel releases it when the holder's last descriptor closes, SIGKILL and
OOM kills included, so a lock is never stale and needs no clean-up. The file also records
who holds it (pid, host, since when, doing what) so that whoever waits or is refused can say
whom it waits for.

``flock`` works on local file systems and NFS; on Lustre (FSx) only when mounted with
``-o flock``. Where the file system refuses it, :meth:`ProcessLock.acquire` raises
:class:`LockUnsupported` and the caller decides whether to go on without it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its holder recorded it."""

    pid: int
    host: str
    since: float  # time.time() when it took the lock
    what: str

    def describe(self) -> str:
        started = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on {self.host} ({self.what}, since {started})"


class LockHeld(RuntimeError):
    """Another live process holds the lock (``holder``: who, if it said so)."""

    def __init__(self, path: Path, holder: Holder | None, waited_s: float):
        who = holder.describe() if holder is not None else "a process that has not said who it is yet"
        waited = f" after waiting {waited_s:.0f} s" if waited_s >= 1 else ""
        super().__init__(f"{path} is held by {who}{waited}")
        self.path, self.holder, self.waited_s = path, holder, waited_s


class LockUnsupported(OSError):
    """The file system of the lock file does not support ``flock`` (e.g. Lustre without ``-o flock``)."""


class ProcessLock:
    """``with ProcessLock(path, "training run r"):`` holds ``path`` exclusively, or raises :class:`LockHeld`.

    :meth:`acquire` can wait for the holder to end, calling ``on_wait(holder, waited_s)`` at a
    steady pace so that the wait is never silent.
    """

    def __init__(self, path: str | os.PathLike, what: str):
        self.path = Path(path)
        self.what = what
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(
        self,
        wait_s: float | None = 0.0,
        *,
        poll_s: float = 0.5,
        on_wait: Callable[[Holder | None, float], None] | None = None,
        report_every_s: float = 30.0,
    ) -> None:
        """Take the lock, waiting up to ``wait_s`` seconds (None: as long as it takes; 0: not at all)."""
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        started, reported = time.monotonic(), None
        try:
            while not _try_flock(fd, self.path):
                waited = time.monotonic() - started
                if wait_s is not None and waited >= wait_s:
                    raise LockHeld(self.path, read_holder(self.path), waited)
                if on_wait is not None and (reported is None or waited - reported >= report_every_s):
                    on_wait(read_holder(self.path), waited)
                    reported = waited
                time.sleep(poll_s)
        except BaseException:
            os.close(fd)
            raise
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "what": self.what}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Give the lock up (closing the descriptor releases it; the file stays for the next holder)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> ProcessLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


def read_holder(path: str | os.PathLike) -> Holder | None:
    """The holder a lock file records (None: no record, or one being written)."""
    try:
        record = json.loads(Path(path).read_text())
        return Holder(int(record["pid"]), str(record["host"]), float(record["since"]), str(record["what"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _try_flock(fd: int, path: Path, kind: int = fcntl.LOCK_EX) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            raise LockUnsupported(
                exc.errno,
                f"the file system of {path} does not support flock ({exc.strerror}); on Lustre, mount it with -o flock",
            ) from None
        raise
    return True
