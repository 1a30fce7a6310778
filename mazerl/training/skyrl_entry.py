"""Run GRPO on the maze with SkyRL, as a Ray job: ``python -m mazerl.training.skyrl_entry --config FILE``.

What it does, in the order it runs (SkyRL's VisGym entrypoint, plus our checks):

1. Read our TrainConfig and translate it (``skyrl_backend.build_overrides``). Any refusal: exit 2.
2. If the checkpoint marker already names the last step, print "already complete at step N"
   and exit 0 without starting anything (SkyRL itself would train one extra step, or rewrite
   the final checkpoint in place, when resumed at the end).
3. Write the dataset tickets (parquet) under the run directory on the shared mount, and the
   base model's fingerprint beside the checkpoints (``base_model.json``: SkyRL's own
   checkpoint files do not carry it); a resume on another base model is exit 2.
4. Build SkyRL's config with ``SkyRLTrainConfig.from_cli_overrides`` and ``validate_cfg``
   (exit 2 when SkyRL rejects it), then ``initialize_ray`` in this process, which must not
   have touched Ray before.
5. One Ray task registers ``maze2d`` (the generator builds envs by id in that process),
   opens our MLflow ``train`` run, and runs ``BasePPOExp`` (its ``run()`` calls
   ``asyncio.run``, so it needs a thread with no event loop: a plain Ray task has none).
   Its tracker also prints ``step N/M: ...`` for every finished step
   (:mod:`mazerl.training.progress`): with ``trainer.logger=mlflow`` SkyRL prints no step
   line itself, and the hang watchdog and the progress artifact read that line.
6. Check that the marker names the final step; anything less is a failure, never a success.

Steps 2-6 hold the run directory's trainer lock (:mod:`mazerl.training.trainer_lock`): a
second driver of the same run waits for the first instead of writing the same checkpoints.

Exit codes: 0 success (or already complete); 2 configuration error, never worth a retry
(bad config, SkyRL rejects it, SkyRL not installed, unusable checkpoint directory);
1 anything else (Ray, GPUs, storage): the submitter may retry, and SkyRL resumes from the
latest checkpoint (``trainer.resume_mode=latest``).

SkyRL is imported only inside functions, so this module and ``--dry-run`` work on
Python 3.11 without it; the real run needs the cluster image (Python >= 3.12, ``skyrl[fsdp]``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import numbers
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from mazerl.cluster.metrics import TrainingMetrics
from mazerl.input_files import read_config_file
from mazerl.training import checkpoints
from mazerl.training.config import TrainConfig, load_config
from mazerl.training.progress import SKYRL_STEP_KEY, tracker_hook
from mazerl.training.skyrl_backend import (
    add_metric_aliases,
    build_overrides,
    save_overrides,
    write_datasets,
)
from mazerl.training.trainer_lock import one_trainer

EXIT_OK, EXIT_INFRA, EXIT_CONFIG = 0, 1, 2


def log(message: str) -> None:
    print(f"[skyrl_entry] {message}", flush=True)


def tracking_target(config: TrainConfig, environ: Mapping[str, str]) -> tuple[str, str | None]:
    """(tracking URI, run id) SkyRL logs into: the config's values, else those the submitter exported."""
    uri = config.mlflow.tracking_uri or environ.get("MLFLOW_TRACKING_URI") or config.tracking_uri
    run_id = config.mlflow.run_id or environ.get("MLFLOW_RUN_ID") or None
    return uri, run_id


def task_runtime_env(tracking_uri: str, run_id: str | None, ship_code: bool) -> dict[str, Any]:
    """Runtime env of the Ray task that runs SkyRL's trainer and generator (and so our env).

    SkyRL forwards only ``MLFLOW_TRACKING_URI``/``MLFLOW_TRACKING_TOKEN`` to its workers, so the
    run id travels here. ``ship_code`` uploads (``py_modules``) the ``envs`` and ``mazerl``
    packages that *this entry process* imported, so the task, on whichever node Ray places it,
    plays the mazes with the same code as the entry that checked the config. Which code that is
    is decided by the job's own runtime env, not here: on a remote cluster the submitter sends
    none, so it is the copy installed in the cluster image (the orchestrator's checkout is never
    uploaded: rebuild the image to run changed code); on a head on the submitting machine it is
    the submitter's checkout, put on ``PYTHONPATH``.
    """
    env_vars = {"MLFLOW_TRACKING_URI": tracking_uri}
    if run_id:
        env_vars["MLFLOW_RUN_ID"] = run_id
    runtime_env: dict[str, Any] = {"env_vars": env_vars}
    if ship_code:
        import envs  # the packages' own directories: what the job ships
        import mazerl

        runtime_env["py_modules"] = [str(Path(envs.__file__).parent), str(Path(mazerl.__file__).parent)]
    return runtime_env


def completed_step(config: TrainConfig, log: Callable[[str], None] = print) -> int | None:
    """The step SkyRL resumes after (None: no checkpoint yet): the marker's, or the newest intact
    one where the marker's step is damaged (the marker is pointed at it, :mod:`~mazerl.training.checkpoints`)."""
    latest = checkpoints.use_resume_point(config.checkpoint_dir, (), log)
    return None if latest is None else latest.step


