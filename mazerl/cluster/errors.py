"""The two ways a cluster stage can fail, so the orchestrator knows whether a retry can help.

``ConfigError`` means the request itself is wrong (a bad address, a missing install, an
entrypoint that rejected its configuration with exit code 2): retrying the same request fails
the same way, so the Prefect task must not retry it. ``RetryableJobError`` means the cluster
or the job failed in a way a fresh attempt can fix (head gone, job killed, job hung, node
lost); the training job's retry resumes from its latest checkpoint. Both name the Ray address
so a failure in a log says where it happened.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """The request is wrong; retrying it unchanged cannot succeed."""


class ClusterAccessError(ConfigError):
    """Something this machine needs to reach the cluster is missing (package, kubeconfig, credentials)."""


class JobConfigError(ConfigError):
    """The job's entrypoint rejected its configuration (exit code 2)."""

    def __init__(self, message: str, *, address: str, submission_id: str):
        super().__init__(message)
        self.address = address
        self.submission_id = submission_id


class JobConflictError(ConfigError):
    """Another pipeline run's job of this stage is active on the cluster and is not the same work.

    Not retried automatically: the other job holds the resources until it ends or is stopped,
    which the message says how to do.
    """

    def __init__(self, message: str, *, address: str, submission_id: str):
        super().__init__(message)
        self.address = address
        self.submission_id = submission_id


class RetryableJobError(RuntimeError):
    """The job or the cluster failed in a way that a new attempt can fix."""

    def __init__(self, message: str, *, address: str, submission_id: str | None = None):
        super().__init__(message)
        self.address = address
        self.submission_id = submission_id


class ResourcesUnavailableError(RuntimeError):
    """The cluster did not get the resources a job asks for within the wait's bound.

    Not retried automatically: a new attempt would meet the same cluster. The message names what
    was missing; the checkpoint is kept, so retrying the flow run once the nodes are back resumes.
    """

    def __init__(self, message: str, *, address: str, waited_s: float):
        super().__init__(message)
        self.address = address
        self.waited_s = waited_s


class StorageFullJobError(RuntimeError):
    """The job paused because its disk is full (exit code 3): its message says where and how much room it needs.

    Not retried automatically: minutes later the disk is as full. The checkpoint marker still
    names the last complete step, so the same command resumes once space is freed.
    """

    def __init__(self, message: str, *, address: str, submission_id: str):
        super().__init__(message)
        self.address = address
        self.submission_id = submission_id
