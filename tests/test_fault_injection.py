"""Fault injection with real processes: training killed at seeded random points, killed at the exact
points between a checkpoint and its metrics row (checkpoint interval 2, metrics in metrics.jsonl and
MLflow exactly once), a second trainer started on a run directory another trainer holds, a full or
read-only disk at checkpoint time (the OS error simulated), the flow process killed while its Ray
job trains and the flow run retried, and the Ray head gone when a stage starts.

The tiny training config is the one of tests/test_local_trainer.py: seconds per step on the
reduced starter, CPU, one torch thread, so resumed runs can be compared bit for bit.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mazerl.training import checkpoints
from mazerl.training.config import TrainConfig, save_config
from mazerl.training.local_trainer import LocalGRPOTrainer
from mazerl.training.recipes import MINIATURE_TRAINING

pytestmark = pytest.mark.slow  # training runs killed and resumed, flow runs retried

PROJECT = Path(__file__).resolve().parents[1]


def tiny_config(root, model_dir, **overrides) -> TrainConfig:
    """Seconds per step: 1 maze x 2 samples, 3-move episodes, sampling warm enough to vary rewards."""
    values = {
        "run_id": "r",
        "data_root": str(root),
        "base_model": str(model_dir),
        "eval_set": "maze256-small-v1",
        **MINIATURE_TRAINING,
        "steps": 3,
        "checkpoints_kept": 2,
    }
    return TrainConfig.model_validate(values | overrides)


def adapter(config: TrainConfig) -> dict[str, torch.Tensor]:
    latest = checkpoints.latest(config.checkpoint_dir)
    return load_file(str(latest.adapter_dir / "adapter_model.safetensors"))


def jsonl_steps(config: TrainConfig) -> list[int]:
    path = config.run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


# --------------------------------------------------------------------------------------
# (a) The training job killed at seeded random points: rollout, optimizer step, checkpoint write
# --------------------------------------------------------------------------------------

# Test instrumentation, run in the training process: the entry point as the Ray job runs it, with
# a line "PHASE <name> <step>" when a phase begins and a pause inside the optimizer step and the
# checkpoint write, so that a kill lands inside them (nothing is persisted mid-phase either way).
PHASES_WRAPPER = textwrap.dedent(
    """
    import sys, time
    import torch
    from mazerl.training import checkpoints, local_entry
    from mazerl.training.local_trainer import LocalGRPOTrainer

    PAUSE_S = float(sys.argv[1])
    current = {"step": 0}

    def announce(phase):
        print(f"PHASE {phase} {current['step']}", flush=True)

    rollout = LocalGRPOTrainer._rollout
    def announced_rollout(self, step):
        current["step"] = step
        announce("rollout")
        return rollout(self, step)
    LocalGRPOTrainer._rollout = announced_rollout

    build = LocalGRPOTrainer._build
    def build_with_paused_optimizer(self, resume_from):
        build(self, resume_from)
        step = self.optimizer.step
        def paused_step(*args, **kwargs):
            announce("optimizer")
            time.sleep(PAUSE_S)
            return step(*args, **kwargs)
        self.optimizer.step = paused_step
    LocalGRPOTrainer._build = build_with_paused_optimizer

    save = checkpoints.save
    def slow_save(root, step, write, keep, **kwargs):
        def write_slowly(path):
            announce("checkpoint")
            real = torch.save
            def paused_save(*args, **kwargs):
                time.sleep(PAUSE_S / 3)  # four files: the write takes about 4/3 PAUSE_S
                return real(*args, **kwargs)
            torch.save = paused_save
            try:
                write(path)
            finally:
                torch.save = real
        return save(root, step, write_slowly, keep, **kwargs)
    checkpoints.save = slow_save

    sys.exit(local_entry.main(sys.argv[2:]))
    """
)
PAUSE_S = 1.0


def kill_plan(seed: int, kills: int, steps: int) -> list[tuple[str, int, int, float]]:
    """(phase, step, occurrence of the phase in that step, delay after it began) per kill, from one seed.

    Kill steps are distinct and increasing, so every launch gets further than the last; each
    phase is hit once per three kills, in a seeded order. A step runs the optimizer twice
    (update_epochs=2), so an optimizer kill picks one of the two.
    """
    rng = random.Random(seed)
    phases = ["rollout", "optimizer", "checkpoint"]
    rng.shuffle(phases)
    plan = []
    for i, step in enumerate(sorted(rng.sample(range(2, steps), kills))):
        phase = phases[i % len(phases)]
        occurrence = rng.randint(1, 2) if phase == "optimizer" else 1
        window = 0.2 if phase == "rollout" else PAUSE_S  # a tiny rollout lasts a fraction of a second
        plan.append((phase, step, occurrence, rng.uniform(0.0, window)))
    return plan


def launch(command: list[str]) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI")}
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=PROJECT, bufsize=1
    )


def test_training_killed_at_seeded_random_points_completes_exactly_like_an_uninterrupted_run(
    tmp_path, starter_model_dir
):
    # Given a 6-step run and three SIGKILLs planned from seed 7 (one per phase in a random order, at
    # random increasing steps, a random delay into it: checkpoint step 2, rollout 4, optimizer 5 or later),
    config = tiny_config(tmp_path / "killed", starter_model_dir, steps=6)
    config_path = save_config(config, tmp_path / "train.json")
    wrapper = tmp_path / "phases.py"
    wrapper.write_text(PHASES_WRAPPER)
    command = [sys.executable, str(wrapper), str(PAUSE_S), "--config", str(config_path)]
    plan = kill_plan(seed=7, kills=3, steps=6)
    assert {phase for phase, *_ in plan} == {"rollout", "optimizer", "checkpoint"}
    killed_at: list[tuple[str, int, int | None]] = []  # (phase, step, marker after the kill)

    # when each launch is killed as planned and then started again,
    for phase, step, occurrence, delay in plan:
        marker_before = checkpoints.read_marker(config.checkpoint_dir)
        step = max(step, (marker_before or 0) + 1)
        proc, seen, killed, first_rollout = launch(command), 0, False, None
        for line in proc.stdout:
            if not line.startswith("PHASE "):
                continue
            _, name, at = line.split()
            first_rollout = first_rollout or (int(at) if name == "rollout" else None)
            seen += name == phase and int(at) >= step  # a step whose rewards all tie has no optimizer phase
            if seen == occurrence:
                step = int(at)
                time.sleep(delay)
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
                break
        proc.wait(timeout=60)
        assert killed, f"the launch ended before a {phase} phase at step >= {step} (plan {plan})"
        # then each launch resumed right after the marker's step, and the marker only ever names a
        # complete checkpoint (latest() verifies its files): never the one being written when killed,
        latest = checkpoints.latest(config.checkpoint_dir)
        marker = latest.step if latest else None
        assert first_rollout == (marker_before or 0) + 1, f"launch resumed at {first_rollout}, marker {marker_before}"
        assert marker == step - 1, f"killed in the {phase} phase of step {step}: marker {marker}"
        killed_at.append((phase, step, marker))

    # and the last launch completes the run,
    final = launch(command)
    output = final.communicate(timeout=600)[0]
    assert final.returncode == 0, output[-3000:]
    resumed_from = killed_at[-1][2]
    if resumed_from:
        assert f"resumed from step {resumed_from}" in output
    # every completed step is kept and none is trained twice (one metrics line per step, in order),
    assert checkpoints.read_marker(config.checkpoint_dir) == 6
    assert jsonl_steps(config) == [1, 2, 3, 4, 5, 6], f"metrics.jsonl steps after kills {killed_at}"
    assert not list(config.checkpoint_dir.glob(".global_step_*")), "no half-written checkpoint is left behind"
    # and the final adapter equals an uninterrupted run's, bit for bit.
    straight = tiny_config(tmp_path / "straight", starter_model_dir, steps=6)
    LocalGRPOTrainer(straight, log=lambda _: None).run()
    a, b = adapter(straight), adapter(config)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"adapters differ after {killed_at}"


# --------------------------------------------------------------------------------------
# (a2) Killed at the exact points between a checkpoint and its metrics row (interval 2)
# --------------------------------------------------------------------------------------

# The entry point as the Ray job runs it, killing itself (SIGKILL) at one exact point of one step:
#   marker:N  right after checkpoint N's marker moved, before step N's metrics row is appended;
#   rename:N  after checkpoint N's directory was renamed into place, before the marker moves;
#   update:N  inside the optimizer step of step N (mid-update).
KILL_AT_WRAPPER = textwrap.dedent(
    """
    import os, signal, sys
    from mazerl.training import checkpoints, local_entry
    from mazerl.training.local_trainer import LocalGRPOTrainer

    point, at = sys.argv[1].split(":")
    at = int(at)
    current = {"step": 0}

    def die():
        print(f"KILLED {point}:{at}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    write_marker = checkpoints.write_text  # mazerl.atomic.write_text, as the checkpoints module calls it
    def kill_around_the_marker(path, text, **kwargs):
        if path.name == checkpoints.MARKER and text == str(at) and point == "rename":
            die()  # the directory global_step_<at> is in place; the marker still names the previous step
        write_marker(path, text, **kwargs)
        if path.name == checkpoints.MARKER and text == str(at) and point == "marker":
            die()  # the marker names step <at>; its metrics row is not in metrics.jsonl yet
    checkpoints.write_text = kill_around_the_marker

    rollout = LocalGRPOTrainer._rollout
    def tracked_rollout(self, step):
        current["step"] = step
        return rollout(self, step)
    LocalGRPOTrainer._rollout = tracked_rollout

    build = LocalGRPOTrainer._build
    def build_with_a_deadly_optimizer_step(self, resume_from):
        build(self, resume_from)
        step = self.optimizer.step
        def deadly_step(*args, **kwargs):
            if point == "update" and current["step"] == at:
                die()
            return step(*args, **kwargs)
        self.optimizer.step = deadly_step
    LocalGRPOTrainer._build = build_with_a_deadly_optimizer_step

    sys.exit(local_entry.main(sys.argv[2:]))
    """
)


def test_kills_between_a_checkpoint_and_its_metrics_row_leave_every_step_logged_exactly_once(
    tmp_path, starter_model_dir, mlflow_root
):
    from mlflow.tracking import MlflowClient

    from mazerl.paths import mlflow_db_uri

    # Given a 6-step run with a checkpoint every 2 steps, logging to MLflow and metrics.jsonl,
    uri = mlflow_db_uri(mlflow_root)
    client = MlflowClient(uri)
    mlflow_run = client.create_run(client.create_experiment("kills")).info.run_id
    config = tiny_config(
        tmp_path / "killed",
        starter_model_dir,
        steps=6,
        checkpoint_interval=2,
        mlflow={"tracking_uri": uri, "run_id": mlflow_run},
    )
    config_path = save_config(config, tmp_path / "train.json")
    wrapper = tmp_path / "kill_at.py"
    wrapper.write_text(KILL_AT_WRAPPER)
    # when it is killed after checkpoint 2's marker moved (step 2's row not yet appended), then after
    # checkpoint 4's directory was renamed but before its marker (step 3 already logged, so redone),
    # then inside step 5's optimizer step, and each time started again,
    plan = [("marker:2", 2, [1]), ("rename:4", 2, [1, 2, 3]), ("update:5", 4, [1, 2, 3, 4])]
    for kill_at, marker, logged in plan:
        proc = launch([sys.executable, str(wrapper), kill_at, "--config", str(config_path)])
        output = proc.communicate(timeout=600)[0]
        assert proc.returncode == -signal.SIGKILL and f"KILLED {kill_at}" in output, output[-3000:]
        # then the marker names only what was complete, and no step is in metrics.jsonl twice,
        assert checkpoints.read_marker(config.checkpoint_dir) == marker, f"after the kill at {kill_at}"
        assert jsonl_steps(config) == logged, f"metrics.jsonl after the kill at {kill_at}"
    final = launch([sys.executable, str(wrapper), "none:0", "--config", str(config_path)])
    output = final.communicate(timeout=600)[0]
    assert final.returncode == 0 and "resumed from step 4" in output, output[-3000:]
    # and in the end every step's row is in metrics.jsonl once, in order (step 2's replayed from its
    # checkpoint, step 3's first row kept when it was redone),
    assert jsonl_steps(config) == [1, 2, 3, 4, 5, 6]
    # and MLflow holds every metric of every step exactly once.
    rows = [json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()]
    for key in ("train/reward_mean", "train/policy_loss", "train/step_seconds"):
        steps = sorted(m.step for m in client.get_metric_history(mlflow_run, key))
        assert steps == [1, 2, 3, 4, 5, 6], f"MLflow history of {key}: steps {steps}"
        values = {m.step: m.value for m in client.get_metric_history(mlflow_run, key)}
        assert values == {row["step"]: row[key] for row in rows}, f"MLflow and metrics.jsonl agree on {key}"


# --------------------------------------------------------------------------------------
# (a3) A second trainer started deliberately on the same run directory
# --------------------------------------------------------------------------------------

# The entry point as the Ray job runs it, holding before step 2's rollout until a gate file exists, so that
# a second trainer is sure to meet it mid-run.
GATED_WRAPPER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from mazerl.training import local_entry
    from mazerl.training.local_trainer import LocalGRPOTrainer

    gate = Path(sys.argv[1])
    rollout = LocalGRPOTrainer._rollout
    def gated_rollout(self, step):
        while step == 2 and not gate.exists():
            time.sleep(0.1)
        return rollout(self, step)
    LocalGRPOTrainer._rollout = gated_rollout

    sys.exit(local_entry.main(sys.argv[2:]))
    """
)


