"""A pipeline run's Ray jobs among those a cluster lists: its own, another run's of the same stage, stopping them.

Every job's metadata names its pipeline run and stage (:mod:`mazerl.cluster.jobs.spec`), so a
re-run finds its own jobs and re-attaches instead of starting a second one. A stage submitted
with an identity (the train stage) also finds another run's active job of the same stage: a new
flow run started after the worker pod crashed gets a new id while the orphan still holds every
GPU. The same training (:func:`same_training`: settings digest and data root) is followed; any
other is refused (:func:`conflict_error`), since a second one would wait for the GPUs the first
holds until Ray gives up.
"""

from __future__ import annotations

import time

from mazerl.cluster.client import job_client
from mazerl.cluster.errors import JobConflictError
from mazerl.cluster.jobs.spec import (
    ACTIVE,
    IDENTITY_MATCH,
    META_RUN,
    META_STAGE,
    TERMINAL,
    job_identity,
    job_metadata,
    job_status,
)


def run_jobs(jobs: list, pipeline_run_id: str, stage: str) -> list:
    """The jobs of ``pipeline_run_id``'s ``stage``, in the order listed."""
    return [
        j for j in jobs if job_metadata(j).get(META_RUN) == pipeline_run_id and job_metadata(j).get(META_STAGE) == stage
    ]


def other_runs_active(jobs: list, pipeline_run_id: str, stage: str) -> list:
    """The active jobs of ``stage`` from pipeline runs other than ``pipeline_run_id``, oldest first."""
    others = [
        j
        for j in jobs
        if job_metadata(j).get(META_STAGE) == stage
        and job_metadata(j).get(META_RUN) != pipeline_run_id
        and job_status(j) in ACTIVE
    ]
    return by_start(others)


def by_start(jobs) -> list:
    """``jobs`` oldest first (a job not started yet counts as the oldest)."""
    return sorted(jobs, key=lambda j: j.start_time or 0)


def same_training(job, identity: dict[str, str]) -> bool:
    """Whether ``job`` was submitted with the same identity (:data:`~mazerl.cluster.jobs.spec.IDENTITY_MATCH`)."""
    return all(job_identity(job).get(k) == identity.get(k) for k in IDENTITY_MATCH)


def conflict_error(other, identity: dict[str, str], stage: str, address: str) -> JobConflictError:
    """The refusal for another training's job ``other`` of ``stage``: it names the job and the command that stops it."""
    theirs = job_identity(other)
    differs = (
        "no identity recorded"
        if not theirs
        else ", ".join(f"{k} {theirs.get(k)!r} vs ours {identity.get(k)!r}" for k in IDENTITY_MATCH)
    )
    return JobConflictError(
        f"Ray job {other.submission_id} ({job_status(other)}, pipeline run {job_metadata(other).get(META_RUN)}) is "
        f"another mazerl {stage} job on {address} ({differs}); a second one would wait for the GPUs it holds "
        f"until Ray gives up. Let it finish, or stop it with: ray job stop {other.submission_id} --address "
        f"{address}; then retry this flow run (a retried flow run re-attaches to its own job; a new flow "
        "run of the same training re-attaches too)",
        address=address,
        submission_id=other.submission_id,
    )


def stop_pipeline_jobs(
    address: str, pipeline_run_id: str, headers: dict[str, str] | None = None, wait_s: float = 30.0
) -> list[str]:
    """Stop every active Ray job of one pipeline run (one abandoned for a fresh start); returns their ids.

    Waits until Ray reports them terminal: a new run's train stage that looked while one was
    still stopping would take it for the same training and re-attach to it.
    """
    client = job_client(address, headers)
    active = [
        j for j in client.list_jobs() if job_metadata(j).get(META_RUN) == pipeline_run_id and job_status(j) in ACTIVE
    ]
    for job in active:
        client.stop_job(job.submission_id)
    deadline = time.monotonic() + wait_s
    for job in active:
        while job_status(client.get_job_info(job.submission_id)) not in TERMINAL and time.monotonic() < deadline:
            time.sleep(0.2)
    return [job.submission_id for job in active]
