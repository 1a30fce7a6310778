"""Where the MLflow store is and how to reach it: the tracking URI, the experiment, the UI's addresses.

Every function takes the tracking URI explicitly and talks to MLflow through ``MlflowClient``
(see :mod:`mazerl.tracking.lineage` for why nothing relies on MLflow's active run).
Embedded default store: ``sqlite:///<root>/mlflow.db`` with artifacts in ``<root>/mlartifacts``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from mazerl import paths

DEFAULT_EXPERIMENT = "vlm-maze-grpo"
# MLflow's own experiment type: "custom_model_development" is its "model training" kind (runs,
# metrics, charts) as opposed to "genai_development" (traces). MLflow 3.1-3.4 open the experiment
# on the view its kind names; later UIs follow a per-browser switch instead (see experiment_url).
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# The parent run's headline metrics (tasks/promote.py logs them): success rates in percent and the gain
# in points (one decimal), the per-maze counts, the p-value, the share of mazes the solver finishes
# within the move budget. Short names, so the runs table's column headers show them whole, whose
# alphabetical order (the order MLflow shows metric columns in) reads as the story does.
HEADLINE_METRICS = (
    "baseline_pct",
    "final_pct",
    "gain_pts",
    "mazes_broken",
    "mazes_fixed",
    "mcnemar_p",
    "solvable_pct",
)
# MLflow 3's runs table shows no metric columns by default and keeps its column choice per browser;
# a "shared view" (an experiment tag the UI reads when the URL names it) can choose them.
RUNS_VIEW = "mazerl"
TAG_RUNS_VIEW = f"mlflow.sharedViewState.{RUNS_VIEW}"
RUNS_VIEW_STATE = {
    "selectedColumns": [f"metrics.`{name}`" for name in HEADLINE_METRICS],
    # newest pipeline run first, each followed by its stages top-down in pipeline order (lineage.TAG_SORT_KEY)
    "orderByKey": "tags.`mazerl.sort_key`",
    "orderByAsc": False,
}


def is_sagemaker_mlflow(tracking_uri: str) -> bool:
    """A SageMaker managed MLflow tracking server (``arn:aws:sagemaker:...``, served by the sagemaker-mlflow plugin)."""
    return tracking_uri.startswith("arn:")


def default_artifact_location(tracking_uri: str, root: str | os.PathLike | None = None) -> str | None:
    """Where a new experiment keeps its artifacts.

    ``<root>/mlartifacts`` when a root is given; for a SQLite store, ``mlartifacts`` next to
    the database file (the embedded layout); for another database, under the data root;
    for a tracking server, None (the server decides).
    """
    if tracking_uri.startswith(("http://", "https://", "databricks")) or is_sagemaker_mlflow(tracking_uri):
        return None  # a server: its own artifact store (SageMaker's is an S3 bucket)
    if root is not None:
        return paths.mlflow_artifacts_dir(Path(root).expanduser().resolve()).as_uri()
    if tracking_uri.startswith("sqlite:///"):
        database = Path(tracking_uri.removeprefix("sqlite:///")).expanduser().resolve()
        return paths.mlflow_artifacts_dir(database.parent).as_uri()
    return paths.mlflow_artifacts_dir(paths.data_root()).as_uri()


def client_for(tracking_uri: str) -> MlflowClient:
    """A client of the store; a SQLite database file is created first, private to its user
    (:func:`mazerl.paths.create_store_file`), where SQLite would make it readable by everyone."""
    if tracking_uri.startswith("sqlite:///"):
        database = Path(tracking_uri.removeprefix("sqlite:///"))
        database.parent.mkdir(parents=True, exist_ok=True)
        paths.create_store_file(database)
    if is_sagemaker_mlflow(tracking_uri) and mlflow.get_tracking_uri() != tracking_uri:
        # sagemaker-mlflow (0.5) signs every request and names the server from the process-wide tracking
        # URI, not the client's: a client for an ARN fails to sign while another URI is the global one
        mlflow.set_tracking_uri(tracking_uri)
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
    if tracking_uri.startswith("databricks") or is_sagemaker_mlflow(tracking_uri):
        return None  # SageMaker's UI: `aws sagemaker create-presigned-mlflow-tracking-server-url`
    return local_ui
