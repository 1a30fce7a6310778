"""Ray-job entrypoint of the local GRPO backend: ``python -m mazerl.training.local_entry --config FILE``.

Exit codes are the submitter's contract: 0 the run completed (or was already complete),
2 a configuration error (retrying cannot help), 3 the disk is full (the run pauses: one line
says where and how much room it needs, and the same command resumes once space is freed;
:mod:`~mazerl.training.disk_room`), 1 anything else (retry from the checkpoint).
Configuration errors are every ``ValueError``, as in ``skyrl_entry``: the config's own checks,
a training pool larger than the world, PEFT's "target modules not found", a model that does
not load. Training is deterministic from its checkpoint, so a retry would meet them again;
I/O and runtime failures (``OSError``, ``RuntimeError``, a full disk) are retried.
One trainer per run directory: the entry holds ``<run dir>/trainer.lock`` from before it reads
the checkpoint until it exits, and a second one waits for the first (:mod:`~mazerl.training.trainer_lock`).
MLflow: the tracking URI and run id come from the config, else from ``MLFLOW_TRACKING_URI``
and ``MLFLOW_RUN_ID`` (set by the orchestrator for the ``train`` child run).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback

import yaml

from mazerl.cluster.metrics import TrainingMetrics
from mazerl.input_files import read_config_file
from mazerl.training.checkpoints import CheckpointError, CheckpointWriteError, resume_note
from mazerl.training.config import TrainConfig, TrainingConfigError, load_config
from mazerl.training.disk_room import StorageFullError, full_message, is_no_space
from mazerl.training.local_trainer import LocalGRPOTrainer
from mazerl.training.trainer_lock import one_trainer

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG_ERROR, EXIT_NO_SPACE = 0, 1, 2, 3


def log(message: str) -> None:
    print(message, flush=True)


class StepSink:
    """Each step's metrics to MLflow (and metrics.jsonl) and, inside a Ray job, to Ray's metrics
    (the ``ray_mazerl_train_*`` gauges of the Grafana dashboard)."""

    def __init__(self, logger, run_id: str) -> None:
        self.logger = logger
        if os.environ.get("RAY_ADDRESS") and os.environ.get("MAZERL_RAY_METRICS", "1") == "1":
            _connect_to_ray()
        self.gauges = TrainingMetrics(run_id=run_id, backend="local")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.logger.log(step, metrics)
        self.gauges.record(
            step,
            reward_mean=metrics.get("train/reward_mean"),
            success_rate=metrics.get("train/success_rate"),
            step_seconds=metrics.get("train/step_seconds"),
        )

    def close(self) -> None:
        self.logger.close()


def _connect_to_ray() -> None:
    """Join the cluster this job runs on (Ray sets RAY_ADDRESS for job drivers); metrics only."""
    try:
        import ray

        if not ray.is_initialized():
            ray.init(address="auto", log_to_driver=False, logging_level="WARNING")  # no "Connecting to ..." lines
    except Exception as exc:  # metrics are a nicety: never fail training for them
        log(f"warning: no Ray metrics export ({type(exc).__name__}: {exc})")


def _named(exc: Exception) -> str:
    """The error, with the config field it is about when the library's own text does not say."""
    text = str(exc)
    if "target modules" in text.lower() and "lora.target_modules" not in text:
        return f"lora.target_modules matches no layer of the model: {text}; name linear layers it has (e.g. q_proj)"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="training config file (JSON or YAML)")
    args = parser.parse_args(argv)

    try:
        read_config_file(args.config, f"--config {args.config}")  # a regular, bounded, shallow file first
        config = load_config(args.config)
        if config.backend != "local":
            raise TrainingConfigError(f"backend={config.backend!r}: this entrypoint runs the local backend only")
    except (ValueError, FileNotFoundError, yaml.YAMLError) as exc:  # ValidationError is one
        log(f"configuration error: {exc}")
        return EXIT_CONFIG_ERROR
    try:
        with one_trainer(config.run_dir, log):  # before the checkpoint is read: another trainer may be writing it
            return train(config)
    except OSError as exc:  # the run directory cannot be written (not even its lock file): retryable
        log(f"training failed: {exc}")
        return EXIT_FAILURE


def train(config: TrainConfig) -> int:
    """Train ``config`` to its last step (resuming after the checkpoint marker); returns the exit code."""
    try:
        trainer = LocalGRPOTrainer(config, log=log)
    except (ValueError, CheckpointError, FileNotFoundError) as exc:
        log(f"configuration error: {exc}")
        return EXIT_CONFIG_ERROR

    from mazerl.tracking.metrics import MetricsLogger  # mlflow is heavy: imported once the config is known good

    run_id = config.mlflow.run_id or os.environ.get("MLFLOW_RUN_ID")
    tracking_uri = config.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or config.tracking_uri
    sink = StepSink(MetricsLogger(tracking_uri, run_id, config.run_dir / "metrics.jsonl", warn=log), config.run_id)
    try:
        result = trainer.run(metrics_sink=sink)
    except (ValueError, CheckpointError) as exc:  # TrainingConfigError and ModelLoadError are ValueErrors
        log(f"configuration error: {_named(exc)}")
        return EXIT_CONFIG_ERROR
    except StorageFullError as exc:  # checked before each checkpoint, or a write that met ENOSPC
        log(f"training paused: {exc}")
        return EXIT_NO_SPACE
    except CheckpointWriteError as exc:  # read-only, an I/O error: retryable once the file system is back
        log(f"training failed: {exc}")
        return EXIT_FAILURE
    except Exception as exc:
        if is_no_space(exc):  # the step's metrics row, a log file: the same pause
            where = resume_note(config.checkpoint_dir)
            log(f"training paused: {full_message(config.run_dir, 'the run directory', where)}")
            return EXIT_NO_SPACE
        log("training failed:\n" + traceback.format_exc())
        return EXIT_FAILURE
    finally:
        with contextlib.suppress(OSError):  # a full disk: the rows wait in metrics.jsonl for the next attempt
            sink.close()
    log(
        f"done: steps {result.start_step + 1}..{result.final_step} ({result.steps_run} run) in "
        f"{result.wall_seconds:.0f}s; checkpoint {result.checkpoint}"
        if result.steps_run
        else f"done: already complete at step {result.final_step}; checkpoint {result.checkpoint}"
    )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
