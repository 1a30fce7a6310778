"""The SkyRL entry module's decisions before SkyRL starts: exit codes, completion, MLflow target.

These run on Python 3.11 without SkyRL (the training itself needs the GPU cluster image);
``scripts/skyrl_cpu_checks.py`` covers the seams with the real SkyRL on Python 3.12.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from mazerl.fingerprint import model_fingerprint
from mazerl.training import checkpoints
from mazerl.training.config import TrainConfig
from mazerl.training.skyrl_backend import build_overrides, run_files
from mazerl.training.skyrl_entry import (
    EXIT_CONFIG,
    EXIT_OK,
    completed_step,
    main,
    task_runtime_env,
    tracking_target,
)


def write_config(tmp_path: Path, **changes) -> Path:
    data = {
        "run_id": "sky-entry",
        "data_root": str(tmp_path / "root"),
        "base_model": str(tmp_path / "model"),
        "backend": "skyrl",
        "eval_set": "maze256-small-v1",
        "train_pool_size": 32,
        "mazes_per_step": 16,
        "steps": 10,
        **changes,
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def fake_checkpoint(config_path: Path, step: int, complete: bool = True) -> None:
    """A checkpoint in SkyRL's layout (trainer_state.pt, policy/lora_adapter/...) and its marker."""
    config = TrainConfig.model_validate(yaml.safe_load(config_path.read_text()))

    def write(directory: Path) -> None:
        checkpoints.save_trainer_state(directory, {"global_step": step})
        adapter = directory / checkpoints.ADAPTER_SUBDIR
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text("{}")
        save_file({"x.lora_A.weight": torch.zeros(2, 2)}, str(adapter / "adapter_model.safetensors"))

    checkpoints.save(config.checkpoint_dir, step, write, keep=2)
    if not complete:  # SkyRL writes in place: a torn directory under a marker must be refused
        (checkpoints.step_dir(config.checkpoint_dir, step) / checkpoints.TRAINER_STATE).unlink()


def test_dry_run_writes_tickets_and_the_overrides_and_exits_0(tmp_path, capsys):
    path = write_config(tmp_path)
    assert main(["--config", str(path), "--dry-run"]) == EXIT_OK
    config = TrainConfig.model_validate(yaml.safe_load(path.read_text()))
    files = run_files(config)
    assert files.train_data.is_file() and files.eval_data.is_file()
    assert json.loads(files.resolved_config.read_text()) == build_overrides(config)
    assert '"generator.vision_language_generator": true' in capsys.readouterr().out


def test_real_run_without_skyrl_is_a_configuration_error_with_the_reason(tmp_path, capsys):
    # given Python 3.11 without SkyRL (as CI is), when the real run is asked for, then exit 2 says why
    (tmp_path / "model").mkdir()
    assert main(["--config", str(write_config(tmp_path))]) == EXIT_CONFIG
    out = capsys.readouterr().out
    assert "configuration error" in out and ("Python >= 3.12" in out or "not installed" in out), out


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"history_images": 3}, "history_images"),
        ({"no_such_field": 1}, "no_such_field"),
        ({"backend": "local"}, "backend"),
        ({"mazes_per_step": 64}, "train_pool_size"),
    ],
)
def test_bad_configs_exit_2_before_writing_anything(tmp_path, capsys, changes, named):
    path = write_config(tmp_path, **changes)
    assert main(["--config", str(path), "--dry-run"]) == EXIT_CONFIG
    assert named in capsys.readouterr().out
    assert not (tmp_path / "root" / "runs").exists(), "nothing may be written for a refused config"


def test_a_lora_rank_vllm_does_not_serve_exits_2_naming_the_allowed_ranks(tmp_path, capsys):
    # given rank 24 (vLLM 0.30's max_lora_rank allows 1, 8, 16, 32, 64, 128, 256, 320, 512),
    path = write_config(tmp_path, lora={"rank": 24, "alpha": 48})
    # when the entry checks the config, then it refuses before any GPU is asked for (exit 2).
    assert main(["--config", str(path), "--dry-run"]) == EXIT_CONFIG
    out = capsys.readouterr().out
    assert "lora.rank (24)" in out and "1, 8, 16, 32, 64, 128, 256, 320, 512" in out, out
    assert not (tmp_path / "root" / "runs").exists(), "nothing is written for a refused config"