def wire_tracker(tracker: Any, cfg: Any, sink: Any | None = None) -> Any:
    """SkyRL's ``Tracking`` with our additions to every ``log`` call: our metric names (docs/mlflow.md), the Grafana gauges, and the ``step N/M:`` line of each finished step (the source
    the hang watchdog and the progress artifact read; SkyRL prints none with ``logger=mlflow``).

    With ``sink`` (a :class:`~mazerl.tracking.metrics.MetricsLogger` on the run's ``metrics.jsonl``,
    as the local backend uses), each end-of-step payload goes through it instead of SkyRL's MLflow
    adapter: exactly once per step (a step SkyRL trains again after a resume keeps its first row)
    and surviving an MLflow outage (rows wait and are sent later) instead of failing the job. Other
    payloads (SkyRL's flush of a failed step) go to SkyRL's own logger, best effort."""
    send, finish = tracker.log, tracker.finish

    def record(data: dict, step: int, commit: bool = False) -> None:
        if sink is not None and SKYRL_STEP_KEY in data:
            sink.log(int(step), numeric_metrics(data))
            return
        try:
            send(data, step, commit=commit)
        except Exception as error:  # noqa: BLE001 - a metric never fails the training
            log(f"warning: metrics of step {step} not logged: {type(error).__name__}: {error}")

    report = tracker_hook(record, total_steps=int(cfg.trainer.max_training_steps))
    gauges = TrainingMetrics(run_id=str(cfg.trainer.run_name), backend="skyrl")

    def log_with_aliases(data: dict, step: int, commit: bool = False) -> None:
        named = add_metric_aliases(data)
        report(named, step, commit=commit)
        gauges.record(  # the Grafana dashboard's ray_mazerl_train_* series
            step,
            reward_mean=named.get("train/reward_mean"),
            success_rate=named.get("train/success_rate"),
            step_seconds=named.get("train/step_seconds"),
        )

    def finish_and_flush() -> None:
        if sink is not None:
            sink.close()  # a last try for rows MLflow has not taken yet; they stay in metrics.jsonl
        finish()

    tracker.log, tracker.finish = log_with_aliases, finish_and_flush
    return tracker


def numeric_metrics(data: Mapping[str, Any]) -> dict[str, float]:
    """A SkyRL payload's numbers, named as SkyRL's MLflow adapter names them ("@" -> "_at_")."""
    return {
        key.replace("@", "_at_"): float(value)
        for key, value in data.items()
        if isinstance(value, numbers.Real) and not isinstance(value, bool)
    }


def _experiment_class(metrics_path: Path | None = None) -> type:
    """``BasePPOExp`` whose tracker is wired by :func:`wire_tracker`, step metrics through
    ``metrics_path`` (the run's ``metrics.jsonl``) into the MLflow run SkyRL logs into."""
    from skyrl.train.entrypoints.main_base import BasePPOExp

    class MazePPOExp(BasePPOExp):
        def get_tracker(self):  # noqa: ANN202 (SkyRL's Tracking)
            import mlflow

            from mazerl.tracking.metrics import MetricsLogger  # lazy: MLflow (seconds)

            tracker = super().get_tracker()  # its MLflow adapter has made (or found) the active run
            active = mlflow.active_run()
            sink = (
                MetricsLogger(mlflow.get_tracking_uri(), active.info.run_id, metrics_path, warn=log)
                if metrics_path is not None and active is not None
                else None
            )
            return wire_tracker(tracker, self.cfg, sink)

    return MazePPOExp


def train_in_ray_task(cfg: Any, tracking_uri: str, run_id: str | None, metrics_path: str | None = None) -> None:
    """Body of the Ray task: register maze2d here (SkyRL builds envs by id in this process), then train."""
    import mlflow

    from envs.skyrl_env import register_maze_env  # lazy: skyrl-gym, installed only in the cluster image

    register_maze_env()
    mlflow.set_tracking_uri(tracking_uri)
    # With our run active, SkyRL's MLflow adapter logs into it and leaves it open
    # (it only creates, and ends, a run of its own when none is active).
    with mlflow.start_run(run_id=run_id) if run_id else nullcontext():
        _experiment_class(Path(metrics_path) if metrics_path else None)(cfg).run()


def skyrl_available() -> str | None:
    """None when SkyRL can be imported here, else why not."""
    if sys.version_info < (3, 12):
        return f"SkyRL needs Python >= 3.12 (this is {sys.version.split()[0]})"
    if importlib.util.find_spec("skyrl") is None:
        return "the 'skyrl' package is not installed"
    return None


