"""Ray cluster plumbing: the embedded local head, job submission, readiness checks, HyperPod.

- :mod:`~mazerl.cluster.ray_local`: start/reuse/stop the local head (127.0.0.1, token auth).
- :mod:`~mazerl.cluster.head_dir`, :mod:`~mazerl.cluster.head_env`, :mod:`~mazerl.cluster.head_leases`,
  :mod:`~mazerl.cluster.head_process`: its private temp dir, its jobs' environment, its users, its processes;
  :mod:`~mazerl.cluster.ray_driver`: this process as its Ray driver.
- :mod:`~mazerl.cluster.client`: addresses (``http://``, ``sagemaker_ray://``) -> job client.
- :mod:`~mazerl.cluster.submitter`: run a stage as a Ray job (re-attach, logs, watchdog).
- :mod:`~mazerl.cluster.job_spec`, :mod:`~mazerl.cluster.pipeline_jobs`, :mod:`~mazerl.cluster.job_log`,
  :mod:`~mazerl.cluster.hang_watchdog`, :mod:`~mazerl.cluster.job_outcome`: what a job is, a run's jobs,
  following its log, the hang watchdog, how it ended.
- :mod:`~mazerl.cluster.verify`: ``verify_cluster`` rows; :mod:`~mazerl.cluster.probe` runs in the cluster.
- :mod:`~mazerl.cluster.hyperpod`: SageMaker HyperPod cluster and node health.
- :mod:`~mazerl.cluster.metrics`: training gauges for Grafana through Ray's metrics API.

Nothing here imports Prefect; Ray and boto3 are imported lazily where it matters.
"""

from mazerl.cluster.errors import ClusterAccessError, ConfigError, JobConfigError, JobConflictError, RetryableJobError
from mazerl.cluster.report import CheckRow, ClusterNotReadyError, ClusterReport

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
