"""Run a stage as a Ray job and follow it to its end: the one submission path for both
training backends, on the embedded local head and on a real cluster alike.

What it guarantees (design section 4):

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
  :class:`JobConflictError`, naming the job and the command that stops it.
- **Logs reach the caller.** The job's output is followed with ``tail_job_logs`` in a thread
  (falling back to polling ``get_job_logs`` from the last offset) and handed line by line to
  ``log`` from the caller's thread, so a Prefect run logger can be used directly. With
  ``log_offsets_dir``, how far the log was handed out is recorded there per job (temporary
  name, then rename); a later attempt that re-attaches to the same job continues after that
  point instead of replaying the lines its flow run already shows, and says so.
- **Failures say whether to retry.** SUCCEEDED -> :class:`JobOutcome`. FAILED with the
  entrypoint's exit code 2 (our entrypoints' "bad configuration", and argparse's) ->
  :class:`JobConfigError`, never retried. Any other failure, STOPPED, a job that vanished, an
  address that stops answering (for longer than ``unreachable_grace_s``) ->
  :class:`RetryableJobError` naming the address; the training retry resumes from its checkpoint.
- **Hung jobs are stopped.** With ``hang_timeout_s``, a RUNNING job whose ``progress_probe``
  (the caller's: the train stage gives :class:`~mazerl.training.progress.TrainingProgress`, the
  last ``step N/M:`` line both training backends print) does not advance for that long is
  stopped and reported as retryable "hung". Works on any Ray cluster.
- **An expired HyperPod session is renewed.** The ``sagemaker_ray://`` toolkit fetches its
  dashboard cookie once, when the client is built; a long wait outlives it. A 401/403 while
  following a job on such an address rebuilds the client (the toolkit signs in again) and goes
  on following the same job, its log from where it stopped. A new session that is refused at
  once is a real access problem and raised as such.
- **A resubmission can wait for the cluster.** ``before_submit`` runs right before a new job is
  submitted (never when re-attaching, nor for an id that already SUCCEEDED): the train stage's
  retries wait there until the cluster has the GPUs the job asks for
  (:func:`mazerl.cluster.capacity.wait_for_resources`).
- **Cancelling the caller stops the job.** Any exception leaving :meth:`RayJob.wait` inside
  the ``with`` block (KeyboardInterrupt, task cancellation, an error in ``log``) stops the Ray
  job, unless ``keep_running_on(exc)`` gives a reason to keep it (a deployment's flow process
  stopped by SIGTERM: its retry re-attaches). A caller killed outright (SIGKILL) leaves it
  running, and the re-run re-attaches.

Code on the cluster: ``runtime_env="auto"`` (the default) gives a head on this machine
(127.0.0.1/localhost) ``PYTHONPATH=<this checkout>`` so the job runs exactly the caller's
code; a remote cluster gets no runtime env because its image has the project installed.
The ids, metadata keys, entrypoints and runtime envs live in :mod:`mazerl.cluster.job_spec`;
following the job's log in :mod:`mazerl.cluster.job_log`.

Secrets: the runtime env is never logged here, but Ray stores it with the job and may log
it, so tokens belong in the cluster's environment (Kubernetes Secrets), not in ``env_vars``.
Only ids, statuses and the job's own output are logged.

A job that cannot be placed stays PENDING until Ray gives up on it
(``RAY_JOB_START_TIMEOUT_SECONDS``, 15 minutes by default) and then FAILS, which is retryable.
"""

from __future__ import annotations

import collections
import json
import logging
import queue
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mazerl.atomic import write_json
from mazerl.cluster.client import job_client, parse_address
from mazerl.cluster.errors import ClusterAccessError, ConfigError, JobConfigError, JobConflictError, RetryableJobError
from mazerl.cluster.job_log import LogFollower
from mazerl.cluster.job_spec import (
    ACTIVE,
    IDENTITY_MATCH,
    META_ATTEMPT,
    META_CPUS,
    META_IDENTITY_PREFIX,
    META_MEMORY,
    META_RUN,
    META_STAGE,
    TERMINAL,
    job_status,
    merged_runtime_env,
    runtime_env_for,
    submission_id_for,
)

