"""``mazerl ui``: the MLflow UI on the embedded store, with the link to the runs table.

The same as ``.venv/bin/mlflow ui --backend-store-uri sqlite:///<root>/mlflow.db
--default-artifact-root <root>/mlartifacts`` (which needs no activated venv either), plus the
link that opens the experiment on its training runs table (docs/mlflow.md says why the link
carries ``workflowType=machine_learning``). Exit codes: 2 no store under the data root; else
the UI's own.
"""

from __future__ import annotations

import argparse
import os
import sys

from mazerl import paths

EXIT_BAD_INPUT = 2


def add_ui_command(subparsers: argparse._SubParsersAction) -> None:
    ui = subparsers.add_parser("ui", help="open the MLflow UI on the embedded store (Ctrl-C stops it)")
    ui.add_argument("--data-root", help=f"the run's data root (default ${paths.ROOT_ENV_VAR} or ./.mazerl)")
    ui.add_argument("--experiment", default="vlm-maze-grpo", help="experiment whose runs table the link opens")
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    ui.add_argument("--port", type=int, default=5000)
    ui.set_defaults(func=ui_command)


def ui_command_line(root, host: str, port: int) -> list[str]:
    """``mlflow ui`` of this environment on the store under ``root``."""
    return [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        paths.mlflow_db_uri(root),
        "--default-artifact-root",
        str(paths.mlflow_artifacts_dir(root)),
        "--host",
        host,
        "--port",
        str(port),
    ]


def ui_command(args: argparse.Namespace) -> int:
    root = paths.data_root(args.data_root)
    if not (root / "mlflow.db").is_file():
        print(
            f"error: no MLflow store under the data root {root} (no mlflow.db); run `mazerl run` first, or give "
            f"--data-root (or ${paths.ROOT_ENV_VAR}) of the run to look at",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    from mazerl.tracking.store import client_for, experiment_url  # imports mlflow: seconds, so only here

    home = f"http://{args.host}:{args.port}"
    experiment = client_for(paths.mlflow_db_uri(root)).get_experiment_by_name(args.experiment)
    link = experiment_url(home, experiment.experiment_id) if experiment is not None else home
    print(f"MLflow UI on {paths.mlflow_db_uri(root)}: open {link}", flush=True)
    command = ui_command_line(root, args.host, args.port)
    os.execv(command[0], command)  # the UI takes over this process: Ctrl-C stops it
    return 0  # not reached
