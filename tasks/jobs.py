"""Running one stage's work as a Ray job from a Prefect task, with its log in the task's log."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.exceptions import TerminationSignal
from prefect.runtime import deployment, flow_run, task_run

from mazerl import atomic
from mazerl.cluster.client import ray_headers
from mazerl.cluster.errors import RetryableJobError
from mazerl.cluster.jobs.hang_watchdog import JobProgress
from mazerl.cluster.jobs.outcome import JobOutcome
from mazerl.cluster.jobs.spec import JobSpec, module_entrypoint
from mazerl.cluster.jobs.submitter import RayJob
from tasks.context import RunContext

# A job's output is a log, not a terminal: Hugging Face's progress bars ("Loading weights",
# "Writing model shards") would add two lines per model load or save.
JOB_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def attempt_number() -> int:
    """The Prefect task's run count (1 on the first try): part of the deterministic job id."""
    return int(task_run.run_count or 1)


def stage_job(
    context: RunContext,
    stage: str,
    module: str,
    config_path: Path,
    *,
    env_vars: dict[str, str] | None = None,
    **asks: Any,
) -> JobSpec:
    """This flow run's attempt at ``stage``: ``python -m module --config config_path``, with the
    stage's environment; ``asks`` are what it asks of the cluster (:class:`JobSpec`'s ``num_gpus``,
    ``num_cpus``, ``memory``, ``identity``)."""
    return JobSpec(
        module_entrypoint(module, config_path),
        pipeline_run_id=context.flow_run_id,
        attempt=attempt_number(),
        stage=stage,
        env_vars=JOB_ENV | (env_vars or {}),
        **asks,
    )


def run_stage_job(
    context: RunContext,
    spec: JobSpec,
    *,
    hang_timeout_s: float | None = None,
    progress_probe: JobProgress | None = None,
    on_line: Callable[[str], None] | None = None,
    rewrite: Callable[[str], str] | None = None,
    before_submit: Callable[[], None] | None = None,
) -> JobOutcome:
    """Submit (or re-attach to) the job ``spec`` describes and follow it to its end.

    ``rewrite`` turns a job line into the line logged (e.g. the train stage adds the total time
    left to each step line); ``on_line`` sees the job's own line; ``before_submit`` runs before a
    new job is submitted (the train stage's retries wait there for the cluster).
    """
    logger = get_run_logger()
    address = context.cluster_address()

    def log(line: str) -> None:
        logger.info(rewrite(line) if rewrite is not None else line)
        if on_line is not None:
            on_line(line)

    with RayJob(
        address,
        spec,
        headers=ray_headers(address),
        log=log,
        hang_timeout_s=hang_timeout_s,
        progress_probe=progress_probe,
        log_offsets_dir=context.run_dir / "job_logs",  # a retry of this flow run continues the log
        keep_running_on=keep_job_when_stopped(context.jobs_on_stop),
        before_submit=before_submit,
    ) as job:  # the submitter has said which job it submitted or re-attached to
        return job.wait()


def keep_job_when_stopped(policy: str) -> Callable[[BaseException], str | None]:
    """What the stage's Ray job does when the flow process is stopped gracefully (``ray_jobs_on_stop``).

    A SIGTERM (a pod eviction, ``kill``) or Ctrl-C reaches the stage as an exception leaving
    the job's ``with`` block. On a deployment (policy ``auto``, or ``keep``) the job keeps
    running: the retry of the flow run re-attaches to it and no step is lost. On the laptop
    (``auto`` without a deployment, or ``stop``) it is stopped: the embedded head goes down with
    the last run using it, and ``mazerl run`` again resumes from the checkpoint. A flow run
    being cancelled always stops its job, as does any other exception.
    """

    def keep(exc: BaseException) -> str | None:
        keeps = policy == "keep" or (policy == "auto" and deployment.id is not None)
        if not keeps or not isinstance(exc, TerminationSignal | KeyboardInterrupt) or _cancelling():
            return None
        return (
            f"the flow process was stopped ({type(exc).__name__}) and ray_jobs_on_stop is {policy!r}: a retry of "
            "this flow run (prefect flow-run retry) re-attaches to it"
        )

    return keep


def _cancelling() -> bool:
    """Whether this flow run is being cancelled (the SIGTERM was the cancellation, not an eviction)."""
    if flow_run.id is None:
        return False
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run.id).state
    except Exception:  # noqa: BLE001 - the API is unreachable: not a cancellation anyone could have asked for
        return False
    return state is not None and (state.is_cancelling() or state.is_cancelled())


def write_request(path: Path, request: dict[str, Any]) -> Path:
    """A stage job's JSON request, written where the cluster reads it (temporary name, then rename)."""
    return atomic.write_json(path, request)


def retry_on_infrastructure(task, task_run, state) -> bool:
    """Prefect retry condition: retry lost jobs, dead heads and hangs, never configuration errors."""
    try:
        state.result()
    except RetryableJobError:
        return True
    except Exception:
        return False
    return False
