"""The pipeline flow: verify cluster -> baseline eval -> GRPO training -> LoRA merge -> final eval -> promotion.

Run it on this machine with ``mazerl run`` (the embedded default), from a Prefect deployment
(`prefect.yaml`), or in Python::

    from flows.pipeline import pipeline
    pipeline(PipelineParams(training={"steps": 20}))
"""

from __future__ import annotations

from prefect import flow

from mazerl.params import PipelineParams
from mazerl.reporting.promotion import PipelineSummary
from tasks.attempts import close_killed_attempts, end_mlflow_runs
from tasks.cluster import verify_cluster
from tasks.evaluation import baseline_eval, final_eval
from tasks.merge import merge_lora
from tasks.promote import promote
from tasks.setup import prepare
from tasks.training import train


@flow(
    name="vlm-maze-grpo",
    log_prints=True,
    validate_parameters=True,
    on_failure=[end_mlflow_runs],  # a failure outside any stage must not leave the MLflow parent RUNNING
    on_crashed=[end_mlflow_runs],
    on_running=[close_killed_attempts],  # a retry closes the task runs a killed attempt left RUNNING
)
def pipeline(params: PipelineParams = PipelineParams()) -> PipelineSummary:  # noqa: B008 (pydantic default)
    """Teach the policy to solve mazes with multi-turn GRPO and promote it if it beats its baseline."""
    run = prepare(params)
    verify_cluster(run, params)
    baseline = baseline_eval(run, run.eval_settings)
    trained = train.with_options(retries=params.train_retries)(run, params, baseline)
    merged = merge_lora(run, trained, params.max_artifact_mb)
    final = final_eval(run, merged.path, run.eval_settings, merged.model_id)
    return promote(
        run,
        baseline,
        final,
        merged,
        trained,
        registered_model=params.registered_model,
        threshold=params.promotion_threshold,
    )
