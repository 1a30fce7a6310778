"""``mazerl eval --model DIR``: the eval stage alone, with a progress bar.

Every flag is checked first (the model directory as the pipeline's preflight reads it: no
weights, no code), so a bad one is refused in seconds with exit code 2, before Ray starts or
the model loads, and nothing is written. Without ``--ray-address`` the eval runs on the
embedded loopback-only Ray head (token auth), started if none runs and stopped when the last
command using it ends; with ``--ray-address http://<head>:8265`` (or such a ``RAY_ADDRESS``) it
runs as a Ray job on that cluster (:mod:`mazerl.evaluation.on_cluster`). Exit codes: 0 done, 2 a
bad flag, 1 a failure during the eval.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from envs.evalset import DEFAULT_EVAL_SET, SPECS, EvalSetError, load
from mazerl import paths
from mazerl.cluster.errors import ConfigError
from mazerl.cluster.head.temp_dir import check_temp_dir
from mazerl.evaluation.on_cluster import evaluate_as_job, is_job_server_address
from mazerl.evaluation.settings import EvalSettings, check_max_eval_mazes
from mazerl.policy.context_mode import CURRENT_FRAME_MODES
from mazerl.preflight.data_root import check_data_root, check_root_env
from mazerl.preflight.input_error import InputError
from mazerl.preflight.model_dir import check_adapter, check_base_model
from mazerl.preflight.ray_address import check_ray_address, check_ray_address_env, check_ray_address_form_as
from mazerl.starter.record import RECORD_FILE

if TYPE_CHECKING:
    from mazerl.evaluation.evaluate import EvalReport

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2


def _history(value: str) -> int | str:
    if value == "all":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not 'all' or an integer") from None


def _history_text(value: str) -> int | str:
    return value if value in CURRENT_FRAME_MODES else _history(value)


class _StoreWithFlag(argparse.Action):
    """Store the value and the flag it came by (``<dest>_flag``), so that an error names what the user
    typed, an old alias included."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_flag", option_string)


def add_eval_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a model greedily on an eval set (Ray workers)")
    parser.add_argument("--model", required=True, help="Hugging Face model directory (e.g. the starter)")
    parser.add_argument("--adapter", default=None, help="PEFT LoRA adapter directory to apply on top")
    parser.add_argument(
        "--eval-set",
        default=None,
        help="eval set name; default: the starter's set for the starter, else maze64-easy-v1",
    )
    # the names `mazerl run` and the pipeline parameters use; the short old ones stay as aliases
    parser.add_argument(
        "--eval-engine", "--engine", dest="engine", choices=("hf", "vllm"), default="hf", action=_StoreWithFlag
    )
    parser.add_argument(
        "--eval-workers",
        "--workers",
        dest="workers",
        type=int,
        default=2,
        action=_StoreWithFlag,
        help="parallel Ray workers (default 2)",
    )
    parser.add_argument("--out", default=None, help="output directory; default <data root>/evals/<model>/<set>")
    parser.add_argument("--gifs", type=int, default=4, help="episode GIFs to write (half solved, half failed)")
    parser.add_argument(
        "--max-eval-mazes",
        "--max-mazes",
        dest="max_mazes",
        type=int,
        default=None,
        action=_StoreWithFlag,
        help="evaluate only the first N mazes",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="a Ray cluster's job server (http://<head>:8265), where the eval runs as a Ray job (paths as the "
        "cluster sees them); default: the embedded local head (loopback only)",
    )
    parser.add_argument("--history-images", type=_history, default=None, help="'all' or K; default: the model's")
    parser.add_argument(
        "--history-text",
        type=_history_text,
        default=None,
        help="'all', K past exchanges, 'feedback' (the last feedback line only) or 'tried' (also the replies given "
        "before on the same frame); default: the model's",
    )
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--data-root", default=None, help="data root (default $MAZERL_HOME or ./.mazerl)")
    parser.set_defaults(
        func=run_eval_command,
        engine_flag="--eval-engine",
        workers_flag="--eval-workers",
        max_mazes_flag="--max-eval-mazes",
    )


def check_eval_flags(args: argparse.Namespace) -> tuple[Path, str, Path]:
    """(model dir, eval set, output dir) once every flag is known to work; raises ValueError naming the flag.

    The cheap checks come first; reading the model's config imports transformers (and torch).
    """
    for flag, value, minimum in (
        (args.workers_flag, args.workers, 1),
        (args.max_mazes_flag, args.max_mazes, 1),
        ("--max-new-tokens", args.max_new_tokens, 1),
        ("--gifs", args.gifs, 0),
    ):
        if value is not None and value < minimum:
            raise InputError(flag, f"{flag} {value} must be >= {minimum}")
    if args.history_images is not None and args.history_images != "all" and args.history_images < 1:
        raise InputError("--history-images", f"--history-images {args.history_images} must be 'all' or >= 1")
    model = paths.absolute_path(args.model)
    eval_set = args.eval_set
    if eval_set is None:
        eval_set = recorded_eval_set(model)
    if eval_set not in SPECS:
        raise InputError("--eval-set", f"--eval-set {eval_set!r} is unknown; choose one of {sorted(SPECS)}")
    try:
        load(eval_set)
    except EvalSetError as exc:
        raise InputError("--eval-set", f"--eval-set {eval_set}: {exc}") from exc
    check_max_eval_mazes(args.max_mazes, eval_set, args.max_mazes_flag)
    if args.adapter is not None:
        check_adapter(Path(args.adapter).expanduser(), field="--adapter")
    root_field = check_root_env(args.data_root)
    out = Path(args.out).expanduser() if args.out else paths.data_root(args.data_root) / "evals" / model.name / eval_set
    if out.exists() and not out.is_dir():
        raise InputError("--out", f"--out {out} is a file; give a directory for the results (it may exist)")
    check_data_root(out, field="--out" if args.out else root_field)
    if args.ray_address is not None:
        check_ray_address(check_ray_address_form_as(args.ray_address, "--ray-address"))
    else:  # evaluate() then connects to RAY_ADDRESS when it is set (Ray's own variable)
        check_ray_address_env()
    check_base_model(model, field="--model")
    check_engine(args.engine, args.ray_address, args.engine_flag)
    if args.ray_address is None:
        check_temp_dir()  # last: it makes the (private) directory when it is fine
    return model, eval_set, out


