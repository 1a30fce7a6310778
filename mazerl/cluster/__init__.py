"""Ray cluster plumbing, in three wings and three shared modules.

- :mod:`~mazerl.cluster.head`: the embedded local head (start, reuse, stop; its temp dir, users, processes);
- :mod:`~mazerl.cluster.jobs`: a stage as a Ray job (submit or re-attach, logs, watchdog, outcome, capacity);
- :mod:`~mazerl.cluster.checks`: ``verify_cluster``'s checks (placement, storage, GPUs, HyperPod);
- :mod:`~mazerl.cluster.client`: addresses (``http://``, ``sagemaker_ray://``) -> job client;
- :mod:`~mazerl.cluster.errors`: the errors every wing raises;
- :mod:`~mazerl.cluster.metrics`: training gauges for Grafana through Ray's metrics API.

Nothing here imports Prefect; Ray and boto3 are imported lazily where it matters.
"""

from mazerl.cluster.checks.report import CheckRow, ClusterNotReadyError, ClusterReport
from mazerl.cluster.errors import ClusterAccessError, ConfigError, JobConfigError, JobConflictError, RetryableJobError

__all__ = [
    "CheckRow",
    "ClusterAccessError",
    "ClusterNotReadyError",
    "ClusterReport",
    "ConfigError",
    "JobConfigError",
    "JobConflictError",
    "RetryableJobError",
]
