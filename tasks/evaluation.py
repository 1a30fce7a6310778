"""baseline_eval and final_eval: the eval job on the cluster, then its report into MLflow.

The baseline's job (``evaluate_baseline``) is cached by (model fingerprint, eval-set digest,
eval settings, data root): a second pipeline run on the same base model reuses the first one's
report and says so, and evaluates anew if that report's files were deleted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from envs.evalset import load as load_eval_set
from mazerl.eval_files import SUMMARY_FILE
from mazerl.evaluation.evaluate import EvalReport, chunk_size_for
from mazerl.evaluation.settings import EvalSettings, eval_request
from mazerl.fingerprint import model_fingerprint
from mazerl.params import EvalParams, PipelineParams
from mazerl.reporting.eval_runs import record_eval
from mazerl.tracking.lineage import stage_run
from mazerl.training.config import TrainConfig
from tasks.context import RunContext
from tasks.jobs import run_stage_job, stage_job, write_request
from tasks.stages import timed_stage


def eval_settings(params: PipelineParams | EvalParams, eval_set: str, trained: TrainConfig | None) -> EvalSettings:
    """The eval settings a pipeline or eval-only run's parameters ask for, on ``eval_set``, in the
    context mode of the training ``trained`` (None: the model's recorded mode). Built once per run,
    by ``prepare`` (or ``prepare_eval``), into ``RunContext.eval_settings``: the run clock's keys and
    both evals read them there."""
    return EvalSettings(
        eval_set=eval_set,
        eval_workers=params.eval_workers,
        max_eval_mazes=params.max_eval_mazes,
        gif_count=params.gif_count,
        eval_engine=params.eval_engine,
        eval_gpus_per_worker=params.resolved_eval_gpus(),
        history_images=trained.history_images if trained is not None else None,
        history_text=trained.history_text if trained is not None else None,
    )


def baseline_cache_key(context, parameters: dict) -> str:
    """Prefect cache key of ``baseline_eval``: the same model and settings are never evaluated twice."""
    run: RunContext = parameters["run"]
    settings: EvalSettings = parameters["settings"]
    eval_set = load_eval_set(settings.eval_set)
    mazes = min(settings.max_eval_mazes or len(eval_set), len(eval_set))
    key = json.dumps(
        {
            "model": model_fingerprint(run.base_model),
            "eval_set": eval_set.digest,
            # workers and their GPUs change speed and placement; of the workers only the chunking they
            # imply (mazes batched per turn) can change a reply
            "settings": asdict(settings) | {"eval_workers": None, "eval_gpus_per_worker": None},
            "chunk_size": chunk_size_for(mazes, settings.eval_workers),
            "root": str(run.root),
        },
        sort_keys=True,
    )
    return "baseline-eval-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def _evaluate(run: RunContext, stage: str, model_dir: Path, settings: EvalSettings) -> EvalReport:
    out_dir = run.run_dir / "eval" / stage
    out_dir.mkdir(parents=True, exist_ok=True)
    request_path = write_request(out_dir / "request.json", eval_request(model_dir, settings, out_dir))
    # The stage's MLflow run starts with the eval job; record_eval ends it once the report is logged.
    clock = run.clock()
    with stage_run(run.tracking_uri, run.stage_run_id(f"{stage}_eval"), finish=False):
        run_stage_job(
            run,
            stage_job(run, stage, "mazerl.evaluation.job_entry", request_path),
            # "eval: 37/256 mazes, ..., 01:10 left" gets the run's total time left
            rewrite=(lambda line: clock.with_total_left(line, f"{stage}_eval")) if run.stage_keys else None,
        )
    return EvalReport.from_summary(out_dir / SUMMARY_FILE)


@task(
    name="evaluate_baseline",
    retries=1,
    retry_delay_seconds=10,
    cache_key_fn=baseline_cache_key,
    persist_result=True,
)
def evaluate_baseline(run: RunContext, settings: EvalSettings) -> EvalReport:
    """Greedy eval job of the base model, cached across pipeline runs (:func:`baseline_cache_key`)."""
    return _evaluate(run, "baseline", run.base_model, settings)


@task(name="baseline_eval", retries=1, retry_delay_seconds=5)
def baseline_eval(run: RunContext, settings: EvalSettings) -> EvalReport:
    """The base model's eval (a cached report when there is one), logged into this run's stage run."""
    with timed_stage(run, "baseline_eval") as timer:
        report = evaluate_baseline(run, settings)
        if not report.summary_path.is_file():  # the cached report's run directory was deleted: evaluate anew
            report = evaluate_baseline.with_options(refresh_cache=True)(run, settings)
        timer.same_work = str(report.out_dir).startswith(str(run.run_dir))  # not a cached report
        _record(run, "baseline_eval", report)
    return report


@task(name="final_eval", retries=1, retry_delay_seconds=10, persist_result=True)
def final_eval(run: RunContext, merged_model: Path, settings: EvalSettings, model_id: str | None = None) -> EvalReport:
    """Greedy eval of the merged model, with the baseline's settings, logged into its stage run
    (and, with ``model_id``, as the metrics of the merged model's MLflow logged model)."""
    with timed_stage(run, "final_eval"):
        report = _evaluate(run, "final", merged_model, settings)
        _record(run, "final_eval", report, model_id=model_id)
    return report


@task(name="eval", retries=1, retry_delay_seconds=10)
def eval_only(run: RunContext, model_dir: Path, settings: EvalSettings) -> dict[str, float]:
    """The eval-only flow's eval of ``model_dir``, logged into its run; returns the metrics logged."""
    return _record(run, "final_eval", _evaluate(run, "final", model_dir, settings))


def _record(run: RunContext, stage: str, report: EvalReport, model_id: str | None = None) -> dict[str, float]:
    """The report into MLflow, its per-maze table and headline into Prefect."""
    logger = get_run_logger()
    metrics, rows = record_eval(
        run.tracking_uri,
        run.stage_run_id(stage),
        report,
        run.run_dir,
        log=lambda line: logger.info(f"{stage}: {line}"),
        model_id=model_id,
    )
    columns = ("index", "seed", "solved", "moves", "optimal_moves", "parse_failures")
    create_table_artifact(
        [{key: row.get(key) for key in columns} for row in rows],
        key=f"{stage.replace('_', '-')}-results",
        description=f"{stage} eval: {report.solved}/{report.n} solved on {report.eval_set}",
    )
    logger.info(
        f"{stage}: {report.solved}/{report.n} solved ({report.success_rate:.1%}, 95% CI "
        f"{report.success_ci95[0]:.1%}-{report.success_ci95[1]:.1%}; budget ceiling {report.budget_ceiling:.1%})"
    )
    return metrics
