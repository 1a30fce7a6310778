"""verify_cluster: fail fast, in seconds, before any GPU hour is spent."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from mazerl.cluster.checks.fixes import CLUSTER_FIXES
from mazerl.cluster.checks.gpu_smoke import smoke_for
from mazerl.cluster.checks.run_requirements import requirements_for
from mazerl.cluster.checks.verify import ReadinessRequest
from mazerl.cluster.checks.verify import verify_cluster as check_readiness
from mazerl.cluster.client import ray_headers
from mazerl.merge.memory import merge_memory
from mazerl.params import PipelineParams
from mazerl.tracking.lineage import stage_run
from mazerl.tracking.store import client_for
from tasks.context import RunContext
from tasks.stages import timed_stage


@task(name="verify_cluster", retries=1, retry_delay_seconds=10)
def verify_cluster(context: RunContext, params: PipelineParams) -> dict:
    """Run the readiness checks; publish them as a Prefect table and an MLflow table; raise if not ready."""
    logger = get_run_logger()
    config = context.training()
    run_id = context.stage_run_id("verify_cluster")
    address = context.cluster_address()
    with timed_stage(context, "verify_cluster"), stage_run(context.tracking_uri, run_id):
        request = ReadinessRequest(
            data_root=str(context.root),
            base_model=str(context.base_model),
            eval_set=context.eval_set,
            hyperpod_cluster=params.hyperpod_cluster,
            eval_workers=params.eval_workers,
            eval_gpus_per_worker=params.resolved_eval_gpus(),
            merge_memory=merge_memory,  # the merge's need, for the weights the probe finds on the cluster
            gpu_smoke=smoke_for(
                backend=config.backend,
                local_gpus=params.local_train_gpus,
                eval_engine=params.eval_engine,
                eval_gpus=params.resolved_eval_gpus(),
                base_model=str(context.base_model),
                lora_rank=config.lora.rank,
                lora_targets=tuple(config.lora.target_modules),
            )
            if params.gpu_smoke
            else None,
            **requirements_for(
                config,
                local_gpus=params.local_train_gpus,
                max_artifact_mb=params.max_artifact_mb,
                mlflow_store_in_data_root=params.tracking_uri is None,  # the embedded store copies the model too
            ),
        )
        report = check_readiness(address, request, headers=ray_headers(address), log=logger.info)
        records = report.records()
        create_table_artifact(records, key="verify-cluster", description=f"Readiness of {report.address}")
        client_for(context.tracking_uri).log_table(
            run_id, data={k: [r[k] for r in records] for k in records[0]}, artifact_file="verify_cluster.json"
        )
        for row in report.warnings:
            logger.warning(f"advisory check not passed: {row.name}: {row.found}")
        for row in report.failures:
            logger.error(f"check failed: {row.name}: expected {row.expected}, found {row.found}")
        report.raise_for_failures(CLUSTER_FIXES)
    return {"address": report.address, "checks": len(records), "seconds": report.seconds}
