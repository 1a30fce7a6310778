"""What every stage of one pipeline run shares: resolved once by the first task, passed as a value.

``RunContext`` holds no secrets (Prefect persists task inputs and results): the Ray token is
looked up where it is needed (:func:`ray_headers`), never carried around.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mazerl.cluster.ray_local import find_local_head


@dataclass(frozen=True)
class RunContext:
    """One pipeline run: ids, where things live, and which cluster and model it uses."""

    run_id: str  # the data-root run directory name (stable across retries of the flow run)
    flow_run_id: str
    root: Path
    tracking_uri: str
    ray_address: str
    base_model: Path
    eval_set: str
    stage_run_ids: dict[str, str]  # MLflow child run ids by stage name
    pipeline_run_id: str  # MLflow parent run id

    @property
    def run_dir(self) -> Path:
        return self.root / "runs" / self.run_id


def ray_headers(address: str) -> dict[str, str] | None:
    """Bearer header for the embedded local head; None elsewhere (Ray reads its token from the environment)."""
    head = find_local_head()
    if head is not None and head.address.rstrip("/") == address.rstrip("/"):
        return head.auth_headers()
    return None
