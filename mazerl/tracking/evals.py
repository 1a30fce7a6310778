"""Eval logging: the eval set as an MLflow dataset input, and an eval directory's report as metrics and tables.

An eval output directory holds ``summary.json`` and ``results.jsonl`` (and episode GIFs);
:func:`log_eval_report` turns it into ``eval/*`` metrics, the per-maze table the MLflow UI's
evaluation view shows, and scrubbed copies of both files.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import DatasetInput, InputTag, Metric

from envs import evalset
from envs.maze import optimal_moves
from mazerl.eval_files import EVAL_METRICS, RESULTS_FILE, SUMMARY_FILE, read_result_rows
from mazerl.tracking.artifacts import log_text_artifact
from mazerl.tracking.params import log_params, safe_name
from mazerl.tracking.store import client_for

TAG_EVAL_SET_SHA256 = "mazerl.eval_set.sha256"
REQUIRED_SUMMARY_KEYS = ("success_rate", "avg_moves", "parse_failure_rate")  # avg_moves may come from the rows
# Summary keys that are settings, not measurements: params of the eval run (eval_params), never metrics.
SETTING_KEYS = ("workers", "max_moves", "gpus_per_worker")
PARAM_PREFIX = "eval"


class EvalReportError(ValueError):
    """An eval output directory that is missing files or fields."""


def _load_eval_set(eval_set: str | os.PathLike) -> tuple[Any, Path]:
    candidate = Path(eval_set)
    if candidate.suffix == ".json" and candidate.is_file():
        return evalset.load_file(candidate), candidate.resolve()
    loaded = evalset.load(str(eval_set))
    return loaded, evalset.path_for(loaded.name).resolve()


def log_eval_set(tracking_uri: str, run_id: str, eval_set: str | os.PathLike, context: str = "eval") -> str:
    """Log an eval set (name or JSON file; its digest is checked on load) as an MLflow dataset input.

    The dataset's digest field holds the first 36 hex digits of our SHA-256 (MLflow's
    limit); the whole digest is the input tag ``mazerl.sha256`` and the run tag
    ``mazerl.eval_set.sha256``. Returns the full digest.
    """
    # pandas (under mlflow.data) takes a second to import: only when an eval set is logged
    import mlflow.data
    import pandas as pd

    loaded, source_path = _load_eval_set(eval_set)
    frame = pd.DataFrame(
        {
            "index": list(range(len(loaded))),
            "seed": [int(seed) for seed in loaded.seeds],
            "size": [layout.size for layout in loaded.layouts],
            "optimal_moves": [optimal_moves(layout) for layout in loaded.layouts],
            "layout": [layout.to_text() for layout in loaded.layouts],
        }
    )
    with warnings.catch_warnings():  # MLflow's hints about integer columns and ambiguous local sources
        warnings.simplefilter("ignore", UserWarning)
        dataset = mlflow.data.from_pandas(frame, source=str(source_path), name=loaded.name, digest=loaded.digest[:36])
        entity = dataset._to_mlflow_entity()
    client = client_for(tracking_uri)
    client.log_inputs(
        run_id,
        datasets=[
            DatasetInput(
                entity,
                tags=[InputTag("mlflow.data.context", context), InputTag("mazerl.sha256", loaded.digest)],
            )
        ],
    )
    client.set_tag(run_id, TAG_EVAL_SET_SHA256, loaded.digest)
    return loaded.digest


def read_eval_report(eval_dir: str | os.PathLike) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(summary, per-maze rows) of an eval output directory (``summary.json`` + ``results.jsonl``)."""
    eval_dir = Path(eval_dir)
    summary_path, results_path = eval_dir / SUMMARY_FILE, eval_dir / RESULTS_FILE
    for path in (summary_path, results_path):
        if not path.is_file():
            raise EvalReportError(
                f"eval_dir={str(eval_dir)!r} has no {path.name}; pass the directory the eval stage wrote "
                "(it holds summary.json and results.jsonl)"
            )
    try:
        summary = json.loads(summary_path.read_text())
        rows = read_result_rows(results_path)
    except json.JSONDecodeError as exc:
        raise EvalReportError(f"eval_dir={str(eval_dir)!r}: unreadable JSON ({exc}); rerun the eval stage") from exc
    if not isinstance(summary, dict):
        raise EvalReportError(f"{summary_path} holds {type(summary).__name__}, not a JSON object; rerun the eval stage")
    return summary, rows


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def _metric_name(key: str, prefix: str) -> str:
    return EVAL_METRICS.get(key, f"eval/{key}").replace("eval/", f"{prefix}/", 1)


