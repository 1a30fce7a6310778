"""The end of a pipeline run: register the merged model, move ``champion`` only when it earned it
(:func:`mazerl.tracking.registry.promote`), and record the run's summary.

The summary compares the final eval with the baseline maze by maze (fixed, broken, still
failing, and the exact McNemar p of the difference; :mod:`mazerl.reporting.per_maze`); it goes
onto the parent MLflow run and beside the run's files (``<run dir>/summary.json``, for scripts
such as ``bench/embedded_result.py``). What a user reads on the parent run's page without
digging: its description (:func:`summary_markdown`: baseline -> final, the decision, the learning
curve, where the periodic evals peaked, the mazes that changed), the headline metrics (percent
and points, :data:`mazerl.tracking.store.HEADLINE_METRICS`), the registered version under
*Registered models*, and the paired per-maze table. The registered version gets a description
of its own, with the link to this run (:func:`version_markdown`).

The champion is the merged model of the **last** checkpoint. No checkpoint is chosen by the
periodic greedy evals: they play the eval set itself, so picking the best of them would make
the final number optimistic. Choosing a checkpoint needs a validation split disjoint from the
eval set (docs/training.md, "Which checkpoint becomes the model").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

from envs.evalset import load as load_eval_set
from mazerl import atomic, paths
from mazerl.cluster.head.local import find_local_head
from mazerl.evaluation.evaluate import EvalReport
from mazerl.evaluation.summary import exact_mcnemar_p
from mazerl.reporting.eval_runs import success_on_first
from mazerl.reporting.per_maze import TABLE_FILE, PairedMaze, changed_mazes, counts, log_per_maze, paired_mazes
from mazerl.tracking.curves import GREEDY_KEY, greedy_peak, history_from_jsonl, history_from_mlflow, log_learning_curve
from mazerl.tracking.lineage import set_run_status
from mazerl.tracking.mlflow_model import TAG_LOGGED_MODEL
from mazerl.tracking.registry import PromotionDecision, TrainedAdapter, describe_version, promote
from mazerl.tracking.secrets import scrub_text
from mazerl.tracking.store import HEADLINE_METRICS, client_for, experiment_url, ui_url
from mazerl.training.config import TrainConfig

SUMMARY_FILE = "summary.json"
TAG_NOTE = "mlflow.note.content"  # the run's description on its MLflow page (Markdown)
CURVE_ARTIFACT = "learning_curve/learning_curve.png"
ALL_MAZES_SHOWN = 32  # evals of up to this many mazes list every maze in the description
CHANGED_ROWS_SHOWN = 20  # larger ones list this many of the mazes that changed; the per-maze table has them all
VERSION_DESCRIPTION_LIMIT = 5000  # characters: the SQL registry's column for a version's description


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
    registered_model: str | None = None
    version: str | None = None  # the registered version of this run's merged model
    checkpoint_step: int | None = None  # the checkpoint the merged model (the champion candidate) comes from
    peak_step: int | None = None  # where the periodic greedy evals peaked (None: the run had none)
    peak_success: float | None = None

    def text(self) -> str:
        return (
            f"baseline {self.baseline:.1%} -> final {self.final:.1%} (budget ceiling {self.budget_ceiling:.1%}); "
            f"per maze: {self.fixed} fixed, {self.broken} broken, {self.still_failing} still failing "
            f"(exact McNemar p = {self.mcnemar_p:.3g})\n{self.decision}\n"
            + (f"{self.checkpoint_note()}\n" if self.checkpoint_note() else "")
            + f"MLflow run {self.mlflow_run_id} at {self.tracking_uri}\n"
            + (f"  {self.mlflow_url}\n" if self.mlflow_url else "")
            + f"artifacts under {self.run_dir}"
        )

    def checkpoint_note(self) -> str:
        """Which checkpoint the model is, and where the periodic evals peaked (not chosen by them)."""
        if self.checkpoint_step is None:
            return ""
        note = f"The model is the last checkpoint's (step {self.checkpoint_step})"
        if self.peak_step is None or self.peak_success is None:
            return note + "."
        return (
            note + f"; the periodic greedy evals peaked at step {self.peak_step} ({self.peak_success:.1%}). "
            "Checkpoints are not chosen by those evals: they play the eval set itself, so choosing by them "
            "would make the final number optimistic."
        )

    def headline_metrics(self) -> dict[str, float]:
        """The parent run's metrics: the numbers the runs table shows for each pipeline run, in percent
        and points rounded to one decimal, so they read at a glance."""
        values = (
            round(100 * self.baseline, 1),
            round(100 * self.final, 1),
            round(100 * (self.final - self.baseline), 1),
            float(self.broken),
            float(self.fixed),
            float(f"{self.mcnemar_p:.3g}"),
            round(100 * self.budget_ceiling, 1),
        )
        return dict(zip(HEADLINE_METRICS, values, strict=True))


@dataclass(frozen=True)
class PipelineRun:
    """Where one pipeline run's records live: its MLflow runs and its run directory."""

    run_id: str  # the run directory's name
    run_dir: Path
    tracking_uri: str
    pipeline_run_id: str  # the MLflow parent run
    train_run_id: str
    merge_run_id: str  # the run the merged model was logged in (its logged model's source run)
    cluster_is_embedded: bool  # no ray_address given: the run used (or started) the embedded head
    baseline_run_id: str | None = None
    final_run_id: str | None = None
    experiment_id: str | None = None


