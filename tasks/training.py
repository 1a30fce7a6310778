"""train: the GRPO run as a Ray job, resumed from its checkpoint on every retry.

A retry (an infrastructure failure: a lost node, a dead head, a hung job) first waits, up to
``resource_wait_s``, until the cluster has the GPUs the job asks for (SkyRL's placement group, or
the local job's GPU), so that a node HyperPod is still replacing does not use up the retries; the
retries themselves back off (:data:`RETRY_DELAYS_S`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.runtime import flow_run

from mazerl.cluster.checks.run_requirements import inference_start_timeout_s
from mazerl.cluster.errors import ResourcesUnavailableError
from mazerl.cluster.jobs import capacity
from mazerl.cluster.jobs.capacity import ResourceNeed, wait_for_resources
from mazerl.cluster.jobs.spec import META_IDENTITY_PREFIX, JobSpec
from mazerl.evaluation.evaluate import EvalReport
from mazerl.merge.memory import weights_bytes
from mazerl.params import PipelineParams
from mazerl.progress import annotate_step_line
from mazerl.reporting.eval_runs import log_baseline_as_step_zero
from mazerl.tracking.artifacts import log_config_file
from mazerl.tracking.lineage import stage_run
from mazerl.tracking.params import log_params
from mazerl.training import checkpoints
from mazerl.training.config import TrainConfig
from mazerl.training.progress import TrainingProgress
from mazerl.training.run_config import check_unedited, record_config
from mazerl.training.skyrl_backend import placement_bundles
from tasks.context import RunContext, ray_headers
from tasks.jobs import attempt_number, retry_on_infrastructure, run_stage_job, stage_job
from tasks.stages import timed_stage

ENTRYPOINTS = {"local": "mazerl.training.local_entry", "skyrl": "mazerl.training.skyrl_entry"}
# Delays before the 1st, 2nd, 3rd (and every later) retry: a transient failure is retried soon, later
# ones further apart. A lost node is waited for before each resubmission (resource_wait_s), not here.
RETRY_DELAYS_S = [10.0, 60.0, 300.0]


def job_need(config: TrainConfig, local_gpus: int) -> ResourceNeed:
    """What the train job asks Ray for: SkyRL's placement group (every training GPU at once), or the
    local job's entrypoint GPU (none: nothing to wait for)."""
    if config.backend == "skyrl":
        bundles, strategy = placement_bundles(config)
        return ResourceNeed(tuple(bundles), strategy, what="the train job (SkyRL's placement group)")
    return ResourceNeed(({"GPU": float(local_gpus)},) if local_gpus else (), what="the train job")


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
    retries=PipelineParams.model_fields["train_retries"].default,  # the flow sets params.train_retries
    retry_delay_seconds=RETRY_DELAYS_S,
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


def _train_job(run: RunContext, params: PipelineParams, config: TrainConfig, config_path: Path) -> JobSpec:
    """The backend's entrypoint as this attempt's job: its MLflow run, the backend's environment, the
    training's identity (a re-run re-attaches to the same training) and the GPUs it asks for."""
    return stage_job(
        run,
        "train",
        ENTRYPOINTS[config.backend],
        config_path,
        env_vars={"MLFLOW_TRACKING_URI": run.tracking_uri, "MLFLOW_RUN_ID": config.mlflow.run_id}
        | _backend_env(run, config),
        identity=config.identity(),
        num_gpus=params.local_train_gpus or None,
    )


