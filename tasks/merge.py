"""merge_lora: fold the adapter named by the checkpoint marker into the base model, with proof.

The merge runs as a Ray job (``mazerl.merge.job_entry``) asking Ray for the memory it needs
(:mod:`mazerl.merge.memory`): a whole copy of the base model, which a flow-run pod does
not have; and for the CPUs of the roomiest node that has it (at most 16), which become the job's
torch threads (a job driver that asks for no CPU runs on one thread). The job writes the merged
directory and its ``merge_record.json`` on the shared mount; the job also saves it as an MLflow
transformers model beside it (``<run>/mlflow_model``); this task reads the record back and uploads
that model to MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import get_run_logger, task

from mazerl.cluster.client import cluster_nodes
from mazerl.cluster.errors import RetryableJobError
from mazerl.merge.memory import merge_cpus, merge_memory, weights_bytes
from mazerl.merge.output import MergeReport
from mazerl.tracking.lineage import stage_run
from mazerl.tracking.mlflow_model import log_merged_model
from tasks.context import RunContext, ray_headers
from tasks.jobs import retry_on_infrastructure, run_stage_job, stage_job, write_request
from tasks.stages import timed_stage
from tasks.training import TrainOutcome


@dataclass(frozen=True)
class MergedModel:
    path: Path
    source: str  # the artifact URI (or pointer) to register
    checkpoint_step: int
    summary: str
    adapter_sha256: str = ""  # the merged adapter's digest: one registered version per trained adapter
    model_id: str | None = None  # the MLflow 3 logged model of the merged weights


@task(
    name="merge_lora",
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=retry_on_infrastructure,
    persist_result=True,
)
def merge_lora(run: RunContext, trained: TrainOutcome, max_artifact_mb: float) -> MergedModel:
    """Run the merge job on a node with the memory it needs; upload the merged model to MLflow
    (as files up to ``max_artifact_mb``; a larger model is registered by its path)."""
    logger = get_run_logger()
    run_id = run.stage_run_id("merge_lora")
    out_dir = run.run_dir / "merged"
    need = merge_memory(weights_bytes(run.base_model))
    address = run.cluster_address()
    try:  # the CPUs of the roomiest node that has the memory: the merge's torch threads
        cpus = merge_cpus(need, cluster_nodes(address, ray_headers(address)))
    except RetryableJobError as exc:
        logger.warning(f"merge_lora: {exc}; asking for 1 CPU")
        cpus = 1
    request = write_request(
        run.run_dir / "merge_request.json",
        {
            "base_model": str(run.base_model),
            "checkpoints_dir": str(trained.checkpoints_dir),
            "out_dir": str(out_dir),
            "probe_eval_set": run.eval_set,
            "mlflow_model_dir": str(run.run_dir / "mlflow_model"),
            "max_artifact_mb": max_artifact_mb,
            "cpus": cpus,
        },
    )
    logger.info(f"merge_lora: a Ray job asking for {cpus} CPUs (its torch threads) and {need.describe()}")
    with timed_stage(run, "merge_lora"), stage_run(run.tracking_uri, run_id):
        run_stage_job(
            run, stage_job(run, "merge_lora", "mazerl.merge.job_entry", request, memory=need.total_bytes, num_cpus=cpus)
        )
        report = MergeReport.read(out_dir)  # its summary is in the job's last line ("merge done: ...") above
        logged = log_merged_model(run.tracking_uri, run_id, report.merged_dir, run.run_dir / "mlflow_model")
    return MergedModel(
        Path(report.merged_dir),
        logged.source,
        report.checkpoint_step or 0,
        report.summary(),
        report.adapter_sha256,
        logged.model_id,
    )