def test_a_second_trainer_on_the_same_run_directory_waits_for_the_first_and_trains_nothing_twice(
    tmp_path, starter_model_dir
):
    from mazerl.training import trainer_lock

    # Given a training running (a 3-step run past its first step, held before its second),
    config = tiny_config(tmp_path, starter_model_dir, steps=3)
    config_path = save_config(config, tmp_path / "train.json")
    wrapper, gate = tmp_path / "gated.py", tmp_path / "gate"
    wrapper.write_text(GATED_WRAPPER)
    first = launch([sys.executable, str(wrapper), str(gate), "--config", str(config_path)])
    first_lines = []
    for line in first.stdout:
        first_lines.append(line)
        if line.startswith("step 1/3"):
            break
    assert first.poll() is None, "".join(first_lines)[-3000:]
    # when a second trainer is started on the same config (as a retry whose first job's process was orphaned),
    second = launch([sys.executable, "-m", "mazerl.training.local_entry", "--config", str(config_path)])
    second_lines = []
    for line in second.stdout:
        second_lines.append(line)
        if "waiting for the trainer" in line:
            break
    # then it waits for the first one, naming its pid and how to stop it, before reading any checkpoint,
    waiting = second_lines[-1]
    assert f"pid {first.pid} on" in waiting and f"kill {first.pid}" in waiting, "".join(second_lines)[-3000:]
    time.sleep(2)
    assert second.poll() is None and jsonl_steps(config) == [1], "the second trainer wrote nothing while it waited"
    # and once the first one finishes, the second takes over, finds the run complete and trains nothing again.
    gate.touch()
    rest_of_first = first.communicate(timeout=600)[0]
    assert first.returncode == 0, rest_of_first[-3000:]
    output = second.communicate(timeout=600)[0]
    assert second.returncode == 0 and "already complete at step 3" in output, output[-3000:]
    assert jsonl_steps(config) == [1, 2, 3], "every step was trained and logged once"
    assert trainer_lock.lock_path(config.run_dir).is_file(), "the lock file stays; the lock died with its holder"


