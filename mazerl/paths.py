"""The data root and the file layout under it (design section 2).

Everything a run produces lives under one root: ``./.mazerl`` by default, ``$MAZERL_HOME``
when set, or an explicit parameter; on a cluster it is the shared mount (``/shared``).
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_ROOT = ".mazerl"
ROOT_ENV_VAR = "MAZERL_HOME"


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Resolve the data root: the argument, else ``$MAZERL_HOME``, else ``./.mazerl`` (absolute)."""
    chosen = root or os.environ.get(ROOT_ENV_VAR) or DEFAULT_ROOT
    return Path(chosen).expanduser().resolve()


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
    """How to call this environment's console script ``name`` from the current directory.

    ``mlflow`` or ``mazerl`` alone is not on the PATH outside an activated venv, so hints
    printed for the user name the script beside this Python (``.venv/bin/mlflow`` when the venv
    lies under the working directory, its absolute path otherwise).
    """
    import sys

    script = Path(sys.executable).parent / name
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)
