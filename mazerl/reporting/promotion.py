"""The end of a pipeline run: register the merged model, move ``champion`` only when it earned it
(:func:`mazerl.tracking.registry.promote`), and record the run's summary.

The summary compares the final eval with the baseline maze by maze (fixed, broken, still
failing, and the exact McNemar p of the difference); it goes onto the parent MLflow run
(``summary.json``, the headline metrics, the learning curve) and beside the run's files
(``<run dir>/summary.json``, for scripts such as ``bench/embedded_result.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from mlflow.entities import Metric

from envs.evalset import load as load_eval_set
from mazerl import atomic, paths
from mazerl.cluster.ray_local import find_local_head
from mazerl.eval_files import read_result_rows
from mazerl.evaluation.evaluate import EvalReport
from mazerl.evaluation.summary import exact_mcnemar_p
from mazerl.tracking.curves import log_learning_curve
from mazerl.tracking.lineage import set_run_status
from mazerl.tracking.registry import TrainedAdapter, promote
from mazerl.tracking.secrets import scrub_text
from mazerl.tracking.store import HEADLINE_METRICS, client_for, experiment_url, ui_url
from mazerl.training.config import TrainConfig

SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class PipelineSummary:
    """What `mazerl run` prints at the end (plain values)."""

    run_id: str
    mlflow_run_id: str
    tracking_uri: str
    baseline: float
    final: float
    budget_ceiling: float
    fixed: int
    broken: int
    still_failing: int
    mcnemar_p: float
    promoted: bool
    decision: str
    run_dir: str
    mlflow_url: str | None = None  # the parent run's page in the MLflow UI (a local store: once `mlflow ui` runs)
    ray_head_note: str | None = None  # an embedded head this run leaves up, and the command that stops it

    def text(self) -> str:
        return (
            f"baseline {self.baseline:.1%} -> final {self.final:.1%} (budget ceiling {self.budget_ceiling:.1%}); "
            f"per maze: {self.fixed} fixed, {self.broken} broken, {self.still_failing} still failing "
            f"(exact McNemar p = {self.mcnemar_p:.3g})\n{self.decision}\n"
            f"MLflow run {self.mlflow_run_id} at {self.tracking_uri}\n"
            + (f"  {self.mlflow_url}\n" if self.mlflow_url else "")
            + f"artifacts under {self.run_dir}"
        )

    def headline_metrics(self) -> dict[str, float]:
        """The parent run's metrics: the numbers the runs table shows for each pipeline run."""
        values = (self.baseline, self.final, self.final - self.baseline, self.mcnemar_p, self.budget_ceiling)
        return dict(zip(HEADLINE_METRICS, values, strict=True))


@dataclass(frozen=True)
class PipelineRun:
    """Where one pipeline run's records live: its MLflow runs and its run directory."""

    run_id: str  # the run directory's name
    run_dir: Path
    tracking_uri: str
    pipeline_run_id: str  # the MLflow parent run
    train_run_id: str
    merge_run_id: str  # the run the merged model was logged in (the registered version's source run)
    cluster_is_embedded: bool  # no ray_address given: the run used (or started) the embedded head


def paired_outcomes(baseline: EvalReport, final: EvalReport) -> tuple[int, int, int, int]:
    """(fixed, broken, still failing, both solved) over the mazes both evals played."""

    def solved(report: EvalReport) -> dict[int, bool]:
        rows = read_result_rows(report.results_path)
        return {row["index"]: bool(row["solved"]) for row in rows}

    before, after = solved(baseline), solved(final)
    common = sorted(set(before) & set(after))
    fixed = sum(not before[i] and after[i] for i in common)
    broken = sum(before[i] and not after[i] for i in common)
    failing = sum(not before[i] and not after[i] for i in common)
    return fixed, broken, failing, len(common) - fixed - broken - failing


def ray_head_note(cluster_is_embedded: bool) -> str | None:
    """The embedded head outlives a flow run that did not start it under ``mazerl run`` (a deployment's
    run, whose worker starts it): say so, and how to stop it. None for a cluster or a head ``mazerl
    run`` stops itself."""
    if not cluster_is_embedded:
        return None
    head = find_local_head()
    if head is None or head.managed:
        return None
    return (
        f"The embedded Ray head at {head.address} stays up for the next run (and for a retry to re-attach to its "
        f"jobs); stop it when no run uses it with: {paths.venv_command('mazerl')} ray stop"
    )


