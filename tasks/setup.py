"""The first task of a pipeline run: resolve the model, the cluster and the MLflow runs."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.runtime import deployment, flow_run

from mazerl.cluster.ray_local import ensure_local_head
from mazerl.params import PipelineParams
from mazerl.policy.starter import ensure_starter
from mazerl.tracking.lineage import start_pipeline_run
from tasks.context import RunContext


def run_id_for(flow_run_name: str, flow_run_id: str) -> str:
    """A readable, stable run directory name: the same for every retry of one flow run."""
    return f"{flow_run_name}-{flow_run_id[:8]}"


@task(name="prepare", retries=1, retry_delay_seconds=5)
def prepare(params: PipelineParams) -> RunContext:
    """Build (or reuse) the starter if no base model is given, find or start Ray, open the MLflow runs."""
    logger = get_run_logger()
    root = params.root()
    root.mkdir(parents=True, exist_ok=True)
    if params.base_model is None:
        base_model = ensure_starter(root, log=logger.info)
    else:
        base_model = Path(params.base_model).expanduser().resolve()
    address = params.ray_address
    if address is None:
        head = ensure_local_head()
        address = head.address
        logger.info(f"embedded Ray head at {address} ({'started' if head.started_here else 'reused'})")
    flow_id = str(flow_run.id or "local")
    run_id = run_id_for(str(flow_run.name or "run"), flow_id)
    runs = start_pipeline_run(
        params.resolved_tracking_uri(),
        params.experiment,
        params=params,
        flow_run_id=flow_id,
        deployment=deployment.name,
        tags={"mazerl.run_id": run_id, "mazerl.backend": params.backend},
    )
    logger.info(
        f"run {run_id}: MLflow parent run {runs.parent_run_id} in {params.experiment} "
        f"({'re-attached' if runs.reattached else 'new'}); data under {root / 'runs' / run_id}"
    )
    return RunContext(
        run_id=run_id,
        flow_run_id=flow_id,
        root=root,
        tracking_uri=runs.tracking_uri,
        ray_address=address,
        base_model=base_model,
        eval_set=params.resolved_eval_set(),
        stage_run_ids=dict(runs.stage_run_ids),
        pipeline_run_id=runs.parent_run_id,
    )
