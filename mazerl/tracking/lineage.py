"""MLflow lineage of a pipeline run: the run tree (the parent run, one child run per stage) and run states.

Every function takes the tracking URI and explicit run ids and talks to MLflow through
``MlflowClient``: MLflow's "active run" is thread-local, and Prefect runs tasks on worker
threads and Ray jobs in other processes, so nothing here relies on ``mlflow.start_run``.

Layout (what docs/mlflow.md shows in the UI)::

    experiment vlm-maze-grpo         tag mlflow.experimentKind = custom_model_development
      <run id>, e.g. ruddy-gerbil-8432ca63
                                     the parent: tags prefect.flow_run_id, prefect.deployment,
                                     mlflow.source.git.commit; the resolved params; headline metrics
        verify_cluster               child runs (tag mlflow.parentRunId = the parent), each created
        baseline_eval                when its stage starts, so its start time, end time and duration
        train                        are the stage's own (retries included); RUNNING, then
        merge_lora                   FINISHED or FAILED
        final_eval

A retry of a failed Prefect flow run calls :func:`start_pipeline_run` again with the same
flow-run id and gets the same parent back (``reattached=True``); its stages find their
runs by the ``mazerl.stage`` tag (:func:`stage_run_id`), so metrics and artifacts of the
retry land next to those of the first attempt.

The store itself is :mod:`mazerl.tracking.store`; what goes on the runs: params
(:mod:`~mazerl.tracking.params`), artifacts (:mod:`~mazerl.tracking.artifacts`), eval reports
(:mod:`~mazerl.tracking.evals`), the merged model (:mod:`~mazerl.tracking.mlflow_model`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import RunStatus, RunTag, ViewType
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

from mazerl.tracking.params import log_params, truncated
from mazerl.tracking.secrets import redact
from mazerl.tracking.store import DEFAULT_EXPERIMENT, client_for, default_artifact_location, ensure_experiment

PIPELINE_RUN_NAME = "pipeline"  # the parent's name when no run id is given (the flow names it by its run id)
STAGES = ("verify_cluster", "baseline_eval", "train", "merge_lora", "final_eval")

TAG_ROLE = "mazerl.role"  # "pipeline" or "stage"
TAG_STAGE = "mazerl.stage"
TAG_FLOW_RUN_ID = "prefect.flow_run_id"
TAG_DEPLOYMENT = "prefect.deployment"
TAG_GIT_COMMIT = "mlflow.source.git.commit"  # the key the MLflow UI shows as "Git commit"
TAG_GIT_DIRTY = "mazerl.git_dirty"
TAG_PARENT = "mlflow.parentRunId"
TAG_RUN_ID = "mazerl.run_id"  # the readable run id (the run directory's name), also the parent's name
# The runs table's sort key (store.RUNS_VIEW_STATE sorts by it, descending): a parent's is its start time
# and ".9", a stage run's its parent's start time and a rank that falls along the pipeline (".8" for
# verify_cluster ... ".4" for final_eval). The table then reads newest pipeline run first, each followed
# by its stages top-down in pipeline order. (MLflow nests child runs under their parent only when the
# table is sorted by start time, which lists them bottom-up: newest first.)
TAG_SORT_KEY = "mazerl.sort_key"
_TERMINAL = {"FINISHED", "FAILED", "KILLED"}
_STATUSES = {RunStatus.to_string(status) for status in RunStatus.all_status()}


@dataclass(frozen=True)
class PipelineRuns:
    """Ids of one pipeline run's MLflow runs; plain values, safe to pass between Prefect tasks.

    ``stage_run_ids`` holds the stage runs that existed when the pipeline run was opened (a
    re-attached flow run's finished stages); :meth:`run_id` finds or creates any stage's run.
    """

    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    stage_run_ids: dict[str, str] = field(default_factory=dict)
    reattached: bool = False

    def run_id(self, stage: str) -> str:
        """The stage's run, created now if it has none yet (a stage's run starts with the stage)."""
        return stage_run_id(self.tracking_uri, self.parent_run_id, stage)


def git_commit(repo_dir: str | os.PathLike | None = None) -> tuple[str | None, bool]:
    """(HEAD commit, working tree dirty) of the repository holding ``repo_dir``; (None, False) without git."""
    repo_dir = Path(repo_dir) if repo_dir else Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo_dir, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo_dir,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, False
    return commit or None, bool(status.strip())


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _find_pipeline_run(client: MlflowClient, experiment_id: str, flow_run_id: str) -> Any | None:
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{TAG_FLOW_RUN_ID}` = {_quote(flow_run_id)} AND tags.`{TAG_ROLE}` = 'pipeline'",
        run_view_type=ViewType.ACTIVE_ONLY,
        order_by=["attributes.start_time ASC"],
        max_results=10,
    )
    return runs[0] if runs else None


def _stage_runs(client: MlflowClient, experiment_id: str, parent_run_id: str) -> dict[str, str]:
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{TAG_PARENT}` = {_quote(parent_run_id)}",
        run_view_type=ViewType.ACTIVE_ONLY,
        order_by=["attributes.start_time ASC"],
        max_results=1000,
    )
    found: dict[str, str] = {}
    for run in runs:
        stage = run.data.tags.get(TAG_STAGE)
        if stage in STAGES and stage not in found:
            found[stage] = run.info.run_id
    return found


def stage_run_id(tracking_uri: str, parent_run_id: str, stage: str) -> str:
    """The id of the parent's child run for ``stage``, created now if it has none.

    Called when the stage starts, so a new run's start time is the stage's: MLflow cannot move
    a run's start time later, which is why stage runs are not created up front. A retried
    stage finds its first attempt's run, so its duration covers all attempts.
    """
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r} is not a pipeline stage; use one of {list(STAGES)}")
    client = client_for(tracking_uri)
    parent = client.get_run(parent_run_id)
    existing = _stage_runs(client, parent.info.experiment_id, parent_run_id)
    if stage in existing:
        return existing[stage]
    tags = {TAG_PARENT: parent_run_id, TAG_ROLE: "stage", TAG_STAGE: stage, TAG_SORT_KEY: stage_sort_key(parent, stage)}
    for key in (TAG_FLOW_RUN_ID, TAG_RUN_ID):
        if key in parent.data.tags:
            tags[key] = parent.data.tags[key]
    return client.create_run(parent.info.experiment_id, run_name=stage, tags=tags).info.run_id


def parent_sort_key(start_time_ms: int) -> str:
    return f"{start_time_ms:015d}.9"


def stage_sort_key(parent: Any, stage: str) -> str:
    """``<parent's start>.<8 - stage index>``: under a descending sort, after the parent, the first stage first."""
    return f"{parent.info.start_time:015d}.{8 - STAGES.index(stage)}"