def paired_outcomes(baseline: EvalReport, final: EvalReport) -> tuple[int, int, int, int]:
    """(fixed, broken, still failing, both solved) over the mazes both evals played."""
    tally = counts(paired_mazes(baseline, final))
    return tally["fixed"], tally["broken"], tally["still failing"], tally["both solved"]


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


def _curve_and_peak(
    run: PipelineRun,
    metrics_jsonl: Path | None,
    baseline: EvalReport,
    final: EvalReport,
    greedy_on: str,
    greedy_mazes: int | None,
) -> tuple[int, float] | None:
    """The learning curve onto the parent run, and (step, success) where the periodic greedy evals peaked."""
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
        greedy_baseline=success_on_first(baseline, greedy_mazes),
    )
    history = history_from_jsonl(metrics_jsonl, (GREEDY_KEY,)) if metrics_jsonl else None
    return greedy_peak(history or history_from_mlflow(run.tracking_uri, run.train_run_id, (GREEDY_KEY,)))


def _pipeline_summary(
    run: PipelineRun,
    baseline: EvalReport,
    final: EvalReport,
    tally: dict[str, int],
    decision: PromotionDecision,
    experiment_id: str,
    checkpoint_step: int | None,
    peak: tuple[int, float] | None,
) -> PipelineSummary:
    """The run's summary in plain values, from the evals' per-maze tally, the promotion decision and the peak."""
    home = ui_url(run.tracking_uri)
    return PipelineSummary(
        run_id=run.run_id,
        mlflow_run_id=run.pipeline_run_id,
        tracking_uri=run.tracking_uri,
        baseline=baseline.success_rate,
        final=final.success_rate,
        budget_ceiling=final.budget_ceiling,
        fixed=tally["fixed"],
        broken=tally["broken"],
        still_failing=tally["still failing"],
        mcnemar_p=exact_mcnemar_p(tally["fixed"], tally["broken"]),
        promoted=decision.promoted,
        decision=decision.reason,
        run_dir=str(run.run_dir),
        mlflow_url=experiment_url(home, experiment_id, run.pipeline_run_id) if home else None,
        ray_head_note=ray_head_note(run.cluster_is_embedded),
        registered_model=decision.registered_model,
        version=decision.version,
        checkpoint_step=checkpoint_step,
        peak_step=peak[0] if peak else None,
        peak_success=peak[1] if peak else None,
    )


