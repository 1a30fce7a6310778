"""``mazerl run``: the pipeline flow on this machine, with nothing configured beforehand.

It checks every input first (flags, the parameters file, :mod:`mazerl.preflight`, Prefect's
environment, the Ray address or the embedded head's temp dir), so a bad input is refused in
about a second, exit code 2, before Prefect or Ray start and before anything is written. Then,
unless a Prefect API is configured, it starts Prefect's server over a store under the data root
in a session of its own (:mod:`cli.prefect_server`), uses the embedded Ray head if no address is
given (started if none runs, stopped when the last run using it ends), runs the flow, and prints
where everything landed. Ctrl-C (which a terminal sends to its whole foreground process group)
and SIGTERM reach only this process: it marks the flow run Crashed, stops the stage's Ray job,
releases the head, stops the server, and exits 130 within seconds.

Run again after an interruption, it resumes: the unfinished run with the same parameters on the
same data root continues from its newest intact checkpoint, and ``--fresh`` starts a new one
instead (:mod:`cli.resume`); a temporary Prefect server a killed run left behind is stopped first.

Exit codes: 0 the run completed, 2 a bad input (the message names the flag or parameter and
the fix), 1 a failure during the run (its record is the failed Prefect flow run; the same command
resumes it), 130 interrupted (Ctrl-C, SIGTERM; the same command resumes it).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shlex
import signal
import sys
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cli import prefect_server, resume
from cli.prefect_env import check_prefect_env
from mazerl import paths
from mazerl.cluster.client import ray_headers
from mazerl.cluster.head.local import find_local_head, local_ray_head
from mazerl.cluster.head.temp_dir import check_temp_dir
from mazerl.cluster.jobs.pipeline_jobs import stop_pipeline_jobs
from mazerl.input_files import InputFileError, parse_json, read_input_text
from mazerl.params import PRESETS, PipelineParams
from mazerl.preflight.pipeline import check_pipeline_inputs
from mazerl.preflight.ray_address import check_ray_address, check_ray_address_env

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
# Lines of a run that tell its user nothing at the terminal. Only the terminal drops them: Prefect's
# log of the run (its database, the UI, `prefect flow-run logs`) and the Ray jobs' logs keep every line.
TERMINAL_NOISE = (
    re.compile(r"^Finished in state Completed\(\)$"),  # one per task run; the stage lines say where the run is
)
OWN_PACKAGES = ("mazerl.", "cli.", "tasks.", "flows.", "envs.")  # modules whose exceptions carry their whole story
QUIET_LOGGERS = ("mlflow.store.db.utils", "alembic.runtime.migration")  # a new store's table creation, at INFO
JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


class FlagError(ValueError):
    """A flag or parameters file that cannot be read as what it must be."""


def configure_prefect(root: Path) -> None:
    """Embedded Prefect: its database, results and cache live under the data root.

    A user with their own Prefect server (``PREFECT_API_URL``) or home keeps them.
    """
    if not os.environ.get("PREFECT_API_URL"):
        os.environ.setdefault("PREFECT_HOME", str(root / "prefect"))
    os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", str(root / "prefect" / "storage"))
    os.environ.setdefault("PREFECT_RESULTS_PERSIST_BY_DEFAULT", "true")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect's temporary server gets 20 s to start by default; a busy 2-core laptop needs more
    # (seen: "Timed out while attempting to connect to ephemeral Prefect API server").
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    # MLflow's download bars ("Downloading artifacts: 100%|...") when a table artifact is appended to
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


class TerminalNoise(logging.Filter):
    """Drops :data:`TERMINAL_NOISE` from the terminal's log handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(pattern.search(message) for pattern in TERMINAL_NOISE)


