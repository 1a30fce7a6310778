"""Training gauges for Grafana, exported through Ray's metrics API.

A trainer running inside a Ray job calls :meth:`TrainingMetrics.record` once per step; Ray's
metrics agent on that node serves the values on its Prometheus endpoint, where the cluster's
Prometheus (Amazon Managed Prometheus on HyperPod) scrapes them next to Ray's own node
metrics. Ray prefixes custom metrics with ``ray_``, so the Grafana dashboard
(``deployments/observability/mazerl-training-dashboard.json``) queries
``ray_mazerl_train_reward_mean`` and friends (:data:`PROMETHEUS_NAMES`).

Outside Ray (``ray.is_initialized()`` false: unit tests, a plain script) every call is a
no-op, so a trainer never needs a branch for it. MLflow stays the record of a run; these
gauges are for watching it live.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# Gauge name -> help text. Tags: run_id (the training run), backend (local | skyrl).
GAUGES: dict[str, str] = {
    "mazerl_train_reward_mean": "Mean episode reward of the last GRPO step's rollouts.",
    "mazerl_train_success_rate": "Share of the last step's rollouts that stopped on the target.",
    "mazerl_train_step_seconds": "Wall time of the last GRPO step (rollout + update + checkpoint).",
    "mazerl_train_global_step": "The last completed optimizer step.",
}
TAG_KEYS = ("run_id", "backend")
PROMETHEUS_PREFIX = "ray_"  # Ray's exporter adds it to every custom metric
PROMETHEUS_NAMES = {name: PROMETHEUS_PREFIX + name for name in GAUGES}


class TrainingMetrics:
    """Per-run training gauges; safe to use whether or not Ray is initialised."""

    def __init__(self, run_id: str, backend: str = "local"):
        self._tags = {"run_id": str(run_id), "backend": str(backend)}
        self._gauges: dict | None = None

    @property
    def active(self) -> bool:
        """Whether values go anywhere (Ray is initialised in this process)."""
        return self._ensure_gauges() is not None

    def record(
        self,
        step: int,
        *,
        reward_mean: float | None = None,
        success_rate: float | None = None,
        step_seconds: float | None = None,
    ) -> bool:
        """Set the gauges for ``step``; returns False (and does nothing) outside Ray."""
        gauges = self._ensure_gauges()
        if gauges is None:
            return False
        values = {
            "mazerl_train_global_step": step,
            "mazerl_train_reward_mean": reward_mean,
            "mazerl_train_success_rate": success_rate,
            "mazerl_train_step_seconds": step_seconds,
        }
        for name, value in values.items():
            if value is not None:
                gauges[name].set(float(value), tags=self._tags)
        return True

    def _ensure_gauges(self) -> dict | None:
        if self._gauges is not None:
            return self._gauges
        try:
            import ray  # lazy: the gauges are optional, and ray takes seconds to import
        except ImportError:
            return None
        if not ray.is_initialized():
            return None
        from ray.util.metrics import Gauge

        self._gauges = {name: Gauge(name, description=text, tag_keys=TAG_KEYS) for name, text in GAUGES.items()}
        return self._gauges