def _record_summary(
    client: MlflowClient,
    run: PipelineRun,
    summary: PipelineSummary,
    story: str,
    experiment_id: str,
    model_id: str | None,
) -> None:
    """What a user reads without digging: the run's and the version's descriptions, summary.json, headline metrics."""
    client.set_tag(run.pipeline_run_id, TAG_NOTE, truncated_markdown(scrub_text(story)))
    describe_version(
        run.tracking_uri,
        summary.registered_model,
        summary.version,
        truncated_markdown(scrub_text(version_markdown(summary, experiment_id, model_id)), VERSION_DESCRIPTION_LIMIT),
        model_id=model_id,
    )
    summary_json = scrub_text(json.dumps(asdict(summary), indent=2))
    client.log_text(run.pipeline_run_id, summary_json, SUMMARY_FILE)
    atomic.write_text(run.run_dir / SUMMARY_FILE, summary_json)  # a copy beside the run's files, for scripts
    now_ms = int(time.time() * 1000)
    metrics = [Metric(key, value, now_ms, 0) for key, value in summary.headline_metrics().items()]
    client.log_batch(run.pipeline_run_id, metrics=metrics)


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
    greedy_mazes: int | None = None,
    checkpoint_step: int | None = None,
    model_id: str | None = None,
    log: Callable[[str], None] = print,
    adapter: TrainedAdapter | None = None,
) -> PipelineSummary:
    """Register and maybe promote; then the learning curve, the per-maze comparison, the headline
    metrics, the description and the summary on the parent run, which ends FINISHED.

    ``greedy_mazes``: how many of the set's first mazes the periodic greedy evals play (None: all),
    for the curve's step-0 point; ``checkpoint_step`` and ``model_id``: the merged model's checkpoint
    and MLflow 3 logged model; ``adapter``: what was merged, so that one trained adapter is
    registered once however many flow runs reach here (:func:`~mazerl.tracking.registry.promote`).
    """
    client = client_for(run.tracking_uri)
    experiment_id = run.experiment_id or client.get_run(run.pipeline_run_id).info.experiment_id
    decision = promote(
        run.tracking_uri,
        registered_model,
        merged_source,
        run.pipeline_run_id,
        baseline.success_rate,
        final.success_rate,
        threshold,
        tags=version_tags(run, model_id),
        adapter=adapter,
        model_id=model_id,
    )
    log(decision.reason)
    pairs, _ = log_per_maze(run.tracking_uri, run.pipeline_run_id, baseline, final, run.run_dir / "per_maze")
    peak = _curve_and_peak(run, metrics_jsonl, baseline, final, greedy_on, greedy_mazes)
    summary = _pipeline_summary(run, baseline, final, counts(pairs), decision, experiment_id, checkpoint_step, peak)
    if summary.checkpoint_note():
        log(summary.checkpoint_note())
    if summary.ray_head_note:
        log(summary.ray_head_note)
    story = summary_markdown(summary, baseline, final, pairs, mlflow=True)
    _record_summary(client, run, summary, story, experiment_id, model_id)
    set_run_status(run.tracking_uri, run.pipeline_run_id, "FINISHED")
    return summary


def version_tags(run: PipelineRun, model_id: str | None = None) -> dict[str, str]:
    """A registered version's tags: the same names and meanings as on the runs (``mazerl.run_id`` is the
    readable run id everywhere), plus the MLflow ids of the runs that made and measured it, and of its
    logged model (MLflow's SQL registry keeps no ``model_id`` of its own)."""
    ids = {
        TAG_LOGGED_MODEL: model_id,
        "mazerl.run_id": run.run_id,
        "mazerl.pipeline_run_id": run.pipeline_run_id,
        "mazerl.merge_run_id": run.merge_run_id,
        "mazerl.train_run_id": run.train_run_id,
        "mazerl.baseline_eval_run_id": run.baseline_run_id,
        "mazerl.final_eval_run_id": run.final_run_id,
        "mazerl.run_dir": str(run.run_dir),
    }
    return {key: value for key, value in ids.items() if value}


def truncated_markdown(text: str, limit: int = MAX_TAG_VAL_LENGTH) -> str:
    """``text`` cut at a line end to fit MLflow's tag and description limit, saying so."""
    if len(text) <= limit:
        return text
    cut = "\n\n(cut here: the whole summary is the run's summary.json)"
    return text[: text.rfind("\n", 0, limit - len(cut))] + cut


def _rate(report: EvalReport) -> str:
    low, high = report.success_ci95
    return f"**{report.success_rate:.1%}** ({report.solved}/{report.n}; 95% CI {low:.1%}-{high:.1%})"


def _per_maze_table(pairs: list[PairedMaze]) -> tuple[str, list[str]]:
    """(heading, Markdown lines): every maze of a small eval, else the first mazes that changed."""
    changed = changed_mazes(pairs)
    if len(pairs) <= ALL_MAZES_SHOWN:
        heading, shown = "Per maze", changed + [pair for pair in pairs if pair not in changed]
    else:
        heading, shown = "Mazes that changed", changed[:CHANGED_ROWS_SHOWN]
    if not shown:
        return heading, ["No maze changed between the baseline and the final eval."]
    lines = ["| maze | change | baseline | final | optimal moves |", "| ---: | --- | --- | --- | ---: |"]

    def outcome(solved: bool, moves: int) -> str:
        return f"solved in {moves}" if solved else f"failed after {moves}"

    for pair in shown:
        lines.append(
            f"| {pair.index} | {pair.change} | {outcome(pair.baseline_solved, pair.baseline_moves)} | "
            f"{outcome(pair.final_solved, pair.final_moves)} | {pair.optimal_moves} |"
        )
    if len(pairs) > ALL_MAZES_SHOWN and len(changed) > CHANGED_ROWS_SHOWN:
        lines += ["", f"... and {len(changed) - CHANGED_ROWS_SHOWN} more in the per-maze table."]
    return heading, lines


