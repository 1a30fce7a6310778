"""How cost grows: eval time as the maze count doubles, GRPO step time as mazes per step and group size double.

    flock /tmp/mazerl-cpu.lock .venv/bin/python bench/scaling.py [--model DIR]

Eval: ``mazerl.evaluation.evaluate`` with one worker on the first 32, 64 and 128 mazes of the
embedded set, in one Ray instance started beforehand (so Ray's start-up is not in the numbers);
the rollout time is mazes / episodes-per-second, the wall time adds the worker's model load.
Training: the local engine with fixed settings of its own (15-turn budget, one image in
the context, 12-token replies, 2 update epochs, 2 threads), 3 steps per configuration, the mean
of steps 2-3 (step 1 pays one-off allocations): mazes per step 2, 4, 8 at group size 4, and group
size 4, 8, 16 at 2 mazes per step.

The fit of each series: the exponent k of t ~ n^k between 1x and 4x (1 = linear), and the
least-squares line t = a + b n (a: the fixed cost, b: the cost per unit).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import write_section  # noqa: E402

EVAL_MAZES = (32, 64, 128)
BASE_MAZES, BASE_GROUP = 2, 4
RECIPE = {
    "history_images": 1,
    "max_turns": 15,
    "train_pool_size": 512,
    "learning_rate": 1e-4,
    "checkpoint_interval": 100,
    "torch_threads": 2,
    "grpo": {"update_epochs": 2, "temperature": 1.0, "max_new_tokens": 12},
}


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float, str]:
    """(exponent between first and last point, intercept a, slope b, verdict)."""
    exponent = math.log(ys[-1] / ys[0]) / math.log(xs[-1] / xs[0])
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum((x - mean_x) ** 2 for x in xs)
    a = mean_y - b * mean_x
    if exponent > 1.1:
        verdict = "worse than linear"
    elif exponent >= 0.9:
        verdict = "linear"
    else:
        verdict = "sublinear (a fixed part is amortised)"
    return exponent, a, b, verdict


def eval_series(model: Path) -> list[tuple[int, float, float]]:
    """(mazes, rollout seconds, wall seconds) for each maze count."""
    from mazerl.cluster.head.driver import ray_driver
    from mazerl.cluster.head.local import local_ray_head
    from mazerl.evaluation.evaluate import evaluate
    from mazerl.evaluation.settings import EvalSettings

    rows = []
    with local_ray_head() as head, ray_driver(head), tempfile.TemporaryDirectory(prefix="mazerl-bench-") as tmp:
        for mazes in EVAL_MAZES:
            settings = EvalSettings("maze256-small-v1", eval_workers=1, max_eval_mazes=mazes, gif_count=0)
            report = evaluate(model, settings, Path(tmp) / str(mazes))
            rows.append((mazes, report.n / report.episodes_per_second, report.wall_seconds))
            print(f"eval {mazes} mazes: rollout {rows[-1][1]:.1f} s, wall {rows[-1][2]:.1f} s", flush=True)
    return rows


def step_seconds(model: Path, mazes: int, group: int) -> dict[str, float]:
    """Mean step / rollout / update seconds of steps 2-3 of a fresh run."""
    from mazerl.tracking.metrics import MetricsLogger
    from mazerl.training.config import TrainConfig
    from mazerl.training.local_trainer import LocalGRPOTrainer

    with tempfile.TemporaryDirectory(prefix="mazerl-bench-") as root:
        values = RECIPE | {
            "run_id": "scaling",
            "data_root": root,
            "base_model": str(model),
            "eval_set": "maze256-small-v1",
            "steps": 3,
            "mazes_per_step": mazes,
            "grpo": RECIPE["grpo"] | {"samples_per_maze": group},
        }
        config = TrainConfig.model_validate(values)
        sink = MetricsLogger(None, None, config.run_dir / "metrics.jsonl")
        LocalGRPOTrainer(config, log=lambda _: None).run(metrics_sink=sink)
        rows = [json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()][1:]
    out = {key: sum(row[f"train/{key}"] for row in rows) / len(rows) for key in ("step_seconds", "rollout_seconds")}
    out["update_seconds"] = sum(row["train/update_seconds"] for row in rows) / len(rows)
    print(f"train {mazes} mazes x {group}: {out}", flush=True)
    return out


def table(rows: list[tuple], header: str) -> str:
    return "\n".join([header, "| " + " | ".join("---:" for _ in rows[0]) + " |", *rows_md(rows)])


def rows_md(rows: list[tuple]) -> list[str]:
    return ["| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row) + " |" for row in rows]


def fit_line(name: str, xs: list[float], ys: list[float], unit: str) -> str:
    exponent, a, b, verdict = fit(xs, ys)
    return f"- {name}: **{verdict}**, t ~ n^{exponent:.2f} from 1x to 4x; t = {a:.1f} s + {b:.2f} s per {unit}."


def main(argv: list[str] | None = None) -> int:
    from mazerl.starter.build import ensure_starter

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", default=None, help="model directory (default: the embedded starter, built if missing)"
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/performance.md alone")
    args = parser.parse_args(argv)
    model = Path(args.model).resolve() if args.model else ensure_starter()

    evals = eval_series(model)
    by_mazes = [(m, step_seconds(model, m, BASE_GROUP)) for m in (BASE_MAZES, 2 * BASE_MAZES, 4 * BASE_MAZES)]
    by_group = [(g, step_seconds(model, BASE_MAZES, g)) for g in (BASE_GROUP, 2 * BASE_GROUP, 4 * BASE_GROUP)]

    eval_rows = [(f"{m} ({m // EVAL_MAZES[0]}x)", rollout, wall) for m, rollout, wall in evals]
    maze_rows = [
        (f"{m} x {BASE_GROUP} ({m // BASE_MAZES}x)", s["step_seconds"], s["rollout_seconds"], s["update_seconds"])
        for m, s in by_mazes
    ]
    group_rows = [
        (f"{BASE_MAZES} x {g} ({g // BASE_GROUP}x)", s["step_seconds"], s["rollout_seconds"], s["update_seconds"])
        for g, s in by_group
    ]
    fits = [
        fit_line("eval rollout vs mazes", [m for m, _, _ in evals], [r for _, r, _ in evals], "maze"),
        fit_line("eval wall vs mazes", [m for m, _, _ in evals], [w for _, _, w in evals], "maze"),
        fit_line(
            "step vs mazes per step",
            [m * BASE_GROUP for m, _ in by_mazes],
            [s["step_seconds"] for _, s in by_mazes],
            "episode",
        ),
        fit_line(
            "step vs group size",
            [BASE_MAZES * g for g, _ in by_group],
            [s["step_seconds"] for _, s in by_group],
            "episode",
        ),
    ]
    body = f"""## How cost grows (`bench/scaling.py`)

Model `{model.name}` on `maze256-small-v1`, CPU. Eval: one worker (hf engine, chunks of 32 mazes batched
per turn), Ray started once beforehand; rollout = mazes / episodes-per-second, wall adds the worker's
model load. Training: the local engine with fixed settings of its own (15-turn budget,
one image in context, 12-token replies, 2 update epochs, 2 threads); mean of steps 2-3 of a fresh run.

{table(eval_rows, "| mazes | rollout s | wall s |")}

{table(maze_rows, "| mazes x group | step s | rollout s | update s |")}

{table(group_rows, "| mazes x group | step s | rollout s | update s |")}

Fit (exponent k of t ~ n^k between 1x and 4x; least-squares line over the three points):

{chr(10).join(fits)}

Episodes per step are what training cost follows: doubling the mazes or the group size doubles the
episodes, and the two series show whether it matters which of the two is doubled (it should not
beyond noise: the same episodes are batched per turn either way)."""
    if not args.no_write:
        write_section("scaling", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
