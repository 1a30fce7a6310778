"""Shared test settings: keep torch and BLAS to the two cores CI has."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


# --------------------------------------------------------------------------------------
# Shared model fixture (policy runtime). Any suite may request it.
# --------------------------------------------------------------------------------------
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def starter_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A reduced starter build (same architecture, tokenizer, processor and chat template as the
    full one; a few warm-start steps, so it answers in the action format but rarely solves a maze).

    Built once per test session (about 20-40 s on 2 cores) under ``<tmp>/starter-root`` through
    ``mazerl.policy.starter.ensure_starter`` and returned as the model directory (a ``Path``);
    treat it as read-only.
    """
    from mazerl.policy.starter import StarterConfig, ensure_starter

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

    Its tracking URI is ``mazerl.tracking.lineage.default_tracking_uri(root)``.
    """
    import shutil

    root = tmp_path / "mazerl-home"
    root.mkdir()
    shutil.copy(_mlflow_template_db, root / "mlflow.db")
    return root