def _train(run: RunContext, params: PipelineParams, baseline: EvalReport | None) -> TrainOutcome:
    logger = get_run_logger()
    run_id = run.stage_run_id("train")
    config = run.training()
    config = config.model_copy(update={"mlflow": config.mlflow.model_copy(update={"run_id": run_id})})
    check_unedited(config)  # a resumed run trains what it started with, or says why not
    config_path = record_config(config)  # where the job reads it
    progress, progress_id, on_line = _progress_artifact(run, config)
    resumed_from = _marker_step(config)
    clock = run.clock()
    greedy_baseline = None
    attempt = attempt_number()

    with stage_run(run.tracking_uri, run_id):
        log_params(run.tracking_uri, run_id, config)
        log_config_file(run.tracking_uri, run_id, config_path)
        if baseline is not None and config.eval_interval:
            greedy_baseline = log_baseline_as_step_zero(run.tracking_uri, run_id, baseline, config.eval_mazes)
        outcome = run_stage_job(
            run,
            _train_job(run, params, config, config_path),
            hang_timeout_s=params.hang_timeout_s,
            progress_probe=progress,
            on_line=on_line,
            rewrite=lambda line: annotate_step_line(
                line,
                baseline=greedy_baseline,
                total_left=(lambda left: clock.left_text("train", left)) if run.stage_keys else None,
            ),
            before_submit=partial(_wait_for_the_cluster, run, params, config, attempt, logger) if attempt > 1 else None,
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
        resumed_from=resumed_from,
    )


def _backend_env(run: RunContext, config: TrainConfig) -> dict[str, str]:
    """The backend's own settings for its job: SkyRL's wait for its vLLM servers, sized to the model
    (SkyRL forwards every SKYRL_* variable of the job to its workers)."""
    if config.backend != "skyrl":
        return {}
    timeout = inference_start_timeout_s(weights_bytes(run.base_model), config.skyrl.num_nodes)
    return {"SKYRL_WAIT_UNTIL_INFERENCE_SERVER_HEALTHY_TIMEOUT_S": str(timeout)}


def _marker_step(config: TrainConfig) -> int:
    """The step the checkpoint marker names (0: none, or a marker the trainer will repair on resume)."""
    try:
        return checkpoints.read_marker(config.checkpoint_dir) or 0
    except checkpoints.CheckpointError:
        return 0


def _progress_artifact(run: RunContext, config: TrainConfig) -> tuple[TrainingProgress, UUID, Callable[[str], None]]:
    """The train-progress artifact and the job-line hook that moves it on, with the progress both read.

    One reading of progress for the hang watchdog and the artifact: the step lines both backends
    print, and the checkpoint marker on the shared mount.
    """
    progress_id = create_progress_artifact(0.0, key="train-progress", description=f"GRPO steps of {run.run_id}")
    progress = TrainingProgress(config.checkpoint_dir, total_steps=config.steps)
    shown = {"fraction": 0.0}

    def on_line(_line: str) -> None:  # the submitter has fed the line to `progress` already
        fraction = progress.fraction
        if fraction is not None and fraction > shown["fraction"]:
            shown["fraction"] = fraction
            update_progress_artifact(progress_id, 100.0 * fraction)

    return progress, progress_id, on_line


def _wait_for_the_cluster(
    run: RunContext,
    params: PipelineParams,
    config: TrainConfig,
    attempt: int,
    logger: logging.Logger | logging.LoggerAdapter,
) -> None:
    """A retry resubmits only once the cluster has what the job asks for; a timeout says how to resume."""
    address = run.cluster_address()
    try:
        wait_for_resources(
            address,
            job_need(config, params.local_train_gpus),
            pipeline_run_id=run.flow_run_id,
            attempt=attempt,
            stage="train",
            timeout_s=params.resource_wait_s,
            report_every_s=capacity.REPORT_EVERY_S,
            headers=ray_headers(address),
            log=logger.info,
        )
    except ResourcesUnavailableError as exc:
        step = _marker_step(config)
        raise ResourcesUnavailableError(
            f"train: {exc}. The checkpoint at step {step} is kept: once the cluster has them again, retry this "
            f"flow run (prefect flow-run retry {flow_run.id}) and training resumes after step {step}; "
            f"resource_wait_s ({params.resource_wait_s:g} s) bounds the wait",
            address=exc.address,
            waited_s=exc.waited_s,
        ) from None
