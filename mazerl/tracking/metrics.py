"""Step metrics to MLflow and to a local JSONL file, surviving an MLflow outage.

Training must never die because the tracking server is down for a while. Every step's
metrics are appended to ``<run dir>/metrics.jsonl`` first (the local record, also used
for learning curves), then sent to MLflow; a failed send is kept and retried with the
next step, and a warning says how many steps are waiting. ``close()`` makes a last try
and reports any gap that could not be delivered.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

# Fail fast inside training jobs: MLflow's default HTTP retries can block a step for minutes.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")

from mlflow.entities import Metric  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402


class MetricsLogger:
    """Append-then-send metric logging for one MLflow run (or only the JSONL file if run_id is None)."""

    def __init__(
        self,
        tracking_uri: str | None,
        run_id: str | None,
        jsonl_path: Path,
        warn: Callable[[str], None] = print,
        retry_every_s: float = 15.0,
    ) -> None:
        self.run_id = run_id
        self.client = MlflowClient(tracking_uri) if run_id else None
        self.jsonl_path = Path(jsonl_path)
        self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)
        self.warn = warn
        self.retry_every_s = retry_every_s
        self.pending: list[Metric] = []
        self._last_failure = 0.0

    def log(self, step: int, metrics: dict[str, float]) -> None:
        now_ms = int(time.time() * 1000)
        with open(self.jsonl_path, "a") as handle:
            handle.write(json.dumps({"step": step, "time_ms": now_ms, **metrics}) + "\n")
        if self.client is None:
            return
        self.pending.extend(Metric(key, float(value), now_ms, step) for key, value in metrics.items())
        if time.monotonic() - self._last_failure >= self.retry_every_s:
            self.flush()

    def flush(self) -> bool:
        """Send what is waiting; True when nothing is left."""
        if self.client is None or not self.pending:
            return True
        try:
            for start in range(0, len(self.pending), 1000):  # MLflow's batch limit
                self.client.log_batch(self.run_id, metrics=self.pending[start : start + 1000])
        except Exception as exc:  # any transport or server error: keep the metrics, keep training
            self._last_failure = time.monotonic()
            steps = sorted({m.step for m in self.pending})
            self.warn(
                f"warning: MLflow unreachable ({type(exc).__name__}: {str(exc)[:120]}); "
                f"{len(steps)} step(s) of metrics held for retry (steps {steps[0]}-{steps[-1]})"
            )
            return False
        self.pending.clear()
        return True

    def close(self) -> None:
        if not self.flush():
            steps = sorted({m.step for m in self.pending})
            self.warn(
                f"warning: metrics of steps {steps[0]}-{steps[-1]} could not be delivered to MLflow; "
                f"they are kept in {self.jsonl_path}"
            )
