"""Training progress: the ``step N/M:`` line both backends print, and who reads it.

The SkyRL side is checked against a job log captured from SkyRL 0.4.0's real tracking module
(``tests/data/skyrl_mlflow_job_log.txt``, written by ``scripts/skyrl_progress_capture.py``):
with ``trainer.logger=mlflow`` SkyRL prints no step line itself, only our tracker wiring does.
The watchdog tests run real jobs on the session's local Ray head that replay that log.
"""

from __future__ import annotations

import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from mazerl.cluster.errors import RetryableJobError
from mazerl.cluster.jobs.spec import JobSpec
from mazerl.cluster.jobs.submitter import RayJob
from mazerl.progress import annotate_step_line, parse_step_line, step_line
from mazerl.training import checkpoints
from mazerl.training.progress import TrainingProgress, tracker_hook

CAPTURED = Path(__file__).parent / "data" / "skyrl_mlflow_job_log.txt"


def captured_lines() -> list[str]:
    return [line for line in CAPTURED.read_text().splitlines() if not line.startswith("#")]


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("step 3/4: reward 0.500 success 0.250 loss +0.0100 (2.1s: rollout 1.0s, update 1.1s)", (3, 4)),
        ("\x1b[36m(train_in_ray_task pid=7)\x1b[0m step 12/160: reward 0.300", (12, 160)),
        ("2026-01-01 INFO | Resuming from global_step: 40", None),  # SkyRL's one-time resume line
        ("[skyrl_entry] datasets: a and b; resuming after step 40", None),
        ("checkpoint step 3 -> /shared/runs/r/checkpoints/global_step_3 (0.2s)", None),
        ("trainer/global_step 3/4: not ours", None),
        ("Training Batches Processed:  10%|#         | 16/160", None),  # SkyRL's tqdm bar
    ],
)
def test_only_the_step_line_counts_as_progress(line, parsed):
    assert parse_step_line(line) == parsed


def test_the_skyrl_job_log_captured_from_its_real_tracking_module_moves_the_progress():
    # given the log of a job whose task logged 4 steps through SkyRL's own Tracking(backend="mlflow"),
    lines = captured_lines()
    assert any("train_in_ray_task pid=" in line for line in lines), "the capture is a Ray job's log"
    progress = TrainingProgress(total_steps=None)
    seen = []
    # when the submitter feeds it line by line,
    for line in lines:
        progress.feed(line)
        if progress() is not None and (not seen or seen[-1] != progress()):
            seen.append(progress())
    # then progress rises step by step to the last one, and the artifact's fraction reaches 100%.
    assert seen == [3, 4, 5, 6], seen
    assert progress.total == 6 and progress.fraction == 1.0


def test_tracker_hook_reports_finished_steps_only_after_skyrl_logged_them():
    logged, printed = [], []
    log = tracker_hook(lambda data, step, commit=False: logged.append((step, commit, dict(data))), 10, printed.append)
    log({"eval/all/environment/solved": 0.5}, 4, commit=True)  # an eval-only payload
    assert printed == [] and logged == [(4, True, {"eval/all/environment/solved": 0.5})]
    log({"trainer/global_step": 4, "train/reward_mean": 0.25, "train/success_rate": 0.125}, 4, commit=True)
    assert printed == ["step 4/10: reward 0.250 success 0.125; 00:00 elapsed, ? left"] and len(logged) == 2
    assert parse_step_line(printed[0]) == (4, 10)


def test_step_line_reads_back_with_and_without_metrics():
    assert parse_step_line(step_line(7, 9, {})) == (7, 9)
    assert step_line(1, 2, {"train/step_seconds": 3.25}) == "step 1/2: (3.2s)"


def test_a_periodic_eval_step_line_shows_its_result_beside_the_baseline_and_the_run_time_left():
    # Given the step line of a step that ran a periodic greedy eval (as the trainer prints it),
    metrics = {"train/reward_mean": 0.5, "train/success_rate": 0.25, "eval/success_rate": 0.1875}
    line = step_line(25, 100, metrics, "02:00 elapsed, 06:00 left")
    assert "greedy eval 18.8%" in line and parse_step_line(line) == (25, 100)
    # when the train stage annotates it with the baseline and the whole run's time left,
    seen = []

    def total_left(training_left):
        seen.append(training_left)
        return "about 07:30 left in total"

    shown = annotate_step_line(f"(pid=7) {line}", baseline=0.27, total_left=total_left)
    # then the eval reads next to the baseline, and the training's own time left feeds the total.
    assert "greedy eval 18.8% (baseline 27.0%)" in shown, shown
    assert shown.endswith("06:00 left; about 07:30 left in total") and seen == [360.0]
    # A step without an eval, a "?" time left and any other line are left as they are or get None.
    assert annotate_step_line(step_line(1, 2, {}, "00:01 elapsed, ? left"), baseline=0.3, total_left=total_left)
    assert seen[-1] is None
    assert (
        annotate_step_line("checkpoint step 3 -> /x", baseline=0.3, total_left=total_left) == "checkpoint step 3 -> /x"
    )


