"""MLflow lineage of a pipeline run: the parent run, one child run per stage, params, inputs, reports.

Every function takes the tracking URI and explicit run ids and talks to MLflow through
``MlflowClient``: MLflow's "active run" is thread-local, and Prefect runs tasks on worker
threads and Ray jobs in other processes, so nothing here relies on ``mlflow.start_run``.

Layout (design section 5)::

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

Embedded default store: ``sqlite:///<root>/mlflow.db`` with artifacts in ``<root>/mlartifacts``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import DatasetInput, InputTag, Param, RunStatus, RunTag, ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH

from mazerl import paths
from mazerl.tracking.secrets import SecretLeakError, find_secrets, redact, scrub_text

DEFAULT_EXPERIMENT = "vlm-maze-grpo"
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
TAG_EVAL_SET_SHA256 = "mazerl.eval_set.sha256"
# MLflow's own experiment type: "custom_model_development" is its "model training" kind (runs,
# metrics, charts) as opposed to "genai_development" (traces). MLflow 3.1-3.4 open the experiment
# on the view its kind names; later UIs follow a per-browser switch instead (see experiment_url).
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# The parent run's headline metrics (tasks/promote.py logs them), in the order the runs table shows them.
HEADLINE_METRICS = (
    "result/baseline_success",
    "result/final_success",
    "result/gain",
    "result/mcnemar_p",
    "result/budget_ceiling",
)
# MLflow 3's runs table shows no metric columns by default and keeps its column choice per browser;
# a "shared view" (an experiment tag the UI reads when the URL names it) can choose them.
RUNS_VIEW = "mazerl"
TAG_RUNS_VIEW = f"mlflow.sharedViewState.{RUNS_VIEW}"
RUNS_VIEW_STATE = {
    "selectedColumns": [f"metrics.`{name}`" for name in HEADLINE_METRICS],
    "orderByKey": "attributes.start_time",
    "orderByAsc": False,
}

# summary.json key -> MLflow metric name; other numeric summary keys are logged as eval/<key>.
EVAL_METRICS = {
    "success_rate": "eval/success_rate",
    "avg_moves": "eval/avg_moves",
    "parse_failure_rate": "eval/parse_failure_rate",
    "ci_low": "eval/success_ci95_low",  # the names EvalReport.metrics() uses
    "ci_high": "eval/success_ci95_high",
    "budget_ceiling": "eval/budget_ceiling",
    "n": "eval/n_mazes",
    "solved": "eval/solved",
}
REQUIRED_SUMMARY_KEYS = ("success_rate", "avg_moves", "parse_failure_rate")  # avg_moves may come from the rows
_TRUNCATED = "...[truncated]"
_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_./\- ]")
_TERMINAL = {"FINISHED", "FAILED", "KILLED"}
_STATUSES = {RunStatus.to_string(status) for status in RunStatus.all_status()}


class LineageError(RuntimeError):
    """The MLflow store holds something that contradicts the run being recorded."""


class EvalReportError(ValueError):
    """An eval output directory that is missing files or fields."""


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

    def job_env(self, stage: str) -> dict[str, str]:
        """Environment for a Ray job that logs into this stage's run (``mlflow`` reads these)."""
        return {"MLFLOW_TRACKING_URI": self.tracking_uri, "MLFLOW_RUN_ID": self.run_id(stage)}


# --------------------------------------------------------------------------------------
# Store, experiment, runs
# --------------------------------------------------------------------------------------


def default_tracking_uri(root: str | os.PathLike | None = None) -> str:
    """``sqlite:///<root>/mlflow.db`` for the data root (``$MAZERL_HOME`` or ``./.mazerl``)."""
    return paths.mlflow_db_uri(paths.data_root(root))


def default_artifact_location(tracking_uri: str, root: str | os.PathLike | None = None) -> str | None:
    """Where a new experiment keeps its artifacts.

    ``<root>/mlartifacts`` when a root is given; for a SQLite store, ``mlartifacts`` next to
    the database file (the embedded layout); for another database, under the data root;
    for a tracking server, None (the server decides).
    """
    if tracking_uri.startswith(("http://", "https://", "databricks")):
        return None
    if root is not None:
        return paths.mlflow_artifacts_dir(Path(root).expanduser().resolve()).as_uri()
    if tracking_uri.startswith("sqlite:///"):
        database = Path(tracking_uri.removeprefix("sqlite:///")).expanduser().resolve()
        return paths.mlflow_artifacts_dir(database.parent).as_uri()
    return paths.mlflow_artifacts_dir(paths.data_root()).as_uri()


