"""The data root: it can be created and written by this user (tried, not guessed from permission bits:
root passes ``os.access`` on ``/proc``), its names fit the file system, no control character and none of
the characters a URI reads specially, no symbolic link that leads nowhere on the way, and room on its file
system; an empty ``MAZERL_HOME`` or ``--data-root`` is refused, not read as ``./.mazerl``.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from mazerl import paths
from mazerl.address_forms import control_character
from mazerl.preflight.input_error import InputError

# A URI's query, fragment and escape: a path holding one is cut or garbled where it becomes a URI (MLflow's
# sqlite:///<root>/mlflow.db: '?' put the database outside the root; Prefect's database URL: '%' hung its server).
URI_SPECIAL = {"?": "a query", "#": "a fragment", "%": "an escape"}
# What a run writes under its data root before verify_cluster measures the run's own footprint: the starter's
# copy (9 MB), the MLflow and Prefect databases, the first eval's files. With less, the run ends in a bare
# "[Errno 28] No space left on device" somewhere in its first stage.
MIN_FREE_BYTES = 64 * 2**20


def check_data_root(root: Path, field: str = "data_root", fix: str | None = None) -> None:
    """The directory exists and is writable, or can be created (tried, and nothing is left to find out).

    ``field`` is the name the user gave it by (``data_root``, ``MAZERL_HOME``; ``--out`` for a command's output,
    ``PREFECT_HOME``); ``fix``, what every refusal ends with (by default: choose another directory for ``field``).
    """
    root = Path(root)
    is_root = field in ("data_root", paths.ROOT_ENV_VAR)
    if fix is None:
        fix = (
            "choose a directory you can write with data_root (--data-root) or MAZERL_HOME"
            if is_root
            else f"choose a directory you can write for {field}"
        )
    char = control_character(str(root))
    if char:
        raise InputError(field, f"{field}={str(root)!r} holds a control character ({char}); {fix}")
    if is_root:
        check_uri_safe(root, field, fix)
    _check_name_lengths(root, field, fix)
    existing = root
    try:
        while not existing.exists() and existing != existing.parent:
            if existing.is_symlink():  # mkdir would fail on it: "File exists"
                raise InputError(
                    field, f"{field}={str(root)!r} cannot be created: {existing} {_dead_link(existing)}; {fix}"
                )
            existing = existing.parent
    except OSError as exc:  # a directory on the way that this user may not look into
        raise InputError(field, f"{field}={str(root)!r} cannot be reached ({exc.strerror}); {fix}") from None
    if not existing.is_dir():
        raise InputError(
            field, f"{field}={str(root)!r} cannot be created: {existing} is a file, not a directory; {fix}"
        )
    what = "is not writable" if existing == root else f"cannot be created: {existing} is not writable"
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(field, f"{field}={str(root)!r} {what} by this user (or is read-only); {fix}")
    try:  # the permission bits can pass where creating fails (root on /proc, some network mounts)
        os.rmdir(tempfile.mkdtemp(prefix=".mazerl-probe-", dir=existing))
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise InputError(field, f"{field}={str(root)!r} {what} ({exc.strerror}); {fix}") from None
    _check_free_space(root, existing, field, fix)


def check_uri_safe(path: Path, field: str, fix: str) -> None:
    """No character a URI reads specially (:data:`URI_SPECIAL`) in ``path``, which database URIs are built from."""
    char = next((char for char in str(path) if char in URI_SPECIAL), None)
    if char:
        raise InputError(
            field,
            f"{field}={str(path)!r} holds {char!r}, which starts {URI_SPECIAL[char]} in a URI: the database URIs "
            f"built from it (MLflow's sqlite:///, Prefect's) would name another file; {fix} (without ?, # or %)",
        )


def _dead_link(path: Path) -> str:
    """Why the symbolic link ``path`` leads nowhere: a loop of links, or a target that does not exist."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a loop of symbolic links"
    return f"is a symbolic link to {os.readlink(path)}, which does not exist"


def _check_free_space(root: Path, existing: Path, field: str, fix: str) -> None:
    """At least :data:`MIN_FREE_BYTES` free where ``root`` is (or will be): a full disk is named with its path."""
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        shown = f"{free / 2**20:.1f} MiB" if free >= 2**20 else f"{free // 2**10} KiB"
        raise InputError(
            field,
            f"{field}={str(root)!r}: the file system under {existing} has {shown} free, and mazerl needs at "
            f"least {MIN_FREE_BYTES // 2**20} MiB there before it starts (the starter's copy, the MLflow "
            f"and Prefect databases); free space there, or {fix}",
        )


def _check_name_lengths(path: Path, field: str, fix: str) -> None:
    """Every name in ``path`` and the whole of it fit the file system's limits (else a raw ``[Errno 36]`` later)."""
    existing = Path(path.anchor or "/")
    name_max, path_max = 255, 4096  # Linux's; the nearest existing directory's own limits where it says
    for part in path.parts[1:]:
        if len(os.fsencode(part)) > name_max:
            break
        try:
            if not (existing / part).is_dir():
                break
        except OSError:
            break
        existing = existing / part
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        pass
    for part in path.parts[1:]:
        size = len(os.fsencode(part))
        if size > name_max:
            raise InputError(
                field,
                f"{field}: the name {part[:40]}... in it is {size} bytes, more than the {name_max} the file system "
                f"under {existing} allows for one name; {fix} (with shorter names)",
            )
    size = len(os.fsencode(str(path)))
    if size > path_max - 512:  # room for what a run writes below it (runs/<id>/checkpoints/global_step_<N>/...)
        raise InputError(
            field,
            f"{field} is {size} bytes long; the file system allows paths of {path_max} bytes and a run writes up to "
            f"about 500 below its data root; {fix} (a shorter path)",
        )


def check_root_env(data_root: str | None) -> str:
    """The name the data root comes by (``data_root`` or ``MAZERL_HOME``); an empty ``MAZERL_HOME`` or
    ``data_root`` is refused (it would silently mean ``./.mazerl`` in whatever directory each process starts
    in), and so is a ``MAZERL_DATA_ROOT_MODE`` that is not a usable mode.
    """
    try:
        paths.data_root_mode()
    except ValueError as exc:
        raise InputError(paths.DATA_ROOT_MODE_ENV_VAR, str(exc)) from None
    if data_root is not None and not data_root.strip():
        raise InputError(
            "data_root",
            f"data_root (--data-root) is empty ({data_root!r}); give the data root (e.g. --data-root "
            f"$HOME/.mazerl), or leave it out for ${paths.ROOT_ENV_VAR} or ./.mazerl",
        )
    if data_root:
        return "data_root"
    value = os.environ.get(paths.ROOT_ENV_VAR)
    if value is None:
        return "data_root"
    if not value.strip():
        raise InputError(
            paths.ROOT_ENV_VAR,
            f"{paths.ROOT_ENV_VAR} is set but empty ({value!r}); set it to the data root (e.g. export "
            f"{paths.ROOT_ENV_VAR}=$HOME/.mazerl), or unset it (unset {paths.ROOT_ENV_VAR}) for ./.mazerl",
        )
    return paths.ROOT_ENV_VAR
