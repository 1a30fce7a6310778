"""Learning curve: history from metrics.jsonl or MLflow, PNG + markdown, baseline and final marked."""

import json
import time

import numpy as np
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from PIL import Image

from mazerl import paths
from mazerl.tracking import curves, lineage

TAB_RED = np.array([214, 39, 40])  # matplotlib's tab:red, the final-eval star


def red_pixels(path):
    image = np.asarray(Image.open(path).convert("RGB")).astype(int)
    return int((np.abs(image - TAB_RED).sum(-1) < 30).sum())


def test_jsonl_history_keeps_the_last_value_of_a_redone_step(tmp_path):
    # given a metrics file where step 2 was logged, lost in a crash and redone, and a cut-off last line
    lines = [
        {"step": 1, "train/success_rate": 0.1},
        {"step": 2, "train/success_rate": 0.2, "eval/success_rate": 0.15},
        {"step": 2, "train/success_rate": 0.25, "eval/success_rate": 0.3},
        {"step": 3, "train/success_rate": 0.4},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 4, "train/succ')
    history = curves.history_from_jsonl(path)
    assert history["train/success_rate"] == [(1, 0.1), (2, 0.25), (3, 0.4)]
    assert history["eval/success_rate"] == [(2, 0.3)]


def test_corrupt_line_in_the_middle_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2 is not JSON"):
        curves.history_from_jsonl(path)


def test_plot_and_table(tmp_path):
    history = {
        "train/success_rate": [(step, step / 60) for step in range(1, 61)],
        "eval/success_rate": [(20, 0.3), (40, 0.5), (60, 0.6)],
    }
    png, markdown = curves.plot_learning_curve(
        history, tmp_path / "with", baseline=0.2, final=0.62, greedy_baseline=0.2
    )
    bare, _ = curves.plot_learning_curve(history, tmp_path / "without")
    assert Image.open(png).size == (880, 495)
    assert red_pixels(png) > 50 and red_pixels(bare) == 0, "the final eval should be marked with a red star"
    assert red_pixels(png) > 0.8 * red_pixels_of_a_whole_star(tmp_path), "the star at the last step is not cut off"
    table = markdown.read_text()
    assert "baseline eval (before training): **0.200**" in table
    assert "final eval (merged model): **0.620** (+0.420)" in table
    rows = [line for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) <= curves.MAX_TABLE_ROWS + 4, "long runs are subsampled"
    assert "| 40 | 0.667 | 0.500 |" in rows and rows[-1] == "| 60 | 1.000 | 0.600 |", (
        "eval steps and the last step stay"
    )
    assert rows[0] == "| 0 |  | 0.200 |", "the greedy series starts at step 0 with the baseline"


def red_pixels_of_a_whole_star(tmp_path):
    """The red pixels of the final star drawn mid-frame (a curve whose last step is far right of the star)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=110)
    axes.plot([30], [0.62], "*", color="tab:red", ms=16)
    axes.set_xlim(0, 60)
    axes.set_ylim(-0.04, 1.04)
    figure.savefig(tmp_path / "star.png")
    plt.close(figure)
    return red_pixels(tmp_path / "star.png")


def test_the_curve_says_which_mazes_each_series_was_measured_on(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to read its legend
    history = {"train/success_rate": [(1, 0.1), (2, 0.2)], "eval/success_rate": [(2, 0.3)]}
    _, markdown = curves.plot_learning_curve(
        history,
        tmp_path,
        baseline=0.25,
        final=0.4,
        greedy_on="the first 64 of the 256 mazes of maze256-small-v1",
        eval_on="256 mazes of maze256-small-v1",
    )
    legend = [text.get_text() for text in figures[0].axes[0].get_legend().get_texts()]
    assert "greedy eval on the first 64 of the 256 mazes of maze256-small-v1" in legend, legend
    assert "baseline 25.0% on 256 mazes of maze256-small-v1" in legend, legend
    table = markdown.read_text()
    assert "greedy eval during training on the first 64 of the 256 mazes of maze256-small-v1" in table
    assert "baseline eval (before training) on 256 mazes of maze256-small-v1: **0.250**" in table


def test_log_learning_curve_from_the_train_run(mlflow_root, tmp_path):
    uri = paths.mlflow_db_uri(mlflow_root)
    runs = lineage.start_pipeline_run(uri)
    now = int(time.time() * 1000)
    metrics = [Metric("train/success_rate", 0.1 * step, now + step, step) for step in range(1, 4)]
    metrics.append(Metric("eval/success_rate", 0.25, now, 3))
    MlflowClient(uri).log_batch(runs.run_id("train"), metrics=metrics)
    png, markdown = curves.log_learning_curve(
        uri, runs.parent_run_id, tmp_path / "curve", train_run_id=runs.run_id("train"), baseline=0.1, final=0.3
    )
    logged = mlflow_root / "mlartifacts" / runs.parent_run_id / "artifacts" / "learning_curve"
    assert (logged / "learning_curve.png").read_bytes() == png.read_bytes()
    assert "| 3 | 0.300 | 0.250 |" in (logged / "learning_curve.md").read_text()
