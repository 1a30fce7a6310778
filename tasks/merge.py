"""merge_lora: fold the adapter named by the checkpoint marker into the base model, with proof."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import get_run_logger, task

from mazerl.params import PipelineParams
from mazerl.tracking.lineage import log_merged_model, stage_run
from mazerl.tracking.merge import merge_lora
from tasks.context import RunContext
from tasks.training import TrainOutcome


@dataclass(frozen=True)
class MergedModel:
    path: Path
    source: str  # the artifact URI (or pointer) to register
    checkpoint_step: int
    summary: str


@task(name="merge_lora", retries=1, retry_delay_seconds=5, persist_result=True)
def merge(run: RunContext, trained: TrainOutcome, params: PipelineParams) -> MergedModel:
    logger = get_run_logger()
    run_id = run.stage_run_id("merge_lora")
    with stage_run(run.tracking_uri, run_id):
        report = merge_lora(
            run.base_model,
            trained.checkpoints_dir,
            run.run_dir / "merged",
            probe_eval_set=run.eval_set,
            log=logger.info,
        )
        logger.info(report.summary())
        logged = log_merged_model(
            run.tracking_uri, run_id, report.merged_dir, params.max_artifact_mb, eval_set=run.eval_set
        )
    return MergedModel(Path(report.merged_dir), logged.source, report.checkpoint_step or 0, report.summary())
