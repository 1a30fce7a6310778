"""What every stage of one pipeline run shares: resolved once by the first task, passed as a value.

``RunContext`` holds no secrets (Prefect persists task inputs and results): the Ray token is
looked up where it is needed (:func:`ray_headers`), never carried around.
"""

from __future__ import annotations

import os
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
    """The bearer header for a token-protected cluster, read fresh where the token lives.

    The embedded head keeps its token in a 0600 file of its own; a cluster's token comes from
    Ray's standard variables (``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``, e.g. a mounted
    Kubernetes Secret). None: no token known, Ray's client decides.
    """
    head = find_local_head()
    if head is not None and head.address.rstrip("/") == address.rstrip("/"):
        return head.auth_headers()
    token = os.environ.get("RAY_AUTH_TOKEN")
    if not token and os.environ.get("RAY_AUTH_TOKEN_PATH"):
        token = Path(os.environ["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else None
