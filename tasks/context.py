"""What every stage of one pipeline run shares: resolved once by the first task, passed as a value.

``RunContext`` holds no secrets (Prefect persists task inputs and results): the Ray token is
looked up where it is needed (:func:`ray_headers`), never carried around.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from mazerl.cluster.ray_local import find_local_head
from mazerl.run_clock import RunClock
from mazerl.tracking import lineage
from mazerl.training.config import TrainConfig


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
    stage_run_ids: dict[str, str]  # MLflow runs known up front by stage name (the eval flow's one run)
    pipeline_run_id: str  # MLflow parent run id
    # the training config prepare resolved, the one every stage uses (None: the eval-only flow); the
    # train stage writes it into the run directory for its job
    train_config: TrainConfig | None = None
    started_at: float = 0.0  # when the run's first stage started (epoch seconds), for the stage lines' elapsed time
    stage_keys: dict[str, str] = field(default_factory=dict)  # what decides each stage's duration (run_clock.work_keys)

    @property
    def run_dir(self) -> Path:
        return self.root / "runs" / self.run_id

    def training(self) -> TrainConfig:
        """The training config ``prepare`` resolved for this run."""
        if self.train_config is None:
            raise ValueError(f"run {self.run_id} has no training config: it is an eval-only run")
        return self.train_config

    def clock(self) -> RunClock:
        """This run's stage times and time left (``mazerl.run_clock``)."""
        steps = self.train_config.steps if self.train_config is not None else 0
        return RunClock(self.root, self.run_id, self.stage_keys, steps, self.started_at)

    def stage_run_id(self, stage: str) -> str:
        """The MLflow run of ``stage``: a known one, else the parent's child run, created now if the
        stage has none yet, so that it starts when the stage starts (``lineage.stage_run_id``)."""
        if stage in self.stage_run_ids:
            return self.stage_run_ids[stage]
        return lineage.stage_run_id(self.tracking_uri, self.pipeline_run_id, stage)


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
