"""The learning curve of a run: success by training step, with the baseline and final eval marked.

Sources: the train run's metric history in MLflow, or the ``metrics.jsonl`` the trainer
writes next to its checkpoints (the local record, complete even when MLflow was down).
Two series: ``train/success_rate`` (sampled rollouts of each step, noisy) and the greedy
eval points (``eval/success_rate`` every ``eval_interval`` steps). A step logged twice (a
step redone after a resume) keeps its last value.

Outputs ``learning_curve.png`` (matplotlib, Agg: no display needed) and
``learning_curve.md`` (a markdown table), and :func:`log_learning_curve` logs both. The greedy
line starts at step 0 from the baseline when it is given (the base model is the step-0 policy),
so a dip below the baseline early in training shows; every point lies inside the frame.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mazerl.atomic import write_bytes, write_text
from mazerl.eval_files import EVAL_METRICS
from mazerl.tracking.store import client_for

SAMPLED_KEY = "train/success_rate"
GREEDY_KEY = EVAL_METRICS["success_rate"]  # the periodic greedy evals log the eval stage's name
MAX_TABLE_ROWS = 40

Series = list[tuple[int, float]]  # (step, value), ascending steps


def _series(points: Iterable[tuple[int, float]]) -> Series:
    by_step: dict[int, float] = {}
    for step, value in points:  # later points win: a redone step replaces the first attempt
        if value is not None and not math.isnan(float(value)):
            by_step[int(step)] = float(value)
    return sorted(by_step.items())


def history_from_mlflow(
    tracking_uri: str, run_id: str, keys: Sequence[str] = (SAMPLED_KEY, GREEDY_KEY)
) -> dict[str, Series]:
    """Per-step history of ``keys`` in a run (missing metrics give empty series)."""
    client = client_for(tracking_uri)
    history = {}
    for key in keys:
        metrics = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.timestamp, m.step))
        history[key] = _series((m.step, m.value) for m in metrics)
    return history


def history_from_jsonl(path: str | os.PathLike, keys: Sequence[str] = (SAMPLED_KEY, GREEDY_KEY)) -> dict[str, Series]:
    """Per-step history of ``keys`` in a ``metrics.jsonl`` (one ``{"step": N, key: value, ...}`` per line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"metrics_jsonl={str(path)!r} does not exist; the trainer writes it in its run directory"
        )
    points: dict[str, list[tuple[int, float]]] = {key: [] for key in keys}
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                continue  # a last line cut short by a crash
            raise ValueError(f"{path}:{number} is not JSON; the metrics file is corrupt") from None
        for key in keys:
            if isinstance(row.get(key), int | float) and "step" in row:
                points[key].append((row["step"], row[key]))
    return {key: _series(values) for key, values in points.items()}


def greedy_peak(history: Mapping[str, Series]) -> tuple[int, float] | None:
    """(step, success) of the best periodic greedy eval after step 0 (the earliest of equal ones); None without any."""
    points = [(step, value) for step, value in history.get(GREEDY_KEY, []) if step > 0]
    return max(points, key=lambda point: (point[1], -point[0])) if points else None


def with_baseline_point(history: Mapping[str, Series], baseline: float | None) -> dict[str, Series]:
    """The history with ``baseline`` as the greedy series' step-0 point (unless it has one)."""
    greedy = list(history.get(GREEDY_KEY, []))
    if baseline is not None and greedy and greedy[0][0] != 0:
        greedy = [(0, float(baseline)), *greedy]
    return {**history, GREEDY_KEY: greedy}


def _pick_rows(steps: list[int], keep: set[int], limit: int) -> list[int]:
    if len(steps) <= limit:
        return steps
    stride = math.ceil(len(steps) / limit)
    return sorted(set(steps[::stride]) | keep | {steps[-1]})


def _on(what: str | None) -> str:
    return f" on {what}" if what else ""


def curve_table(
    history: Mapping[str, Series],
    baseline: float | None = None,
    final: float | None = None,
    max_rows: int = MAX_TABLE_ROWS,
    *,
    greedy_on: str | None = None,
    eval_on: str | None = None,
) -> str:
    """Markdown: baseline and final, then success by step (greedy eval steps always included).

    ``greedy_on`` and ``eval_on`` say which mazes the greedy points and the baseline/final evals
    were measured on (e.g. "the first 64 of the 256 mazes of maze256-small-v1"): they can differ,
    and a curve that compares different sets without saying so misleads.
    """
    sampled, greedy = dict(history.get(SAMPLED_KEY, [])), dict(history.get(GREEDY_KEY, []))
    steps = sorted(set(sampled) | set(greedy))
    lines = ["# Learning curve", ""]
    if baseline is not None:
        lines.append(f"- baseline eval (before training){_on(eval_on)}: **{baseline:.3f}**")
    if final is not None:
        delta = f" ({final - baseline:+.3f})" if baseline is not None else ""
        lines.append(f"- final eval (merged model){_on(eval_on)}: **{final:.3f}**{delta}")
    if greedy:
        lines.append(f"- greedy eval during training{_on(greedy_on)}")
    lines += ["", "| step | sampled success (train) | greedy eval success |", "| ---: | ---: | ---: |"]
    for step in _pick_rows(steps, set(greedy), max_rows):
        cells = [f"{sampled[step]:.3f}" if step in sampled else "", f"{greedy[step]:.3f}" if step in greedy else ""]
        lines.append(f"| {step} | {cells[0]} | {cells[1]} |")
    if not steps:
        lines.append("| (no steps logged) | | |")
    return "\n".join(lines) + "\n"