logger = logging.getLogger(__name__)

CONFIG_ERROR_EXIT_CODE = 2
_EXIT_CODE = re.compile(r"exit code (-?\d+)")
_AUTH_REFUSED = re.compile(r"status code 40[13]\b")  # Ray's job client: "Request failed with status code 401"
SESSION_MIN_S = 10.0  # a session refused sooner than this after renewal was not an expiry

LogFn = Callable[[str], None]


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


# --- the job ------------------------------------------------------------------------------


class RayJob:
    """One stage's Ray job: submitted or re-attached by :meth:`start`, followed by :meth:`wait`.

    Use it as a context manager so that leaving the block early stops the job::

        with RayJob(address, entrypoint, pipeline_run_id=run, attempt=n, log=print) as job:
            outcome = job.wait()
    """

    def __init__(
        self,
        address: str,
        entrypoint: str,
        *,
        pipeline_run_id: str,
        attempt: int,
        stage: str = "train",
        runtime_env: dict[str, Any] | None | Literal["auto"] = "auto",
        env_vars: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        log: LogFn | None = None,
        hang_timeout_s: float | None = None,
        progress_probe: Callable[[], object] | None = None,
        poll_s: float = 0.5,
        unreachable_grace_s: float = 20.0,
        entrypoint_num_gpus: float | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_memory: int | None = None,
        identity: dict[str, str] | None = None,
        log_offsets_dir: str | Path | None = None,
        keep_running_on: Callable[[BaseException], str | None] | None = None,
        before_submit: Callable[[], None] | None = None,
    ):
        if not isinstance(entrypoint, str) or not entrypoint.strip():
            raise ConfigError(
                "entrypoint is empty: give the command the job runs, e.g. python -m <module> --config <file>"
            )
        if hang_timeout_s is not None and not hang_timeout_s > 0:
            raise ConfigError(f"hang_timeout_s ({hang_timeout_s}) must be > 0 seconds, or None to disable the watchdog")
        if hang_timeout_s is not None and progress_probe is None:
            raise ConfigError(
                f"hang_timeout_s ({hang_timeout_s:g}) needs a progress_probe to watch, e.g. "
                "mazerl.training.progress.TrainingProgress() for a training job, or hang_timeout_s=None"
            )
        if not poll_s > 0 or unreachable_grace_s < 0:
            raise ConfigError(f"poll_s ({poll_s}) must be > 0 and unreachable_grace_s ({unreachable_grace_s}) >= 0")
        parsed = parse_address(address)
        self.address = parsed.value
        self._renews_sessions = parsed.is_sagemaker  # its session cookie expires; a new client gets a new one
        if runtime_env == "auto":
            runtime_env = runtime_env_for(self.address)
        self.entrypoint = entrypoint
        self.pipeline_run_id = pipeline_run_id
        self.attempt = attempt
        self.stage = stage
        self.base_submission_id = submission_id_for(pipeline_run_id, attempt, stage)
        self.runtime_env = merged_runtime_env(runtime_env, env_vars)
        self.headers = dict(headers) if headers else None
        self.log: LogFn = log or logger.info
        self.hang_timeout_s = hang_timeout_s
        self.progress_probe = progress_probe
        self.poll_s = poll_s
        self.unreachable_grace_s = unreachable_grace_s
        self.entrypoint_num_gpus = entrypoint_num_gpus
        self.entrypoint_num_cpus = entrypoint_num_cpus  # the job's driver gets them (and its OMP_NUM_THREADS)
        self.entrypoint_memory = entrypoint_memory  # bytes: Ray starts the job on a node that has them
        self.before_submit = before_submit  # runs only when a new job is about to be submitted
        self.identity = dict(identity) if identity is not None else None
        self.metadata: dict[str, str] = {}
        self.submission_id: str | None = None
        self.reattached = False
        self._client = None
        self._finished = False
        self._already_succeeded = False
        self._follower: LogFollower | None = None
        self._recent: collections.deque[str] = collections.deque(maxlen=40)
        self._lines = 0
        self._started_at = time.monotonic()
        self._progress_value: object = None
        self._progress_since: float | None = None
        self._session_renewed_at: float | None = None
        self.log_offsets_dir = Path(log_offsets_dir) if log_offsets_dir is not None else None
        self._log_offset = self._recorded_offset = 0  # log characters handed to ``log`` / recorded as such
        self._lines_before = 0  # lines an earlier attempt handed out (from its record)
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
            mine = [
                j
                for j in jobs
                if _meta(j).get(META_RUN) == self.pipeline_run_id and _meta(j).get(META_STAGE) == self.stage
            ]
            active = sorted((j for j in mine if job_status(j) in ACTIVE), key=lambda j: j.start_time or 0)
            if active:
                return self._attach(active)
            done = next((j for j in mine if j.submission_id == self.base_submission_id), None)
            if done is not None and job_status(done) == "SUCCEEDED":
                self.submission_id, self.reattached, self._already_succeeded = done.submission_id, True, True
                self.metadata = _meta(done)
                self.log(f"job {done.submission_id} at {self.address} already SUCCEEDED; not running it again")
                return done.submission_id
            if self.identity is not None:
                others = [
                    j
                    for j in jobs
                    if _meta(j).get(META_STAGE) == self.stage
                    and _meta(j).get(META_RUN) != self.pipeline_run_id
                    and job_status(j) in ACTIVE
                ]
                if others:
                    return self._attach_other_run(sorted(others, key=lambda j: j.start_time or 0))
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
        follow = getattr(self.progress_probe, "follow", None)
        if follow is not None:  # where the followed job writes (another run's directory, if re-attached)
            follow(self.metadata)
        skip = self._already_logged() if self.reattached else 0
        self._follower = LogFollower(self._client, self.submission_id, self.poll_s, skip_chars=skip)
        self._follower.start()
        last_answer = time.monotonic()
        while True:
            self._drain_logs()
            now = time.monotonic()
            try:
                info = self._client.get_job_info(self.submission_id)
                last_answer = now
            except Exception as exc:  # noqa: BLE001 - sorted below; anything unknown is re-raised
                if self._renews_sessions and _auth_refused(exc):
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
        self._follower.finish()
        self._drain_logs()
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
        if self.entrypoint_num_gpus is not None:
            options["entrypoint_num_gpus"] = self.entrypoint_num_gpus
        if self.entrypoint_num_cpus is not None:
            options["entrypoint_num_cpus"] = self.entrypoint_num_cpus
        if self.entrypoint_memory is not None:
            options["entrypoint_memory"] = int(self.entrypoint_memory)
        metadata = {META_RUN: self.pipeline_run_id, META_STAGE: self.stage, META_ATTEMPT: str(self.attempt)}
        metadata |= {META_IDENTITY_PREFIX + key: str(value) for key, value in (self.identity or {}).items()}
        # Ray's job listing (JobDetails) shows neither what the driver asked for; operators and tests can read it here.
        if self.entrypoint_memory is not None:
            metadata[META_MEMORY] = str(int(self.entrypoint_memory))
        if self.entrypoint_num_cpus is not None:
            metadata[META_CPUS] = str(self.entrypoint_num_cpus)
        self._call(
            self._client.submit_job,
            entrypoint=self.entrypoint,
            submission_id=submission_id,
            runtime_env=self.runtime_env,
            metadata=metadata,
            **options,
        )
        self.submission_id, self.metadata = submission_id, metadata
        self.log(f"submitted Ray job {submission_id} to {self.address}: {self.entrypoint}")

    def _attach(self, active: list) -> str:
        keep, extras = active[-1], active[:-1]
        for extra in extras:  # two trainers on one checkpoint dir would corrupt it
            self._call(self._client.stop_job, extra.submission_id)
            self.log(f"stopped duplicate Ray job {extra.submission_id} of pipeline run {self.pipeline_run_id}")
        self.submission_id, self.reattached, self.metadata = keep.submission_id, True, _meta(keep)
        self.log(
            f"re-attached to {job_status(keep)} Ray job {keep.submission_id} of pipeline run {self.pipeline_run_id} "
            f"at {self.address} instead of submitting a second one"
        )
        return keep.submission_id

    def _attach_other_run(self, others: list) -> str:
        """Follow another pipeline run's job of this stage if it is the same training, else refuse."""
        same = [j for j in others if all(_identity(j).get(k) == self.identity.get(k) for k in IDENTITY_MATCH)]
        if same:
            keep = same[-1]
            self.submission_id, self.reattached, self.metadata = keep.submission_id, True, _meta(keep)
            self.log(
                f"re-attached to {job_status(keep)} Ray job {keep.submission_id} of pipeline run "
                f"{_meta(keep).get(META_RUN)} at {self.address}: the same training (settings digest "
                f"{self.identity.get('config_digest', '?')[:12]}, data root {self.identity.get('data_root')}) "
                "started by an earlier flow run; following it instead of starting a second one"
            )
            return keep.submission_id
        other = others[-1]
        theirs = _identity(other)
        differs = (
            "no identity recorded"
            if not theirs
            else ", ".join(f"{k} {theirs.get(k)!r} vs ours {self.identity.get(k)!r}" for k in IDENTITY_MATCH)
        )
        raise JobConflictError(
            f"Ray job {other.submission_id} ({job_status(other)}, pipeline run {_meta(other).get(META_RUN)}) is another "
            f"mazerl {self.stage} job on {self.address} ({differs}); a second one would wait for the GPUs it holds "
            f"until Ray gives up. Let it finish, or stop it with: ray job stop {other.submission_id} --address "
            f"{self.address}; then retry this flow run (a retried flow run re-attaches to its own job; a new flow "
            "run of the same training re-attaches too)",
            address=self.address,
            submission_id=other.submission_id,
        )

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
            if _auth_refused(exc):
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
        self._drain_logs()
        skip = self._follower.abandon() if self._follower is not None else 0
        self._client, self._session_renewed_at = client, now
        self._follower = LogFollower(self._client, self.submission_id, self.poll_s, skip_chars=skip)
        self._follower.start()
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

    def _drain_logs(self) -> None:
        if self._follower is None:
            return
        feed = getattr(self.progress_probe, "feed", None)
        while True:
            try:
                line, self._log_offset = self._follower.lines.get_nowait()
            except queue.Empty:
                self._record_log_offset()
                return
            if not line.strip():  # a blank line would be an empty "Task run '...' -" record
                continue
            self._lines += 1
            self._recent.append(line)
            if feed is not None:
                feed(line)
            self.log(line)

    def _log_record(self) -> Path | None:
        if self.log_offsets_dir is None or self.submission_id is None:
            return None
        return self.log_offsets_dir / f"{self.submission_id}.json"

    def _already_logged(self) -> int:
        """Characters of the re-attached job's log that an earlier attempt already handed to its ``log``."""
        path = self._log_record()
        try:
            record = json.loads(path.read_text()) if path is not None else None
        except (OSError, ValueError):
            record = None
        if not isinstance(record, dict) or record.get("submission_id") != self.submission_id:
            if path is not None:
                self.log(f"job {self.submission_id}: following its log from the start (no earlier attempt showed it)")
            return 0
        chars, lines = int(record.get("chars", 0)), int(record.get("lines", 0))
        self._log_offset = self._recorded_offset = chars
        self._lines_before = lines
        self.log(
            f"job {self.submission_id}: its log continues after the {lines} lines an earlier attempt already showed"
        )
        return chars

    def _record_log_offset(self) -> None:
        """Say how far the log was handed out (temporary name, then rename): a retry continues from there."""
        path = self._log_record()
        if path is None or self._log_offset == self._recorded_offset:
            return
        record = {"submission_id": self.submission_id, "chars": self._log_offset}
        record["lines"] = self._lines_before + self._lines
        try:
            write_json(path, record, indent=None)
        except OSError as exc:  # a full disk must not stop the job being followed; a retry replays more
            logger.warning("could not record the log offset of job %s in %s: %s", self.submission_id, path, exc)
            self.log_offsets_dir = None
        self._recorded_offset = self._log_offset

    def _watch_progress(self, now: float) -> None:
        if self.hang_timeout_s is None or self.progress_probe is None:
            return
        try:
            value = self.progress_probe()
        except Exception as exc:  # noqa: BLE001 - a broken probe must not kill a healthy job
            logger.warning("progress probe failed: %s", exc)
            value = self._progress_value
        if self._progress_since is None or value != self._progress_value:
            self._progress_value, self._progress_since = value, now
            return
        idle_s = now - self._progress_since
        if idle_s > self.hang_timeout_s:
            self.stop(reason=f"no progress for {idle_s:.0f} s")
            raise RetryableJobError(
                f"job {self.submission_id} at {self.address} hung: no progress for {idle_s:.0f} s "
                f"(hang_timeout_s={self.hang_timeout_s:g}; last progress: {self._progress_value!r}); stopped it",
                address=self.address,
                submission_id=self.submission_id,
            )

    def _map_final(self, info) -> JobOutcome:
        status = job_status(info)
        if status == "SUCCEEDED":
            return self._outcome(status, info.message or "")
        tail = "\n".join(list(self._recent)[-20:])
        if status == "STOPPED":
            raise RetryableJobError(
                f"job {self.submission_id} at {self.address} was STOPPED before finishing (stopped outside this "
                f"submitter, or the head stopped it)\n{tail}",
                address=self.address,
                submission_id=self.submission_id,
            )
        exit_code = _exit_code(info)
        if exit_code == CONFIG_ERROR_EXIT_CODE:
            raise JobConfigError(
                f"job {self.submission_id} at {self.address} rejected its configuration (exit code 2); fix the "
                f"config and run again. Last log lines:\n{tail}",
                address=self.address,
                submission_id=self.submission_id,
            )
        raise RetryableJobError(
            f"job {self.submission_id} at {self.address} FAILED (exit code {exit_code}, {info.error_type or 'no error type'})"
            f"; a retry resumes from the latest checkpoint. Last log lines:\n{tail}",
            address=self.address,
            submission_id=self.submission_id,
        )

    def _outcome(self, status: str, message: str) -> JobOutcome:
        return JobOutcome(
            submission_id=self.submission_id,
            address=self.address,
            status=status,
            reattached=self.reattached,
            duration_s=time.monotonic() - self._started_at,
            log_lines=self._lines,
            message=message,
            metadata=dict(self.metadata),
        )