def _tag_value(value: object) -> str:
    return truncated(str(value), MAX_TAG_VAL_LENGTH)


def start_pipeline_run(
    tracking_uri: str,
    experiment: str = DEFAULT_EXPERIMENT,
    run_name: str = PIPELINE_RUN_NAME,
    tags: Mapping[str, object] | None = None,
    params: Any = None,
    *,
    flow_run_id: str | None = None,
    deployment: str | None = None,
    artifact_location: str | None = None,
    repo_dir: str | os.PathLike | None = None,
) -> PipelineRuns:
    """Create (or re-attach to) the parent run; returns its id and those of the stage runs it has.

    With a ``flow_run_id`` that already has a pipeline run in ``experiment``, that run is
    reused (marked RUNNING again) with its stage runs. Stage runs are created by their stages
    (:func:`stage_run_id`). ``params`` (a pydantic model, dataclass or nested dict) are
    flattened, scrubbed of secrets and logged on the parent; ``tags`` are scrubbed and set on
    the parent. ``artifact_location`` applies only when the experiment is created here; by
    default it is ``<data root>/mlartifacts`` for a local store.
    """
    if not run_name or not str(run_name).strip():
        raise ValueError(f"run_name={run_name!r} must be a non-empty name for the parent run, e.g. 'pipeline'")
    if artifact_location is None:
        artifact_location = default_artifact_location(tracking_uri)
    client = client_for(tracking_uri)
    experiment_id = ensure_experiment(tracking_uri, experiment, artifact_location)
    commit, dirty = git_commit(repo_dir)
    run_tags = {
        TAG_ROLE: "pipeline",
        **({TAG_FLOW_RUN_ID: flow_run_id} if flow_run_id else {}),
        **({TAG_DEPLOYMENT: deployment} if deployment else {}),
        **({TAG_GIT_COMMIT: commit, TAG_GIT_DIRTY: str(dirty).lower()} if commit else {}),
        **redact({str(key): value for key, value in (tags or {}).items()}),
    }
    existing = _find_pipeline_run(client, experiment_id, flow_run_id) if flow_run_id else None
    if existing is not None:
        parent_id = existing.info.run_id
        client.update_run(parent_id, status="RUNNING")
        stage_ids = _stage_runs(client, experiment_id, parent_id)
    else:
        created = client.create_run(experiment_id, run_name=run_name, tags={TAG_ROLE: "pipeline"})
        parent_id = created.info.run_id
        run_tags[TAG_SORT_KEY] = parent_sort_key(created.info.start_time)
        stage_ids = {}
    client.log_batch(parent_id, tags=[RunTag(key, _tag_value(value)) for key, value in run_tags.items()])
    if params is not None:
        log_params(tracking_uri, parent_id, params)
    return PipelineRuns(
        tracking_uri=tracking_uri,
        experiment_id=experiment_id,
        parent_run_id=parent_id,
        stage_run_ids={stage: stage_ids[stage] for stage in STAGES if stage in stage_ids},
        reattached=existing is not None,
    )