# --------------------------------------------------------------------------------------
# (b) Disk full / read-only data root at checkpoint time (the OS error is simulated)
# --------------------------------------------------------------------------------------

SIMULATED_ERRORS = {
    "ENOSPC": lambda path: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)),
    "EROFS": lambda path: OSError(errno.EROFS, os.strerror(errno.EROFS), str(path)),
    # what torch.save itself raises on a full tmpfs (seen on this machine): no errno, no path
    "torch-full-disk": lambda path: RuntimeError(
        "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"
    ),
}


# what each simulated failure makes of the training job: a full disk pauses it (exit 3, never retried),
# anything else is an infrastructure failure, retried (exit 1)
OUTCOMES = {
    "ENOSPC": (3, "training paused: the disk under", "run the same command again: the marker still names step 1"),
    "EROFS": (1, "training failed: could not write checkpoint step 2", "Free space or make"),
    "torch-full-disk": (1, "training failed: could not write checkpoint step 2", "Free space or make"),
}


@pytest.mark.parametrize("kind", list(SIMULATED_ERRORS))
def test_simulated_checkpoint_write_error_is_clear_and_the_retry_resumes_from_the_previous_one(
    tmp_path, starter_model_dir, monkeypatch, capsys, kind
):
    """A checkpoint write failing with a simulated OS error says so clearly, keeps the previous
    checkpoint, and the retry succeeds from it."""
    from mazerl.training import local_entry

    config = tiny_config(tmp_path, starter_model_dir, steps=2)
    config_path = save_config(config, tmp_path / "train.json")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    real_save = torch.save
    full = {"on": True}

    def save_on_a_full_disk(obj, f, *args, **kwargs):
        if full["on"] and "global_step_2" in str(f):  # the file system fills up during step 2's checkpoint
            raise SIMULATED_ERRORS[kind](f)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_on_a_full_disk)
    # Given the checkpoint write of step 2 failing, when the training entry runs,
    code = local_entry.main(["--config", str(config_path)])
    out = capsys.readouterr().out
    exit_code, opening, fix = OUTCOMES[kind]
    failure = [line for line in out.splitlines() if line.startswith(opening.split(":")[0])]
    # then it exits with the failure's code (a full disk pauses, never retried) and one clear line naming
    # the checkpoint directory, the free space and the fix, without a traceback,
    assert code == exit_code and len(failure) == 1, out[-3000:]
    message = failure[0]
    assert message.startswith(opening) and str(config.checkpoint_dir) in message, message
    assert "MiB free" in message and fix in message, message
    assert "Traceback" not in out, out[-3000:]
    # the previous checkpoint is intact and still the one the marker names, nothing half-written is left,
    before = adapter(config)
    assert checkpoints.latest(config.checkpoint_dir).step == 1
    assert (
        not list(config.checkpoint_dir.glob(".global_step_2*"))
        and not (config.checkpoint_dir / "global_step_2").exists()
    )
    # and once space returns, the retry resumes after step 1 and completes.
    full["on"] = False
    assert local_entry.main(["--config", str(config_path)]) == local_entry.EXIT_OK
    out = capsys.readouterr().out
    assert "resumed from step 1" in out and checkpoints.latest(config.checkpoint_dir).step == 2
    step1 = load_file(
        str(checkpoints.step_dir(config.checkpoint_dir, 1) / checkpoints.ADAPTER_SUBDIR / "adapter_model.safetensors")
    )
    assert all(torch.equal(before[k], step1[k]) for k in before), "step 1's checkpoint was not touched"
    assert jsonl_steps(config) == [1, 2], "step 2 is logged once, by the run that completed it"


