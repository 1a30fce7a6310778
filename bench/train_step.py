"""One GRPO step of the local engine, old path against new, side by side in one run.

    python bench/train_step.py --model .mazerl/models/maze-starter-v6 [--steps 2]

At the embedded recipe's settings (mazerl.training.recipes.EMBEDDED_TRAINING: 16 mazes x 8 samples),
each measured step runs four ways from the same weights (restored in between, so every
variant sees the same policy and the same mazes):

- **before**: the path this issue replaced: transformers' ``generate`` (HFEngine) and
  per-turn scoring, with the old context mode (``history_text: all``);
- **old path, new mode**: the same engines on the recipe's Markov contexts
  (``history_text`` as the recipe), on exactly the batch the new path then scores;
- **new, prompt per row**: the prefix-caching engine and the packed scorer with each row
  computing the task prompt itself (``share_prefix=False``), on the same batch;
- **new**: the same, the task prompt computed once per micro-batch (what training runs).

Per phase (rollout, update) it reports seconds and tokens: *existing* (every request's
context and reply, what a per-turn path computes) and *computed*. The three updates of the
same batch must give the same loss (printed). Then it times a checkpoint write and a resume.
The machine is shared: compare the columns of one run; absolute seconds carry the load
average printed beside them. Writes its section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

import torch  # noqa: E402

from bench.report import write_section  # noqa: E402
from mazerl.policy.engines import HFEngine  # noqa: E402
from mazerl.policy.prefix_engine import PrefixCachingEngine  # noqa: E402
from mazerl.training.config import TrainConfig  # noqa: E402
from mazerl.training.local_trainer import LocalGRPOTrainer  # noqa: E402
from mazerl.training.per_turn_oracle import PerTurnScorer  # noqa: E402
from mazerl.training.recipes import EMBEDDED_TRAINING  # noqa: E402
from mazerl.training.scoring import PackedScorer  # noqa: E402
from mazerl.training.seeding import seed_everything, step_seed  # noqa: E402

VARIANTS = {  # name -> (engine, scorer, history_text override or None for the recipe's)
    "before": (HFEngine, PerTurnScorer, "all"),
    "old path, new mode": (HFEngine, PerTurnScorer, None),
    "new, prompt per row": (PrefixCachingEngine, functools.partial(PackedScorer, share_prefix=False), None),
    "new": (PrefixCachingEngine, PackedScorer, None),
}


def rollout_tokens(episodes: list, engine: object) -> tuple[int, int]:
    """(existing, computed): every request's context + reply; what the engine computed."""
    existing = sum(len(t.input_ids) + len(t.response_ids) for e in episodes for t in e.turns)
    stats = getattr(engine, "stats", None)
    computed = existing if stats is None else stats.prefill_tokens + stats.decode_tokens
    return existing, computed


def load() -> float:
    return os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="starter model directory")
    parser.add_argument("--steps", type=int, default=2, help="measured steps (each run four ways)")
    parser.add_argument("--training", default="{}", help="JSON overrides of the embedded recipe")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    loads = [load()]
    with tempfile.TemporaryDirectory(prefix="mazerl-bench-") as root:
        values = {
            **EMBEDDED_TRAINING,
            **json.loads(args.training),
            "run_id": "bench",
            "data_root": root,
            "base_model": args.model,
            "eval_set": "maze256-small-v1",
            "steps": args.steps,
            "eval_interval": 0,
        }
        config = TrainConfig.model_validate(values)
        trainer = LocalGRPOTrainer(config, log=print)
        trainer._build(None)
        for step in range(1, args.steps + 1):
            shared: list = []
            weights = copy.deepcopy({k: v for k, v in trainer.model.state_dict().items() if "lora" in k})
            optimizer = copy.deepcopy(trainer.optimizer.state_dict())
            for name, (engine, scorer, history_text) in VARIANTS.items():
                trainer.model.load_state_dict(weights, strict=False)
                trainer.optimizer.load_state_dict(optimizer)
                trainer.engine_class, trainer.scorer_class = engine, scorer
                trainer.config = config.model_copy(
                    update={"history_text": config.history_text if history_text is None else history_text}
                )
                seed_everything(step_seed(config.seed, step))
                started = time.perf_counter()
                episodes = trainer._rollout(step)
                rollout_s = time.perf_counter() - started
                existing, computed = rollout_tokens(episodes, trainer.last_engine)
                if name == "old path, new mode":
                    shared = episodes
                if name.startswith("new"):
                    episodes = shared  # the update scores the batch the old path scored: same loss expected
                samples = trainer._samples(episodes)
                started = time.perf_counter()
                metrics = trainer._update(samples)
                update_s = time.perf_counter() - started
                stats = trainer.last_scorer.stats
                results[name].append(
                    {
                        "rollout_s": rollout_s,
                        "update_s": update_s,
                        "rollout_existing": existing,
                        "rollout_computed": computed,
                        "update_existing": stats["tokens_existing"],
                        "update_computed": stats["tokens_computed"],
                        "loss": metrics["train/policy_loss"],
                        "episodes_moves": sum(e.moves for e in episodes) / len(episodes),
                    }
                )
                loads.append(load())
                print(name, step, json.dumps(results[name][-1]), f"load {loads[-1]:.1f}", flush=True)
        checkpoint_started = time.perf_counter()
        trainer._save(args.steps)
        checkpoint_s = time.perf_counter() - checkpoint_started
        resume_started = time.perf_counter()
        resumed = LocalGRPOTrainer(config.model_copy(update={"steps": args.steps + 1}), log=lambda _: None)
        resumed._build(resumed._resume_point())
        resume_s = time.perf_counter() - resume_started
    write_report(config, results, checkpoint_s, resume_s, loads, args.no_write)