class NoOwnTracebacks(logging.Formatter):
    """The terminal's formatter without the traceback of the project's own errors.

    An exception class of this project (``InputError``, the cluster's ``ConfigError`` family,
    ``StorageFullJobError``, ...) is raised with a complete message that names the cause and the
    fix: at the terminal its 80-line traceback would bury that one line. Prefect's log of the
    run keeps the traceback (its API handler formats the record first), and a library's or
    Python's own exception (a bug) keeps its traceback here too.
    """

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        error = record.exc_info[1] if record.exc_info else None
        if error is None or not type(error).__module__.startswith(OWN_PACKAGES):
            return self.inner.format(record)
        saved = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text = saved


def quiet_terminal() -> None:
    """Filter the terminal's Prefect handler (never the one that sends logs to Prefect's API), keep the
    project's own errors to their message there, and hush the loggers of :data:`QUIET_LOGGERS`; call
    after Prefect is imported (it sets up its logging then)."""
    for handler in logging.getLogger().handlers:
        if type(handler).__name__ == "PrefectConsoleHandler":
            handler.addFilter(TerminalNoise())
            handler.setFormatter(NoOwnTracebacks(handler.formatter or logging.Formatter()))
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def add_run_command(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser("run", help="run the whole pipeline (embedded default: this machine, CPU)")
    run.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="named defaults that the other flags override; smoke: every stage once in about 2 minutes "
        "(the miniature training recipe, 16 eval mazes)",
    )
    run.add_argument(
        "--data-root", help=f"where models, runs and MLflow live (default ${paths.ROOT_ENV_VAR} or ./.mazerl)"
    )
    run.add_argument("--base-model", help="HF model directory (default: the self-built starter)")
    run.add_argument("--eval-set", help="eval set name (default: maze256-small-v1 for the starter)")
    run.add_argument("--backend", choices=["local", "skyrl"], help="training backend (default: local)")
    run.add_argument("--ray-address", help="Ray dashboard address (default: start a local head)")
    run.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite under the data root)")
    run.add_argument("--steps", type=int, help="GRPO steps (default: the embedded recipe's)")
    run.add_argument("--max-eval-mazes", type=int, help="evaluate only the first N mazes (smoke runs)")
    run.add_argument("--training", help="JSON object of training config overrides, e.g. '{\"learning_rate\": 5e-5}'")
    run.add_argument("--params", help="JSON file with all pipeline parameters (flags override it)")
    run.add_argument(
        "--fresh",
        action="store_true",
        help="start a new run even if a run with the same parameters on this data root was interrupted "
        "(default: resume that one from its last checkpoint)",
    )
    run.set_defaults(func=run_command)


def json_object(text: str, what: str, example: str) -> dict[str, Any]:
    """``text`` parsed as a JSON object; the error names ``what`` (a flag, or a file and its flag)."""
    try:
        value = parse_json(text, what, example)
    except InputFileError as exc:
        raise FlagError(str(exc)) from None
    if not isinstance(value, dict):
        kind = JSON_KINDS.get(type(value), type(value).__name__)
        raise FlagError(f"{what} holds a JSON {kind}, not an object; give an object, e.g. {example}")
    return value


def read_params_file(path: str) -> dict[str, Any]:
    """The ``--params`` file as a dict; every error names the file and the flag.

    Only a regular file of bounded size is read (:mod:`mazerl.input_files`): a FIFO or ``/dev/zero``
    is refused instead of blocking or filling memory, and nesting is bounded.
    """
    what = f"--params {path}"
    example = '{"base_model": "/models/qwen3-vl", "training": {"steps": 40}}'
    try:
        text = read_input_text(path, what, "a JSON file of pipeline parameters")
    except InputFileError as exc:
        raise FlagError(str(exc)) from None
    return json_object(text, what, example)