def client_for(tracking_uri: str) -> MlflowClient:
    if tracking_uri.startswith("sqlite:///"):
        Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def ensure_experiment(tracking_uri: str, name: str = DEFAULT_EXPERIMENT, artifact_location: str | None = None) -> str:
    """The id of experiment ``name``, created (with ``artifact_location``) or restored if needed.

    A new or untyped experiment is tagged as MLflow's model-training kind (``mlflow.experimentKind``);
    a kind someone chose in the UI is kept.
    """
    client = client_for(tracking_uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(
                name,
                artifact_location=artifact_location,
                tags={TAG_EXPERIMENT_KIND: EXPERIMENT_KIND, TAG_RUNS_VIEW: json.dumps(RUNS_VIEW_STATE)},
            )
        except MlflowException:  # created by a concurrent caller in between
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage == "deleted":
        client.restore_experiment(experiment.experiment_id)
    if TAG_EXPERIMENT_KIND not in experiment.tags:
        client.set_experiment_tag(experiment.experiment_id, TAG_EXPERIMENT_KIND, EXPERIMENT_KIND)
    view = json.dumps(RUNS_VIEW_STATE)
    if experiment.tags.get(TAG_RUNS_VIEW) != view:
        client.set_experiment_tag(experiment.experiment_id, TAG_RUNS_VIEW, view)
    return experiment.experiment_id


def experiment_url(ui_url: str, experiment_id: str, run_id: str | None = None) -> str:
    """The MLflow UI's address of an experiment's runs table (with the headline metric columns), or of
    one run's page.

    ``workflowType=machine_learning`` opens MLflow 3's "model training" side of the UI: from
    MLflow 3.5 on, the UI picks GenAI or model training per browser (default GenAI, whose
    experiment overview shows only trace panels) and ignores the experiment's kind tag; the
    URL parameter overrides that choice, and older UIs ignore it. ``viewStateShareKey`` names
    the experiment's shared view (:data:`RUNS_VIEW_STATE`).
    """
    base = f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}"
    if run_id:
        return f"{base}/runs/{run_id}?workflowType=machine_learning"
    return f"{base}/runs?viewStateShareKey={RUNS_VIEW}&workflowType=machine_learning"


def ui_url(tracking_uri: str, local_ui: str = "http://127.0.0.1:5000") -> str | None:
    """Where a browser finds the UI of this store: the server itself, or ``local_ui`` for a local store
    (once ``mlflow ui`` serves it there); None where the UI lives elsewhere (Databricks)."""
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    if tracking_uri.startswith("databricks"):
        return None
    return local_ui


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
    tags = {TAG_PARENT: parent_run_id, TAG_ROLE: "stage", TAG_STAGE: stage}
    for key in (TAG_FLOW_RUN_ID, TAG_RUN_ID):
        if key in parent.data.tags:
            tags[key] = parent.data.tags[key]
    return client.create_run(parent.info.experiment_id, run_name=stage, tags=tags).info.run_id


def _tag_value(value: object) -> str:
    text = str(value)
    return text if len(text) <= MAX_TAG_VAL_LENGTH else text[: MAX_TAG_VAL_LENGTH - len(_TRUNCATED)] + _TRUNCATED


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
        parent_id = client.create_run(experiment_id, run_name=run_name, tags={TAG_ROLE: "pipeline"}).info.run_id
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


# --------------------------------------------------------------------------------------
# Params
# --------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Pydantic models and dataclasses -> dicts; everything else unchanged."""
    if hasattr(value, "model_dump") and callable(value.model_dump):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _param_key(key: str) -> str:
    key = _BAD_NAME_CHARS.sub("_", key)
    return key[:MAX_ENTITY_KEY_LENGTH]


def _param_value(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool) or value is None or isinstance(value, int | float):
        text = str(value)
    elif isinstance(value, os.PathLike):
        text = os.fspath(value)
    else:
        text = json.dumps(value, default=str, sort_keys=True)
    if len(text) > MAX_PARAM_VAL_LENGTH:
        text = text[: MAX_PARAM_VAL_LENGTH - len(_TRUNCATED)] + _TRUNCATED
    return text


