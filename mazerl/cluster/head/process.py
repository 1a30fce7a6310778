"""The embedded Ray head's processes: is a pid still our head, is anything of its process group left, kill it.

The head is ``ray start --head --block`` in its own process group, so it outlives a crashed
caller and can be stopped by its process id without touching any other Ray on the machine.
A pid read back from the registry may have been recycled: :func:`is_our_head_process` checks
that it is ``ray start`` with our temp dir before anything is signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from mazerl.cluster.head.temp_dir import RAY_SUBDIR


def is_our_head_process(pid: int, temp: Path) -> bool:
    """Guards against a recycled pid: the process must be `ray start` with our temp dir."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return pid_alive(pid)  # no /proc (macOS): fall back to liveness
    return f"--temp-dir={temp / RAY_SUBDIR}".encode() in cmdline


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_group_alive(pgid: int) -> bool:
    """Any non-zombie process left in the head's process group (reaping our own child first:
    a zombie leader would otherwise look alive to ``killpg(pgid, 0)``)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)
    import psutil  # a Ray dependency

    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` of a started process's log, for the error that says it did not come up."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
