"""The embedded Ray head's private temp dir, and the names of the files kept in it.

The head's temp dir is private: it must belong to this user and not be group- or
world-writable (a directory someone else made, or opened up, is refused: whoever can write
there can replace the registry or the token). Ray's own temp dir is a subdirectory of it
(``r/``): Ray makes that one 0777 whenever it starts a worker (measured with Ray 2.60), so
it is the private parent, which Ray never touches, that keeps other users out.

The head's token is kept here in a 0600 file (:func:`write_secret`) and never logged.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import stat
import tempfile
from pathlib import Path

REGISTRY_NAME = "mazerl_head.json"
TOKEN_NAME = "mazerl_auth_token"
HEAD_LOG_NAME = "mazerl_head.log"
LOCK_NAME = "mazerl_head.lock"
LEASES_NAME = "mazerl_leases"
PRIVATE_MODE = 0o700
# Ray's Unix socket paths (<temp>/r/session_<date>_<pid>/sockets/plasma_store) must stay under
# 107 bytes, so the temp dir has to be short.
MAX_TEMP_DIR_CHARS = 38
RAY_SUBDIR = "r"  # Ray's --temp-dir, inside ours


class UnsafeTempDirError(ValueError):
    """The head's temp dir is too long for Ray, or others could write into it: a bad input, not a failure."""


def default_temp_dir() -> Path:
    """A short per-user directory (Ray's socket paths have a length limit)."""
    return Path(tempfile.gettempdir()) / f"mazerl-ray-{os.getuid()}"


def check_temp_dir(temp_dir: str | os.PathLike | None = None) -> Path:
    """The head's temp dir, made if missing, refused (UnsafeTempDirError) if Ray cannot use it or others
    can write into it.

    Cheap and writes nothing but the directory itself: what ``mazerl run`` and ``mazerl eval``
    check before they start anything, and what every use of the head goes through.
    """
    if temp_dir is None:
        check_tmpdir_env()
    temp = Path(temp_dir) if temp_dir is not None else default_temp_dir()
    temp = temp.expanduser().absolute()
    if len(str(temp)) > MAX_TEMP_DIR_CHARS:
        given = "temp_dir" if temp_dir is not None else f"TMPDIR ({tempfile.gettempdir()})"
        short = Path("/tmp") / f"mazerl-ray-{os.getuid()}"
        raise UnsafeTempDirError(
            f"the local Ray head's temp dir {temp} is {len(str(temp))} characters, from {given}; Ray's socket paths "
            f"under it must stay below 107 bytes, so it may have at most {MAX_TEMP_DIR_CHARS}: set TMPDIR to a "
            f"shorter directory (e.g. export TMPDIR=/tmp, which gives {short})"
        )
    temp.mkdir(mode=PRIVATE_MODE, parents=True, exist_ok=True)
    info = temp.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise UnsafeTempDirError(
            f"the local Ray head's temp dir {temp} belongs to uid {info.st_uid}, not to you (uid {os.getuid()}), "
            "or is not a directory: whoever owns it can replace the head's registry and token. Remove it, or set "
            "TMPDIR to a directory of your own"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        raise UnsafeTempDirError(
            f"the local Ray head's temp dir {temp} has mode {mode:04o}: other users can write into it and could "
            f"have replaced the head's registry or token. Check it and remove it (rm -rf {shlex.quote(str(temp))}), or "
            f"make it private again (chmod 700 {shlex.quote(str(temp))}), then run again"
        )
    return temp


def check_tmpdir_env() -> None:
    """``TMPDIR``, when set, names a directory this user can write.

    Python (and so the head's temp dir, and Ray) silently falls back to the shared ``/tmp`` when it does
    not: the head's files would land where the user did not say, shared with whoever else runs there.
    """
    value = os.environ.get("TMPDIR")
    if not value:  # unset or empty: Python's default, /tmp
        return
    path = Path(value)
    if not path.is_dir():
        problem = "is not a directory" if path.exists() else "does not exist"
    elif not os.access(path, os.W_OK | os.X_OK):
        problem = "is not writable by this user"
    else:
        return
    raise UnsafeTempDirError(
        f"TMPDIR={value!r} {problem}, so the local Ray head's temp dir would silently be under the shared /tmp "
        f"instead; create it (mkdir -p {shlex.quote(value)}), set TMPDIR to a directory you can write, or unset it "
        "(unset TMPDIR) for /tmp"
    )


def write_secret(path: Path, value: str) -> None:
    """``value`` into ``path``, readable by this user only from the moment it exists (0600, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value)
    os.replace(tmp, path)


def remove(path: Path) -> None:
    """Remove ``path`` if it is there."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
