"""The pipeline flow: verify cluster -> baseline eval -> GRPO training -> LoRA merge -> final eval -> promotion.

Run it on this machine with ``mazerl run`` (the embedded default), from a Prefect deployment
(`prefect.yaml`), or in Python::

    from flows.pipeline import pipeline
    pipeline(PipelineParams(training={"steps": 20}))
"""

from __future__ import annotations

from prefect import flow

from mazerl.params import PipelineParams
from tasks.attempts import end_mlflow_runs
from tasks.cluster import check_cluster
from tasks.evaluation import EvalSettings, baseline_eval, final_eval, record_eval
from tasks.merge import merge
from tasks.promote import PipelineSummary, promote_model
from tasks.setup import prepare
from tasks.training import train


@flow(
    name="vlm-maze-grpo",
    log_prints=True,
    validate_parameters=True,
    on_failure=[end_mlflow_runs],  # a failure outside any stage must not leave the MLflow parent RUNNING
    on_crashed=[end_mlflow_runs],
)
def pipeline(params: PipelineParams = PipelineParams()) -> PipelineSummary:  # noqa: B008 (pydantic default)
    """Teach the policy to solve mazes with multi-turn GRPO and promote it if it beats its baseline."""
    run = prepare(params)
    check_cluster(run, params)
    settings = EvalSettings.of(params, run.eval_set)
    baseline = baseline_eval(run, settings)
    if not baseline.summary_path.is_file():  # the cached report's run directory was deleted: evaluate anew
        baseline = baseline_eval.with_options(refresh_cache=True)(run, settings)
    record_eval(run, "baseline_eval", baseline)
    trained = train.with_options(retries=params.train_retries)(run, params)
    merged = merge(run, trained, params)
    final = final_eval(run, merged.path, settings)
    record_eval(run, "final_eval", final)
    return promote_model(run, params, baseline, final, merged, trained)
