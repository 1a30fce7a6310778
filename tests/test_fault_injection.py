"""Fault injection with real processes: training killed at seeded random points, a full or read-only
disk at checkpoint time (the OS error simulated), the Prefect process killed while training runs,
and the Ray head gone when a stage starts.

The tiny training config is the one of tests/test_local_trainer.py: seconds per step on the
reduced starter, CPU, one torch thread, so resumed runs can be compared bit for bit.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
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

PROJECT = Path(__file__).resolve().parents[1]


def tiny_config(root, model_dir, **overrides) -> TrainConfig:
    """Seconds per step: 1 maze x 2 samples, 3-move episodes, sampling warm enough to vary rewards."""
    values = {
        "run_id": "r",
        "data_root": str(root),
        "base_model": str(model_dir),
        "eval_set": "maze256-small-v1",
        "history_images": 1,
        "max_turns": 3,
        "steps": 3,
        "mazes_per_step": 1,
        "train_pool_size": 8,
        "checkpoint_interval": 1,
        "checkpoints_kept": 2,
        "torch_threads": 1,
        "lora": {"rank": 4, "alpha": 8},
        "grpo": {"samples_per_maze": 2, "max_new_tokens": 8, "temperature": 0.7, "format_bonus": 1.0},
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
    def slow_save(root, step, write, keep):
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
        return save(root, step, write_slowly, keep)
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


@pytest.mark.parametrize("kind", list(SIMULATED_ERRORS))
def test_checkpoint_write_failing_with_simulated_os_error_is_clear_keeps_the_previous_checkpoint_and_retry_succeeds(
    tmp_path, starter_model_dir, monkeypatch, capsys, kind
):
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
    failure = [line for line in capsys.readouterr().out.splitlines() if line.startswith("training failed")]
    # then it exits retryable (1) with one clear line naming the checkpoint directory and the fix,
    assert code == local_entry.EXIT_FAILURE and failure, "a full disk is an infrastructure failure, retried"
    message = failure[-1]
    assert str(config.checkpoint_dir) in message and "could not write checkpoint step 2" in message, message
    assert "MiB free there" in message and "Free space or make" in message, message
    assert "the marker still names step 1, which is intact" in message, message
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