def test_the_base_models_fingerprint_is_kept_beside_the_checkpoints_and_a_resume_on_another_is_refused(
    tmp_path, capsys
):
    # given a base model directory and a first (real, not dry) run of the entry,
    base = tmp_path / "model"
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "qwen3_vl"}')
    path = write_config(tmp_path)
    main(["--config", str(path)])  # exits 2 afterwards on CI: SkyRL is not installed on Python 3.11
    config = TrainConfig.model_validate(yaml.safe_load(path.read_text()))
    record = json.loads((config.checkpoint_dir / checkpoints.BASE_MODEL_RECORD).read_text())
    assert record == {"fingerprint": model_fingerprint(base), "base_model": str(base)}
    # when the base model changes under the same run, then the entry refuses to resume onto it.
    (base / "config.json").write_text('{"model_type": "qwen3_vl", "changed": true}')
    capsys.readouterr()
    assert main(["--config", str(path)]) == EXIT_CONFIG
    assert "trained from a base model with fingerprint" in capsys.readouterr().out


def test_missing_or_unreadable_config_file_is_a_configuration_error(tmp_path, capsys):
    assert main(["--config", str(tmp_path / "absent.yaml"), "--dry-run"]) == EXIT_CONFIG
    broken = tmp_path / "broken.yaml"
    broken.write_text("run_id: [unclosed")
    assert main(["--config", str(broken), "--dry-run"]) == EXIT_CONFIG


def test_a_pool_larger_than_the_world_is_a_configuration_error(tmp_path, capsys):
    # the 7x7 world has 768 mazes, 256 of them in the eval set: 600 training mazes cannot exist
    path = write_config(tmp_path, train_pool_size=600)
    assert main(["--config", str(path), "--dry-run"]) == EXIT_CONFIG
    assert "train_pool_size" in capsys.readouterr().out


def test_a_finished_run_reports_already_complete_and_does_nothing(tmp_path, capsys):
    path = write_config(tmp_path, steps=10)
    fake_checkpoint(path, step=10)
    assert main(["--config", str(path)]) == EXIT_OK
    assert "already complete at step 10" in capsys.readouterr().out
    assert not (tmp_path / "root" / "runs" / "sky-entry" / "skyrl").exists(), "no datasets, no SkyRL"


def test_an_unfinished_run_goes_on_to_training(tmp_path, capsys):
    path = write_config(tmp_path, steps=10)
    fake_checkpoint(path, step=4)
    assert main(["--config", str(path), "--dry-run"]) == EXIT_OK
    assert "resuming after step 4" in capsys.readouterr().out


def test_resume_none_refuses_a_directory_with_a_checkpoint(tmp_path, capsys):
    path = write_config(tmp_path, resume="none")
    fake_checkpoint(path, step=4)
    assert main(["--config", str(path), "--dry-run"]) == EXIT_CONFIG
    assert "resume is 'none'" in capsys.readouterr().out


def test_a_torn_checkpoint_under_the_marker_is_refused_not_trusted(tmp_path, capsys):
    path = write_config(tmp_path, steps=10)
    fake_checkpoint(path, step=10, complete=False)
    assert main(["--config", str(path)]) == EXIT_CONFIG
    assert "checkpoint step 10 is damaged: missing trainer_state.pt" in capsys.readouterr().out


def test_completed_step_is_none_without_a_marker(tmp_path):
    config = TrainConfig.model_validate(yaml.safe_load(write_config(tmp_path).read_text()))
    assert completed_step(config) is None


@pytest.mark.parametrize(
    ("mlflow", "environ", "expected"),
    [
        (
            {"tracking_uri": "http://a", "run_id": "r1"},
            {"MLFLOW_TRACKING_URI": "http://b", "MLFLOW_RUN_ID": "r2"},
            ("http://a", "r1"),
        ),
        ({}, {"MLFLOW_TRACKING_URI": "http://b", "MLFLOW_RUN_ID": "r2"}, ("http://b", "r2")),
        ({}, {}, ("sqlite:///ROOT/mlflow.db", None)),
    ],
    ids=["config-wins", "submitter-env", "embedded-store"],
)
def test_tracking_target_prefers_the_config_then_the_submitter(tmp_path, mlflow, environ, expected):
    path = write_config(tmp_path, mlflow=mlflow)
    config = TrainConfig.model_validate(yaml.safe_load(path.read_text()))
    uri, run_id = tracking_target(config, environ)
    assert (uri, run_id) == (expected[0].replace("ROOT", str(tmp_path / "root")), expected[1])