def test_a_full_disk_at_the_metrics_row_pauses_the_training_and_the_rerun_logs_each_step_once(
    tmp_path, starter_model_dir, monkeypatch, capsys
):
    from mazerl.tracking.metrics import MetricsLogger
    from mazerl.training import local_entry

    config = tiny_config(tmp_path, starter_model_dir, steps=3)
    config_path = save_config(config, tmp_path / "train.json")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    real_log = MetricsLogger.log
    full = {"on": True}

    def log_on_a_full_disk(self, step, metrics):
        if full["on"] and step == 2:  # the disk fills up between step 2's checkpoint and its metrics row
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.jsonl_path))
        return real_log(self, step, metrics)

    monkeypatch.setattr(MetricsLogger, "log", log_on_a_full_disk)
    # Given the metrics row of step 2 failing for a full disk, the training pauses with one line and no traceback,
    assert local_entry.main(["--config", str(config_path)]) == local_entry.EXIT_NO_SPACE
    out = capsys.readouterr().out
    paused = [line for line in out.splitlines() if line.startswith("training paused:")]
    assert len(paused) == 1 and "Traceback" not in out, out[-3000:]
    assert str(config.run_dir) in paused[0] and "the marker still names step 2" in paused[0], paused[0]
    assert jsonl_steps(config) == [1]
    # and once space returns, the same command resumes after step 2, replays its row from the checkpoint,
    # and every step is logged once.
    full["on"] = False
    assert local_entry.main(["--config", str(config_path)]) == local_entry.EXIT_OK
    assert "resumed from step 2" in capsys.readouterr().out
    assert jsonl_steps(config) == [1, 2, 3]


