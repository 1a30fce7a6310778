"""The first task of a pipeline run: resolve the model, the cluster and the MLflow runs."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.runtime import deployment, flow_run

from envs.evalset import load as load_eval_set
from mazerl import paths
from mazerl.cluster.head.local import ensure_local_head
from mazerl.fingerprint import model_fingerprint
from mazerl.params import EvalParams, PipelineParams
from mazerl.paths import run_id_for
from mazerl.preflight.input_error import InputError
from mazerl.preflight.pipeline import check_pipeline_inputs
from mazerl.preflight.tracking_store import check_tracking_uri
from mazerl.reporting.eval_runs import start_eval_run
from mazerl.run_clock import RunClock, work_keys
from mazerl.starter.build import ensure_starter, starter_dir
from mazerl.tracking.lineage import start_pipeline_run
from mazerl.tracking.registry import model_version_dir
from mazerl.training.config import TrainConfig
from mazerl.training.recipes import PIPELINE_SET_TRAINING_FIELDS
from tasks.context import RunContext
from tasks.evaluation import eval_settings


def retry_unless_bad_input(task, task_run, state) -> bool:
    """Prefect retry condition: a bad input stays bad, anything else (a locked database, a slow head) may pass."""
    try:
        state.result()
    except InputError:
        return False
    except Exception:
        return True
    return False


@task(name="prepare", retries=1, retry_delay_seconds=5, retry_condition_fn=retry_unless_bad_input)
def prepare(params: PipelineParams) -> RunContext:
    """Build (or reuse) the starter if no base model is given, find or start Ray, open the MLflow runs."""
    logger = get_run_logger()
    started = time.time()
    flow_id = str(flow_run.id or "local")
    run_id = run_id_for(str(flow_run.name or "run"), flow_id)
    root = params.root()
    base_model = starter_dir(root) if params.base_model is None else Path(params.base_model).expanduser().resolve()
    # the run's training config, resolved once: the checks read it, every stage gets it from the context
    config = params.train_config(run_id, base_model)
    check_pipeline_inputs(params, config)  # before anything is built, started or written
    paths.make_data_root(root)
    if params.base_model is None:
        ensure_starter(root, log=logger.info)
    settings = eval_settings(params, params.resolved_eval_set(), config)
    keys = work_keys(
        eval_settings=asdict(settings),
        training=config.model_dump(mode="json"),
        base_model=base_model,
    )
    clock = RunClock(root, run_id, keys, config.steps, started)
    logger.info(clock.stage_line("prepare"))
    cluster_address(params.ray_address, logger.info)  # the stages look the embedded head up anew at each use
    runs = start_pipeline_run(
        params.resolved_tracking_uri(),
        params.experiment,
        run_name=run_id,
        params=resolved_params(params, config),
        flow_run_id=flow_id,
        deployment=deployment.name,
        tags={"mazerl.run_id": run_id, "mazerl.backend": params.backend},
    )
    logger.info(
        f"run {run_id}: MLflow parent run {runs.parent_run_id} in {params.experiment} "
        f"({'re-attached' if runs.reattached else 'new'}); data under {root / 'runs' / run_id}"
    )
    context = RunContext(
        run_id=run_id,
        flow_run_id=flow_id,
        root=root,
        tracking_uri=runs.tracking_uri,
        ray_address=params.ray_address,
        base_model=base_model,
        eval_set=params.resolved_eval_set(),
        stage_run_ids={},  # each stage opens (or, on a retry, finds) its own run when it starts
        pipeline_run_id=runs.parent_run_id,
        train_config=config,
        eval_settings=settings,
        jobs_on_stop=params.ray_jobs_on_stop,
        started_at=started,
        stage_keys=keys,
    )
    clock.record("prepare", time.time() - started)
    return context


def cluster_address(ray_address: str | None, log: Callable[[str], None]) -> str:
    """The cluster's dashboard address: the one given, else the embedded head's (started if none runs)."""
    if ray_address is not None:
        return ray_address
    head = ensure_local_head()
    log(f"embedded Ray head at {head.address} ({'started' if head.started_here else 'reused'})")
    return head.address


def resolved_params(params: PipelineParams, config: TrainConfig) -> dict[str, Any]:
    """What the run really uses, for the parent run's params: the resolved model, eval set, data
    root, tracking URI and recipe instead of their ``None`` defaults, and every field of the
    training config (``training.<field>``) with the user's overrides."""
    eval_set = load_eval_set(config.eval_set)
    base_model = config.base_model
    return params.model_dump(mode="json", exclude={"training", "recipe"}) | {
        "base_model": str(base_model),
        "base_model.fingerprint": model_fingerprint(base_model),
        "eval_set": eval_set.name,
        "eval_set.sha256": eval_set.digest,
        "data_root": str(params.root()),
        "tracking_uri": params.resolved_tracking_uri(),
        "training.recipe": params.training_recipe(),
        "training.overrides": json.dumps(params.training, sort_keys=True),
        "training": config.model_dump(mode="json", exclude=set(PIPELINE_SET_TRAINING_FIELDS)),  # logged at the top
    }


@task(name="prepare_eval", retries=1, retry_delay_seconds=5, retry_condition_fn=retry_unless_bad_input)
def prepare_eval(params: EvalParams) -> tuple[RunContext, Path]:
    """Resolve the model (a directory, or a registry version/alias), find or start Ray, open one MLflow run."""
    logger = get_run_logger()
    tracking_uri = params.resolved_tracking_uri()
    # seconds, not MLflow's minutes of retries; the embedded store's directory is the data root, made below
    check_tracking_uri(tracking_uri, params.experiment, embedded=params.tracking_uri is None)
    root = params.root()
    paths.make_data_root(root)
    if params.model_dir is not None:
        model_dir = Path(params.model_dir).expanduser().resolve()
    else:
        model_dir = Path(model_version_dir(tracking_uri, params.registered_model, params.version))
        logger.info(f"{params.registered_model} {params.version} -> {model_dir}")
    cluster_address(params.ray_address, logger.info)
    flow_id = str(flow_run.id or "local")
    run_id = run_id_for(str(flow_run.name or "eval"), flow_id)
    mlflow_run = start_eval_run(
        tracking_uri, params.experiment, flow_run_id=flow_id, model_dir=model_dir, params=params
    )
    context = RunContext(
        run_id=run_id,
        flow_run_id=flow_id,
        root=root,
        tracking_uri=tracking_uri,
        ray_address=params.ray_address,
        base_model=model_dir,
        eval_set=params.eval_set,
        stage_run_ids={"final_eval": mlflow_run},  # the eval logs into the run itself: there is no parent
        pipeline_run_id=mlflow_run,
        eval_settings=eval_settings(params, params.eval_set, None),
    )
    return context, model_dir