def summary_markdown(
    summary: PipelineSummary,
    baseline: EvalReport,
    final: EvalReport,
    pairs: list[PairedMaze] | None = None,
    *,
    mlflow: bool = False,
) -> str:
    """The run's story as Markdown: the parent MLflow run's description (``mlflow=True``: with the
    learning curve image and the artifacts' names) and the Prefect UI's ``pipeline-summary`` artifact."""
    pairs = paired_mazes(baseline, final) if pairs is None else pairs
    gain = 100 * (summary.final - summary.baseline)
    lines = [
        f"## {summary.run_id}: baseline {summary.baseline:.1%} -> final {summary.final:.1%} ({gain:+.1f} points)",
        "",
        f"**{'Promoted' if summary.promoted else 'Not promoted'}.** {summary.decision}",
        "",
        "| | model | success | parse failures |",
        "| --- | --- | --- | --- |",
        f"| baseline | base model | {_rate(baseline)} | {baseline.parse_failure_rate:.1%} |",
        f"| final | merged model | {_rate(final)} | {final.parse_failure_rate:.1%} |",
        "",
        f"Per maze: **{summary.fixed} fixed**, **{summary.broken} broken**, {summary.still_failing} still failing; "
        f"exact McNemar p = {summary.mcnemar_p:.3g}. Budget ceiling {summary.budget_ceiling:.1%} (the share of "
        f"these {baseline.n} mazes of {baseline.eval_set} the solver finishes within the move budget).",
    ]
    if summary.checkpoint_note():
        lines += ["", summary.checkpoint_note()]
    if mlflow:
        curve = f"get-artifact?path={CURVE_ARTIFACT}&run_uuid={summary.mlflow_run_id}"
        lines += [
            "",
            "### Learning curve",
            "",
            f"![Learning curve: success by training step, with the baseline]({curve})",
            "",
            "Greedy evals during training (green, from the baseline at step 0), sampled rollouts (blue), the "
            "baseline (dashed) and the final eval (red star); the train run's `eval/success_rate` chart has the "
            "same points.",
        ]
    heading, table = _per_maze_table(pairs)
    lines += ["", f"### {heading}", "", *table]
    if mlflow:
        lines += [
            "",
            f"Every maze, paired: `{TABLE_FILE}` in Artifacts; baseline beside final for a few fixed mazes (and "
            "a broken one): `per_maze/gifs/`.",
        ]
    lines += [
        "",
        f"MLflow parent run `{summary.mlflow_run_id}` at `{summary.tracking_uri}`; files under `{summary.run_dir}`.",
        *(["", summary.ray_head_note] if summary.ray_head_note else []),
    ]
    return "\n".join(lines)


def version_markdown(summary: PipelineSummary, experiment_id: str, model_id: str | None = None) -> str:
    """The registered version's description: what it scored, the decision, and the link to its pipeline run."""
    gain = 100 * (summary.final - summary.baseline)
    link = f"#/experiments/{experiment_id}/runs/{summary.mlflow_run_id}?workflowType=machine_learning"
    lines = [
        f"Merged model of pipeline run [{summary.run_id}]({link}): baseline {summary.baseline:.1%} -> final "
        f"{summary.final:.1%} ({gain:+.1f} points; {summary.fixed} mazes fixed, {summary.broken} broken, exact "
        f"McNemar p = {summary.mcnemar_p:.3g}).",
        "",
        f"**{'Promoted' if summary.promoted else 'Not promoted'}.** {summary.decision}",
    ]
    if summary.checkpoint_note():
        lines += ["", summary.checkpoint_note()]
    lines += ["", f"The pipeline run's page tells the whole story: [{summary.run_id}]({link})."]
    if model_id:
        model_link = f"#/experiments/{experiment_id}/models/{model_id}?workflowType=machine_learning"
        lines += [f"The model's files, params and eval metrics: logged model [{model_id}]({model_link})."]
    return "\n".join(lines)


def greedy_eval_mazes(config: TrainConfig) -> str:
    """Which mazes the trainer's greedy evals play, in words, for the learning curve's legend."""
    total = len(load_eval_set(config.eval_set))
    played = min(config.eval_mazes or total, total)
    return f"{'all' if played == total else f'the first {played} of the'} {total} mazes of {config.eval_set}"
