"""Eval throughput: the starter on the embedded eval set with 1 and 2 Ray workers.

    python bench/eval_throughput.py [--model DIR] [--max-mazes N]

Each run is a full ``mazerl.evaluation.evaluate`` call (it starts and stops its own local
Ray). Episodes/s count the rollout phase only (workers loaded); wall time is the whole
call, Ray start-up and model loading included. Targets: full eval <= 60 s on 2 cores,
scaling >= 1.7x from 1 to 2 workers. Run it alone (under the CPU lock): other load on the
two cores distorts both numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import write_section  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from mazerl.evaluation.evaluate import evaluate
    from mazerl.evaluation.settings import EvalSettings
    from mazerl.starter.build import ensure_starter

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: the starter, built if missing)")
    parser.add_argument("--max-mazes", type=int, default=None, help="evaluate only the first N mazes")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/performance.md alone")
    args = parser.parse_args(argv)
    model = Path(args.model) if args.model else ensure_starter()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (1, 2):
            settings = EvalSettings(
                "maze256-small-v1", eval_workers=workers, max_eval_mazes=args.max_mazes, gif_count=0
            )
            report = evaluate(model, settings, Path(tmp) / f"w{workers}")
            rows[workers] = report
            print(
                f"{workers} worker(s): {report.n} mazes, {report.episodes_per_second:.2f} episodes/s, "
                f"wall {report.wall_seconds:.1f} s, success {report.success_rate:.1%}",
                flush=True,
            )
        same = [json.loads(line)["actions"] for line in rows[1].results_path.read_text().splitlines()] == [
            json.loads(line)["actions"] for line in rows[2].results_path.read_text().splitlines()
        ]
    scaling = rows[2].episodes_per_second / rows[1].episodes_per_second
    table = "\n".join(
        f"| {w} | {r.n} | {r.episodes_per_second:.2f} | {r.wall_seconds:.1f} | {r.success_rate:.1%} |"
        for w, r in rows.items()
    )
    body = f"""## Eval throughput (`bench/eval_throughput.py`)

Greedy eval of `{model.name}` on `maze256-small-v1` (hf engine, one torch thread per Ray worker,
chunks of 32 mazes batched per turn). Episodes/s count the rollout phase; wall time includes
starting local Ray and loading the model in each worker. Targets: full eval <= 60 s on 2 cores,
>= 1.7x from 1 to 2 workers.

| workers | mazes | episodes/s | wall s | success |
| ---: | ---: | ---: | ---: | ---: |
{table}

Scaling 1 -> 2 workers: **{scaling:.2f}x**; replies identical maze by maze: {"yes" if same else "NO"}."""
    if not args.no_write:
        write_section("eval_throughput", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