def build_params(args: argparse.Namespace) -> PipelineParams:
    """The flags and the parameters file as one ``PipelineParams`` (flags win); raises ValueError subclasses."""
    values = read_params_file(args.params) if args.params else {}
    flags = {
        "preset": args.preset,
        "data_root": args.data_root,
        "base_model": args.base_model,
        "eval_set": args.eval_set,
        "backend": args.backend,
        "ray_address": args.ray_address,
        "tracking_uri": args.tracking_uri,
        "max_eval_mazes": args.max_eval_mazes,
    }
    values |= {key: value for key, value in flags.items() if value is not None}
    training = values.get("training", {})
    if not isinstance(training, dict):
        raise FlagError(f'training in --params {args.params} must be a JSON object of overrides, e.g. {{"steps": 40}}')
    if args.training is not None:
        training = training | json_object(args.training, "--training", "'{\"learning_rate\": 5e-5}'")
    if args.steps is not None:
        training = training | {"steps": args.steps}
    values["training"] = training
    return PipelineParams.model_validate(values)


def describe(exc: Exception) -> str:
    """One line per problem: ``field: what is wrong and the fix`` (pydantic's own text without its noise)."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    lines = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        lines.append(message if not field or message.startswith(field) else f"{field}: {message}")
    return "\n".join(lines)


def check_run_inputs(params: PipelineParams) -> None:
    """Everything ``mazerl run`` can check in about a second, before it starts or writes anything."""
    check_pipeline_inputs(params)
    check_prefect_env()
    if params.ray_address is None:
        check_ray_address_env()
        check_temp_dir()  # the embedded head's (TMPDIR too long, or a directory others can write)
    else:
        check_ray_address(params.ray_address)


class Stopped(BaseException):
    """SIGTERM outside a flow run (Prefect turns it into ``TerminationSignal`` inside one)."""


def _raise_stopped(signum: int, _frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


def run_command(args: argparse.Namespace) -> int:
    try:
        params = build_params(args)
        check_run_inputs(params)
        root = params.root()
        paths.make_data_root(root)
        run_lock = resume.hold_run_lock(params)  # one mazerl run per run; held until this process ends
    except (ValueError, OSError) as exc:  # pydantic's ValidationError, InputError, FlagError are ValueErrors
        print(f"error: {describe(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    configure_prefect(root)
    signal.signal(signal.SIGTERM, _raise_stopped)  # a `kill` ends the run as Ctrl-C does: records closed, hint
    try:
        with run_lock, prefect_api():
            return _run_pipeline(args, params, root)
    except (KeyboardInterrupt, Stopped) as exc:  # before or after the flow run: nothing of it to close
        print(f"\ninterrupted ({signal_name(exc)}): {resume_hint(args)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except prefect_server.PrefectServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE


@contextlib.contextmanager
def prefect_api() -> Iterator[None]:
    """The Prefect API of this run: the configured one, or a temporary server of the data root's
    ``PREFECT_HOME`` in a session of its own (:mod:`cli.prefect_server`), stopped when the block ends."""
    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    home = os.environ["PREFECT_HOME"]
    prefect_server.stop_orphaned_servers(home, log=print)  # before this run's server opens the same database
    timeout = float(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"])
    with prefect_server.temporary_server(Path(home), timeout):
        yield


def _run_pipeline(args: argparse.Namespace, params: PipelineParams, root: Path) -> int:
    """The flow run (resumed, or new) on the embedded head or the given cluster; the exit code."""
    with local_ray_head() if params.ray_address is None else nullcontext() as head:
        if head is not None:
            print(f"local Ray head at {head.address} ({'started' if head.started_here else 'reused'})", flush=True)
        # Prefect, torch and MLflow take seconds to import: only once every input is known to be good
        from prefect.exceptions import TerminationSignal

        from flows.pipeline import pipeline

        quiet_terminal()
        try:
            state = run_or_resume(pipeline, params, fresh=args.fresh, ray_address=params.ray_address or head.address)
            summary = state.result()
        except Exception as exc:  # the flow run's record (state, logs, traceback) is in Prefect
            print(f"\nerror: the pipeline run failed: {type(exc).__name__}: {describe(exc)}", file=sys.stderr)
            print("its record: prefect flow-run ls --state Failed; prefect flow-run logs <id>", file=sys.stderr)
            return EXIT_BAD_INPUT if isinstance(exc, ValueError) else EXIT_FAILURE
        except (KeyboardInterrupt, TerminationSignal, Stopped) as exc:  # Ctrl-C, SIGTERM: the run is Crashed
            print(f"\ninterrupted ({signal_name(exc)}): {resume_hint(args)}", file=sys.stderr)
            return EXIT_INTERRUPTED
    print("\n" + "=" * 72 + "\n" + summary.text())
    print(closing_hints(summary.tracking_uri, root, embedded_head=params.ray_address is None))
    return EXIT_OK


def run_or_resume(flow: Any, params: PipelineParams, *, fresh: bool, ray_address: str) -> Any:
    """Resume the unfinished run of these parameters (or, with ``fresh``, leave it) and run; the final State."""
    for other in resume.abandoned_runs(flow, params):
        for closed in resume.close_dead_attempt(other, params):
            print(f"the interrupted run {other.name}: {closed}", flush=True)
        print(
            f"the interrupted run {other.name} has other parameters ({resume.differences(other.params, params)}) and "
            f"is left as it is; to resume it {other.progress()}, run: {other.resume_command()}",
            flush=True,
        )
    interrupted = resume.find_interrupted_run(flow, params)
    if interrupted is not None:
        for closed in resume.close_dead_attempt(interrupted, params):
            print(f"the interrupted run {interrupted.name}: {closed}", flush=True)
        if not fresh:
            resume.check_recorded_config(interrupted, params)
            print(f"resuming {interrupted.name} {interrupted.progress()} (--fresh starts a new run)", flush=True)
            return resume.resume(flow, interrupted, params)
        stopped = stop_pipeline_jobs(ray_address, interrupted.flow_run_id, ray_headers(ray_address))
        print(
            f"starting a new run (--fresh); the interrupted run {interrupted.name} is left as it ended, its files "
            f"under {interrupted.run_dir}" + (f"; stopped its Ray jobs {', '.join(stopped)}" if stopped else ""),
            flush=True,
        )
    return flow(params, return_state=True)


def signal_name(exc: BaseException) -> str:
    """How the run was stopped, in the words of the user's action: KeyboardInterrupt (Ctrl-C) or SIGTERM."""
    signum = getattr(exc, "signal", None)  # Prefect's TerminationSignal
    return str(exc) if isinstance(exc, Stopped) else signal.Signals(signum).name if signum else type(exc).__name__


