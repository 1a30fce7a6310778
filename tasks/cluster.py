"""verify_cluster: fail fast, in seconds, before any GPU hour is spent."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from mazerl.cluster.verify import requirements_for, verify_cluster
from mazerl.params import PipelineParams
from mazerl.tracking.lineage import stage_run
from mazerl.tracking.store import client_for
from tasks.context import RunContext, ray_headers

# What a user changes when a check fails: the pipeline parameter behind each requirement.
CLUSTER_FIXES = {
    "ray.address": "set ray_address to the head's dashboard (http://<head>:8265), or leave it empty to start a "
    "local head, and check that the head is running",
    "ray.probe_job": "make mazerl importable on the cluster (the image, or PYTHONPATH) and check the job's log",
    "ray.version": "use the same Ray major version (>= 2.52) on the cluster as here",
    "ray.nodes": "start the missing nodes, or lower training.skyrl.num_nodes",
    "ray.dead_nodes": "replace the DEAD nodes, or lower training.skyrl.num_nodes",
    "ray.gpus": "add GPU nodes, or lower training.skyrl.num_gpus / num_nodes or local_train_gpus (the training "
    "placement)",
    "ray.gpu_placement": "add nodes with enough GPUs, or lower training.skyrl.num_gpus (GPUs per node)",
    "ray.eval_placement": "lower eval_workers or eval_gpus_per_worker, or add GPU nodes (eval_engine hf needs no GPU)",
    "ray.merge_memory": "give a node (the head) more memory in the RayCluster spec, or merge a smaller model",
    "storage.shared": "set data_root to a mount every node shares (/shared on HyperPod)",
    "storage.free_space": "free space under data_root, or choose another data_root",
    "inputs.base_model": "set base_model to a complete model directory as the cluster's nodes see it",
    "inputs.eval_set": "restore the eval set file (git checkout envs/data) or choose another eval_set",
    "hyperpod.cluster": "set hyperpod_cluster to an existing cluster of this account and AWS_REGION",
    "hyperpod.nodes": "wait for HyperPod to replace the failed nodes, or retry later",
}


@task(name="verify_cluster", retries=1, retry_delay_seconds=10)
def check_cluster(context: RunContext, params: PipelineParams) -> dict:
    """Run the readiness checks; publish them as a Prefect table and an MLflow table; raise if not ready."""
    logger = get_run_logger()
    config = params.train_config(context.run_id, context.base_model)
    run_id = context.stage_run_id("verify_cluster")
    with stage_run(context.tracking_uri, run_id):
        report = verify_cluster(
            context.ray_address,
            data_root=str(context.root),
            base_model=str(context.base_model),
            eval_set=context.eval_set,
            headers=ray_headers(context.ray_address),
            hyperpod_cluster=params.hyperpod_cluster,
            eval_workers=params.eval_workers,
            eval_gpus_per_worker=params.resolved_eval_gpus(),
            log=logger.info,
            **requirements_for(config, local_gpus=params.local_train_gpus),
        )
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