def test_task_runtime_env_carries_the_run_id_and_ships_our_packages():
    env = task_runtime_env("http://mlflow:5000", "run-7", ship_code=True)
    assert env["env_vars"] == {"MLFLOW_TRACKING_URI": "http://mlflow:5000", "MLFLOW_RUN_ID": "run-7"}
    shipped = [Path(p) for p in env["py_modules"]]
    assert (shipped[0] / "skyrl_env.py").is_file(), "the env module must travel with the training task"
    assert (shipped[1] / "training" / "skyrl_backend.py").is_file()
    assert "py_modules" not in task_runtime_env("http://m", None, ship_code=False)
    assert "MLFLOW_RUN_ID" not in task_runtime_env("http://m", None, ship_code=False)["env_vars"]


class SkyrlTrackingStandIn:
    """Stand-in for SkyRL 0.4's ``Tracking`` (SkyRL needs Python 3.12; this suite runs 3.11): its
    ``log(data, step, commit)`` and ``finish()``, recording what reaches SkyRL's own MLflow adapter."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.finished = False

    def log(self, data, step, commit=False) -> None:
        self.sent.append(step)

    def finish(self) -> None:
        self.finished = True


def skyrl_step_payload(step: int) -> dict:
    """An end-of-step payload as SkyRL 0.4's ``RayPPOTrainer.train`` logs it (trainer.py: ``log_payload``)."""
    return {
        "trainer/global_step": step,
        "environment/solved": 0.25 * step,
        "reward/avg_raw_reward": 0.5,
        "timing/step": 12.0,
        "generate/avg_num_tokens": 8,
        "pass_at_8@k": 1.0,
        "policy/note": "not a number",
    }


def test_skyrls_step_metrics_are_logged_once_and_an_mlflow_outage_never_fails_the_job(tmp_path, mlflow_root, capsys):
    from types import SimpleNamespace

    from mlflow.tracking import MlflowClient

    from mazerl.tracking.metrics import MetricsLogger
    from mazerl.training.skyrl_entry import wire_tracker

    uri = f"sqlite:///{mlflow_root / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    cfg = SimpleNamespace(trainer=SimpleNamespace(max_training_steps=4, run_name="r"))
    jsonl = tmp_path / "metrics.jsonl"
    # Given SkyRL's tracker wired with the run's logger, steps 1-3 logged, then the job killed and resumed
    # after the checkpoint of step 2 (step 3 trained again), then step 4,
    first = wire_tracker(SkyrlTrackingStandIn(), cfg, MetricsLogger(uri, run_id, jsonl))
    for step in (1, 2, 3):
        first.log(skyrl_step_payload(step), step=step, commit=True)
    second = wire_tracker(SkyrlTrackingStandIn(), cfg, MetricsLogger(uri, run_id, jsonl))
    for step in (3, 4):
        second.log(skyrl_step_payload(step), step=step, commit=True)
    second.finish()
    # then every step is in MLflow once, under our names and SkyRL's, numbers only, none through SkyRL's adapter,
    history = client.get_metric_history(run_id, "train/success_rate")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]
    logged = client.get_run(run_id).data.metrics
    assert "pass_at_8_at_k" in logged and "environment/solved" in logged and "policy/note" not in logged
    assert first.sent == [] and second.sent == [] and second.finished
    assert "step 4/4:" in capsys.readouterr().out, "the step line the watchdog reads"
    # and with MLflow down, a step is kept in metrics.jsonl and the training goes on (no exception).
    down = wire_tracker(SkyrlTrackingStandIn(), cfg, MetricsLogger("http://127.0.0.1:9", run_id, tmp_path / "m2.jsonl"))
    down.log(skyrl_step_payload(1), step=1, commit=True)
    down.finish()
    assert [json.loads(line)["step"] for line in (tmp_path / "m2.jsonl").read_text().splitlines()] == [1]
