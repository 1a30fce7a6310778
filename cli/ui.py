"""``mazerl ui``: the MLflow UI on the embedded store, with the link to the runs table.

The same as ``.venv/bin/mlflow ui --backend-store-uri sqlite:///<root>/mlflow.db
--default-artifact-root <root>/mlartifacts`` (which needs no activated venv either), plus the
link that opens the experiment on its training runs table (docs/mlflow.md says why the link
carries ``workflowType=machine_learning``), sized for a laptop: one web worker (MLflow starts
four), no line per HTTP request, and none of MLflow's background job processes (they serve
GenAI features a training store does not use).

Port 5000 taken (another UI, another program): without ``--port`` the UI takes a free port and
prints its link; with ``--port`` it refuses with the fix instead of starting. Every flag and the
store are checked before MLflow is imported, so a bad one is refused in a moment, naming it and the
fix, instead of a traceback. Exit codes: 2 a bad flag (a port out of range or taken, a host that is
no address of this machine, an empty ``--data-root``) or no usable store under the data root (no
``mlflow.db``, or one that is not a SQLite database); else the UI's own.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from pathlib import Path

from mazerl import paths
from mazerl.preflight.data_root import check_root_env
from mazerl.preflight.input_error import InputError
from mazerl.preflight.tracking_store import sqlite_file_problem

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


def choose_port(host: str, asked: int | None) -> tuple[int, str | None]:
    """(port to use, note for the user); an InputError when the port asked for is taken, or ``host`` is no
    address of this machine to listen on (a name that does not resolve, another machine's address)."""
    try:
        if asked is not None:
            if port_is_free(host, asked):
                return asked, None
            raise InputError(
                "--port",
                f"port {asked} on {host} is already in use (another MLflow UI or program listens there); stop it, "
                "or give another --port, or leave --port out to take a free one",
            )
        if port_is_free(host, DEFAULT_PORT):
            return DEFAULT_PORT, None
        port = free_port(host)
    except OSError as exc:  # socket.gaierror (a name that does not resolve) is one
        what = "does not resolve" if isinstance(exc, socket.gaierror) else "is not an address of this machine"
        raise InputError(
            "--host",
            f"--host {host!r} {what} ({exc.strerror}); give an address of this machine to listen on, e.g. "
            "127.0.0.1 (this machine only) or 0.0.0.0 (every interface)",
        ) from None
    return port, (
        f"port {DEFAULT_PORT} is in use, so this UI listens on port {port}: in links printed by `mazerl run`, "
        f"put {port} in place of {DEFAULT_PORT}"
    )


def check_ui_inputs(args: argparse.Namespace) -> tuple[Path, int, str | None]:
    """(data root, port, note for the user) once the flags and the store are known to work, before MLflow is
    imported; an InputError names the flag and the fix (MLflow would end in a traceback on each)."""
    if args.port is not None and not 0 < args.port < 65536:
        raise InputError(
            "--port",
            f"--port {args.port} is not a TCP port; give one from 1 to 65535, or leave --port out for {DEFAULT_PORT} "
            "(or a free one if it is taken)",
        )
    port, note = choose_port(args.host, args.port)
    check_root_env(args.data_root)  # an empty --data-root or MAZERL_HOME is refused, not read as ./.mazerl
    root = paths.data_root(args.data_root)
    database = root / "mlflow.db"
    if not database.is_file():
        raise InputError(
            "--data-root",
            f"no MLflow store under the data root {root} (no mlflow.db); run `mazerl run` first, or give "
            f"--data-root (or ${paths.ROOT_ENV_VAR}) of the run to look at",
        )
    problem = sqlite_file_problem(database)
    if problem:
        raise InputError(
            "--data-root",
            f"the data root's MLflow store cannot be opened: {problem}; give --data-root (or ${paths.ROOT_ENV_VAR}) "
            "of a run's data root, or move the file away (mazerl run then makes a new store)",
        )
    return root, port, note


def ui_command(args: argparse.Namespace) -> int:
    try:
        root, port, note = check_ui_inputs(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
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
