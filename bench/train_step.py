"""Seconds per GRPO step of the local engine, split into rollout / update / checkpoint; resume time.

    python bench/train_step.py --model .mazerl/models/maze-starter-v1 [--steps 3]

Runs the embedded recipe (mazerl.params.EMBEDDED_TRAINING) for a few steps in a throw-away
run directory, then times a resume from the last checkpoint (load the base model, attach the
saved adapter, restore optimizer/scheduler state). Writes its section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench.report import write_section  # noqa: E402
from mazerl.params import EMBEDDED_TRAINING  # noqa: E402
from mazerl.tracking.metrics import MetricsLogger  # noqa: E402
from mazerl.training.config import TrainConfig  # noqa: E402
from mazerl.training.local_trainer import LocalGRPOTrainer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="starter model directory")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--training", default="{}", help="JSON overrides of the embedded recipe")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mazerl-bench-") as root:
        values = {
            **EMBEDDED_TRAINING,
            **json.loads(args.training),
            "run_id": "bench",
            "data_root": root,
            "base_model": args.model,
            "eval_set": "maze256-small-v1",
            "steps": args.steps,
            "checkpoint_interval": 1,
            "eval_interval": 0,
        }
        config = TrainConfig.model_validate(values)
        sink = MetricsLogger(None, None, config.run_dir / "metrics.jsonl")
        started = time.perf_counter()
        LocalGRPOTrainer(config, log=print).run(metrics_sink=sink)
        total = time.perf_counter() - started
        rows = [json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()]
        resume_started = time.perf_counter()
        trainer = LocalGRPOTrainer(config.model_copy(update={"steps": args.steps + 1}), log=lambda _: None)
        trainer._build(trainer._resume_point())
        resume_seconds = time.perf_counter() - resume_started

    def mean(key: str) -> float:
        return sum(row.get(key, 0.0) for row in rows) / len(rows)

    step = mean("train/step_seconds")
    rollout, update, ckpt = (
        mean("train/rollout_seconds"),
        mean("train/update_seconds"),
        mean("train/checkpoint_seconds"),
    )
    episodes = config.mazes_per_step * config.grpo.samples_per_maze
    body = "\n".join(
        [
            "## GRPO step of the local engine (`bench/train_step.py`)",
            "",
            f"Embedded recipe: {config.mazes_per_step} mazes x {config.grpo.samples_per_maze} samples = {episodes} "
            f"episodes per step, history_images={config.history_images}, update_epochs={config.grpo.update_epochs}, "
            f"LoRA rank {config.lora.rank}; mean over {len(rows)} steps ({total:.0f} s with model loading).",
            "",
            "| part | seconds per step | share |",
            "| --- | ---: | ---: |",
            f"| rollout (sampling {episodes} episodes, batched per turn) | {rollout:.1f} | {rollout / step:.0%} |",
            f"| update (old log-probs + clipped-surrogate epochs) | {update:.1f} | {update / step:.0%} |",
            f"| checkpoint (adapter, optimizer, scheduler, RNG; atomic) | {ckpt:.2f} | {ckpt / step:.1%} |",
            f"| **step** | **{step:.1f}** | |",
            "",
            f"Mean moves per episode {mean('train/moves_mean'):.1f}, reply tokens per episode "
            f"{mean('train/response_tokens'):.0f}. Resume (load base, attach the saved adapter, restore "
            f"optimizer and scheduler): **{resume_seconds:.1f} s**.",
        ]
    )
    print(body)
    if not args.no_write:
        write_section("train_step", body)


if __name__ == "__main__":
    main()
