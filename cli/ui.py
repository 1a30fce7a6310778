"""``mazerl ui``: the MLflow UI on the embedded store, with the link to the runs table.

The same as ``.venv/bin/mlflow ui --backend-store-uri sqlite:///<root>/mlflow.db
--default-artifact-root <root>/mlartifacts`` (which needs no activated venv either), plus the
link that opens the experiment on its training runs table (docs/mlflow.md says why the link
carries ``workflowType=machine_learning``), sized for a laptop: one web worker (MLflow starts
four), no line per HTTP request, and none of MLflow's background job processes (they serve
GenAI features a training store does not use).

Port 5000 taken (another UI, another program): without ``--port`` the UI takes a free port and
prints its link; with ``--port`` it refuses with the fix instead of starting. Exit codes: 2 no
store under the data root, or the port asked for is taken; else the UI's own.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys

from mazerl import paths

EXIT_BAD_INPUT = 2
DEFAULT_PORT = 5000  # the port the run's printed link names
# MLflow's own server settings for one user on one machine (``mlflow ui --help``).
UI_OPTIONS = ["--workers", "1", "--uvicorn-opts=--no-access-log"]
UI_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def add_ui_command(subparsers: argparse._SubParsersAction) -> None:
    ui = subparsers.add_parser("ui", help="open the MLflow UI on the embedded store (Ctrl-C stops it)")
    ui.add_argument("--data-root", help=f"the run's data root (default ${paths.ROOT_ENV_VAR} or ./.mazerl)")
    ui.add_argument("--experiment", default="vlm-maze-grpo", help="experiment whose runs table the link opens")
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    ui.add_argument(
        "--port", type=int, help=f"port to listen on (default {DEFAULT_PORT}, or a free one if {DEFAULT_PORT} is taken)"
    )
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
        *UI_OPTIONS,
    ]


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now (the UI's server sets SO_REUSEADDR too)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def choose_port(host: str, asked: int | None) -> tuple[int | None, str | None]:
    """(port to use, note for the user), or (None, error) when the port asked for is taken."""
    if asked is not None:
        if port_is_free(host, asked):
            return asked, None
        return None, (
            f"error: port {asked} on {host} is already in use (another MLflow UI or program listens there); "
            f"stop it, or give another --port, or leave --port out to take a free one"
        )
    if port_is_free(host, DEFAULT_PORT):
        return DEFAULT_PORT, None
    port = free_port(host)
    return port, (
        f"port {DEFAULT_PORT} is in use, so this UI listens on port {port}: in links printed by `mazerl run`, "
        f"put {port} in place of {DEFAULT_PORT}"
    )


def ui_command(args: argparse.Namespace) -> int:
    root = paths.data_root(args.data_root)
    if not (root / "mlflow.db").is_file():
        print(
            f"error: no MLflow store under the data root {root} (no mlflow.db); run `mazerl run` first, or give "
            f"--data-root (or ${paths.ROOT_ENV_VAR}) of the run to look at",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    port, note = choose_port(args.host, args.port)
    if port is None:
        print(note, file=sys.stderr)
        return EXIT_BAD_INPUT
    from mazerl.tracking.store import client_for, experiment_url  # imports mlflow: seconds, so only here

    home = f"http://{args.host}:{port}"
    experiment = client_for(paths.mlflow_db_uri(root)).get_experiment_by_name(args.experiment)
    link = experiment_url(home, experiment.experiment_id) if experiment is not None else home
    print(f"MLflow UI on {paths.mlflow_db_uri(root)}: open {link}", flush=True)
    if note:
        print(note, flush=True)
    command = ui_command_line(root, args.host, port)
    os.execve(command[0], command, os.environ | UI_ENV)  # the UI takes over this process: Ctrl-C stops it
    return 0  # not reached
