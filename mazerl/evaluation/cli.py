"""``mazerl eval --model DIR``: the eval stage alone, with a progress bar."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _history(value: str) -> int | str:
    return value if value == "all" else int(value)


def add_eval_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a model greedily on an eval set (Ray workers)")
    parser.add_argument("--model", required=True, help="Hugging Face model directory (e.g. the starter)")
    parser.add_argument("--adapter", default=None, help="PEFT LoRA adapter directory to apply on top")
    parser.add_argument(
        "--eval-set",
        default=None,
        help="eval set name; default: the starter's set for the starter, else maze64-easy-v1",
    )
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--workers", type=int, default=2, help="parallel Ray workers (default 2)")
    parser.add_argument("--out", default=None, help="output directory; default <data root>/evals/<model>/<set>")
    parser.add_argument("--gifs", type=int, default=4, help="episode GIFs to write (half solved, half failed)")
    parser.add_argument("--max-mazes", type=int, default=None, help="evaluate only the first N mazes")
    parser.add_argument("--ray-address", default=None, help="Ray cluster address; default: a local Ray for this call")
    parser.add_argument("--history-images", type=_history, default=None, help="'all' or K; default: the model's")
    parser.add_argument(
        "--history-text", type=_history, default=None, help="'all' or K past exchanges; default: the model's"
    )
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--data-root", default=None, help="data root (default $MAZERL_HOME or ./.mazerl)")
    parser.set_defaults(func=run_eval_command)


def run_eval_command(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from envs.evalset import DEFAULT_EVAL_SET
    from mazerl import paths
    from mazerl.evaluation import evaluate
    from mazerl.policy.starter import RECORD_FILE

    model = Path(args.model).expanduser().resolve()
    eval_set = args.eval_set
    if eval_set is None:
        record = model / RECORD_FILE
        eval_set = json.loads(record.read_text())["config"]["eval_set"] if record.is_file() else DEFAULT_EVAL_SET
    out = args.out or paths.data_root(args.data_root) / "evals" / model.name / eval_set
    bar = tqdm(total=0, unit="maze", desc=f"eval {model.name} on {eval_set}")

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        report = evaluate(
            model,
            adapter=args.adapter,
            eval_set=eval_set,
            engine=args.engine,
            workers=args.workers,
            out_dir=out,
            gif_count=args.gifs,
            max_mazes=args.max_mazes,
            ray_address=args.ray_address,
            history_images=args.history_images,
            history_text=args.history_text,
            max_new_tokens=args.max_new_tokens,
            progress=progress,
        )
    finally:
        bar.close()
    low, high = report.success_ci95
    print(
        f"success {report.success_rate:.1%} ({report.solved}/{report.n}, 95% CI {low:.1%}-{high:.1%}), "
        f"budget ceiling {report.budget_ceiling:.1%}, parse failures {report.parse_failure_rate:.1%}, "
        f"{report.episodes_per_second:.1f} episodes/s, {report.wall_seconds:.1f} s"
    )
    print(f"wrote {report.summary_path}, {report.results_path} and {len(report.gif_paths)} GIFs")
    return 0
