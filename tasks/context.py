"""What every stage of one pipeline run shares: resolved once by the first task, passed as a value.

``RunContext`` holds no secrets (Prefect persists task inputs and results): the Ray token is
looked up where it is needed (:func:`mazerl.cluster.client.ray_headers`), never carried around.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mazerl.cluster.client import ray_headers  # noqa: F401 (tests/test_bad_inputs.py imports it from here)
from mazerl.cluster.head.local import ensure_local_head
from mazerl.evaluation.settings import EvalSettings
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
    # the cluster given (ray_address), or None: the embedded head, looked up anew at each use
    # (cluster_address), since a resumed run's head is not the killed one's (another port, perhaps)
    ray_address: str | None
    base_model: Path
    eval_set: str
    stage_run_ids: dict[str, str]  # MLflow runs known up front by stage name (the eval flow's one run)
    pipeline_run_id: str  # MLflow parent run id
    # the training config prepare resolved, the one every stage uses (None: the eval-only flow); the
    # train stage writes it into the run directory for its job
    train_config: TrainConfig | None = None
    # how both evals play (resolved once by prepare: the baseline, the final eval and the stage clock's keys use it)
    eval_settings: EvalSettings | None = None
    # what a gracefully stopped flow process does with its stage's Ray job (PipelineParams.ray_jobs_on_stop)
    jobs_on_stop: str = "auto"
    started_at: float = 0.0  # when the run's first stage started (epoch seconds), for the stage lines' elapsed time
    stage_keys: dict[str, str] = field(default_factory=dict)  # what decides each stage's duration (run_clock.work_keys)

    def cluster_address(self) -> str:
        """The Ray dashboard address to use now: the cluster given, else the embedded head running
        now (started if none runs). Never an address an earlier attempt of the flow run cached."""
        if self.ray_address is not None:
            return self.ray_address
        return ensure_local_head().address

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
