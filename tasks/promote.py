"""promote: register the merged model and move ``champion`` only when it earned it; the run's summary."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from mazerl.evaluation.evaluate import EvalReport
from mazerl.reporting.promotion import (
    PipelineRun,
    PipelineSummary,
    conclude_pipeline_run,
    greedy_eval_mazes,
    summary_markdown,
)
from mazerl.tracking.lineage import fails_run
from mazerl.tracking.registry import TrainedAdapter
from tasks.context import RunContext
from tasks.merge import MergedModel
from tasks.stages import timed_stage
from tasks.training import TrainOutcome


@task(name="promote", retries=1, retry_delay_seconds=5)
def promote(
    run: RunContext,
    baseline: EvalReport,
    final: EvalReport,
    merged: MergedModel,
    trained: TrainOutcome,
    *,
    registered_model: str,
    threshold: float,
) -> PipelineSummary:
    """Register and maybe promote; then the curve, the headline metrics and the summary on the parent run."""
    # the parent's duration ends here too
    with timed_stage(run, "promote"), fails_run(run.tracking_uri, run.pipeline_run_id):
        summary = conclude_pipeline_run(
            PipelineRun(
                run_id=run.run_id,
                run_dir=run.run_dir,
                tracking_uri=run.tracking_uri,
                pipeline_run_id=run.pipeline_run_id,
                train_run_id=run.stage_run_id("train"),
                merge_run_id=run.stage_run_id("merge_lora"),
                cluster_is_embedded=run.ray_address is None,
                baseline_run_id=run.stage_run_id("baseline_eval"),
                final_run_id=run.stage_run_id("final_eval"),
            ),
            registered_model=registered_model,
            merged_source=merged.source,
            threshold=threshold,
            baseline=baseline,
            final=final,
            metrics_jsonl=trained.metrics_jsonl if trained.metrics_jsonl.is_file() else None,
            greedy_on=greedy_eval_mazes(run.training()),
            greedy_mazes=run.training().eval_mazes,
            checkpoint_step=merged.checkpoint_step or trained.final_step,
            model_id=merged.model_id,
            log=get_run_logger().info,
            adapter=trained_adapter(trained, merged),
        )
        create_markdown_artifact(summary_markdown(summary, baseline, final), key="pipeline-summary")
    return summary


def trained_adapter(trained: TrainOutcome, merged: MergedModel) -> TrainedAdapter | None:
    """The training run whose checkpoint was merged (another flow run's, if this one followed its job)
    and the adapter's digest: the key of the one registered version of that adapter."""
    if not merged.adapter_sha256:
        return None
    return TrainedAdapter(training_run=trained.checkpoints_dir.parent.name, adapter_sha256=merged.adapter_sha256)
