"""An eval's MLflow records: the run of an eval-only flow run (one run, no parent, holding the
eval's params and results), the logging of an eval report into its stage run, and the
baseline as the train run's step-0 eval point."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow.entities import LoggedModelInput, Metric

from envs.evalset import load as load_eval_set
from mazerl.eval_files import EVAL_METRICS, read_result_rows
from mazerl.evaluation.evaluate import EvalReport
from mazerl.tracking.evals import log_eval_report, log_eval_set, read_eval_report
from mazerl.tracking.lineage import TAG_FLOW_RUN_ID, stage_run
from mazerl.tracking.params import log_params
from mazerl.tracking.store import client_for, default_artifact_location, ensure_experiment

EVAL_RUN_NAME = "eval"
TAG_MODEL_DIR = "mazerl.model_dir"
TAG_REUSED_EVAL_DIR = "mazerl.reused_eval_dir"  # a cached report's directory, on the stage run that reused it


def start_eval_run(tracking_uri: str, experiment: str, *, flow_run_id: str, model_dir: Path, params: Any) -> str:
    """Open the eval-only run in ``experiment`` (created if missing) and log ``params``; returns its id."""
    experiment_id = ensure_experiment(tracking_uri, experiment, default_artifact_location(tracking_uri))
    tags = {TAG_FLOW_RUN_ID: flow_run_id, TAG_MODEL_DIR: str(model_dir)}
    run_id = client_for(tracking_uri).create_run(experiment_id, run_name=EVAL_RUN_NAME, tags=tags).info.run_id
    log_params(tracking_uri, run_id, params)
    return run_id


def record_eval(
    tracking_uri: str,
    run_id: str,
    report: EvalReport,
    run_dir: Path,
    log: Callable[[str], None] = print,
    *,
    model_id: str | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Log an eval report into its stage run ``run_id`` and end that run; returns (metrics, per-maze rows).

    A report from another run directory is a cached one (the baseline of an earlier run on the
    same model and settings): it is logged here all the same, tagged with where it came from.
    ``model_id``: the MLflow 3 logged model that was evaluated (the merged model), which becomes
    the run's model input and gets the eval's metrics.
    """
    if not report.summary_path.is_file():
        raise FileNotFoundError(
            f"the eval report {report.summary_path} is gone (was the data root cleaned?); re-run with "
            "a fresh cache: `prefect cache` entries live under PREFECT_LOCAL_STORAGE_PATH"
        )
    reused = not str(report.out_dir).startswith(str(run_dir))
    if reused:
        log(f"reusing the cached evaluation from {report.out_dir} (same model, set and settings)")
    with stage_run(tracking_uri, run_id):
        if reused:
            client_for(tracking_uri).set_tag(run_id, TAG_REUSED_EVAL_DIR, str(report.out_dir))
        log_eval_set(tracking_uri, run_id, report.eval_set)
        if model_id:
            client_for(tracking_uri).log_inputs(run_id, models=[LoggedModelInput(model_id)])
        metrics = log_eval_report(tracking_uri, run_id, report.out_dir, model_id=model_id)
    _, rows = read_eval_report(report.out_dir)
    return metrics, rows


def success_on_first(report: EvalReport, mazes: int | None) -> float | None:
    """The report's success rate on the eval set's first ``mazes`` mazes (None: all of the set), or
    None when it did not play them all."""
    rows = {row["index"]: row for row in read_result_rows(report.results_path)}
    count = mazes or len(load_eval_set(report.eval_set))
    if not all(index in rows for index in range(count)):
        return None
    return sum(bool(rows[index]["solved"]) for index in range(count)) / count


def log_baseline_as_step_zero(
    tracking_uri: str, train_run_id: str, baseline: EvalReport, greedy_mazes: int | None
) -> float | None:
    """The baseline as the train run's ``eval/success_rate`` at step 0: the base model is the
    policy before step 1, so the periodic greedy evals' chart starts where training started.

    Logged only on the mazes the periodic evals play (the first ``greedy_mazes`` of the set) and
    only when the baseline played them all; a retry that finds the point does not log it twice.
    Returns the value, or None when there is no such point.
    """
    value = success_on_first(baseline, greedy_mazes)
    if value is None:
        return None
    client = client_for(tracking_uri)
    key = EVAL_METRICS["success_rate"]
    if any(metric.step == 0 for metric in client.get_metric_history(train_run_id, key)):
        return value
    client.log_batch(train_run_id, metrics=[Metric(key, value, int(time.time() * 1000), 0)])
    return value