def flatten_params(values: Any, prefix: str = "") -> dict[str, str]:
    """Nested pydantic models, dataclasses and dicts -> ``{"a.b.c": "value"}`` within MLflow's limits.

    Lists of plain values stay one JSON-valued param; lists holding dicts are expanded by
    index (``a.0.b``). Keys keep letters, digits and ``_ . / - space`` (others become ``_``);
    values longer than MLflow's 6000 characters end in ``...[truncated]``. Not yet redacted:
    :func:`log_params` does that.
    """
    values = _plain(values)
    out: dict[str, str] = {}
    if isinstance(values, Mapping):
        items = values.items()
    elif isinstance(values, list | tuple) and any(isinstance(_plain(v), Mapping) for v in values):
        items = enumerate(values)
    else:
        if not prefix:
            raise TypeError(f"params must be a mapping, pydantic model or dataclass, not {type(values).__name__}")
        return {_param_key(prefix): _param_value(values)}
    for key, value in items:
        name = f"{prefix}.{key}" if prefix else str(key)
        value = _plain(value)
        if isinstance(value, Mapping) and value:
            out |= flatten_params(value, name)
        elif isinstance(value, list | tuple) and any(isinstance(_plain(v), Mapping) for v in value):
            out |= flatten_params(list(value), name)
        else:
            out[_param_key(name)] = _param_value(value)
    return out


def log_params(tracking_uri: str, run_id: str, params: Any, prefix: str = "") -> dict[str, str]:
    """Flatten, redact and log ``params`` on a run; returns what was logged.

    Params that the run already holds with the same value are skipped (a retried task
    logs the same config again); a different value is a :class:`LineageError`, because a
    run whose config changed half-way cannot be compared with anything.
    """
    flat = redact(flatten_params(params, prefix))
    client = client_for(tracking_uri)
    existing = client.get_run(run_id).data.params
    conflicts = {
        key: (existing[key], value) for key, value in flat.items() if key in existing and existing[key] != value
    }
    if conflicts:
        listed = "; ".join(f"{key}: logged {old!r}, now {new!r}" for key, (old, new) in list(conflicts.items())[:5])
        raise LineageError(
            f"run {run_id} already holds different values for {len(conflicts)} param(s) ({listed}); "
            "a retry must use the parameters of the first attempt, or start a new flow run"
        )
    new = [Param(key, value) for key, value in flat.items() if key not in existing]
    for start in range(0, len(new), 100):  # MLflow's per-request param limit
        client.log_batch(run_id, params=new[start : start + 100])
    return flat


# --------------------------------------------------------------------------------------
# Artifacts (scrubbed)
# --------------------------------------------------------------------------------------