def eval_metrics(
    summary: Mapping[str, Any], rows: list[dict[str, Any]] | None = None, prefix: str = "eval"
) -> dict[str, float]:
    """The numbers of an eval summary under their MLflow names (``eval/success_rate``, ...).

    Accepts the confidence interval as ``success_ci95: [low, high]`` or ``ci_low``/``ci_high``
    and derives ``avg_moves`` (mean moves per maze) from the rows when the summary lacks it.
    Fields that are None (e.g. mean moves of solved episodes when none was solved) are skipped.
    """
    values: dict[str, float] = {}
    for key, value in summary.items():
        if key in SETTING_KEYS:
            continue
        if _number(value):
            values[key] = float(value)
        elif key in ("success_ci95", "success_ci") and isinstance(value, list | tuple) and len(value) == 2:
            low, high = value
            if _number(low) and _number(high):
                values["ci_low"], values["ci_high"] = float(low), float(high)
    if "avg_moves" not in values and rows and all(_number(row.get("moves")) for row in rows):
        values["avg_moves"] = sum(row["moves"] for row in rows) / len(rows)
    missing = [key for key in REQUIRED_SUMMARY_KEYS if key not in values]
    if missing:
        raise EvalReportError(
            f"the eval summary lacks {', '.join(missing)} (has {sorted(summary)}); rerun the eval stage"
        )
    return {_metric_name(safe_name(key), prefix): value for key, value in values.items()}


def eval_params(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What an eval ran with, for the eval run's params (``eval.model_dir``, ``eval.model_digest``,
    ``eval.set``, ``eval.set_sha256``, ``eval.engine``, ...): which model on which mazes, and how."""
    settings = summary.get("settings") if isinstance(summary.get("settings"), Mapping) else {}
    values = {
        "model_dir": summary.get("model_dir"),
        "model_digest": summary.get("model_digest"),
        "adapter": summary.get("adapter"),
        "adapter_digest": summary.get("adapter_digest"),
        "set": summary.get("eval_set"),
        "set_sha256": summary.get("eval_set_digest"),
        **{key: value for key, value in settings.items() if key != "max_mazes"},
        "mazes": summary.get("n"),
        **{key: summary.get(key) for key in SETTING_KEYS},
    }
    return {f"{PARAM_PREFIX}.{key}": value for key, value in values.items() if value is not None}


def _table_rows(rows: list[dict[str, Any]]) -> dict[str, list]:
    """Column-wise table for ``log_table``; nested values become JSON text so every cell is a scalar."""
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    table: dict[str, list] = {column: [] for column in columns}
    for row in rows:
        for column in columns:
            value = row.get(column)
            table[column].append(
                value if value is None or isinstance(value, str | int | float | bool) else json.dumps(value)
            )
    return table


def log_eval_report(
    tracking_uri: str,
    run_id: str,
    eval_dir: str | os.PathLike,
    *,
    step: int = 0,
    prefix: str = "eval",
    log_gifs: bool = True,
    model_id: str | None = None,
) -> dict[str, float]:
    """Log an eval output directory on a run; returns the metrics logged.

    Metrics: ``eval/success_rate``, ``eval/avg_moves``, ``eval/parse_failure_rate``,
    ``eval/success_ci95_low``/``_high``, ``eval/budget_ceiling``, ``eval/n_mazes`` (and any
    other numeric summary field as ``eval/<key>``) at ``step``; with ``model_id`` (an MLflow 3
    logged model: the model evaluated) they are that model's metrics too, on the eval set's
    dataset. Params: what the eval ran with (:func:`eval_params`). Artifacts: the per-maze
    table ``eval/results.json`` (``log_table``, shown in the MLflow UI's evaluation view),
    ``eval/summary.json`` and ``eval/results.jsonl`` (scrubbed), and the episode GIFs under
    ``eval/gifs/``.
    """
    summary, rows = read_eval_report(eval_dir)
    eval_dir = Path(eval_dir)
    metrics = eval_metrics(summary, rows, prefix)
    now_ms = int(time.time() * 1000)
    client = client_for(tracking_uri)
    dataset = (
        {"dataset_name": summary["eval_set"], "dataset_digest": str(summary["eval_set_digest"])[:36]}
        if model_id and summary.get("eval_set") and summary.get("eval_set_digest")
        else {}
    )
    client.log_batch(
        run_id,
        metrics=[Metric(key, value, now_ms, step, model_id=model_id, **dataset) for key, value in metrics.items()],
    )
    log_params(tracking_uri, run_id, eval_params(summary))
    if rows:
        client.log_table(run_id, data=_table_rows(rows), artifact_file=f"{prefix}/results.json")
    for name in (SUMMARY_FILE, RESULTS_FILE):
        log_text_artifact(tracking_uri, run_id, eval_dir / name, prefix)
    if log_gifs:
        gifs = sorted(eval_dir.rglob("*.gif"))
        for gif in gifs:
            relative = gif.parent.relative_to(eval_dir).as_posix().removeprefix(".").removeprefix("gifs").strip("/")
            folder = f"{prefix}/gifs/{relative}" if relative else f"{prefix}/gifs"
            client.log_artifact(run_id, str(gif), folder)
    return metrics
