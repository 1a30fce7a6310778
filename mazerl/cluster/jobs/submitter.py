"""Run a stage as a Ray job and follow it to its end: the one submission path for both
training backends, on the embedded local head and on a real cluster alike.

What it guarantees:

- **One job per pipeline run.** The submission id is deterministic,
  ``mazerl-<pipeline run>-<stage>-a<attempt>``, and every job carries metadata
  ``{"mazerl_pipeline_run", "mazerl_stage", "mazerl_attempt"}``. Before submitting, a still
  PENDING/RUNNING job of the same pipeline run and stage is re-attached to instead of starting
  a second one (the orchestrator crashed and was re-run; the job kept running). If this
  attempt's id already SUCCEEDED, its result is returned without running it again; if it
  failed, the resubmission gets the suffix ``-r<k>`` (Ray never reuses an id).
- **One training per cluster.** A stage submitted with an ``identity`` (the train stage: its
  settings digest and data root, :meth:`~mazerl.training.config.TrainConfig.identity`) also
  looks at active jobs of the same stage from *other* pipeline runs (a new flow run started
  after the worker pod crashed gets a new id, while the orphan still holds every GPU). One
  with the same identity is the same training: it is re-attached to, and its metadata
  (``JobOutcome.metadata``) says where it writes. Any other is refused with
  :class:`JobConflictError`, naming the job and the command that stops it
  (:mod:`mazerl.cluster.jobs.pipeline_jobs`).
- **Logs reach the caller.** The job's output is followed with ``tail_job_logs`` in a thread
  (falling back to polling ``get_job_logs``) and handed line by line to ``log`` from the
  caller's thread, so a Prefect run logger can be used directly. With ``log_offsets_dir``, a
  later attempt that re-attaches continues the log where the earlier one stopped
  (:class:`~mazerl.cluster.jobs.log.JobLogFeed`).
- **Failures say whether to retry.** SUCCEEDED -> :class:`~mazerl.cluster.jobs.outcome.JobOutcome`;
  exit code 2 -> :class:`JobConfigError`, never retried (:mod:`mazerl.cluster.jobs.outcome`). Any
  other failure, STOPPED, a job that vanished, an address that stops answering (for longer than
  ``unreachable_grace_s``) -> :class:`RetryableJobError` naming the address; the training retry
  resumes from its checkpoint.
- **Hung jobs are stopped.** With ``hang_timeout_s``, a RUNNING job whose ``progress_probe``
  does not advance for that long is stopped and reported as retryable "hung"
  (:mod:`mazerl.cluster.jobs.hang_watchdog`).
- **An expired HyperPod session is renewed.** The ``sagemaker_ray://`` toolkit fetches its
  dashboard cookie once, when the client is built; a long wait outlives it. A 401/403 while
  following a job on such an address rebuilds the client (the toolkit signs in again) and goes
  on following the same job, its log from where it stopped. A new session that is refused at
  once is a real access problem and raised as such.
- **A resubmission can wait for the cluster.** ``before_submit`` runs right before a new job is
  submitted (never when re-attaching, nor for an id that already SUCCEEDED): the train stage's
  retries wait there until the cluster has the GPUs the job asks for
  (:func:`mazerl.cluster.jobs.capacity.wait_for_resources`).
- **Cancelling the caller stops the job.** Any exception leaving :meth:`RayJob.wait` inside
  the ``with`` block (KeyboardInterrupt, task cancellation, an error in ``log``) stops the Ray
  job, unless ``keep_running_on(exc)`` gives a reason to keep it (a deployment's flow process
  stopped by SIGTERM: its retry re-attaches). A caller killed outright (SIGKILL) leaves it
  running, and the re-run re-attaches.

Code on the cluster: ``runtime_env="auto"`` (the default) gives a head on this machine
(127.0.0.1/localhost) ``PYTHONPATH=<this checkout>`` so the job runs exactly the caller's
code; a remote cluster gets no runtime env because its image has the project installed.
The ids, metadata keys, entrypoints and runtime envs live in :mod:`mazerl.cluster.jobs.spec`;
following the job's log in :mod:`mazerl.cluster.jobs.log`; finding a pipeline run's jobs among the
cluster's, and stopping them, in :mod:`mazerl.cluster.jobs.pipeline_jobs`.

Secrets: the runtime env is never logged here, but Ray stores it with the job and may log
it, so tokens belong in the cluster's environment (Kubernetes Secrets), not in ``env_vars``.
Only ids, statuses and the job's own output are logged.

A job that cannot be placed stays PENDING until Ray gives up on it
(``RAY_JOB_START_TIMEOUT_SECONDS``, 15 minutes by default) and then FAILS, which is retryable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mazerl.cluster.client import auth_refused, job_client, parse_address
from mazerl.cluster.errors import ClusterAccessError, ConfigError, RetryableJobError
from mazerl.cluster.jobs.hang_watchdog import HangWatchdog, JobProgress
from mazerl.cluster.jobs.log import JobLogFeed, LogOffsets
from mazerl.cluster.jobs.outcome import JobOutcome, failure_error
from mazerl.cluster.jobs.pipeline_jobs import by_start, conflict_error, other_runs_active, run_jobs, same_training
from mazerl.cluster.jobs.spec import (
    ACTIVE,
    META_RUN,
    TERMINAL,
    JobSpec,
    job_metadata,
    job_status,
    merged_runtime_env,
    runtime_env_for,
    submission_metadata,
)

logger = logging.getLogger(__name__)

SESSION_MIN_S = 10.0  # a session refused sooner than this after renewal was not an expiry

LogFn = Callable[[str], None]


def _check_arguments(
    hang_timeout_s: float | None, progress_probe: object, poll_s: float, unreachable_grace_s: float
) -> None:
    """RayJob's arguments that make no sense, refused before any address is parsed or client built."""
    if hang_timeout_s is not None and not hang_timeout_s > 0:
        raise ConfigError(f"hang_timeout_s ({hang_timeout_s}) must be > 0 seconds, or None to disable the watchdog")
    if hang_timeout_s is not None and progress_probe is None:
        raise ConfigError(
            f"hang_timeout_s ({hang_timeout_s:g}) needs a progress_probe to watch, e.g. "
            "mazerl.training.progress.TrainingProgress() for a training job, or hang_timeout_s=None"
        )
    if not poll_s > 0 or unreachable_grace_s < 0:
        raise ConfigError(f"poll_s ({poll_s}) must be > 0 and unreachable_grace_s ({unreachable_grace_s}) >= 0")


