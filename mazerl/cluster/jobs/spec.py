"""What a mazerl Ray job is: its id and metadata, its entrypoint, its runtime env, and its statuses.

The submission id is deterministic (``mazerl-<pipeline run>-<stage>-a<attempt>``) and every job
carries the ``META_*`` metadata keys, so a re-run finds its own jobs; every job is started as
``exec python -m <module> --config <file>`` (:func:`module_entrypoint`); a job on a head on this
machine gets this checkout on its ``PYTHONPATH`` (:func:`runtime_env_for`). A :class:`JobSpec` is one
stage's job; :class:`RayJob` (:mod:`mazerl.cluster.jobs.submitter`) submits and follows it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from mazerl.cluster.client import parse_address
from mazerl.cluster.errors import ConfigError
from mazerl.cluster.head.loopback import is_loopback_host

META_RUN = "mazerl_pipeline_run"
META_STAGE = "mazerl_stage"
META_ATTEMPT = "mazerl_attempt"
META_IDENTITY_PREFIX = "mazerl_id_"  # identity keys, e.g. mazerl_id_config_digest, mazerl_id_data_root
IDENTITY_MATCH = ("config_digest", "data_root")  # what makes another run's job the same training
META_MEMORY = "mazerl_entrypoint_memory"  # the bytes of memory the job asked Ray for
META_CPUS = "mazerl_entrypoint_num_cpus"  # the CPUs the job's driver asked Ray for
ACTIVE = frozenset({"PENDING", "RUNNING"})
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
_ID_CHARS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class JobSpec:
    """What one stage's Ray job is: its command, whose attempt it is, and what it asks of the cluster.

    ``runtime_env`` "auto": this checkout on ``PYTHONPATH`` for a head on this machine, nothing for a
    remote cluster (its image has the project); ``env_vars`` are added to it. ``num_cpus`` go to the
    job's driver (and its ``OMP_NUM_THREADS``); ``memory`` (bytes) starts it on a node that has it.
    ``identity`` marks a training, so another pipeline run's job of the same training is re-attached to.
    """

    entrypoint: str
    pipeline_run_id: str
    attempt: int
    stage: str = "train"
    runtime_env: dict[str, Any] | None | Literal["auto"] = "auto"
    env_vars: dict[str, str] | None = None
    num_gpus: float | None = None
    num_cpus: float | None = None
    memory: int | None = None
    identity: dict[str, str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.entrypoint, str) or not self.entrypoint.strip():
            raise ConfigError(
                "entrypoint is empty: give the command the job runs, e.g. python -m <module> --config <file>"
            )
        submission_id_for(self.pipeline_run_id, self.attempt, self.stage)  # refuses a bad id part, naming it

    @property
    def submission_id(self) -> str:
        """The id of this attempt's first submission (a resubmission adds ``-r<k>``)."""
        return submission_id_for(self.pipeline_run_id, self.attempt, self.stage)


def submission_id_for(pipeline_run_id: str, attempt: int, stage: str = "train") -> str:
    """``mazerl-<pipeline run>-<stage>-a<attempt>``: the same inputs always give the same id."""
    if not isinstance(pipeline_run_id, str) or not _ID_CHARS.match(pipeline_run_id):
        raise ConfigError(
            f"pipeline_run_id ({pipeline_run_id!r}) must be 1-100 characters of letters, digits, '_', '.', '-' "
            "(e.g. the Prefect flow-run id)"
        )
    if not isinstance(stage, str) or not _ID_CHARS.match(stage):
        raise ConfigError(f"stage ({stage!r}) must be a short name of letters, digits, '_', '.', '-'")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise ConfigError(f"attempt ({attempt!r}) must be an integer >= 1 (the Prefect task's run count)")
    return f"mazerl-{pipeline_run_id}-{stage}-a{attempt}"


