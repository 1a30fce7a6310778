"""Step metrics to MLflow and to a local JSONL file, exactly once per step, surviving an MLflow outage.

Training must never die because the tracking server is down for a while. Every step's
metrics are appended to ``<run dir>/metrics.jsonl`` first (the local record, also used
for learning curves), then sent to MLflow; a failed send is kept and retried with the
next step, and a warning says how many steps are waiting. ``close()`` makes a last try
and reports any gap that could not be delivered.

Exactly once, whatever kill point a resumed run comes back from: the step is the row's key.

- A step already in ``metrics.jsonl`` is not logged again: a step redone after a resume
  (it ran after the last checkpoint, then the job was killed) keeps its first row, in the
  file and in MLflow. (On CPU the redone step computes the same values; only its timings
  differ.)
- A step whose row never reached the file (killed after its checkpoint's marker moved, before
  the append) is replayed from the copy its checkpoint holds (``checkpoints.save(metrics=)``):
  the trainer hands that row to :meth:`MetricsLogger.log` on resume.
- Rows in the file that MLflow lacks (killed between the append and the send, or MLflow was
  down) are found when a logger opens an existing file and sent with the next step.
- A torn last line (killed mid-append) is dropped when the file is opened.
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

from mazerl.atomic import write_jsonl  # noqa: E402
from mazerl.tracking.store import client_for  # noqa: E402


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
        self.client = client_for(tracking_uri) if run_id else None
        self.jsonl_path = Path(jsonl_path)
        self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)
        self.warn = warn
        self.retry_every_s = retry_every_s
        self.pending: list[Metric] = []
        self._last_failure = 0.0
        rows = self._read_rows()
        self.logged_steps = {row["step"] for row in rows}
        if rows and self.client is not None:
            self._queue_rows_mlflow_lacks(rows)

    def log(self, step: int, metrics: dict[str, float]) -> bool:
        """Record ``step`` once; False (and nothing written or sent) if it was recorded before."""
        if step in self.logged_steps:
            return False
        now_ms = int(time.time() * 1000)
        with open(self.jsonl_path, "a") as handle:
            handle.write(json.dumps({"step": step, "time_ms": now_ms, **metrics}) + "\n")
        self.logged_steps.add(step)
        if self.client is None:
            return True
        self.pending.extend(Metric(key, float(value), now_ms, step) for key, value in metrics.items())
        if time.monotonic() - self._last_failure >= self.retry_every_s:
            self.flush()
        return True

    def _read_rows(self) -> list[dict]:
        """The file's rows; a torn or duplicated line (a kill mid-append, an older version) is dropped for good."""
        if not self.jsonl_path.exists():
            return []
        lines = self.jsonl_path.read_text().splitlines()
        rows, seen = [], set()
        for line in lines:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] not in seen:
                seen.add(row["step"])
                rows.append(row)
        if len(rows) != len(lines):
            write_jsonl(self.jsonl_path, rows)
        return rows

    def _queue_rows_mlflow_lacks(self, rows: list[dict]) -> None:
        """Queue every (metric, step) of ``rows`` that the MLflow run does not hold (sent with the next flush)."""
        keys = sorted({key for row in rows for key in row if key not in ("step", "time_ms")})
        try:
            held = {(m.key, m.step) for key in keys for m in self.client.get_metric_history(self.run_id, key)}
        except Exception as exc:  # MLflow down: the file stays complete; say what may be missing there
            self.warn(
                f"warning: MLflow unreachable ({type(exc).__name__}: {str(exc)[:120]}); steps recorded in "
                f"{self.jsonl_path} before this restart are not compared with MLflow and may be missing there"
            )
            return
        for row in rows:
            time_ms = int(row.get("time_ms", time.time() * 1000))
            self.pending.extend(
                Metric(key, float(value), time_ms, row["step"])
                for key, value in row.items()
                if key not in ("step", "time_ms") and (key, row["step"]) not in held
            )

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
