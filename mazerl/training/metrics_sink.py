"""What the trainers hand each step's metrics to.

The local trainer and the SkyRL tracker wiring call ``log(step, metrics)`` once per finished
step (and once more for a checkpoint's own row on resume); the training job passes the MLflow +
``metrics.jsonl`` logger (:class:`mazerl.tracking.metrics.MetricsLogger`, inside
:class:`mazerl.training.local_entry.StepSink`), tests pass a list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class MetricsSink(Protocol):
    """Takes one step's metrics row; the step number is the row's key (a step logged twice keeps its first row)."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...
