"""Artifacts on MLflow runs, never with a credential in them.

Text files are logged with secrets scrubbed from their content; a directory is logged as is
only after none of its text files holds a credential (:func:`check_no_secrets`, which the merged model's
logging calls; :mod:`mazerl.tracking.secrets`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mazerl.tracking.secrets import SecretLeakError, find_secrets, scrub_text
from mazerl.tracking.store import client_for


def log_text_artifact(tracking_uri: str, run_id: str, path: str | os.PathLike, artifact_path: str | None = None) -> str:
    """Log one text file with secrets scrubbed from its content; returns the artifact's relative path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path={str(path)!r} does not exist; nothing to log")
    text = scrub_text(path.read_text(errors="replace"))
    with tempfile.TemporaryDirectory(prefix="mazerl-artifact-") as staging:
        staged = Path(staging) / path.name
        staged.write_text(text)
        client_for(tracking_uri).log_artifact(run_id, str(staged), artifact_path)
    return f"{artifact_path}/{path.name}" if artifact_path else path.name


def check_no_secrets(local_dir: str | os.PathLike) -> None:
    """Raise SecretLeakError if a file under ``local_dir`` holds a credential (nothing is logged then)."""
    local_dir = Path(local_dir)
    leaks = find_secrets(p for p in local_dir.rglob("*") if p.is_file())
    if leaks:
        raise SecretLeakError(
            f"refusing to log {local_dir} to MLflow: {'; '.join(leaks[:5])}; remove the credential from the files"
        )


def log_config_file(tracking_uri: str, run_id: str, path: str | os.PathLike, artifact_path: str = "config") -> str:
    """Log the resolved training config file (secrets scrubbed) under ``config/``."""
    return log_text_artifact(tracking_uri, run_id, path, artifact_path)


def artifact_uri(tracking_uri: str, run_id: str, artifact_path: str) -> str:
    """The absolute URI of an artifact of a run (what the model registry wants as a version's source)."""
    base = client_for(tracking_uri).get_run(run_id).info.artifact_uri.rstrip("/")
    return f"{base}/{artifact_path.strip('/')}"