def _plot_series(
    axes: Any,
    history: Mapping[str, Series],
    baseline: float | None,
    final: float | None,
    last_step: int,
    greedy_on: str | None,
    eval_on: str | None,
) -> None:
    """The curve's lines and markers: sampled, greedy (its peak labelled), the baseline, the final eval's star."""
    sampled, greedy = list(history.get(SAMPLED_KEY, [])), list(history.get(GREEDY_KEY, []))
    if sampled:
        axes.plot(*zip(*sampled, strict=True), color="tab:blue", alpha=0.6, lw=1.2, label="sampled (train rollouts)")
    if greedy:
        axes.plot(*zip(*greedy, strict=True), "o-", color="tab:green", lw=1.8, label=f"greedy eval{_on(greedy_on)}")
        peak = greedy_peak(history)
        if peak is not None:
            axes.annotate(
                f"peak {peak[1]:.1%} (step {peak[0]})",
                peak,
                textcoords="offset points",
                xytext=(0, 9),
                ha="center",
                fontsize=8,
                color="tab:green",
            )
    if baseline is not None:
        axes.axhline(baseline, color="tab:gray", ls="--", lw=1, label=f"baseline {baseline:.1%}{_on(eval_on)}")
        axes.plot([0], [baseline], "s", color="tab:gray", ms=8)
    if final is not None:
        axes.plot([last_step], [final], "*", color="tab:red", ms=16, label=f"final (merged) {final:.1%}{_on(eval_on)}")


def _frame(axes: Any, values: list[float], last_step: int, title: str) -> None:
    """Axis labels, a percent scale, and limits that keep every point (the final star too) inside the frame."""
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    axes.set_xlabel("training step")
    axes.set_ylabel("success rate")
    axes.yaxis.set_major_formatter(PercentFormatter(1.0))
    top = min(1.0, max(values, default=1.0) + 0.12)  # room above the highest point for its marker and label
    axes.set_ylim(-0.04, max(top, 0.2) + 0.04)
    pad = max(0.6, 0.04 * last_step)  # a marker at the last step (the final star) stays inside the frame
    axes.set_xlim(-pad, max(last_step, 1) + pad)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    axes.grid(alpha=0.3)
    axes.set_title(title)
    axes.legend(loc="best", fontsize=8)


def plot_learning_curve(
    history: Mapping[str, Series],
    out_dir: str | os.PathLike,
    baseline: float | None = None,
    final: float | None = None,
    title: str = "Success by training step",
    *,
    greedy_on: str | None = None,
    eval_on: str | None = None,
    greedy_baseline: float | None = None,
) -> tuple[Path, Path]:
    """Write ``learning_curve.png`` and ``learning_curve.md`` into ``out_dir``; returns both paths.

    The legend names the mazes each series was measured on (``greedy_on``, ``eval_on``).
    ``greedy_baseline`` (the baseline eval's success on the mazes the greedy evals play) starts
    the greedy line at step 0."""
    import matplotlib  # a second to import: only when a curve is drawn

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    history = with_baseline_point(history, greedy_baseline)
    points = list(history.get(SAMPLED_KEY, [])) + list(history.get(GREEDY_KEY, []))
    last_step = max([s for s, _ in points], default=0)
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=110)
    _plot_series(axes, history, baseline, final, last_step, greedy_on, eval_on)
    values = [v for _, v in points] + [v for v in (baseline, final) if v is not None]
    _frame(axes, values, last_step, title)
    figure.tight_layout()
    png, markdown = out_dir / "learning_curve.png", out_dir / "learning_curve.md"
    image = io.BytesIO()
    figure.savefig(image, format="png")
    write_bytes(png, image.getvalue())
    write_text(markdown, curve_table(history, baseline, final, greedy_on=greedy_on, eval_on=eval_on))
    plt.close(figure)
    return png, markdown


def log_learning_curve(
    tracking_uri: str,
    run_id: str,
    out_dir: str | os.PathLike,
    *,
    train_run_id: str | None = None,
    metrics_jsonl: str | os.PathLike | None = None,
    baseline: float | None = None,
    final: float | None = None,
    greedy_on: str | None = None,
    eval_on: str | None = None,
    greedy_baseline: float | None = None,
) -> tuple[Path, Path]:
    """Plot from the train run's MLflow history (or ``metrics_jsonl``), write into ``out_dir``, log to ``run_id``.

    ``metrics_jsonl`` wins when given (it is complete even when MLflow missed steps);
    otherwise ``train_run_id`` (default: ``run_id``) is read from MLflow. The files land in
    the run's artifacts under ``learning_curve/``.
    """
    if metrics_jsonl is not None:
        history = history_from_jsonl(metrics_jsonl)
    else:
        history = history_from_mlflow(tracking_uri, train_run_id or run_id)
    png, markdown = plot_learning_curve(
        history, out_dir, baseline, final, greedy_on=greedy_on, eval_on=eval_on, greedy_baseline=greedy_baseline
    )
    client = client_for(tracking_uri)
    for path in (png, markdown):
        client.log_artifact(run_id, str(path), "learning_curve")
    return png, markdown
