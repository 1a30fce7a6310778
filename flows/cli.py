"""``mazerl run``: the pipeline flow on this machine, with nothing configured beforehand.

It points Prefect at a store under the data root (unless a Prefect API is configured),
starts the embedded Ray head if no address is given (and stops it afterwards if it started
it), runs the flow, and prints where everything landed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from mazerl import paths


def configure_prefect(root: Path) -> None:
    """Embedded Prefect: its database, results and cache live under the data root.

    A user with their own Prefect server (``PREFECT_API_URL``) or home keeps them.
    """
    if not os.environ.get("PREFECT_API_URL"):
        os.environ.setdefault("PREFECT_HOME", str(root / "prefect"))
    os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", str(root / "prefect" / "storage"))
    os.environ.setdefault("PREFECT_RESULTS_PERSIST_BY_DEFAULT", "true")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def add_run_command(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser("run", help="run the whole pipeline (embedded default: this machine, CPU)")
    run.add_argument(
        "--data-root", help=f"where models, runs and MLflow live (default ${paths.ROOT_ENV_VAR} or ./.mazerl)"
    )
    run.add_argument("--base-model", help="HF model directory (default: the self-built starter)")
    run.add_argument("--eval-set", help="eval set name (default: maze256-small-v1 for the starter)")
    run.add_argument("--backend", choices=["local", "skyrl"], default="local")
    run.add_argument("--ray-address", help="Ray dashboard address (default: start a local head)")
    run.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite under the data root)")
    run.add_argument("--steps", type=int, help="GRPO steps (default: the embedded recipe's)")
    run.add_argument("--max-eval-mazes", type=int, help="evaluate only the first N mazes (smoke runs)")
    run.add_argument("--training", help="JSON object of training config overrides, e.g. '{\"learning_rate\": 5e-5}'")
    run.add_argument("--params", help="JSON file with all pipeline parameters (flags override it)")
    run.set_defaults(func=run_command)


def build_params(args: argparse.Namespace):
    from mazerl.params import PipelineParams

    values = json.loads(Path(args.params).read_text()) if args.params else {}
    flags = {
        "data_root": args.data_root,
        "base_model": args.base_model,
        "eval_set": args.eval_set,
        "ray_address": args.ray_address,
        "tracking_uri": args.tracking_uri,
        "max_eval_mazes": args.max_eval_mazes,
    }
    values |= {key: value for key, value in flags.items() if value is not None}
    values["backend"] = args.backend
    training = dict(values.get("training", {}))
    if args.training:
        training |= json.loads(args.training)
    if args.steps is not None:
        training["steps"] = args.steps
    values["training"] = training
    return PipelineParams.model_validate(values)


def run_command(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        params = build_params(args)
    except (ValidationError, ValueError, OSError) as exc:
        print(f"error: invalid pipeline parameters:\n{exc}", file=sys.stderr)
        return 2
    from mazerl.preflight import InputError, check_data_root

    root = params.root()
    try:
        check_data_root(root)  # Prefect's own database goes under it next
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    root.mkdir(parents=True, exist_ok=True)
    configure_prefect(root)

    from mazerl.cluster.ray_local import ensure_local_head

    head = None
    if params.ray_address is None:
        head = ensure_local_head()
        print(f"local Ray head at {head.address} ({'started' if head.started_here else 'reused'})", flush=True)
    try:
        from flows.pipeline import pipeline

        summary = pipeline(params)
    finally:
        if head is not None and head.started_here:
            head.stop()
    print("\n" + "=" * 72 + "\n" + summary.text())
    print(
        f"\nLook at it: mlflow ui --backend-store-uri {summary.tracking_uri}"
        + (
            f" --default-artifact-root {paths.mlflow_artifacts_dir(root)}"
            if summary.tracking_uri.startswith("sqlite")
            else ""
        )
    )
    return 0