DAMAGED_LATEST = {  # what the issue found, each beside an intact earlier checkpoint
    "truncated adapter weights": lambda root: (
        root / "global_step_3" / checkpoints.ADAPTER_SUBDIR / "adapter_model.safetensors"
    ).write_bytes(b"\x10"),
    "marker naming a step that does not exist": lambda root: (root / checkpoints.MARKER).write_text("999"),
    "half-written (empty) marker": lambda root: (root / checkpoints.MARKER).write_text(""),
}


@pytest.mark.parametrize("kind", list(DAMAGED_LATEST))
def test_the_training_entry_resumes_past_a_damaged_latest_checkpoint_from_the_newest_intact_step(
    tmp_path, starter_model_dir, monkeypatch, capsys, kind
):
    from mazerl.training import local_entry

    config = tiny_config(tmp_path, starter_model_dir, steps=3, checkpoints_kept=3)
    config_path = save_config(config, tmp_path / "train.json")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    assert local_entry.main(["--config", str(config_path)]) == local_entry.EXIT_OK
    capsys.readouterr()
    # Given a finished run whose latest checkpoint (or its marker) was damaged afterwards,
    DAMAGED_LATEST[kind](config.checkpoint_dir)
    # when the training entry runs again, it says what it passes over and resumes from the newest intact step
    # (never a traceback, never an exit code the submitter would retry), and ends with the marker on step 3,
    code = local_entry.main(["--config", str(config_path)])
    out = capsys.readouterr().out
    assert code == local_entry.EXIT_OK and "Traceback" not in out, out[-3000:]
    intact = 2 if kind == "truncated adapter weights" else 3
    assert f"resuming from step {intact}, the newest intact checkpoint" in out, out[-3000:]
    assert checkpoints.latest(config.checkpoint_dir).step == 3
    assert jsonl_steps(config) == [1, 2, 3], "each step logged once"


