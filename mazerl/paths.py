"""The data root and the file layout under it (docs/architecture.md, "The data root").

Everything a run produces lives under one root: ``./.mazerl`` by default, ``$MAZERL_HOME``
when set, or an explicit parameter; on a cluster it is the shared mount (``/shared``).
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_ROOT = ".mazerl"
ROOT_ENV_VAR = "MAZERL_HOME"
DATA_ROOT_MODE_ENV_VAR = "MAZERL_DATA_ROOT_MODE"
PRIVATE_DIR_MODE = 0o700  # what mazerl creates is its user's alone unless a deployment says otherwise


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Resolve the data root: the argument, else ``$MAZERL_HOME``, else ``./.mazerl`` (:func:`absolute_path`)."""
    return absolute_path(root or os.environ.get(ROOT_ENV_VAR) or DEFAULT_ROOT)


def absolute_path(path: str | os.PathLike) -> Path:
    """``path`` made absolute (``~`` expanded, links resolved).

    A path that cannot exist (a name longer than the file system allows, a loop of symbolic links) is
    made absolute without resolving links, so the preflight (:mod:`mazerl.preflight.data_root`,
    :mod:`mazerl.preflight.model_dir`) can say what is wrong with it instead of a traceback.
    """
    path = Path(path).expanduser()
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # Python 3.11 raises RuntimeError for a loop of links (3.13: OSError)
        return Path(os.path.abspath(path))


def data_root_mode() -> int:
    """The mode of a data root mazerl creates: ``$MAZERL_DATA_ROOT_MODE`` (octal), else 0700 (its user only).

    A deployment whose pods share the root under different users in one group sets e.g. 0770;
    the files mazerl creates directly in it (the embedded ``mlflow.db``) get the same bits without
    execute (:func:`store_file_mode`). A root that already exists (a cluster's mount) keeps its mode.
    """
    text = os.environ.get(DATA_ROOT_MODE_ENV_VAR, "").strip()
    if not text:
        return PRIVATE_DIR_MODE
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777 or not mode & 0o700 == 0o700:
        raise ValueError(
            f"{DATA_ROOT_MODE_ENV_VAR}={text!r} is not a directory mode its owner can use; give octal permission "
            "bits with rwx for the owner, e.g. 0700 (private, the default) or 0770 (shared with the group)"
        )
    return mode


def store_file_mode() -> int:
    """The mode of a file mazerl creates in the data root: the root's bits without execute (0700 -> 0600)."""
    return data_root_mode() & 0o666


def make_data_root(root: Path) -> Path:
    """Create the data root (and missing parents) if it does not exist, with :func:`data_root_mode`."""
    mode = data_root_mode()
    if not root.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, mode)  # exactly, whatever the umask
    return root


def create_store_file(path: Path) -> None:
    """Create an empty ``path`` (SQLite's database file) with :func:`store_file_mode`, unless it exists.

    SQLite would create it readable by everyone (0644 under the usual umask); its journal and WAL
    files take the database file's mode.
    """
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, store_file_mode()))
    except FileExistsError:
        return
    os.chmod(path, store_file_mode())


def dir_size_mb(path: str | os.PathLike) -> float:
    """Total size of the files under ``path``, in MiB."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()) / 2**20


def models_dir(root: Path) -> Path:
    return root / "models"


def run_id_for(flow_run_name: str, flow_run_id: str) -> str:
    """A pipeline run's directory name: readable, and the same for every attempt of one flow run
    (``festive-rattlesnake-1a2b3c4d``: the Prefect flow run's name and the start of its id)."""
    return f"{flow_run_name}-{flow_run_id[:8]}"


def run_dir(root: Path, run_id: str) -> Path:
    return root / "runs" / run_id


def checkpoints_dir(root: Path, run_id: str) -> Path:
    return run_dir(root, run_id) / "checkpoints"


def merged_dir(root: Path, run_id: str) -> Path:
    return run_dir(root, run_id) / "merged"


def eval_dir(root: Path, run_id: str, stage: str) -> Path:
    return run_dir(root, run_id) / "eval" / stage


def mlflow_db_uri(root: Path) -> str:
    return f"sqlite:///{root / 'mlflow.db'}"


def mlflow_artifacts_dir(root: Path) -> Path:
    return root / "mlartifacts"


def venv_command(name: str) -> str:
    """How to call this environment's console script ``name`` from the current directory, shell-quoted.

    ``mlflow`` or ``mazerl`` alone is not on the PATH outside an activated venv, so hints
    printed for the user name the script beside this Python (``.venv/bin/mlflow`` when the venv
    lies under the working directory, its absolute path otherwise), quoted so the hint works pasted
    into a shell wherever the venv lies (a path with spaces).
    """
    import shlex
    import sys

    script = Path(sys.executable).parent / name
    try:
        return shlex.quote(str(script.relative_to(Path.cwd())))
    except ValueError:
        return shlex.quote(str(script))
