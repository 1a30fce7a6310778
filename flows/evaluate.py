"""Eval alone: any model directory, or a registered model version/alias, on a fixed eval set.

from flows.evaluate import evaluate_model
evaluate_model(EvalParams(registered_model="maze-vlm", version="champion"))
"""

from __future__ import annotations

from prefect import flow

from mazerl.params import EvalParams
from tasks.attempts import close_killed_attempts
from tasks.evaluation import eval_only
from tasks.setup import prepare_eval


@flow(
    name="vlm-maze-eval",
    log_prints=True,
    validate_parameters=True,
    on_running=[close_killed_attempts],  # a retry closes the task runs a killed attempt left RUNNING
)
def evaluate_model(params: EvalParams) -> dict[str, float]:
    """Greedy eval of one model; results in an MLflow run of its own and as Prefect artifacts."""
    run, model_dir = prepare_eval(params)
    return eval_only(run, model_dir, run.eval_settings)