# --------------------------------------------------------------------------------------
# (c) The flow process killed while its Ray job trains; the crashed flow run retried
# (d) The Ray head gone when a stage starts
# --------------------------------------------------------------------------------------

FOUR_STEPS = MINIATURE_TRAINING | {"steps": 4}
FLOW_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from flows.pipeline import pipeline
    from mazerl.params import PipelineParams
    pipeline(PipelineParams.model_validate(json.loads(sys.argv[1])))
    """
)


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def training_processes(run_root: Path) -> list:
    """The local trainer processes of the run under ``run_root`` (what a kill test kills)."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "mazerl.training.local_entry" in cmdline and str(run_root) in cmdline:
            found.append(process)
    return found


def ray_jobs(head, pipeline_run: str | None = None, stage: str | None = None) -> list:
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(head.address, headers=head.auth_headers()).list_jobs()
    return [
        job
        for job in jobs
        if (pipeline_run is None or (job.metadata or {}).get("mazerl_pipeline_run") == pipeline_run)
        and (stage is None or (job.metadata or {}).get("mazerl_stage") == stage)
    ]


def test_flow_process_killed_while_training_then_the_retry_resumes_and_logs_each_step_once(
    prefect_api, local_ray_head, mlflow_root, starter_model_dir, tmp_path
):
    """The flow process is killed while its Ray job trains; the retried flow run resumes and logs each
    step once."""
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client

    # A miniature step takes well under a second: with only a few steps the job finished its last one
    # between the kill and the job's stop (CI, 2026-12-07), and the retry had nothing left to resume.
    total_steps = 30
    params = {
        "base_model": str(starter_model_dir),
        "eval_set": "maze256-small-v1",
        "data_root": str(mlflow_root),
        "ray_address": local_ray_head.address,
        "max_eval_mazes": 2,
        "eval_workers": 1,
        "gif_count": 0,
        "training": MINIATURE_TRAINING | {"steps": total_steps, "checkpoint_interval": 2},
    }
    env = os.environ | {
        "PREFECT_API_URL": prefect_api["url"],
        "PREFECT_LOCAL_STORAGE_PATH": str(prefect_api["storage"]),
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "true",
        "PREFECT_LOGGING_LEVEL": "INFO",
        "RAY_AUTH_TOKEN_PATH": str(local_ray_head.token_path),
    }
    script = tmp_path / "flow.py"
    script.write_text(FLOW_SCRIPT)
    first_log, retry_log = tmp_path / "first.log", tmp_path / "retry.log"
    processes: list[subprocess.Popen] = []

    def start(command: list[str], log: Path) -> subprocess.Popen:
        with open(log, "w") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=PROJECT, start_new_session=True
            )
        processes.append(process)
        return process

    try:
        # Given a pipeline flow run in its own process, its training job running on the Ray head,
        first = start([sys.executable, str(script), json.dumps(params)], first_log)
        markers = lambda: list(mlflow_root.glob(f"runs/*/checkpoints/{checkpoints.MARKER}"))  # noqa: E731
        wait_for(lambda: markers() or first.poll() is not None, 600, "the first training checkpoint")
        assert first.poll() is None, f"the flow process ended early:\n{first_log.read_text()[-3000:]}"
        # (the session's head also holds finished jobs of other tests: look at the running ones)
        running = [job for job in ray_jobs(local_ray_head, stage="train") if job.status == "RUNNING"]
        assert len(running) == 1, [(j.submission_id, j.status) for j in running]
        flow_run_id = running[0].metadata["mazerl_pipeline_run"]
        assert checkpoints.read_marker(markers()[0].parent) < total_steps, "killed while steps are left to train"
        # when the flow process is killed (SIGTERM, as `kill`, a Kubernetes eviction or Ctrl-C send it),
        os.kill(first.pid, signal.SIGTERM)
        first.wait(timeout=120)
        # then Prefect itself records the flow run as crashed, and the killed run's job is stopped with it,
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run_id).state
        assert state.is_crashed(), f"{state.type}: {state.message}\n{first_log.read_text()[-3000:]}"
        wait_for(
            lambda: (
                ray_jobs(local_ray_head, pipeline_run=flow_run_id, stage="train")[0].status in ("STOPPED", "FAILED")
            ),
            60,
            "the killed run's training job to stop",
        )
        assert checkpoints.read_marker(markers()[0].parent) < total_steps, (
            f"the killed job finished all {total_steps} steps before it was stopped: nothing to resume"
        )
        # and when the crashed flow run is retried (prefect flow-run retry), it completes:
        retry = start(
            [
                str(Path(sys.executable).parent / "prefect"),
                *("flow-run", "retry", flow_run_id, "--entrypoint", "flows/pipeline.py:pipeline"),
            ],
            retry_log,
        )
        retry.wait(timeout=900)
        output = retry_log.read_text()
        assert retry.returncode == 0, output[-4000:]
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)

    with get_client(sync_client=True) as client:
        assert client.read_flow_run(flow_run_id).state.is_completed()
    # the finished stages were not run again, the training resumed from its checkpoint in a new job,
    assert len(ray_jobs(local_ray_head, pipeline_run=flow_run_id, stage="baseline")) == 1, "baseline not rerun"
    trains = sorted(ray_jobs(local_ray_head, pipeline_run=flow_run_id, stage="train"), key=lambda j: j.start_time)
    assert [job.status for job in trains][-1] == "SUCCEEDED" and len(trains) == 2, [j.status for j in trains]
    assert "resumed from step" in output, output[-4000:]
    # and every step's metrics landed exactly once, in metrics.jsonl and in MLflow.
    metrics = next(mlflow_root.glob("runs/*/metrics.jsonl"))
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == list(range(1, total_steps + 1))
    uri = f"sqlite:///{mlflow_root / 'mlflow.db'}"
    train_runs = MlflowClient(uri).search_runs(
        [e.experiment_id for e in MlflowClient(uri).search_experiments()], "attributes.run_name = 'train'"
    )
    (train_run,) = train_runs  # a fresh MLflow store: this pipeline run's only train run
    history = MlflowClient(uri).get_metric_history(train_run.info.run_id, "train/reward_mean")
    assert sorted(m.step for m in history) == list(range(1, total_steps + 1))


