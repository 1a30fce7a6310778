"""train: the GRPO run as a Ray job, resumed from its checkpoint on every retry."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from mazerl.cluster.submitter import META_IDENTITY_PREFIX
from mazerl.evaluation.evaluate import EvalReport
from mazerl.params import PipelineParams
from mazerl.reporting.eval_runs import log_baseline_as_step_zero
from mazerl.tracking.artifacts import log_config_file
from mazerl.tracking.lineage import stage_run
from mazerl.tracking.params import log_params
from mazerl.training import checkpoints
from mazerl.training.config import save_config
from mazerl.training.progress import TrainingProgress, annotate_step_line
from tasks.context import RunContext
from tasks.jobs import retry_on_infrastructure, run_stage_job
from tasks.stages import timed_stage

ENTRYPOINTS = {"local": "mazerl.training.local_entry", "skyrl": "mazerl.training.skyrl_entry"}


@dataclass(frozen=True)
class TrainOutcome:
    """What the train stage leaves behind: the checkpoint the marker names, and how far it got."""

    checkpoints_dir: Path
    final_step: int
    steps: int
    metrics_jsonl: Path
    submission_id: str
    resumed_from: int = 0  # the step this attempt's job started after (0: from the start)


@task(
    name="train",
    retries=3,
    retry_delay_seconds=10,
    retry_condition_fn=retry_on_infrastructure,
    persist_result=True,
)
def train(run: RunContext, params: PipelineParams, baseline: EvalReport | None = None) -> TrainOutcome:
    """Submit the backend's entrypoint; a retry resubmits and the job resumes from the marker's step.

    With the ``baseline`` report, the train run's greedy eval chart starts at step 0 with it, and
    each periodic eval's step line shows it alongside."""
    with timed_stage(run, "train") as timer:
        outcome = _train(run, params, baseline)
        timer.same_work = outcome.resumed_from == 0  # a resumed attempt ran only part of the steps
    return outcome


def _train(run: RunContext, params: PipelineParams, baseline: EvalReport | None) -> TrainOutcome:
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

    resumed = checkpoints.latest(config.checkpoint_dir)
    clock = run.clock()
    greedy_baseline = None
    with stage_run(run.tracking_uri, run_id):
        log_params(run.tracking_uri, run_id, config)
        log_config_file(run.tracking_uri, run_id, config_path)
        if baseline is not None and config.eval_interval:
            greedy_baseline = log_baseline_as_step_zero(run.tracking_uri, run_id, baseline, config.eval_mazes)
        outcome = run_stage_job(
            run,
            "train",
            ENTRYPOINTS[config.backend],
            config_path,
            env_vars={"MLFLOW_TRACKING_URI": run.tracking_uri, "MLFLOW_RUN_ID": run_id},
            hang_timeout_s=params.hang_timeout_s,
            progress_probe=progress,
            on_line=on_line,
            rewrite=lambda line: annotate_step_line(
                line,
                baseline=greedy_baseline,
                total_left=(lambda left: clock.left_text("train", left)) if run.stage_keys else None,
            ),
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
        resumed_from=resumed.step if resumed else 0,
    )
