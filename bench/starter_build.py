"""The starter build: time on 2 cores, learning curve, and greedy baseline across seeds.

    python bench/starter_build.py [--seeds 0 1 2] [--checkpoints 3]

For each seed: a full ``build_starter`` into a temporary directory (the same recipe as
``mazerl build-starter``), with greedy success on the first 64 eval mazes measured at
``checkpoints`` points of the warm-start (excluded from the build time), then the full
greedy eval (``mazerl.evaluation.evaluate``, 2 workers) on the embedded eval set, whose
mazes the warm-start never saw, and on 256 mazes of the warm-start's own pool (what
memorisation alone would give). Target: build <= 10 min on 2 cores, eval-set success in
[25%, 60%]. Run it alone, under the CPU lock.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import write_section  # noqa: E402

CURVE_MAZES = 64


def greedy_success(model, processor, layouts, history_images, cell_px: int, max_moves: int) -> float:
    from mazerl.policy.engines import GenerationSettings, HFEngine
    from mazerl.policy.episodes import run_episodes

    episodes = run_episodes(
        HFEngine(model, processor, max_batch_size=64),
        processor,
        layouts,
        GenerationSettings(greedy=True, max_new_tokens=8),
        max_moves=max_moves,
        cell_px=cell_px,
        history_images=history_images,
    )
    return sum(e.solved for e in episodes) / len(episodes)


def build_one(seed: int, checkpoints: int, workdir: Path) -> dict:
    from envs.evalset import load as load_eval_set
    from mazerl.evaluation.evaluate import evaluate
    from mazerl.evaluation.settings import EvalSettings
    from mazerl.starter.build import build_starter
    from mazerl.starter.config import StarterConfig
    from mazerl.starter.record import read_record
    from mazerl.starter.states import training_mazes

    config = StarterConfig(seed=seed)
    eval_set = load_eval_set(config.eval_set)
    curve_layouts = list(eval_set.layouts[:CURVE_MAZES])

    def measure(model, processor, step: int, epoch: float) -> dict[str, float]:
        rate = greedy_success(
            model, processor, curve_layouts, config.history_images, eval_set.cell_px, eval_set.max_moves
        )
        return {"eval64_success": round(rate, 4)}

    model_dir = build_starter(workdir / f"starter-seed{seed}", config, on_checkpoint=measure, checkpoints=checkpoints)
    record = read_record(model_dir)
    settings = EvalSettings(eval_set.name, eval_workers=2, gif_count=0)
    held_out = evaluate(model_dir, settings, workdir / f"eval{seed}")
    # The warm-start's own mazes (memorisation), played through the same runner.
    import torch

    from mazerl.policy.loader import load_policy

    torch.set_num_threads(2)
    policy = load_policy(model_dir, device="cpu")
    pool = training_mazes(eval_set, config.train_mazes)[:256]
    seen = greedy_success(
        policy.model, policy.processor, pool, config.history_images, eval_set.cell_px, eval_set.max_moves
    )
    return {"seed": seed, "record": record, "eval": held_out, "train_success": seen}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--checkpoints", type=int, default=3, help="curve points during the warm-start")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/performance.md alone")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            result = build_one(seed, args.checkpoints, Path(tmp))
            results.append(result)
            report = result["eval"]
            print(
                f"seed {seed}: build {result['record']['build_seconds']} s, eval-set success {report.success_rate:.1%} "
                f"({report.solved}/{report.n}), warm-start mazes {result['train_success']:.1%}",
                flush=True,
            )
    config = results[0]["record"]["config"]
    warm = results[0]["record"]["warm_start"]
    rows = "\n".join(
        f"| {r['seed']} | {r['record']['build_seconds']:.0f} | {r['record']['weights_sha256'][:12]} | "
        f"{r['eval'].success_rate:.1%} [{r['eval'].success_ci95[0]:.1%}, {r['eval'].success_ci95[1]:.1%}] | "
        f"{r['eval'].parse_failure_rate:.1%} | {r['train_success']:.1%} |"
        for r in results
    )
    curve_rows = "\n".join(
        f"| {p['step']} | {p['epoch']} | {p['answer_loss']} | {p['answer_accuracy']} | {p.get('cell_loss', '')} | "
        f"{p.get('eval64_success', '')} |"
        for p in warm["curve"]
    )
    body = f"""## Starter build (`bench/starter_build.py`)

`mazerl build-starter`: a {results[0]["record"]["parameters"] / 1e6:.2f} M-parameter Qwen3-VL (text
{config["text_hidden"]}x{config["text_layers"]}, vision {config["vision_hidden"]}x{config["vision_layers"]},
patch {config["patch_size"]}, merge 1), warm-started for {config["epochs"]} epochs on the {warm["states"]}
(maze, agent cell) states of the {warm["mazes"]} mazes outside the eval set, with history_images
{config["history_images"]}. Greedy success is free decoding (parse failures count as moves) on the
256 mazes of `maze256-small-v1`, which the warm-start never saw (budget ceiling 100%), and on 256 of the
warm-start's own mazes. Target: build <= 600 s on 2 cores; eval-set success in [25%, 60%].

| seed | build s | weights sha256 | eval-set success [95% CI] | parse failures | warm-start mazes |
| ---: | ---: | --- | ---: | ---: | ---: |
{rows}

Learning curve of seed {results[0]["seed"]} (training metrics averaged since the previous point;
`eval64` = greedy success on the first {CURVE_MAZES} eval mazes):

| step | epoch | answer loss | answer accuracy | cell loss | eval64 success |
| ---: | ---: | ---: | ---: | ---: | ---: |
{curve_rows}"""
    if not args.no_write:
        write_section("starter_build", body)
    print(body)
    print(json.dumps([{k: v for k, v in r.items() if k != "eval"} for r in results], default=str)[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