def stop_pipeline_jobs(
    address: str, pipeline_run_id: str, headers: dict[str, str] | None = None, wait_s: float = 30.0
) -> list[str]:
    """Stop every active Ray job of one pipeline run (one abandoned for a fresh start); returns their ids.

    Waits until Ray reports them terminal: a new run's train stage that looked while one was
    still stopping would take it for the same training and re-attach to it.
    """
    client = job_client(address, headers)
    active = [j for j in client.list_jobs() if _meta(j).get(META_RUN) == pipeline_run_id and job_status(j) in ACTIVE]
    for job in active:
        client.stop_job(job.submission_id)
    deadline = time.monotonic() + wait_s
    for job in active:
        while job_status(client.get_job_info(job.submission_id)) not in TERMINAL and time.monotonic() < deadline:
            time.sleep(0.2)
    return [job.submission_id for job in active]


# --- helpers ------------------------------------------------------------------------------


def _meta(job) -> dict[str, str]:
    return job.metadata or {}


def _identity(job) -> dict[str, str]:
    return {
        k.removeprefix(META_IDENTITY_PREFIX): v for k, v in _meta(job).items() if k.startswith(META_IDENTITY_PREFIX)
    }


def _auth_refused(exc: Exception) -> bool:
    """A 401/403 from the job API: Ray >= 2.5x raises AuthenticationError, older clients a
    RuntimeError naming the status code."""
    return type(exc).__name__ == "AuthenticationError" or bool(_AUTH_REFUSED.search(str(exc)))


def _exit_code(info) -> int | None:
    """Ray >= 2.4x reports ``driver_exit_code``; older servers only say it in the message."""
    code = getattr(info, "driver_exit_code", None)
    if code is not None:
        return int(code)
    match = _EXIT_CODE.search(info.message or "")
    return int(match.group(1)) if match else None
