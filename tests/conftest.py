"""Shared test settings: keep torch and BLAS to the two cores CI has."""

import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_report_header(config) -> str:
    """The library stack under test (`make test-image-stack` runs the cluster image's)."""
    import importlib.metadata

    names = ("torch", "ray", "transformers", "peft")
    return "stack: " + ", ".join(f"{name} {importlib.metadata.version(name)}" for name in names)


# --------------------------------------------------------------------------------------
# Shared model fixture (policy runtime). Any suite may request it.
# --------------------------------------------------------------------------------------
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def starter_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A reduced starter build (same architecture, tokenizer, processor and chat template as the
    full one; a few warm-start steps, so it answers in the action format but rarely solves a maze).

    Built once per test session (about 20-40 s on 2 cores) under ``<tmp>/starter-root`` through
    ``mazerl.starter.build.ensure_starter`` and returned as the model directory (a ``Path``);
    treat it as read-only.
    """
    from mazerl.starter.build import ensure_starter
    from mazerl.starter.config import StarterConfig

    root = tmp_path_factory.mktemp("starter-root")
    return ensure_starter(root, StarterConfig.reduced_build(), log=lambda _: None)


# --------------------------------------------------------------------------------------
# MLflow store fixture (tracking). Creating a SQLite store runs MLflow's migrations
# (about 5 s on 2 cores); a migrated template is copied per test instead (milliseconds).
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def _mlflow_template_db(tmp_path_factory: pytest.TempPathFactory):
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()  # creates and migrates the schema
    return path


@pytest.fixture
def mlflow_root(tmp_path, _mlflow_template_db):
    """A fresh data root whose ``mlflow.db`` is an empty, migrated MLflow store (``<root>/mlartifacts`` not yet made).

    Its tracking URI is ``mazerl.tracking.paths.mlflow_db_uri(root)``.
    """
    import shutil

    root = tmp_path / "mazerl-home"
    root.mkdir()
    shutil.copy(_mlflow_template_db, root / "mlflow.db")
    return root


# --------------------------------------------------------------------------------------
# Embedded local Ray head (cluster). One per test session, started on first use and
# stopped at the end; any suite may request it.
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def local_ray_head():
    """One real local Ray head for the whole session (``mazerl.cluster.head.local``): about 10 s
    to start on 2 cores, stopped (all its processes) when the session ends.

    Dashboard and job server on 127.0.0.1 (a free port), every Ray process bound to loopback,
    token authentication on, 2 CPUs, 150 MB object store, a short temp dir under /tmp, Ray
    metrics exported every 2 s. Use it through the job API::

        client = JobSubmissionClient(local_ray_head.address, headers=local_ray_head.auth_headers())
        with RayJob(local_ray_head.address, entrypoint, ..., headers=local_ray_head.auth_headers()) as job:
            job.wait()

    Jobs run this checkout's code when given ``runtime_env=mazerl.cluster.jobs.spec.local_runtime_env()``
    (the submitter's ``runtime_env="auto"`` does that for 127.0.0.1). A subprocess that wants
    to be a Ray driver on it needs ``local_ray_head.client_env()`` in its environment. Do not
    stop it in a test; start your own head (``start_local_head``) for destructive tests.
    """
    import shutil
    import tempfile

    from mazerl.cluster.head.local import start_local_head

    temp = tempfile.mkdtemp(prefix="mzr-t", dir="/tmp" if os.path.isdir("/tmp") else None)
    head = start_local_head(
        temp, num_cpus=2, object_store_mb=150, dashboard_port=0, extra_env={"RAY_metrics_report_interval_ms": "2000"}
    )
    yield head
    head.stop()
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="session")
def local_ray_address(local_ray_head) -> str:
    """The session's local Ray job-server address, ``http://127.0.0.1:<port>``; send
    ``local_ray_head.auth_headers()`` with every request (token auth is on)."""
    return local_ray_head.address


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory: pytest.TempPathFactory):
    """Prefect's own test harness for one module: a temporary API server on 127.0.0.1 and a fresh
    database that subprocesses can share, results persisted to a throw-away folder.

    Yields ``{"url": API URL, "storage": result folder (Path), "database": SQLite file (Path)}``;
    the environment is restored afterwards.
    """
    from prefect.settings import PREFECT_API_URL, get_current_settings
    from prefect.testing.utilities import prefect_test_harness

    storage = tmp_path_factory.mktemp("prefect-storage")
    keys = ("PREFECT_LOCAL_STORAGE_PATH", "PREFECT_RESULTS_PERSIST_BY_DEFAULT")
    saved = {key: os.environ.get(key) for key in keys}
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(storage)
    os.environ["PREFECT_RESULTS_PERSIST_BY_DEFAULT"] = "true"
    with prefect_test_harness(server_startup_timeout=120):
        url = get_current_settings().server.database.connection_url.get_secret_value()
        yield {"url": PREFECT_API_URL.value(), "storage": storage, "database": Path(url.split(":///", 1)[1])}
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def no_aws_identity(monkeypatch, tmp_path):
    """This process as a pod without an IAM identity: no keys, profile, Pod Identity agent, web
    identity or instance role that boto3's credential chain could find (and no network tried)."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