def check_engine(engine: str, ray_address: str | None, flag: str = "--eval-engine") -> None:
    """The engine can run where the eval runs; the one place that decides it.

    vLLM's eval workers each ask Ray for a GPU: on the embedded head of a machine without one they
    would wait for it forever (the bar at ``0maze`` for minutes, no message), so that is refused
    before anything starts. A cluster (``--ray-address``, or ``RAY_ADDRESS``) counts its own GPUs
    (declared ones too: that is how the vLLM test leg runs vLLM's CPU build, ``MAZERL_VLLM_DEVICE=cpu``).
    """
    if engine != "vllm" or ray_address is not None or os.environ.get("RAY_ADDRESS"):
        return
    import torch  # lazy: seconds; the model check before this one has imported it already

    if torch.cuda.device_count() == 0:
        raise InputError(
            flag,
            f"{flag} vllm: this machine has no GPU, and each vLLM eval worker needs one (on the embedded Ray head "
            "it would wait for one forever); run it on a machine with a GPU, give --ray-address of a Ray cluster "
            f"with GPUs, or use {flag} hf (CPU)",
        )


def recorded_eval_set(model: Path) -> str:
    """The eval set a starter's ``starter.json`` names (the default set for other models); a damaged record
    is refused naming the file."""
    record = model / RECORD_FILE
    if not record.is_file():
        return DEFAULT_EVAL_SET
    try:
        eval_set = json.loads(record.read_bytes())["config"]["eval_set"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            "--model",
            f"--model {model}: its {RECORD_FILE} does not parse as a starter's build record ({type(exc).__name__}: "
            f"{exc}); restore the file from the starter it came with, or pass --eval-set",
        ) from None
    if not isinstance(eval_set, str):
        raise InputError("--model", f"--model {model}: its {RECORD_FILE} names no eval set; pass --eval-set")
    return eval_set


def run_eval_command(args: argparse.Namespace) -> int:
    try:
        model, eval_set, out = check_eval_flags(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    settings = EvalSettings(
        eval_set=eval_set,
        eval_workers=args.workers,
        max_eval_mazes=args.max_mazes,
        gif_count=args.gifs,
        eval_engine=args.engine,
        max_new_tokens=args.max_new_tokens,
        history_images=args.history_images,
        history_text=args.history_text,
    )
    job_server = args.ray_address or os.environ.get("RAY_ADDRESS")
    if is_job_server_address(job_server):  # a dashboard: ray.init cannot take it, Ray's job API can
        return _run_eval_job(job_server, args, model, settings, out)

    from tqdm import tqdm

    from mazerl.evaluation.evaluate import evaluate  # imports torch and ray: only once the flags are known good

    bar = tqdm(total=0, unit="maze", desc=f"eval {model.name} on {eval_set}")

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:  # without an address (and no RAY_ADDRESS) evaluate() uses the embedded head
        report = evaluate(model, settings, out, args.adapter, ray_address=args.ray_address, progress=progress)
    except ValueError as exc:  # what only loading can find (a tokenizer without Qwen's tokens, ...)
        bar.close()
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:
        bar.close()
        print(f"error: the eval failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    bar.close()
    _print_report(report)
    return EXIT_OK


def _run_eval_job(address: str, args: argparse.Namespace, model: Path, settings: EvalSettings, out: Path) -> int:
    """The eval as a Ray job on the cluster at ``address``; the job's own lines show its progress."""
    print(f"eval {model.name} on {settings.eval_set}: a Ray job on {address}", flush=True)
    try:
        report = evaluate_as_job(address, model, settings, out, args.adapter, log=lambda line: print(line, flush=True))
    except ConfigError as exc:  # the job refused its request (exit code 2), or another run's job is in the way
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:
        print(f"error: the eval failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    _print_report(report)
    return EXIT_OK


def _print_report(report: EvalReport) -> None:
    low, high = report.success_ci95
    print(
        f"success {report.success_rate:.1%} ({report.solved}/{report.n}, 95% CI {low:.1%}-{high:.1%}), "
        f"budget ceiling {report.budget_ceiling:.1%}, parse failures {report.parse_failure_rate:.1%}, "
        f"{report.episodes_per_second:.1f} episodes/s, {report.wall_seconds:.1f} s"
    )
    print(f"wrote {report.summary_path}, {report.results_path} and {len(report.gif_paths)} GIFs")
