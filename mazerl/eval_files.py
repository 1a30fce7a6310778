"""The eval stage's output files: their names and the one reader of the per-maze rows.

An eval output directory holds ``summary.json`` (the aggregate) and ``results.jsonl`` (one
row per maze, in set order). The eval stage writes them; MLflow logging, promotion and the
benchmarks read them. This module sits below all of those (it imports nothing of the project),
so none of them has to import another to agree on the format.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"


def read_result_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The per-maze rows of a ``results.jsonl``, in file order.

    A line that is not JSON raises :class:`json.JSONDecodeError`; blank lines are skipped.
    """
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