def module_entrypoint(module: str, config_path: str | Path, python: str = "python") -> str:
    """``exec python -m <module> --config <file>``: how every mazerl job is started.

    Ray runs an entrypoint through ``/bin/sh -c``; ``exec`` makes that shell *become* the
    module's process. Without it the shell stays as a wrapper: killed alone, it ends the job
    (FAILED, retried) while the trainer under it runs on as an orphan that Ray's stop no longer
    reaches, and the retry would start a second trainer on the same checkpoints.
    """
    if not isinstance(module, str) or not _MODULE.match(module):
        raise ConfigError(
            f"entrypoint_module ({module!r}) must be a dotted module name, e.g. mazerl.training.local_entry"
        )
    if not str(config_path).strip():
        raise ConfigError("config_path is empty: give the path of the training config file as the cluster sees it")
    return f"exec {python} -m {module} --config {shlex.quote(str(config_path))}"


def project_root() -> Path:
    """The directory that holds the ``mazerl`` and ``envs`` packages this process imports."""
    import mazerl

    return Path(mazerl.__file__).resolve().parent.parent


def local_runtime_env() -> dict[str, Any]:
    """Runtime env for the embedded local head: the job imports exactly the code the caller runs.

    ``PYTHONPATH`` to the project root rather than ``working_dir``: the head shares this
    machine's file system, so nothing is zipped or uploaded (a working_dir upload would also
    sweep up the data root and is capped at 100 MiB). A cluster image has the project
    installed and needs no runtime env for it.
    """
    return {"env_vars": {"PYTHONPATH": str(project_root())}}


def runtime_env_for(address: str) -> dict[str, Any] | None:
    """The ``"auto"`` runtime env: a head on this machine (localhost, 127.0.0.0/8, ::1) shares its files,
    so point PYTHONPATH at our code; a remote cluster runs its image's installed project."""
    parsed = parse_address(address)
    host = urlparse(parsed.value).hostname
    return local_runtime_env() if not parsed.is_sagemaker and is_loopback_host(host) else None


def merged_runtime_env(runtime_env: dict[str, Any] | None, env_vars: dict[str, str] | None) -> dict[str, Any] | None:
    """``runtime_env`` with ``env_vars`` added to its own (checked: a dict, and str to str)."""
    if runtime_env is not None and not isinstance(runtime_env, dict):
        raise ConfigError(f"runtime_env must be a dict (Ray's runtime_env), got {type(runtime_env).__name__}")
    merged = dict(runtime_env or {})
    if env_vars:
        for key, value in env_vars.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ConfigError(f"env_vars[{key!r}] must map str to str (got {type(value).__name__})")
        merged["env_vars"] = {**dict(merged.get("env_vars") or {}), **env_vars}
    return merged or None


def job_status(job) -> str:
    """A job's status as a plain string (Ray gives an enum or a string, by version)."""
    status = job.status
    return str(getattr(status, "value", status))


def submission_metadata(
    pipeline_run_id: str,
    stage: str,
    attempt: int,
    identity: dict[str, str] | None = None,
    entrypoint_memory: int | None = None,
    entrypoint_num_cpus: float | None = None,
) -> dict[str, str]:
    """The metadata a new job is submitted with: its run, stage and attempt, its identity, what its driver asked for.

    Ray's job listing (JobDetails) shows neither the memory nor the CPUs the driver asked for;
    operators and tests can read them here.
    """
    metadata = {META_RUN: pipeline_run_id, META_STAGE: stage, META_ATTEMPT: str(attempt)}
    metadata |= {META_IDENTITY_PREFIX + key: str(value) for key, value in (identity or {}).items()}
    if entrypoint_memory is not None:
        metadata[META_MEMORY] = str(int(entrypoint_memory))
    if entrypoint_num_cpus is not None:
        metadata[META_CPUS] = str(entrypoint_num_cpus)
    return metadata


def job_metadata(job) -> dict[str, str]:
    """A listed job's metadata (Ray gives None for a job submitted without any)."""
    return job.metadata or {}


def job_identity(job) -> dict[str, str]:
    """The identity keys of a job's metadata, without their prefix (``config_digest``, ``data_root``)."""
    return {
        k.removeprefix(META_IDENTITY_PREFIX): v
        for k, v in job_metadata(job).items()
        if k.startswith(META_IDENTITY_PREFIX)
    }
