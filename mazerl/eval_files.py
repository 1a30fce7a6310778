"""The eval stage's output files: their names, the one reader of the per-maze rows, and the metric names.

An eval output directory holds ``summary.json`` (the aggregate) and ``results.jsonl`` (one
row per maze, in set order). The eval stage writes them; MLflow logging, promotion and the
benchmarks read them. This module sits below all of those (it imports nothing of the project),
so none of them has to import another to agree on the format. :data:`EVAL_METRICS` names the
summary's measurements as MLflow metrics, for the eval stage's run and the trainer's periodic
greedy evals alike (the trainer needs the names without importing MLflow).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
# summary.json key -> MLflow metric name; other numeric summary keys are logged as eval/<key>.
EVAL_METRICS = {
    "success_rate": "eval/success_rate",
    "avg_moves": "eval/avg_moves",
    "parse_failure_rate": "eval/parse_failure_rate",
    "ci_low": "eval/success_ci95_low",
    "ci_high": "eval/success_ci95_high",
    "budget_ceiling": "eval/budget_ceiling",
    "n": "eval/n_mazes",
    "solved": "eval/solved",
}


def read_result_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The per-maze rows of a ``results.jsonl``, in file order.

    A line that is not JSON raises :class:`json.JSONDecodeError`; blank lines are skipped.
    """
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
