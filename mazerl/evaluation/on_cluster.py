"""``mazerl eval --ray-address http://<head>:8265``: the eval submitted as a Ray job to that cluster.

A Ray dashboard (job server) address cannot be handed to ``ray.init``: Ray (2.57 and later)
refuses an ``http://`` address there ("Invalid Ray address"), and a driver on a laptop would
need every port of the cluster besides. So, like the pipeline's eval stages, the command
submits :mod:`mazerl.evaluation.job_entry` through Ray's job API (the one submitter,
:class:`~mazerl.cluster.jobs.submitter.RayJob`), prints the job's own lines, and reads the report
the job wrote. The model, the adapter and ``out_dir`` must be paths the cluster sees (a head on
this machine does; a remote one needs them on its shared storage, like the pipeline's data root).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mazerl.atomic import write_json
from mazerl.cluster.client import ray_headers
from mazerl.cluster.jobs.spec import JobSpec, module_entrypoint
from mazerl.cluster.jobs.submitter import RayJob
from mazerl.eval_files import SUMMARY_FILE
from mazerl.evaluation.settings import EvalSettings, eval_request

if TYPE_CHECKING:
    from mazerl.evaluation.evaluate import EvalReport

REQUEST_FILE = "request.json"
JOB_MODULE = "mazerl.evaluation.job_entry"


def is_job_server_address(address: str | None) -> bool:
    """Whether ``address`` names a Ray job server (a dashboard, or a HyperPod ``sagemaker_ray://`` one)
    rather than an address a Ray driver connects to (``auto``, ``host:6379``, ``ray://``)."""
    return address is not None and address.split("://", 1)[0].lower() in ("http", "https", "sagemaker_ray")


def evaluate_as_job(
    address: str,
    model_dir: str | os.PathLike,
    settings: EvalSettings,
    out_dir: str | os.PathLike,
    adapter: str | os.PathLike | None = None,
    *,
    log: Callable[[str], None] = print,
) -> EvalReport:
    """Run :func:`~mazerl.evaluation.evaluate.evaluate` of ``model_dir`` with ``settings`` as a Ray job
    on ``address`` (paths as the cluster sees them); its lines go to ``log``.

    Raises :class:`~mazerl.cluster.errors.ConfigError` where the job refused its request (exit
    code 2) and :class:`~mazerl.cluster.errors.RetryableJobError` where the job or the cluster failed.
    """
    from mazerl.evaluation.evaluate import EvalReport  # lazy: the eval module imports torch (seconds)

    request = eval_request(model_dir, settings, out_dir, adapter)
    out_dir = Path(request["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    request_path = write_json(out_dir / REQUEST_FILE, request)
    with RayJob(
        address,
        JobSpec(
            module_entrypoint(JOB_MODULE, request_path),
            pipeline_run_id=f"eval-{uuid.uuid4().hex[:12]}",  # one command, one job: no re-attach across commands
            attempt=1,
            stage="eval",
            env_vars={"HF_HUB_DISABLE_PROGRESS_BARS": "1"},
        ),
        headers=ray_headers(address),
        log=log,
    ) as job:
        job.wait()
    return EvalReport.from_summary(out_dir / SUMMARY_FILE)