def test_checkpoint_marker_counts_when_the_directory_is_visible(tmp_path):
    progress = TrainingProgress(tmp_path, total_steps=8)
    assert progress() is None and progress.fraction is None
    (tmp_path / checkpoints.MARKER).write_text("4")
    assert progress() == 4 and progress.fraction == 0.5
    progress.feed("step 5/8: reward 0.1")
    assert progress() == 5, "the larger of the logged step and the marker"
    (tmp_path / checkpoints.MARKER).write_text("garbage")
    assert progress() == 5, "an unreadable marker is no news, not a crash"


# --- the watchdog on real jobs that replay the captured SkyRL log ---------------------------

REPLAY = textwrap.dedent(
    r"""
    import re, sys, time
    lines = [l for l in open(sys.argv[1]).read().splitlines() if not l.startswith("#")]
    gap_s, stall_after = float(sys.argv[2]), int(sys.argv[3])
    for line in lines:
        step = re.search(r"\bstep (\d+)/", line)
        if step and int(step.group(1)) > stall_after:
            break
        print(line, flush=True)
        time.sleep(gap_s if step else 0.0)
    else:
        sys.exit(0)
    # stalled: still alive and talking (SkyRL's loguru, Ray, MLflow lines), but no step finishes
    while True:
        print("(train_in_ray_task pid=1) INFO | Started: 'generate'", flush=True)
        time.sleep(0.3)
    """
)


@pytest.fixture(scope="module")
def replay_script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("replay") / "replay.py"
    path.write_text(REPLAY)
    return path


def replay_job(head, script: Path, gap_s: float, stall_after: int, hang_timeout_s: float) -> RayJob:
    return RayJob(
        head.address,
        JobSpec(
            f"{sys.executable} {script} {CAPTURED} {gap_s} {stall_after}",
            pipeline_run_id=f"p{uuid.uuid4().hex[:10]}",
            attempt=1,
        ),
        headers=head.auth_headers(),
        log=lambda _line: None,
        hang_timeout_s=hang_timeout_s,
        progress_probe=TrainingProgress(),
        poll_s=0.25,
    )


def test_watchdog_keeps_a_skyrl_job_whose_steps_advance_slower_than_the_timeout_in_total(local_ray_head, replay_script):
    # given a job whose 4 steps take 1.5 s each (6 s in all) and a 4 s hang timeout,
    running = replay_job(local_ray_head, replay_script, gap_s=1.5, stall_after=99, hang_timeout_s=4.0)
    # when it runs to its end, then the watchdog lets it: every step line reset the clock.
    with running:
        outcome = running.wait()
    assert outcome.status == "SUCCEEDED"
    assert running.progress_probe() == 6


def test_watchdog_stops_a_skyrl_job_whose_steps_stall_while_its_log_keeps_talking(local_ray_head, replay_script):
    from ray.job_submission import JobSubmissionClient

    # given a job that finishes steps 3 and 4, then keeps printing but finishes no step,
    running = replay_job(local_ray_head, replay_script, gap_s=0.2, stall_after=4, hang_timeout_s=3.0)
    started = time.monotonic()
    # when the hang timeout passes, then it is stopped and reported retryable, naming the last step.
    with pytest.raises(RetryableJobError, match="hung") as caught, running:
        running.wait()
    assert "last progress: 4" in str(caught.value), str(caught.value)
    assert time.monotonic() - started < 60
    client = JobSubmissionClient(local_ray_head.address, headers=local_ray_head.auth_headers())
    assert str(client.get_job_status(running.submission_id)) == "STOPPED"


def test_progress_lines_say_done_total_and_the_time_left_from_the_measured_rate():
    from mazerl.progress import ProgressMeter

    # Given a resumed piece of work (4 of 10 steps done before) on a clock we move by hand,
    now = [100.0]
    meter = ProgressMeter(10, "step", done=4, clock=lambda: now[0])
    # when nothing was done yet in this process, the time left is unknown, not made up;
    assert meter.text(4) == "4/10 steps, 00:00 elapsed, ? left"
    # when 2 steps took 60 s, the 4 left take 120 s (resumed steps do not count towards the rate),
    now[0] += 60.0
    assert meter.text(6) == "6/10 steps, 01:00 elapsed, 02:00 left"
    # and a step line that carries the times still reads back for the hang watchdog, as one plain line.
    line = step_line(6, 10, {"train/reward_mean": 0.5}, meter.times(6))
    assert line == "step 6/10: reward 0.500; 01:00 elapsed, 02:00 left"
    assert parse_step_line(line) == (6, 10) and "\r" not in line and "\n" not in line


def test_skyrl_step_lines_carry_the_time_left_from_the_steps_this_attempt_ran():
    printed = []
    log = tracker_hook(lambda data, step, commit=False: None, 10, printed.append)
    for step in (5, 6):  # resumed after step 4
        log({"trainer/global_step": step}, step, commit=True)
    assert printed[0].endswith("; 00:00 elapsed, ? left"), printed
    assert parse_step_line(printed[1]) == (6, 10) and printed[1].endswith(" left"), printed
