"""How a mazerl Ray job ended, and whether a retry can help.

SUCCEEDED -> :class:`JobOutcome`. FAILED with the entrypoint's exit code 2 (our entrypoints'
"bad configuration", and argparse's) -> :class:`~mazerl.cluster.errors.JobConfigError`, never
retried: the same request fails the same way. Exit code 3 (a full disk: the trainer paused) ->
:class:`~mazerl.cluster.errors.StorageFullJobError` with the job's own one-line message, never
retried either. Any other failure, and STOPPED ->
:class:`~mazerl.cluster.errors.RetryableJobError` naming the address; the training retry
resumes from its checkpoint. :class:`~mazerl.cluster.jobs.submitter.RayJob` raises what
:func:`failure_error` gives it for a job that did not succeed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mazerl.cluster.errors import JobConfigError, RetryableJobError, StorageFullJobError
from mazerl.cluster.jobs.spec import job_status

CONFIG_ERROR_EXIT_CODE = 2
NO_SPACE_EXIT_CODE = 3
PAUSED_PREFIX = "training paused: "  # the line a trainer that paused on a full disk prints
_EXIT_CODE = re.compile(r"exit code (-?\d+)")


@dataclass(frozen=True)
class JobOutcome:
    """A job that SUCCEEDED (failures are exceptions)."""

    submission_id: str
    address: str
    status: str
    reattached: bool  # True: this call followed a job that an earlier call had submitted
    duration_s: float
    log_lines: int
    message: str
    metadata: dict[str, str] = field(default_factory=dict)  # the followed job's (another run's, if re-attached)


def failure_error(
    info, *, submission_id: str, address: str, tail: str
) -> JobConfigError | RetryableJobError | StorageFullJobError:
    """The error for a job that ended without succeeding (``info``: Ray's JobInfo), with its last log lines."""
    status = job_status(info)
    if status == "STOPPED":
        return RetryableJobError(
            f"job {submission_id} at {address} was STOPPED before finishing (stopped outside this "
            f"submitter, or the head stopped it)\n{tail}",
            address=address,
            submission_id=submission_id,
        )
    exit_code = job_exit_code(info)
    if exit_code == NO_SPACE_EXIT_CODE:
        paused = [line.split(PAUSED_PREFIX, 1)[1] for line in tail.splitlines() if PAUSED_PREFIX in line]
        return StorageFullJobError(
            f"the training paused: {paused[-1]}" if paused else f"job {submission_id} paused on a full disk:\n{tail}",
            address=address,
            submission_id=submission_id,
        )
    if exit_code == CONFIG_ERROR_EXIT_CODE:
        return JobConfigError(
            f"job {submission_id} at {address} rejected its configuration (exit code 2); fix the "
            f"config and run again. Last log lines:\n{tail}",
            address=address,
            submission_id=submission_id,
        )
    return RetryableJobError(
        f"job {submission_id} at {address} FAILED (exit code {exit_code}, {info.error_type or 'no error type'})"
        f"; a retry resumes from the latest checkpoint. Last log lines:\n{tail}",
        address=address,
        submission_id=submission_id,
    )


def job_exit_code(info) -> int | None:
    """Ray >= 2.4x reports ``driver_exit_code``; older servers only say it in the message."""
    code = getattr(info, "driver_exit_code", None)
    if code is not None:
        return int(code)
    match = _EXIT_CODE.search(info.message or "")
    return int(match.group(1)) if match else None
