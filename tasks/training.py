"""train: the GRPO run as a Ray job, resumed from its checkpoint on every retry."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from mazerl.cluster.submitter import META_IDENTITY_PREFIX
from mazerl.params import PipelineParams
from mazerl.tracking.artifacts import log_config_file
from mazerl.tracking.lineage import stage_run
from mazerl.tracking.params import log_params
from mazerl.training import checkpoints
from mazerl.training.config import save_config
from mazerl.training.progress import TrainingProgress
from tasks.context import RunContext
from tasks.jobs import retry_on_infrastructure, run_stage_job

ENTRYPOINTS = {"local": "mazerl.training.local_entry", "skyrl": "mazerl.training.skyrl_entry"}


@dataclass(frozen=True)
class TrainOutcome:
    """What the train stage leaves behind: the checkpoint the marker names, and how far it got."""

    checkpoints_dir: Path
    final_step: int
    steps: int
    metrics_jsonl: Path
    submission_id: str


@task(
    name="train",
    retries=3,
    retry_delay_seconds=10,
    retry_condition_fn=retry_on_infrastructure,
    persist_result=True,
)
def train(run: RunContext, params: PipelineParams) -> TrainOutcome:
    """Submit the backend's entrypoint; a retry resubmits and the job resumes from the marker's step."""
    logger = get_run_logger()
    run_id = run.stage_run_id("train")
    config = run.training()
    config = config.model_copy(update={"mlflow": config.mlflow.model_copy(update={"run_id": run_id})})
    config_path = save_config(config, run.run_dir / "train_config.json")  # where the job reads it
    progress_id = create_progress_artifact(0.0, key="train-progress", description=f"GRPO steps of {run.run_id}")
    # One reading of progress for the hang watchdog and the artifact: the step lines both
    # backends print, and the checkpoint marker on the shared mount.
    progress = TrainingProgress(config.checkpoint_dir, total_steps=config.steps)
    shown = {"fraction": 0.0}

    def on_line(_line: str) -> None:  # the submitter has fed the line to `progress` already
        fraction = progress.fraction
        if fraction is not None and fraction > shown["fraction"]:
            shown["fraction"] = fraction
            update_progress_artifact(progress_id, 100.0 * fraction)

    with stage_run(run.tracking_uri, run_id):
        log_params(run.tracking_uri, run_id, config)
        log_config_file(run.tracking_uri, run_id, config_path)
        outcome = run_stage_job(
            run,
            "train",
            ENTRYPOINTS[config.backend],
            config_path,
            env_vars={"MLFLOW_TRACKING_URI": run.tracking_uri, "MLFLOW_RUN_ID": run_id},
            hang_timeout_s=params.hang_timeout_s,
            progress_probe=progress,
            on_line=on_line,
            identity=config.identity(),
            entrypoint_num_gpus=params.local_train_gpus or None,
        )
        trained_by = outcome.metadata.get(META_IDENTITY_PREFIX + "run_id", config.run_id)
        if trained_by != config.run_id:  # re-attached to the same training started by an earlier flow run
            logger.info(f"train: the checkpoints are those of run {trained_by}, whose job this flow run followed")
            config = config.model_copy(update={"run_id": trained_by})
        latest = checkpoints.latest(config.checkpoint_dir)
        final_step = latest.step if latest else 0
        if final_step < config.steps:  # never report steps that did not run as done
            raise RuntimeError(
                f"the training job {outcome.submission_id} ended successfully but its checkpoint marker says "
                f"step {final_step} of {config.steps}; see the job log above"
            )
    update_progress_artifact(progress_id, 100.0)
    logger.info(f"train: {final_step}/{config.steps} steps, checkpoint {latest.path}")
    return TrainOutcome(
        checkpoints_dir=config.checkpoint_dir,
        final_step=final_step,
        steps=config.steps,
        metrics_jsonl=config.run_dir / "metrics.jsonl",
        submission_id=outcome.submission_id,
    )
