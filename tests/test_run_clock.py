"""The ``stage k/7`` lines and the total time left (mazerl.run_clock), from recorded stage times."""

from __future__ import annotations

import json

import pytest

from mazerl.run_clock import STAGES, RunClock, format_seconds, parse_seconds, work_keys

SETTINGS = {"eval_set": "maze256-small-v1", "max_eval_mazes": 16, "eval_workers": 2}
TRAINING = {"run_id": "a", "steps": 10, "learning_rate": 1e-3, "mlflow": {"run_id": "x"}}


def clock(root, run_id="run-a", steps=10, training=TRAINING, started_at=1000.0):
    keys = work_keys(eval_settings=SETTINGS, training=training | {"steps": steps}, base_model="/models/starter")
    return RunClock(root, run_id, keys, steps, started_at)


def test_a_first_run_says_what_it_cannot_estimate_and_the_final_eval_takes_the_baselines_time(tmp_path):
    # Given a data root where nothing was timed yet,
    first = clock(tmp_path)
    assert first.stage_line("prepare").startswith("stage 1/7 prepare: ")
    assert first.stage_line("prepare").endswith(
        "time left not known yet (the first run of this work here; the stages will say)"
    )
    # when the baseline eval took 90 s, the final eval (same mazes and settings) is expected to as well,
    first.record("baseline_eval", 90.0)
    assert first.estimate("final_eval") == 90.0
    seconds, unknown = first.total_left("train", stage_left=600.0)
    assert seconds == 690.0 and unknown == ["merge_lora"], "promote takes seconds: never a reason for 'unknown'"
    assert first.left_text("train", 600.0) == "about 11:30 left in total (+ merge_lora: not timed here before)"


def test_the_next_run_of_the_same_work_is_estimated_from_the_last_one_training_scaled_by_its_steps(tmp_path):
    first = clock(tmp_path)
    for stage, seconds in zip(STAGES, (5, 10, 60, 200, 30, 60, 5), strict=True):
        first.record(stage, seconds)
    # a second run with twice the steps of the same training settings, and a baseline from the cache,
    second = clock(tmp_path, run_id="run-b", steps=20, training=TRAINING | {"run_id": "b", "mlflow": {"run_id": "y"}})
    second.record("baseline_eval", 0.5, same_work=False)
    assert second.estimate("train") == pytest.approx(400.0), "20 steps at the 20 s per step measured before"
    assert second.estimate("final_eval") == 60.0, "a cached baseline is no measure of an eval: the last one counts"
    assert second.total_left("train") == (pytest.approx(400 + 30 + 60 + 5), [])
    assert second.stage_line("train") == "stage 4/7 train: " + second.stage_line("train").split(": ", 1)[1]
    # and other training settings are not taken for the same work.
    other = clock(tmp_path, run_id="run-c", training=TRAINING | {"learning_rate": 5e-4})
    assert other.estimate("train") is None and other.estimate("merge_lora") == 30.0
    recorded = json.loads((tmp_path / "stage_times.json").read_text())
    assert recorded["stages"]["train"][second.keys["train"]] == 20.0, "kept per step"


@pytest.mark.parametrize(("text", "seconds"), [("14:03", 843.0), ("2:15:24", 8124.0), ("?", None), ("soon", None)])
def test_times_read_as_the_step_lines_write_them(text, seconds):
    assert parse_seconds(text) == seconds
    if seconds is not None:
        assert format_seconds(seconds).lstrip("0") == text.lstrip("0")


def test_a_stage_progress_line_gets_the_runs_total_time_left(tmp_path):
    running = clock(tmp_path)
    running.record("merge_lora", 30.0)
    line = "eval: 37/256 mazes, 00:20 elapsed, 01:10 left"
    # the final eval's own 70 s, then merge_lora is done already; promote was never timed (seconds)
    assert running.with_total_left(line, "final_eval") == f"{line}; about 01:10 left in total"
    assert running.with_total_left("eval done: 12/16 solved", "final_eval") == "eval done: 12/16 solved"