def log_text_artifact(tracking_uri: str, run_id: str, path: str | os.PathLike, artifact_path: str | None = None) -> str:
    """Log one text file with secrets scrubbed from its content; returns the artifact's relative path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path={str(path)!r} does not exist; nothing to log")
    text = scrub_text(path.read_text(errors="replace"))
    with tempfile.TemporaryDirectory(prefix="mazerl-artifact-") as staging:
        staged = Path(staging) / path.name
        staged.write_text(text)
        client_for(tracking_uri).log_artifact(run_id, str(staged), artifact_path)
    return f"{artifact_path}/{path.name}" if artifact_path else path.name


def log_dir_artifacts(
    tracking_uri: str, run_id: str, local_dir: str | os.PathLike, artifact_path: str | None = None
) -> None:
    """Log a directory as is, after checking that none of its text files holds a credential."""
    check_no_secrets(local_dir)
    client_for(tracking_uri).log_artifacts(run_id, str(local_dir), artifact_path)


def check_no_secrets(local_dir: str | os.PathLike) -> None:
    """Raise SecretLeakError if a file under ``local_dir`` holds a credential (nothing is logged then)."""
    local_dir = Path(local_dir)
    leaks = find_secrets(p for p in local_dir.rglob("*") if p.is_file())
    if leaks:
        raise SecretLeakError(
            f"refusing to log {local_dir} to MLflow: {'; '.join(leaks[:5])}; remove the credential from the files"
        )


def log_config_file(tracking_uri: str, run_id: str, path: str | os.PathLike, artifact_path: str = "config") -> str:
    """Log the resolved training config file (secrets scrubbed) under ``config/``."""
    return log_text_artifact(tracking_uri, run_id, path, artifact_path)


def artifact_uri(tracking_uri: str, run_id: str, artifact_path: str) -> str:
    """The absolute URI of an artifact of a run (what the model registry wants as a version's source)."""
    base = client_for(tracking_uri).get_run(run_id).info.artifact_uri.rstrip("/")
    return f"{base}/{artifact_path.strip('/')}"


# --------------------------------------------------------------------------------------
# Eval set and eval reports
# --------------------------------------------------------------------------------------


def _load_eval_set(eval_set: str | os.PathLike) -> tuple[Any, Path]:
    from envs import evalset

    candidate = Path(eval_set)
    if candidate.suffix == ".json" and candidate.is_file():
        return evalset.load_file(candidate), candidate.resolve()
    loaded = evalset.load(str(eval_set))
    return loaded, evalset.path_for(loaded.name).resolve()


def log_eval_set(tracking_uri: str, run_id: str, eval_set: str | os.PathLike, context: str = "eval") -> str:
    """Log an eval set (name or JSON file; its digest is checked on load) as an MLflow dataset input.

    The dataset's digest field holds the first 36 hex digits of our SHA-256 (MLflow's
    limit); the whole digest is the input tag ``mazerl.sha256`` and the run tag
    ``mazerl.eval_set.sha256``. Returns the full digest.
    """
    import mlflow.data
    import pandas as pd

    from envs.maze import optimal_moves

    loaded, source_path = _load_eval_set(eval_set)
    frame = pd.DataFrame(
        {
            "index": list(range(len(loaded))),
            "seed": [int(seed) for seed in loaded.seeds],
            "size": [layout.size for layout in loaded.layouts],
            "optimal_moves": [optimal_moves(layout) for layout in loaded.layouts],
            "layout": [layout.to_text() for layout in loaded.layouts],
        }
    )
    with warnings.catch_warnings():  # MLflow's hints about integer columns and ambiguous local sources
        warnings.simplefilter("ignore", UserWarning)
        dataset = mlflow.data.from_pandas(frame, source=str(source_path), name=loaded.name, digest=loaded.digest[:36])
        entity = dataset._to_mlflow_entity()
    client = client_for(tracking_uri)
    client.log_inputs(
        run_id,
        datasets=[
            DatasetInput(
                entity,
                tags=[InputTag("mlflow.data.context", context), InputTag("mazerl.sha256", loaded.digest)],
            )
        ],
    )
    client.set_tag(run_id, TAG_EVAL_SET_SHA256, loaded.digest)
    return loaded.digest


def read_eval_report(eval_dir: str | os.PathLike) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(summary, per-maze rows) of an eval output directory (``summary.json`` + ``results.jsonl``)."""
    eval_dir = Path(eval_dir)
    summary_path, results_path = eval_dir / "summary.json", eval_dir / "results.jsonl"
    for path in (summary_path, results_path):
        if not path.is_file():
            raise EvalReportError(
                f"eval_dir={str(eval_dir)!r} has no {path.name}; pass the directory the eval stage wrote "
                "(it holds summary.json and results.jsonl)"
            )
    try:
        summary = json.loads(summary_path.read_text())
        rows = [json.loads(line) for line in results_path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise EvalReportError(f"eval_dir={str(eval_dir)!r}: unreadable JSON ({exc}); rerun the eval stage") from exc
    if not isinstance(summary, dict):
        raise EvalReportError(f"{summary_path} holds {type(summary).__name__}, not a JSON object; rerun the eval stage")
    return summary, rows


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def _metric_name(key: str, prefix: str) -> str:
    return EVAL_METRICS.get(key, f"eval/{key}").replace("eval/", f"{prefix}/", 1)


def eval_metrics(
    summary: Mapping[str, Any], rows: list[dict[str, Any]] | None = None, prefix: str = "eval"
) -> dict[str, float]:
    """The numbers of an eval summary under their MLflow names (``eval/success_rate``, ...).

    Accepts the confidence interval as ``success_ci95: [low, high]`` or ``ci_low``/``ci_high``
    and derives ``avg_moves`` (mean moves per maze) from the rows when the summary lacks it.
    Fields that are None (e.g. mean moves of solved episodes when none was solved) are skipped.
    """
    values: dict[str, float] = {}
    for key, value in summary.items():
        if _number(value):
            values[key] = float(value)
        elif key in ("success_ci95", "success_ci") and isinstance(value, list | tuple) and len(value) == 2:
            low, high = value
            if _number(low) and _number(high):
                values["ci_low"], values["ci_high"] = float(low), float(high)
    if "avg_moves" not in values and rows and all(_number(row.get("moves")) for row in rows):
        values["avg_moves"] = sum(row["moves"] for row in rows) / len(rows)
    missing = [key for key in REQUIRED_SUMMARY_KEYS if key not in values]
    if missing:
        raise EvalReportError(
            f"the eval summary lacks {', '.join(missing)} (has {sorted(summary)}); rerun the eval stage"
        )
    return {_metric_name(_BAD_NAME_CHARS.sub("_", key), prefix): value for key, value in values.items()}


def _table_rows(rows: list[dict[str, Any]]) -> dict[str, list]:
    """Column-wise table for ``log_table``; nested values become JSON text so every cell is a scalar."""
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    table: dict[str, list] = {column: [] for column in columns}
    for row in rows:
        for column in columns:
            value = row.get(column)
            table[column].append(
                value if value is None or isinstance(value, str | int | float | bool) else json.dumps(value)
            )
    return table


def log_eval_report(
    tracking_uri: str,
    run_id: str,
    eval_dir: str | os.PathLike,
    *,
    step: int = 0,
    prefix: str = "eval",
    log_gifs: bool = True,
) -> dict[str, float]:
    """Log an eval output directory on a run; returns the metrics logged.

    Metrics: ``eval/success_rate``, ``eval/avg_moves``, ``eval/parse_failure_rate``,
    ``eval/success_ci95_low``/``_high``, ``eval/budget_ceiling``, ``eval/n_mazes`` (and any
    other numeric summary field as ``eval/<key>``) at ``step``. Artifacts: the per-maze
    table ``eval/results.json`` (``log_table``, shown in the MLflow UI's evaluation view),
    ``eval/summary.json`` and ``eval/results.jsonl`` (scrubbed), and the episode GIFs under
    ``eval/gifs/``.
    """
    from mlflow.entities import Metric

    summary, rows = read_eval_report(eval_dir)
    eval_dir = Path(eval_dir)
    metrics = eval_metrics(summary, rows, prefix)
    now_ms = int(time.time() * 1000)
    client = client_for(tracking_uri)
    client.log_batch(run_id, metrics=[Metric(key, value, now_ms, step) for key, value in metrics.items()])
    if rows:
        client.log_table(run_id, data=_table_rows(rows), artifact_file=f"{prefix}/results.json")
    for name in ("summary.json", "results.jsonl"):
        log_text_artifact(tracking_uri, run_id, eval_dir / name, prefix)
    if log_gifs:
        gifs = sorted(eval_dir.rglob("*.gif"))
        for gif in gifs:
            relative = gif.parent.relative_to(eval_dir).as_posix().removeprefix(".").removeprefix("gifs").strip("/")
            folder = f"{prefix}/gifs/{relative}" if relative else f"{prefix}/gifs"
            client.log_artifact(run_id, str(gif), folder)
    return metrics


# --------------------------------------------------------------------------------------
# The merged model
# --------------------------------------------------------------------------------------

MERGED_MODEL_ARTIFACT = "merged_model"  # an MLflow transformers model (mazerl.tracking.mlflow_model)


@dataclass(frozen=True)
class LoggedModel:
    """Where the merged model went: ``source`` is the artifact URI to register as a model version."""

    source: str
    uploaded: bool  # False: the MLflow model names ``local_path`` for its weights instead of holding them
    local_path: str
    size_mb: float


def log_merged_model(
    tracking_uri: str,
    run_id: str,
    merged_dir: str | os.PathLike,
    mlflow_model_dir: str | os.PathLike,
) -> LoggedModel:
    """Upload the MLflow transformers model the merge job wrote (``mlflow_model_dir``) as ``merged_model/``.

    Nothing is loaded here: the merge job saved the model beside the weights
    (:func:`mazerl.tracking.mlflow_model.write_mlflow_model`). A model that only points at its
    weights (above ``max_artifact_mb``) also tags the run with ``mazerl.merged_model_path``.
    The merge record's proofs are logged as ``merge/*`` metrics.
    """
    from mlflow.entities import Metric

    from mazerl.tracking.mlflow_model import holds_weights

    merged_dir, model_path = Path(merged_dir).resolve(), Path(mlflow_model_dir)
    if not (merged_dir / "config.json").is_file():
        raise FileNotFoundError(f"merged_dir={str(merged_dir)!r} is not a model directory (no config.json)")
    if not (model_path / "MLmodel").is_file():
        raise FileNotFoundError(f"{model_path} holds no MLflow model (no MLmodel); the merge job writes it")
    check_no_secrets(merged_dir)
    client = client_for(tracking_uri)
    record_path = merged_dir / "merge_record.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    numeric = {
        f"merge/{key}": float(value)
        for key, value in record.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and key != "checkpoint_step"
    }
    now_ms = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(key, value, now_ms, 0) for key, value in numeric.items()])
    uploaded = holds_weights(model_path)
    client.log_artifacts(run_id, str(model_path), MERGED_MODEL_ARTIFACT)
    if not uploaded:
        client.set_tag(run_id, "mazerl.merged_model_path", str(merged_dir))
    return LoggedModel(
        artifact_uri(tracking_uri, run_id, MERGED_MODEL_ARTIFACT),
        uploaded,
        str(merged_dir),
        paths.dir_size_mb(merged_dir),
    )