# --- the job ------------------------------------------------------------------------------


class RayJob:
    """One stage's Ray job: submitted or re-attached by :meth:`start`, followed by :meth:`wait`.

    Use it as a context manager so that leaving the block early stops the job::

        with RayJob(address, JobSpec(entrypoint, pipeline_run_id=run, attempt=n), log=print) as job:
            outcome = job.wait()
    """

    def __init__(
        self,
        address: str,
        spec: JobSpec,
        *,
        headers: dict[str, str] | None = None,
        log: LogFn | None = None,
        hang_timeout_s: float | None = None,
        progress_probe: JobProgress | None = None,
        poll_s: float = 0.5,
        unreachable_grace_s: float = 20.0,
        log_offsets_dir: str | Path | None = None,
        keep_running_on: Callable[[BaseException], str | None] | None = None,
        before_submit: Callable[[], None] | None = None,
    ):
        _check_arguments(hang_timeout_s, progress_probe, poll_s, unreachable_grace_s)
        parsed = parse_address(address)
        self.address = parsed.value
        self._renews_sessions = parsed.is_sagemaker  # its session cookie expires; a new client gets a new one
        self.spec = spec
        self.base_submission_id = spec.submission_id
        runtime_env = runtime_env_for(self.address) if spec.runtime_env == "auto" else spec.runtime_env
        self.runtime_env = merged_runtime_env(runtime_env, spec.env_vars)
        self.headers = dict(headers) if headers else None
        self.log: LogFn = log or logger.info
        self.hang_timeout_s = hang_timeout_s
        self.progress_probe = progress_probe
        self._watchdog = HangWatchdog(progress_probe, hang_timeout_s) if hang_timeout_s is not None else None
        self.poll_s = poll_s
        self.unreachable_grace_s = unreachable_grace_s
        self.before_submit = before_submit  # runs only when a new job is about to be submitted
        self.metadata: dict[str, str] = {}
        self.submission_id: str | None = None
        self.reattached = False
        self._client = None
        self._finished = False
        self._already_succeeded = False
        self._started_at = time.monotonic()
        self._session_renewed_at: float | None = None
        feed = progress_probe.feed if progress_probe is not None else None  # the probe reads the job's lines too
        self._job_log = JobLogFeed(LogOffsets(log_offsets_dir), self.log, feed, poll_s)
        # asked when an exception leaves the ``with`` block: a reason to leave the job running, or None to stop it
        self.keep_running_on = keep_running_on

    # context manager: leaving the block with an exception stops the job
    def __enter__(self) -> RayJob:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None or self._finished:
            return
        keep = self.keep_running_on(exc) if self.keep_running_on is not None and exc is not None else None
        if keep and self.submission_id is not None:
            self.log(f"left Ray job {self.submission_id} running at {self.address}: {keep}")
            return
        self.stop(reason=f"the caller stopped waiting ({exc_type.__name__})")

    def start(self) -> str:
        """Re-attach to this pipeline run's active job, or submit a new one; returns its id."""
        self._client = job_client(self.address, self.headers)
        self._started_at = time.monotonic()
        # a second pass if a concurrent caller submitted the same id first; one more after before_submit
        for _ in range(3):
            jobs = self._call(self._client.list_jobs)
            mine = run_jobs(jobs, self.spec.pipeline_run_id, self.spec.stage)
            active = by_start(j for j in mine if job_status(j) in ACTIVE)
            if active:
                return self._attach(active)
            done = next((j for j in mine if j.submission_id == self.base_submission_id), None)
            if done is not None and job_status(done) == "SUCCEEDED":
                self.submission_id, self.reattached, self._already_succeeded = done.submission_id, True, True
                self.metadata = job_metadata(done)
                self.log(f"job {done.submission_id} at {self.address} already SUCCEEDED; not running it again")
                return done.submission_id
            others = (
                other_runs_active(jobs, self.spec.pipeline_run_id, self.spec.stage)
                if self.spec.identity is not None
                else []
            )
            if others:
                return self._attach_other_run(others)
            if self.before_submit is not None:  # e.g. wait until the cluster has what the job asks for
                wait, self.before_submit = self.before_submit, None
                wait()
                continue  # look again: the cluster's jobs may have changed while waiting
            taken = {j.submission_id for j in jobs}
            submission_id, k = self.base_submission_id, 0
            while submission_id in taken:
                k += 1
                submission_id = f"{self.base_submission_id}-r{k}"
            try:
                self._submit(submission_id)
            except RuntimeError as exc:
                if "already exists" in str(exc):
                    continue
                raise
            return submission_id
        raise RetryableJobError(
            f"could not submit {self.base_submission_id} at {self.address}: the id kept being taken concurrently",
            address=self.address,
        )

    def wait(self) -> JobOutcome:
        """Follow the job to a terminal status; see the module docstring for the mapping."""
        if self.submission_id is None:
            self.start()
        if self._already_succeeded:
            self._finished = True
            return self._outcome("SUCCEEDED", "already succeeded")
        if self.progress_probe is not None:  # where the followed job writes (another run's directory, if re-attached)
            self.progress_probe.follow(self.metadata)
        self._job_log.follow(self._client, self.submission_id, resume=self.reattached)
        last_answer = time.monotonic()
        while True:
            self._job_log.drain()
            now = time.monotonic()
            try:
                info = self._client.get_job_info(self.submission_id)
                last_answer = now
            except Exception as exc:  # noqa: BLE001 - sorted below; anything unknown is re-raised
                if self._renews_sessions and auth_refused(exc):
                    try:
                        self._renew_session(exc)
                        last_answer = now
                        continue
                    except RetryableJobError as outage:  # the token service is down for now: keep trying
                        exc = outage  # noqa: PLW2901
                elif isinstance(exc, RuntimeError) and ("does not exist" in str(exc) or "status code 404" in str(exc)):
                    self._finished = True
                    raise RetryableJobError(
                        f"job {self.submission_id} disappeared from Ray at {self.address} (head restarted?): {exc}",
                        address=self.address,
                        submission_id=self.submission_id,
                    ) from None
                elif not isinstance(exc, RuntimeError | OSError):  # OSError: connection refused/reset
                    raise
                last_answer = self._tolerate_outage(exc, last_answer, now)
                time.sleep(self.poll_s)
                continue
            status = job_status(info)
            if status in TERMINAL:
                break
            if status == "RUNNING":
                self._watch_progress(now)
            time.sleep(self.poll_s)
        self._job_log.finish()
        self._finished = True
        return self._map_final(info)

    def stop(self, reason: str = "stopped", wait_s: float = 30.0) -> None:
        """Best-effort stop of the Ray job (no error if it already ended or the head is gone).

        Waits until Ray reports it terminal: a retry that looked while it was still stopping
        would otherwise re-attach to the very job that was just given up on.
        """
        if self.submission_id is None or self._client is None or self._already_succeeded:
            return
        try:
            stopped = self._client.stop_job(self.submission_id)
            deadline = time.monotonic() + wait_s
            while job_status(self._client.get_job_info(self.submission_id)) not in TERMINAL:
                if time.monotonic() > deadline:
                    logger.warning(
                        "Ray job %s at %s still not stopped after %.0f s", self.submission_id, self.address, wait_s
                    )
                    break
                time.sleep(0.2)
        except Exception as exc:  # noqa: BLE001 - stopping is best effort on the way out
            logger.warning("could not stop Ray job %s at %s: %s", self.submission_id, self.address, exc)
            return
        finally:
            self._finished = True
        if stopped:
            self.log(f"stopped Ray job {self.submission_id} at {self.address}: {reason}")

    # --- internals ---

    def _submit(self, submission_id: str) -> None:
        options: dict[str, Any] = {}
        if self.spec.num_gpus is not None:
            options["entrypoint_num_gpus"] = self.spec.num_gpus
        if self.spec.num_cpus is not None:
            options["entrypoint_num_cpus"] = self.spec.num_cpus
        if self.spec.memory is not None:
            options["entrypoint_memory"] = int(self.spec.memory)
        metadata = submission_metadata(
            self.spec.pipeline_run_id,
            self.spec.stage,
            self.spec.attempt,
            self.spec.identity,
            self.spec.memory,
            self.spec.num_cpus,
        )
        self._call(
            self._client.submit_job,
            entrypoint=self.spec.entrypoint,
            submission_id=submission_id,
            runtime_env=self.runtime_env,
            metadata=metadata,
            **options,
        )
        self.submission_id, self.metadata = submission_id, metadata
        self.log(f"submitted Ray job {submission_id} to {self.address}: {self.spec.entrypoint}")

    def _attach(self, active: list) -> str:
        keep, extras = active[-1], active[:-1]
        for extra in extras:  # two trainers on one checkpoint dir would corrupt it
            self._call(self._client.stop_job, extra.submission_id)
            self.log(f"stopped duplicate Ray job {extra.submission_id} of pipeline run {self.spec.pipeline_run_id}")
        self.submission_id, self.reattached, self.metadata = keep.submission_id, True, job_metadata(keep)
        self.log(
            f"re-attached to {job_status(keep)} Ray job {keep.submission_id} of pipeline run {self.spec.pipeline_run_id} "
            f"at {self.address} instead of submitting a second one"
        )
        return keep.submission_id

    def _attach_other_run(self, others: list) -> str:
        """Follow another pipeline run's job of this stage if it is the same training, else refuse."""
        same = [j for j in others if same_training(j, self.spec.identity)]
        if same:
            keep = same[-1]
            self.submission_id, self.reattached, self.metadata = keep.submission_id, True, job_metadata(keep)
            self.log(
                f"re-attached to {job_status(keep)} Ray job {keep.submission_id} of pipeline run "
                f"{job_metadata(keep).get(META_RUN)} at {self.address}: the same training (settings digest "
                f"{self.spec.identity.get('config_digest', '?')[:12]}, data root {self.spec.identity.get('data_root')}) "
                "started by an earlier flow run; following it instead of starting a second one"
            )
            return keep.submission_id
        raise conflict_error(others[-1], self.spec.identity, self.spec.stage, self.address)

    def _call(self, fn: Callable, *args, **kwargs):
        """A client call whose connection failure becomes a retryable error naming the address."""
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            raise RetryableJobError(
                f"Ray at {self.address} is unreachable ({type(exc).__name__}: {exc})", address=self.address
            ) from None
        except RuntimeError as exc:  # the job API answered with an error status
            if "already exists" in str(exc):
                raise  # a concurrent submission of the same id: start() looks again
            raise RetryableJobError(f"Ray at {self.address} refused the request: {exc}", address=self.address) from None
        except Exception as exc:
            if auth_refused(exc):
                raise ClusterAccessError(
                    f"Ray at {self.address} refused this client's credentials: {str(exc).splitlines()[0]}"
                ) from None
            raise

    def _renew_session(self, reason: Exception) -> None:
        """A 401/403 on a ``sagemaker_ray://`` address: sign in again, keep following the same job."""
        now = time.monotonic()
        if self._session_renewed_at is not None and now - self._session_renewed_at < SESSION_MIN_S:
            self._finished = True
            raise ClusterAccessError(
                f"Ray at {self.address} refused a session renewed {now - self._session_renewed_at:.0f} s ago while "
                f"following job {self.submission_id} ({str(reason)[:200]}); check the HyperPod access of these "
                "credentials. The job keeps running: retry the flow run to follow it again"
            ) from None
        client = job_client(self.address, self.headers)  # the toolkit fetches a new session cookie
        self._client, self._session_renewed_at = client, now
        self._job_log.switch_client(client)
        self.log(
            f"the session to {self.address} expired ({str(reason)[:80]}); signed in again, still following "
            f"job {self.submission_id}"
        )

    def _tolerate_outage(self, exc: Exception, last_answer: float, now: float) -> float:
        if now - last_answer > self.unreachable_grace_s:
            self._finished = True
            raise RetryableJobError(
                f"Ray at {self.address} stopped answering for {now - last_answer:.0f} s while job "
                f"{self.submission_id} was running (head gone?): {type(exc).__name__}: {exc}",
                address=self.address,
                submission_id=self.submission_id,
            ) from None
        return last_answer

    def _watch_progress(self, now: float) -> None:
        if self._watchdog is None:
            return
        idle_s = self._watchdog.idle_s(now)
        if idle_s is not None:
            self.stop(reason=f"no progress for {idle_s:.0f} s")
            raise RetryableJobError(
                f"job {self.submission_id} at {self.address} hung: no progress for {idle_s:.0f} s "
                f"(hang_timeout_s={self.hang_timeout_s:g}; last progress: {self._watchdog.value!r}); stopped it",
                address=self.address,
                submission_id=self.submission_id,
            )

    def _map_final(self, info) -> JobOutcome:
        status = job_status(info)
        if status == "SUCCEEDED":
            return self._outcome(status, info.message or "")
        raise failure_error(info, submission_id=self.submission_id, address=self.address, tail=self._job_log.tail())

    def _outcome(self, status: str, message: str) -> JobOutcome:
        return JobOutcome(
            submission_id=self.submission_id,
            address=self.address,
            status=status,
            reattached=self.reattached,
            duration_s=time.monotonic() - self._started_at,
            log_lines=self._job_log.lines,
            message=message,
            metadata=dict(self.metadata),
        )