def set_run_status(tracking_uri: str, run_id: str, status: str) -> None:
    """Mark a run RUNNING, FINISHED, FAILED, KILLED or SCHEDULED (terminal states set the end time)."""
    status = status.upper()
    if status not in _STATUSES:
        raise ValueError(f"status={status!r} is not an MLflow run status; use one of {sorted(_STATUSES)}")
    client = client_for(tracking_uri)
    if status in _TERMINAL:
        client.set_terminated(run_id, status=status)
    else:
        client.update_run(run_id, status=status)


def end_pipeline_run(tracking_uri: str, experiment: str, flow_run_id: str, status: str = "FAILED") -> list[str]:
    """End the flow run's parent run and its stage runs that are still RUNNING with ``status``.

    For a flow run that failed or crashed outside any stage (between stages, in a task that
    records results): no stage's ``stage_run`` was there to end the runs, which would otherwise
    stay RUNNING in the UI forever. Returns the names of the runs it ended. Creates nothing: a
    run refused before it opened a store leaves no ``mlflow.db`` behind.
    """
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).is_file():
        return []
    client = client_for(tracking_uri)
    experiment_entity = client.get_experiment_by_name(experiment)
    if experiment_entity is None:
        return []
    parent = _find_pipeline_run(client, experiment_entity.experiment_id, flow_run_id)
    if parent is None:
        return []
    ended = []
    for stage, run_id in _stage_runs(client, experiment_entity.experiment_id, parent.info.run_id).items():
        if client.get_run(run_id).info.status == "RUNNING":
            set_run_status(tracking_uri, run_id, status)
            ended.append(stage)
    if client.get_run(parent.info.run_id).info.status == "RUNNING":
        set_run_status(tracking_uri, parent.info.run_id, status)
        ended.append(parent.info.run_name)
    return ended


@contextlib.contextmanager
def fails_run(tracking_uri: str, run_id: str) -> Iterator[str]:
    """``with fails_run(uri, run_id):`` marks the run FAILED (ending it now) if the body raises."""
    try:
        yield run_id
    except BaseException:
        set_run_status(tracking_uri, run_id, "FAILED")
        raise


@contextlib.contextmanager
def stage_run(tracking_uri: str, run_id: str, *, finish: bool = True) -> Iterator[str]:
    """``with stage_run(uri, run_id):`` marks the run RUNNING, then FINISHED, or FAILED on an exception.

    The parent follows: a failing stage marks it FAILED too (its end time is then the failure's,
    so its duration stays true), and a stage that starts again (a retry) marks it RUNNING.
    ``finish=False`` leaves a run that succeeded RUNNING, for a stage whose end is logged by a
    later task (an eval's report).
    """
    parent_id = client_for(tracking_uri).get_run(run_id).data.tags.get(TAG_PARENT)
    set_run_status(tracking_uri, run_id, "RUNNING")
    if parent_id:
        set_run_status(tracking_uri, parent_id, "RUNNING")
    try:
        yield run_id
    except BaseException:
        set_run_status(tracking_uri, run_id, "FAILED")
        if parent_id:
            set_run_status(tracking_uri, parent_id, "FAILED")
        raise
    if finish:
        set_run_status(tracking_uri, run_id, "FINISHED")