def write_report(config, results, checkpoint_s, resume_s, loads, no_write: bool) -> None:
    def mean(name: str, key: str) -> float:
        return sum(row[key] for row in results[name]) / len(results[name])

    rows = []
    for name in results:
        rollout, update = mean(name, "rollout_s"), mean(name, "update_s")
        rows.append(
            f"| {name} | {rollout:.1f} | {update:.1f} | **{rollout + update:.1f}** | "
            f"{mean(name, 'rollout_computed') / 1e3:.0f}k of {mean(name, 'rollout_existing') / 1e3:.0f}k | "
            f"{mean(name, 'update_computed') / 1e3:.0f}k of {mean(name, 'update_existing') / 1e3:.0f}k |"
        )
    before = mean("before", "rollout_s") + mean("before", "update_s")
    old_same = mean("old path, new mode", "rollout_s") + mean("old path, new mode", "update_s")
    new = mean("new", "rollout_s") + mean("new", "update_s")
    per_row = mean("new, prompt per row", "update_s")
    losses = [
        (a["loss"], b["loss"], c["loss"])
        for a, b, c in zip(results["old path, new mode"], results["new, prompt per row"], results["new"], strict=True)
    ]
    episodes = config.mazes_per_step * config.grpo.samples_per_maze
    body = "\n".join(
        [
            "## GRPO step of the local engine (`bench/train_step.py`)",
            "",
            f"The embedded recipe's batch: {config.mazes_per_step} mazes x {config.grpo.samples_per_maze} samples = "
            f"{episodes} episodes per step, history_images={config.history_images}, "
            f"update_epochs={config.grpo.update_epochs}, LoRA rank {config.lora.rank}, "
            f"{config.torch_threads} torch threads; each of {len(results['new'])} steps run four ways from the same "
            "weights, side by side in one run. Tokens: computed of existing (every request's context and reply, "
            "what a per-turn path computes), per step; the update's count covers all its epochs.",
            "",
            "| path | rollout s | update s | step s | rollout tokens | update tokens |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
            f"- **new vs before: {before / new:.1f}x** faster per step; new vs the old path on the same Markov "
            f"contexts (the engine and scorer alone): **{old_same / new:.1f}x**; the update with the task prompt "
            f"computed once per micro-batch against once per row: **{per_row / mean('new', 'update_s'):.2f}x**.",
            f"- before: `generate` + per-turn scoring, `history_text: all`; old path, new mode: the same code on "
            f"`history_text: {config.history_text}` and exactly the batch both new paths score (policy loss "
            + ", ".join(f"{a:+.6f} / {b:+.6f} / {c:+.6f}" for a, b, c in losses)
            + ").",
            f"- checkpoint (adapter, optimizer, RNG; atomic): {checkpoint_s:.2f} s; resume (load base, "
            f"attach the saved adapter, restore the optimizer): {resume_s:.1f} s.",
            f"- 1-minute load average during the run: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores "
            "(other jobs shared the machine: the ratios hold, absolute seconds are inflated by about the load / cores).",
        ]
    )
    print(body)
    if not no_write:
        write_section("train_step", body)


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