def run(config: TrainConfig, overrides: dict[str, Any], ship_code: bool = True) -> int:
    """Steps 4-6: SkyRL config, Ray, the training task, the final marker check."""
    import ray
    from skyrl.train.config import SkyRLTrainConfig
    from skyrl.train.utils import validate_cfg
    from skyrl.train.utils.utils import initialize_ray

    try:
        cfg = SkyRLTrainConfig.from_cli_overrides(overrides)
        validate_cfg(cfg)
    except Exception as error:  # SkyRL raises ValueError, AssertionError, omegaconf errors
        log(f"configuration error: SkyRL rejected the config: {type(error).__name__}: {error}")
        return EXIT_CONFIG

    if ray.is_initialized():
        log("error: Ray is already initialised in this process; SkyRL's initialize_ray must be the first ray.init")
        return EXIT_INFRA
    uri, run_id = tracking_target(config, os.environ)
    # SkyRL copies MLFLOW_TRACKING_URI (and a few others) from this process into the runtime env it
    # passes to ray.init. Inside a Ray job the job's runtime env holds the same variables, and Ray
    # refuses to merge two runtime envs that set the same key unless told to let ray.init's win
    # (the values are identical: SkyRL read them from this environment).
    os.environ["MLFLOW_TRACKING_URI"] = uri
    os.environ.setdefault("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
    initialize_ray(cfg)

    task = ray.remote(num_cpus=1)(train_in_ray_task).options(runtime_env=task_runtime_env(uri, run_id, ship_code))
    log(f"training {config.run_id} for {config.steps} steps (MLflow run {run_id or 'new'} at {uri})")
    ray.get(task.remote(cfg, uri, run_id, str(config.run_dir / "metrics.jsonl")))

    step = completed_step(config)
    if step is None or step < config.steps:
        log(f"error: SkyRL returned but the checkpoint marker names step {step}, not the final step {config.steps}")
        return EXIT_INFRA
    log(f"done: checkpoint at step {step} in {config.checkpoint_dir}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="TrainConfig file (JSON or YAML) with backend: skyrl")
    parser.add_argument(
        "--dry-run", action="store_true", help="check the config, write the datasets, print the overrides; no SkyRL"
    )
    parser.add_argument(
        "--no-ship-code", action="store_true", help="use the envs/mazerl installed in the image instead of uploading"
    )
    args = parser.parse_args(argv)

    try:
        read_config_file(args.config, f"--config {args.config}")  # a regular, bounded, shallow file first
        config = load_config(args.config)
        overrides = build_overrides(config)
    except (OSError, ValueError, ValidationError, yaml.YAMLError) as error:  # SkyrlConfigError is a ValueError
        log(f"configuration error: {error}")
        return EXIT_CONFIG
    try:
        with one_trainer(config.run_dir, log):  # before the checkpoint is read: another trainer may be writing it
            return train(config, overrides, args)
    except OSError as error:  # the run directory on the shared mount cannot be written (its lock file)
        log(f"infrastructure error: {error}")
        return EXIT_INFRA


def train(config: TrainConfig, overrides: dict[str, Any], args: argparse.Namespace) -> int:
    """Steps 2-6 of the module docstring, holding the run directory's trainer lock."""
    try:
        step = completed_step(config)
    except checkpoints.CheckpointError as error:
        log(f"configuration error: {error}")
        return EXIT_CONFIG
    if step is not None and step >= config.steps:
        log(f"already complete at step {step} (requested steps: {config.steps}); nothing to train")
        return EXIT_OK
    if step is None and config.resume == "required":
        log(
            f"configuration error: resume is 'required' but {config.checkpoint_dir} holds no checkpoint; "
            "use resume: latest to start from scratch, or the data_root/run_id of the run to continue"
        )
        return EXIT_CONFIG
    if step is not None and config.resume == "none":
        log(
            f"configuration error: resume is 'none' but {config.checkpoint_dir} holds a checkpoint at step {step}; "
            "use a new run_id or resume: latest"
        )
        return EXIT_CONFIG

    try:
        files = write_datasets(config)
    except ValueError as error:  # e.g. a training pool larger than the world outside the eval set
        log(f"configuration error: {error}")
        return EXIT_CONFIG
    save_overrides(overrides, files.resolved_config)
    log(f"datasets: {files.train_data} and {files.eval_data}; resuming after step {step or 0}")
    if args.dry_run:
        print(json.dumps(overrides, indent=2, sort_keys=True))
        return EXIT_OK

    try:  # SkyRL's trainer_state.pt has no base-model fingerprint: keep one beside the checkpoints
        checkpoints.record_base_model(config.checkpoint_dir, config.base_model)
    except (OSError, checkpoints.CheckpointError) as error:
        log(f"configuration error: {error}")
        return EXIT_CONFIG
    missing = skyrl_available()
    if missing:
        log(f"configuration error: {missing}; backend: skyrl runs in the GPU cluster image (deployments/docker)")
        return EXIT_CONFIG
    try:
        return run(config, overrides, ship_code=not args.no_ship_code)
    except Exception:  # Ray, GPUs, storage: retryable, SkyRL resumes from the marker
        log("infrastructure error:\n" + traceback.format_exc())
        return EXIT_INFRA


if __name__ == "__main__":
    sys.exit(main())