def resume_hint(args: argparse.Namespace) -> str:
    """What to type to continue an interrupted run: the same command."""
    mazerl = paths.venv_command("mazerl")
    again = f"{mazerl} {shlex.join(sys.argv[1:])}" if sys.argv[1:2] == ["run"] else f"{mazerl} run with the same flags"
    return f"run the same command again ({again}) to resume from the last checkpoint, or add --fresh to start over"


def closing_hints(tracking_uri: str, root: Path, *, embedded_head: bool) -> str:
    """How to look at the run, and the state of the embedded Ray head, as commands that work pasted (shell-quoted:
    a data root may hold spaces)."""
    mazerl, mlflow, quote = paths.venv_command("mazerl"), paths.venv_command("mlflow"), shlex.quote
    if tracking_uri == paths.mlflow_db_uri(root):
        lines = [
            f"Look at it: {mazerl} ui --data-root {quote(str(root))}",
            f"  (the same as {mlflow} ui --backend-store-uri {quote(tracking_uri)} "
            f"--default-artifact-root {quote(str(paths.mlflow_artifacts_dir(root)))})",
        ]
    elif tracking_uri.startswith(("http://", "https://")):
        lines = [f"Look at it: {tracking_uri}"]
    else:
        lines = [f"Look at it: {mlflow} ui --backend-store-uri {quote(tracking_uri)}"]
    if embedded_head:
        head = find_local_head()
        if head is None:
            lines.append("The embedded Ray head is stopped (no other run uses it).")
        else:
            lines.append(
                f"The embedded Ray head at {head.address} stays up (another run or eval uses it, or it was started "
                f"before this run); stop it when unused with: {mazerl} ray stop"
            )
    return "\n".join(lines)
