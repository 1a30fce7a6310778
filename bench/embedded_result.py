"""The embedded learning result: a finished `mazerl run` written up in docs/performance.md.

    time make run                                  # the embedded default, end to end
    .venv/bin/python bench/embedded_result.py --root .mazerl [--run RUN_ID] [--wall-seconds S]

Reads what the pipeline left in ``<root>/runs/<run>/`` (the newest run unless ``--run``):
``summary.json`` (baseline, final, paired per-maze outcomes, exact McNemar p, ceiling),
``metrics.jsonl`` (sampled and greedy success by step, step times), ``train_result.json``
and ``train_config.json``; copies the learning-curve plot to ``docs/img/`` and replaces the
``embedded_result`` section of docs/performance.md. ``--wall-seconds``: the whole command's
wall time (from ``time make run``), which the run's files do not hold.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.learning_result import shaping_words  # noqa: E402
from bench.report import write_section  # noqa: E402
from mazerl.eval_files import read_result_rows  # noqa: E402
from mazerl.tracking.curves import GREEDY_KEY, SAMPLED_KEY, curve_table, history_from_jsonl  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs"


def newest_run(root: Path) -> Path:
    done = [p.parent for p in (root / "runs").glob("*/summary.json")]
    if not done:
        raise SystemExit(f"no finished run under {root / 'runs'} (a run writes summary.json when promote ends)")
    return max(done, key=lambda p: (p / "summary.json").stat().st_mtime)


def baseline_on_subset(root: Path, run_dir: Path, base_model: str, count: int | None) -> float | None:
    """The baseline's greedy success on the first ``count`` mazes (what the periodic evals play):
    from this run's baseline eval, or the cached one it reused (same base model directory)."""
    candidates = [run_dir / "eval" / "baseline", *sorted((root / "runs").glob("*/eval/baseline"))]
    for folder in candidates:
        summary = folder / "summary.json"
        if summary.is_file() and json.loads(summary.read_text()).get("model_dir") == base_model:
            rows = read_result_rows(folder / "results.jsonl")
            played = sorted(rows, key=lambda row: row["index"])[:count]
            return sum(row["solved"] for row in played) / len(played)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(".mazerl"), help="data root of the run")
    parser.add_argument("--run", help="run id (default: the newest finished run)")
    parser.add_argument("--wall-seconds", type=float, help="wall time of the whole `make run`")
    parser.add_argument("--note", default="", help="how the command was run (load, venv), appended to the timing")
    args = parser.parse_args(argv)

    run_dir = args.root / "runs" / args.run if args.run else newest_run(args.root)
    summary = json.loads((run_dir / "summary.json").read_text())
    trained = json.loads((run_dir / "train_result.json").read_text())
    config = json.loads((run_dir / "train_config.json").read_text())
    history = history_from_jsonl(run_dir / "metrics.jsonl", (SAMPLED_KEY, GREEDY_KEY, "train/step_seconds"))
    step_seconds = sum(seconds for _, seconds in history["train/step_seconds"])  # a redone step counts once

    image = DOCS / "img" / "embedded_learning_curve.png"
    image.parent.mkdir(exist_ok=True)
    shutil.copyfile(run_dir / "learning_curve" / "learning_curve.png", image)

    grpo = config["grpo"]
    subset = baseline_on_subset(args.root, run_dir, config["base_model"], config.get("eval_mazes"))
    eval_note = f"the first {config['eval_mazes']} eval mazes" if config.get("eval_mazes") else "the eval set"
    if subset is not None:
        eval_note += f" (the starter's greedy success there: {subset:.3f})"
    gain = summary["final"] - summary["baseline"]
    table = curve_table(history, summary["baseline"], summary["final"]).split("\n", 2)[2]
    wall = f"{args.wall_seconds / 60:.1f} min for the whole command; " if args.wall_seconds else ""
    body = f"""## The embedded learning result (`make run`)

The starter (`{Path(config["base_model"]).name}`) trained by GRPO with the embedded recipe
(`mazerl.training.recipes.EMBEDDED_TRAINING`): {config["steps"]} steps of {config["mazes_per_step"]} mazes x
{grpo["samples_per_maze"]} samples, learning rate {config["learning_rate"]:g} ({config.get("lr_schedule", "constant")}), update epochs per step:
{grpo["update_epochs"]}, {shaping_words(grpo)}temperature {grpo["temperature"]:g}, LoRA rank {config["lora"]["rank"]}{"" if config.get("freeze_vision", True) else " (the vision tower too)"}, {config["torch_threads"]} torch
thread(s), context mode: history_images {config["history_images"]}, history_text {config["history_text"]}, move
budget: {config["max_turns"]}. Baseline and final: greedy on every
maze of `{config["eval_set"]}` (none of them in the training pool).

| | greedy success |
| --- | ---: |
| baseline (starter) | **{summary["baseline"]:.1%}** |
| final (merged model) | **{summary["final"]:.1%}** ({gain * 100:+.1f} points) |
| budget ceiling | {summary["budget_ceiling"]:.1%} |

Per maze: {summary["fixed"]} fixed, {summary["broken"]} broken, {summary["still_failing"]} still failing;
exact McNemar p = {summary["mcnemar_p"]:.2g} (paired per-maze outcomes). Training: {trained["wall_seconds"] / 60:.1f} min wall
({step_seconds / 60:.1f} min in the steps, the rest in the periodic evals and loading); {wall}{args.note}
{summary["decision"]}

![learning curve](img/embedded_learning_curve.png)

Sampled success: the step's own training rollouts (temperature {grpo["temperature"]:g}; each step
draws other mazes, so it is noisy). Greedy eval: {eval_note}, every {config["eval_interval"]} steps.

{table}"""
    write_section("embedded_result", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