def conclude_pipeline_run(
    run: PipelineRun,
    *,
    registered_model: str,
    merged_source: str,
    threshold: float,
    baseline: EvalReport,
    final: EvalReport,
    metrics_jsonl: Path | None,
    greedy_on: str,
    log: Callable[[str], None] = print,
    adapter: TrainedAdapter | None = None,
) -> PipelineSummary:
    """Register and maybe promote; then the learning curve, the headline metrics and the summary on the
    parent run, which ends FINISHED. ``adapter``: what was merged, so that one trained adapter is
    registered once however many flow runs reach here (:func:`~mazerl.tracking.registry.promote`)."""
    decision = promote(
        run.tracking_uri,
        registered_model,
        merged_source,
        run.merge_run_id,
        baseline.success_rate,
        final.success_rate,
        threshold,
        tags={"mazerl.pipeline_run_id": run.pipeline_run_id, "mazerl.run_dir": str(run.run_dir)},
        adapter=adapter,
    )
    log(decision.reason)
    fixed, broken, failing, _ = paired_outcomes(baseline, final)
    log_learning_curve(
        run.tracking_uri,
        run.pipeline_run_id,
        run.run_dir / "learning_curve",
        train_run_id=run.train_run_id,
        metrics_jsonl=metrics_jsonl,
        baseline=baseline.success_rate,
        final=final.success_rate,
        greedy_on=greedy_on,
        eval_on=f"{baseline.n} mazes of {baseline.eval_set}",
    )
    client = client_for(run.tracking_uri)
    home = ui_url(run.tracking_uri)
    experiment_id = client.get_run(run.pipeline_run_id).info.experiment_id
    summary = PipelineSummary(
        run_id=run.run_id,
        mlflow_run_id=run.pipeline_run_id,
        tracking_uri=run.tracking_uri,
        baseline=baseline.success_rate,
        final=final.success_rate,
        budget_ceiling=final.budget_ceiling,
        fixed=fixed,
        broken=broken,
        still_failing=failing,
        mcnemar_p=exact_mcnemar_p(fixed, broken),
        promoted=decision.promoted,
        decision=decision.reason,
        run_dir=str(run.run_dir),
        mlflow_url=experiment_url(home, experiment_id, run.pipeline_run_id) if home else None,
        ray_head_note=ray_head_note(run.cluster_is_embedded),
    )
    if summary.ray_head_note:
        log(summary.ray_head_note)
    summary_json = scrub_text(json.dumps(asdict(summary), indent=2))
    client.log_text(run.pipeline_run_id, summary_json, SUMMARY_FILE)
    atomic.write_text(run.run_dir / SUMMARY_FILE, summary_json)  # a copy beside the run's files, for scripts
    now_ms = int(time.time() * 1000)
    metrics = [Metric(key, value, now_ms, 0) for key, value in summary.headline_metrics().items()]
    client.log_batch(run.pipeline_run_id, metrics=metrics)
    set_run_status(run.tracking_uri, run.pipeline_run_id, "FINISHED")
    return summary


def summary_markdown(summary: PipelineSummary, baseline: EvalReport, final: EvalReport) -> str:
    """The run's summary as Markdown (the Prefect UI's ``pipeline-summary`` artifact)."""

    def rate(report: EvalReport) -> str:
        low, high = report.success_ci95
        return f"{report.success_rate:.1%} ({report.solved}/{report.n}; 95% CI {low:.1%}-{high:.1%})"

    return "\n".join(
        [
            f"# Pipeline run {summary.run_id}",
            "",
            "| | success | parse failures |",
            "| --- | --- | --- |",
            f"| baseline | {rate(baseline)} | {baseline.parse_failure_rate:.1%} |",
            f"| final | {rate(final)} | {final.parse_failure_rate:.1%} |",
            "",
            f"Delta: {summary.final - summary.baseline:+.1%} (budget ceiling {summary.budget_ceiling:.1%}). "
            f"Per maze: {summary.fixed} fixed, {summary.broken} broken, {summary.still_failing} still failing; "
            f"exact McNemar p = {summary.mcnemar_p:.3g}.",
            "",
            f"Promotion: {summary.decision}",
            "",
            f"MLflow parent run `{summary.mlflow_run_id}` at `{summary.tracking_uri}`; files under `{summary.run_dir}`.",
            *(["", summary.ray_head_note] if summary.ray_head_note else []),
        ]
    )


def greedy_eval_mazes(config: TrainConfig) -> str:
    """Which mazes the trainer's greedy evals play, in words, for the learning curve's legend."""
    total = len(load_eval_set(config.eval_set))
    played = min(config.eval_mazes or total, total)
    return f"{'all' if played == total else f'the first {played} of the'} {total} mazes of {config.eval_set}"
