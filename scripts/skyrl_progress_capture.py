"""Capture the Ray job log that SkyRL's real tracking module produces through our tracker wiring.

The hang watchdog and the train stage's progress artifact read ``step N/M:`` lines from a
training job's log (:mod:`mazerl.training.progress`). With ``trainer.logger=mlflow`` SkyRL
prints no step line of its own, so the SkyRL entry adds one in :func:`wire_tracker`. This
script records what such a job's log really looks like, for ``tests/test_training_progress.py``:

- a real local Ray head and a real Ray job (this file with ``--job``);
- the job driver calls ``ray.init(log_to_driver=True)`` as SkyRL's ``initialize_ray`` does, and
  runs one ``num_cpus=1`` Ray task named ``train_in_ray_task``, as ``skyrl_entry`` does;
- inside it, an active MLflow run (SQLite in a temp dir), SkyRL 0.4.0's own
  ``Tracking(backend="mlflow")`` built from the real ``SkyRLTrainConfig`` of our overrides,
  wired by ``skyrl_entry.wire_tracker``, and logged to the way ``RayPPOTrainer.train`` logs:
  one ``tracker.log(payload, step=global_step, commit=True)`` per finished step whose payload
  carries ``trainer/global_step``, plus an eval-only payload at an eval step.

SkyRL's training loop itself needs GPUs, so the calls are made here in the trainer's order; the
tracking code, the Ray task and the log forwarding are the real ones.

Usage (SkyRL 0.4.0 importable: installed on Python >= 3.12, or its unpacked wheel on Python 3.11
given with --skyrl-src, plus the few pure-Python packages its config and tracking modules import,
kept outside the project's venv)::

    pip download --no-deps --python-version 3.12 --only-binary=:all: skyrl==0.4.0 -d /tmp/skyrl
    (cd /tmp/skyrl && unzip -q skyrl-0.4.0-py3-none-any.whl -d src)
    .venv/bin/pip install --target /tmp/skyrl/deps loguru omegaconf pybase64 cloudpathlib
    PYTHONPATH=/tmp/skyrl/deps .venv/bin/python scripts/skyrl_progress_capture.py \\
        --skyrl-src /tmp/skyrl/src --out tests/data/skyrl_mlflow_job_log.txt
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS, FIRST_STEP, EVAL_STEP = 6, 3, 4  # resumed after step 2 of 6, an eval at step 4


def load_tracking(skyrl_src: str | None):
    """SkyRL's ``Tracking`` class: a normal import, or tracking.py by path from an unpacked wheel
    (its package ``skyrl.train.utils`` imports the GPU stack, which needs Python 3.12).

    On Python 3.11 pydantic refuses ``typing.TypedDict`` in models (SkyRL 0.4.0's
    ``skyrl.tinker.types``, reached from ``SkyRLTrainConfig.__post_init__``), so the 3.11 path
    hands SkyRL ``typing_extensions.TypedDict``, which is what ``typing.TypedDict`` is on 3.12.
    """
    if skyrl_src:
        if sys.version_info < (3, 12):
            import typing

            import typing_extensions

            typing.TypedDict = typing_extensions.TypedDict
        sys.path.insert(0, skyrl_src)
        path = Path(skyrl_src) / "skyrl" / "train" / "utils" / "tracking.py"
        spec = importlib.util.spec_from_file_location("skyrl.train.utils.tracking", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.Tracking
    return importlib.import_module("skyrl.train.utils.tracking").Tracking


def job(args: argparse.Namespace) -> None:
    """The Ray job's driver (``--job``): SkyRL's Ray setup, then the tracker inside one task."""
    import ray

    ray.init(address="auto", log_to_driver=True)  # as skyrl.train.utils.utils.initialize_ray

    @ray.remote(num_cpus=1)
    def train_in_ray_task(skyrl_src: str | None, config_json: str, mlflow_dir: str) -> int:
        import mlflow

        tracking_class = load_tracking(skyrl_src)
        from skyrl.train.config import SkyRLTrainConfig

        from mazerl.training.config import TrainConfig
        from mazerl.training.skyrl_backend import build_overrides
        from mazerl.training.skyrl_entry import wire_tracker

        config = TrainConfig.model_validate_json(config_json)
        cfg = SkyRLTrainConfig.from_cli_overrides(build_overrides(config))
        mlflow.set_tracking_uri(f"sqlite:///{mlflow_dir}/mlflow.db")
        mlflow.set_experiment(cfg.trainer.project_name)
        with mlflow.start_run(run_name="train") as run:
            tracker = wire_tracker(
                tracking_class(
                    project_name=cfg.trainer.project_name,
                    experiment_name=cfg.trainer.run_name,
                    backend=cfg.trainer.logger,
                    config=cfg,
                    tags=cfg.trainer.tags,
                ),
                cfg,
            )
            for global_step in range(FIRST_STEP, STEPS + 1):
                payload = {
                    "reward/avg_raw_reward": 0.1 * global_step,
                    "environment/solved": 0.05 * global_step,
                    "generate/avg_assistant_tokens": 9.0,
                    "policy/policy_loss": -0.01 * global_step,
                    "policy/grad_norm": 0.5,
                    "trainer/epoch": 0,
                    "trainer/global_step": global_step,
                    "timing/step": 40.0 + global_step,
                }
                if global_step == EVAL_STEP:
                    payload["eval/all/environment/solved"] = 0.5
                tracker.log(payload, step=global_step, commit=True)
                time.sleep(0.2)
            tracker.finish()
            logged = mlflow.get_run(run.info.run_id).data.metrics
        assert logged["train/success_rate"] == 0.05 * STEPS, "the aliased metrics reached MLflow"
        return len(logged)

    config = Path(args.config).read_text()
    print(f"metrics logged: {ray.get(train_in_ray_task.remote(args.skyrl_src, config, args.mlflow_dir))}", flush=True)


def capture(args: argparse.Namespace) -> None:
    from ray.job_submission import JobSubmissionClient

    from mazerl.cluster.head.local import start_local_head
    from mazerl.training.config import TrainConfig

    with tempfile.TemporaryDirectory(prefix="mzcap", dir="/tmp") as tmp:
        config = TrainConfig.model_validate(
            {
                "run_id": "capture",
                "data_root": tmp,
                "base_model": f"{tmp}/model",
                "backend": "skyrl",
                "eval_set": "maze256-small-v1",
                "steps": STEPS,
                "mazes_per_step": 4,
                "train_pool_size": 32,
                "skyrl": {"num_gpus": 2, "num_nodes": 1},
            }
        )
        config_path = Path(tmp) / "train.json"
        config_path.write_text(config.model_dump_json())
        head = start_local_head(f"{tmp}/ray", num_cpus=2, dashboard_port=0)
        try:
            client = JobSubmissionClient(head.address, headers=head.auth_headers())
            paths = [str(REPO), *(p for p in (args.skyrl_src, os.environ.get("PYTHONPATH")) if p)]
            entrypoint = (
                f"{sys.executable} {Path(__file__).resolve()} --job --config {config_path} --mlflow-dir {tmp}"
                + (f" --skyrl-src {args.skyrl_src}" if args.skyrl_src else "")
            )
            job_id = client.submit_job(
                entrypoint=entrypoint, runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}}
            )
            while str(client.get_job_status(job_id)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
                time.sleep(0.5)
            logs, status = client.get_job_logs(job_id), str(client.get_job_status(job_id))
        finally:
            head.stop()
    if status != "SUCCEEDED":
        sys.exit(f"the capture job {status}:\n{logs}")
    import ray

    skyrl_version = importlib.import_module("skyrl").__version__
    header = [
        "# The log of a Ray job whose task logs through SkyRL's real Tracking(backend='mlflow'),",
        f"# wired by mazerl.training.skyrl_entry.wire_tracker; skyrl {skyrl_version}, ray {ray.__version__},",
        f"# python {sys.version.split()[0]}. Written by scripts/skyrl_progress_capture.py; do not edit.",
        f"# steps {FIRST_STEP}..{STEPS} of {STEPS} (resumed after step {FIRST_STEP - 1}), an eval at step {EVAL_STEP}.",
        f"# {json.dumps({'skyrl': skyrl_version, 'ray': ray.__version__})}",
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(header) + "\n" + logs)
    print(f"wrote {out} ({len(logs.splitlines())} log lines)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skyrl-src", help="an unpacked skyrl 0.4.0 wheel (for Python 3.11)")
    parser.add_argument("--out", default=str(REPO / "tests" / "data" / "skyrl_mlflow_job_log.txt"))
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--mlflow-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.skyrl_src:
        sys.path.insert(0, args.skyrl_src)
    job(args) if args.job else capture(args)


if __name__ == "__main__":
    main()