def test_ray_head_gone_when_the_train_stage_starts_is_a_retryable_error_naming_the_address(
    prefect_api, mlflow_root, starter_model_dir
):
    from prefect import flow

    from mazerl.cluster.errors import RetryableJobError
    from mazerl.params import PipelineParams
    from mazerl.paths import mlflow_db_uri
    from mazerl.tracking.lineage import start_pipeline_run
    from tasks.context import RunContext
    from tasks.jobs import retry_on_infrastructure
    from tasks.training import train

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed again: the head is gone
    uri = mlflow_db_uri(mlflow_root)
    runs = start_pipeline_run(uri, flow_run_id="gone-head")
    params = PipelineParams.model_validate(
        {"base_model": str(starter_model_dir), "data_root": str(mlflow_root), "ray_address": address}
        | {"eval_set": "maze256-small-v1", "training": FOUR_STEPS}
    )
    context = RunContext(
        run_id="gone-head",
        flow_run_id="gone-head",
        root=mlflow_root,
        tracking_uri=uri,
        ray_address=address,
        base_model=Path(starter_model_dir),
        eval_set="maze256-small-v1",
        stage_run_ids=runs.stage_run_ids,
        pipeline_run_id=runs.parent_run_id,
        train_config=params.train_config("gone-head", Path(starter_model_dir)),
    )

    @flow
    def stage_alone() -> dict:
        state = train.with_options(retries=0)(context, params, return_state=True)
        error = state.result(raise_on_failure=False)
        return {
            "failed": state.is_failed(),
            "error": f"{type(error).__name__}: {error}",
            "address": getattr(error, "address", None),
            "retried": retry_on_infrastructure(None, None, state),
        }

    # Given the Ray head gone, when the train stage starts,
    outcome = stage_alone()
    # then it fails with a retryable error naming the address, and the stage's retry rule retries it.
    assert outcome["failed"] and outcome["error"].startswith(RetryableJobError.__name__), outcome
    assert outcome["address"] == address and address in outcome["error"], outcome
    assert outcome["retried"] is True, "train's retry condition retries infrastructure failures"
    from mlflow.tracking import MlflowClient

    assert MlflowClient(uri).get_run(runs.run_id("train")).info.status == "FAILED"
