"""Orchestration overhead of the embedded pipeline: its wall time minus the time inside stage work.

    flock /tmp/mazerl-cpu.lock .venv/bin/python bench/orchestration_overhead.py [--model DIR]

Starts what ``mazerl run`` starts, each timed on its own (the fixed start-up): a local Ray head,
a fresh MLflow SQLite store (created and migrated), and Prefect's temporary API server on a
fresh database (what Prefect starts when no server is configured). Then runs the pipeline flow
once on the *miniature* config of tests/test_pipeline_flow.py (4 eval mazes, 2 GRPO steps of
1 maze x 2 samples) and splits its wall time into

- work inside the stages: the Ray jobs' own run time (verify probe, baseline eval, training,
  final eval; from Ray's start/end times) and the merge's compute (its merge record's seconds);
- orchestration: everything else (Prefect's flow and task engine, MLflow bookkeeping and
  artifact copies, job submission, log streaming and polling), per task from Prefect's task runs.

Targets (issue 7): overhead <= 10% of the run, fixed start-up <= 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import write_section  # noqa: E402
from mazerl.training.recipes import MINIATURE_TRAINING  # noqa: E402

STAGE_OF_JOB = {"verify": "verify_cluster", "baseline": "baseline_eval", "train": "train", "final": "final_eval"}


def timed(fn):
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def task_runs(flow_run_id) -> list[tuple[str, float]]:
    """(task name, wall seconds) of every task run of the flow run, in start order."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            return sorted(runs, key=lambda run: run.start_time)

    return [
        (run.name.rsplit("-", 1)[0], (run.end_time - run.start_time).total_seconds()) for run in asyncio.run(read())
    ]


def job_seconds(head, flow_run_id: str) -> dict[str, float]:
    """Run time of the flow run's Ray jobs (and the verify probe on this fresh head), by stage."""
    from ray.job_submission import JobSubmissionClient

    seconds: dict[str, float] = {}
    for job in JobSubmissionClient(head.address, headers=head.auth_headers()).list_jobs():
        meta = job.metadata or {}
        if meta.get("mazerl_pipeline_run") not in (flow_run_id, None) or not job.end_time:
            continue
        stage = STAGE_OF_JOB.get(meta.get("mazerl_stage", ""))
        if stage:
            seconds[stage] = seconds.get(stage, 0.0) + (job.end_time - job.start_time) / 1000
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", default=None, help="model directory (default: the embedded starter, built if missing)"
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/performance.md alone")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="mazerl-bench-") as tmp:
        root = Path(tmp) / "root"
        os.environ["PREFECT_HOME"] = str(Path(tmp) / "prefect")  # before Prefect is imported: a fresh database
        os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(Path(tmp) / "prefect" / "storage")
        os.environ["PREFECT_RESULTS_PERSIST_BY_DEFAULT"] = "true"
        os.environ.pop("PREFECT_API_URL", None)
        from mlflow.tracking import MlflowClient
        from prefect.server.api.server import SubprocessASGIServer
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from mazerl.cluster.head.local import start_local_head
        from mazerl.starter.build import ensure_starter

        model = Path(args.model).resolve() if args.model else ensure_starter()
        ray_temp = tempfile.mkdtemp(prefix="mzr-b", dir="/tmp")
        head, ray_s = timed(lambda: start_local_head(ray_temp, num_cpus=2, dashboard_port=0))
        try:
            _, mlflow_s = timed(lambda: MlflowClient(f"sqlite:///{root / 'mlflow.db'}").search_experiments())
            server = SubprocessASGIServer()
            _, prefect_s = timed(server.start)
            os.environ["RAY_AUTH_TOKEN_PATH"] = str(head.token_path)
            from flows.pipeline import pipeline
            from mazerl.params import PipelineParams

            params = PipelineParams.model_validate(
                {
                    "base_model": str(model),
                    "eval_set": "maze256-small-v1",
                    "data_root": str(root),
                    "ray_address": head.address,
                    "max_eval_mazes": 4,
                    "eval_workers": 1,
                    "gif_count": 2,
                    "training": MINIATURE_TRAINING,
                }
            )
            with temporary_settings({PREFECT_API_URL: server.api_url}):
                state, flow_s = timed(lambda: pipeline(params, return_state=True))
                summary = state.result()
                flow_run_id = str(state.state_details.flow_run_id)
                tasks = task_runs(flow_run_id)
            jobs = job_seconds(head, flow_run_id)
            merge_record = json.loads((root / "runs" / summary.run_id / "merged" / "merge_record.json").read_text())
            server.stop()
        finally:
            head.stop()

    work = dict(jobs) | {"merge_lora": float(merge_record["seconds"])}
    rows, task_total = [], 0.0
    for name, wall in tasks:
        inside = work.pop(name, 0.0)
        task_total += wall
        rows.append(f"| {name} | {wall:.1f} | {inside:.1f} | {max(wall - inside, 0.0):.1f} |")
        print(rows[-1], flush=True)
    work_total = sum(jobs.values()) + float(merge_record["seconds"])
    overhead = flow_s - work_total
    share = overhead / flow_s
    fixed = ray_s + mlflow_s + prefect_s
    break_even_min = 9 * overhead / 60  # stage work at which the overhead is 10% of the run
    body = f"""## Orchestration overhead (`bench/orchestration_overhead.py`)

The pipeline flow once, on the **miniature config** of `tests/test_pipeline_flow.py` (model `{model.name}`,
4 eval mazes, 2 GRPO steps of 1 maze x 2 samples, 3-move episodes), against a local Ray head, MLflow
on SQLite and Prefect's temporary server, all started fresh. Work inside the stages is the Ray jobs'
own run time (Ray's start/end times: process start, imports, model load and the work itself) and the
merge's compute; orchestration is the rest of the flow's wall time.

| task | wall s | work inside s | orchestration s |
| --- | ---: | ---: | ---: |
{chr(10).join(rows)}

| | seconds |
| --- | ---: |
| flow wall time | {flow_s:.1f} |
| work inside stages | {work_total:.1f} |
| orchestration (flow wall - work) | **{overhead:.1f} ({share:.0%})** |
| of which between tasks (flow wall - sum of task walls) | {flow_s - task_total:.1f} |
| fixed start-up: Ray head | {ray_s:.1f} |
| fixed start-up: MLflow SQLite store (create + migrate) | {mlflow_s:.1f} |
| fixed start-up: Prefect temporary server (fresh database) | {prefect_s:.1f} |
| **fixed start-up, total** | **{fixed:.1f}** |

Targets: overhead <= 10% ({"met" if share <= 0.10 else "**not met** on this config"}), fixed start-up
<= 30 s ({"met" if fixed <= 30 else "**not met**"}). The miniature config does seconds of work per stage,
so the per-task costs dominate it; they do not grow with the work (they are MLflow writes, artifact
copies of a small model, job submission and polling), so the share falls below 10% once the stages'
work exceeds 9x the overhead, about **{break_even_min:.0f} minutes**, which any real training run does
(the embedded recipe's training alone: see the training benchmark)."""
    if not args.no_write:
        write_section("orchestration_overhead", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
