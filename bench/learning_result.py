"""The embedded recipe's learning result over several seeds: curve, paired test, spread, failure kinds.

    # one training run per seed, without Prefect (the recipe: mazerl.training.recipes.EMBEDDED_TRAINING)
    python bench/learning_result.py train --model DIR --root /tmp/recipe --seeds 0 1 2
    # the report from those runs (baseline computed here, greedy, on all 256 mazes)
    python bench/learning_result.py report --model DIR --root /tmp/recipe --seeds 0 1 2

``train`` runs ``python -m mazerl.training.local_entry`` once per seed (run ids
``recipe-seed<N>``), one after the other. Every ``eval_interval`` steps the trainer plays all
256 held-out mazes greedily (``JUDGED_ON_ALL``: the recipe's own periodic evals play a subset) and keeps the per-maze rows (``<run>/evals/step_<N>.jsonl``).
``report`` plays the starter on the same mazes (the baseline), then per seed: the greedy curve,
the final success, fixed / broken mazes against the baseline with the exact McNemar p, the
mean and spread over seeds, and the failure kinds (``mazerl.evaluation.failures``) before and
after. Writes ``docs/img/embedded_recipe_curve.png`` and the ``learning_result`` section of
docs/performance.md. Training seconds are the steps' own (``train/step_seconds``) plus the
periodic evals; the load average of the machine during the runs goes beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import write_section  # noqa: E402
from mazerl.atomic import write_jsonl  # noqa: E402
from mazerl.eval_files import read_result_rows  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs"


def epochs_words(grpo: dict) -> str:
    """One update epoch is a plain policy-gradient step (the ratio is 1: nothing clips); more are clipped."""
    if grpo["update_epochs"] == 1:
        return "1 update epoch per batch (a plain policy-gradient step)"
    return f"{grpo['update_epochs']} clipped epochs per batch (clip {grpo['clip_low']})"


def run_dir(root: Path, seed: int) -> Path:
    return root / "runs" / f"recipe-seed{seed}"


# A bench judges each seed on every held-out maze at each eval step: the recipe's periodic evals play
# a subset (the pipeline's final eval plays all of them; a bench runs no final eval).
JUDGED_ON_ALL = {"eval_mazes": None}


def train(args: argparse.Namespace) -> None:
    from mazerl.training.config import TrainConfig, save_config
    from mazerl.training.recipes import EMBEDDED_TRAINING, deep_merge

    for seed in args.seeds:
        values = deep_merge(EMBEDDED_TRAINING, json.loads(args.training)) | JUDGED_ON_ALL
        values |= {
            "run_id": f"recipe-seed{seed}",
            "seed": seed,
            "data_root": str(args.root),
            "base_model": str(args.model),
            "eval_set": "maze256-small-v1",
            "mlflow": {"tracking_uri": f"sqlite:///{args.root}/mlflow.db"},
        }
        config = TrainConfig.model_validate(values)
        path = save_config(config, args.root / f"recipe-seed{seed}.json")
        started = os.getloadavg()[0]
        subprocess.run([sys.executable, "-m", "mazerl.training.local_entry", "--config", str(path)], check=True)
        (run_dir(args.root, seed) / "load.json").write_text(json.dumps([started, os.getloadavg()[0]]))


def baseline_rows(model: Path, out: Path) -> list[dict]:
    """Greedy rows of the starter on every maze (cached in ``out``)."""
    if out.is_file():
        return read_result_rows(out)
    import torch

    from envs.evalset import load as load_eval_set
    from mazerl.evaluation.summary import result_row
    from mazerl.policy.engines import GenerationSettings
    from mazerl.policy.episodes import run_episodes
    from mazerl.policy.loader import load_policy
    from mazerl.policy.prefix_engine import PrefixCachingEngine
    from mazerl.policy.vision_cache import VisionCache
    from mazerl.starter.record import recorded_context_mode

    torch.set_num_threads(2)
    eval_set = load_eval_set("maze256-small-v1")
    policy = load_policy(model, device="cpu")
    VisionCache().attach(policy.model)
    images, text = recorded_context_mode(model)
    episodes = run_episodes(
        PrefixCachingEngine.from_policy(policy),
        policy.processor,
        list(eval_set.layouts),
        GenerationSettings(greedy=True, max_new_tokens=24),
        maze_ids=[f"{eval_set.name}/{i}" for i in range(len(eval_set))],
        max_moves=eval_set.max_moves,
        history_images=images,
        history_text=text,
    )
    rows = [result_row(i, eval_set.seeds[i], e) for i, e in enumerate(episodes)]
    write_jsonl(out, rows)
    return rows


def kinds_of(rows: list[dict]) -> dict[str, int]:
    from envs.evalset import load as load_eval_set
    from mazerl.evaluation.failures import failure_kind, kind_counts

    eval_set = load_eval_set("maze256-small-v1")
    return kind_counts(failure_kind(eval_set.layouts[r["index"]], r["actions"], eval_set.max_moves) for r in rows)


def mistakes_of(rows: list[dict]) -> dict[str, int]:
    """Where each failed maze left the solver's way (``mazerl.evaluation.failures.first_mistake``)."""
    from envs.evalset import load as load_eval_set
    from mazerl.evaluation.failures import MISTAKES, first_mistake

    eval_set = load_eval_set("maze256-small-v1")
    found = [first_mistake(eval_set.layouts[r["index"]], r["actions"]) for r in rows if not r["solved"]]
    return {mistake: found.count(mistake) for mistake in MISTAKES}


def report(args: argparse.Namespace) -> None:
    from envs.evalset import load as load_eval_set
    from mazerl.evaluation.summary import exact_mcnemar_p
    from mazerl.tracking.curves import GREEDY_KEY, history_from_jsonl

    base = baseline_rows(args.model, args.root / "baseline_rows.jsonl")
    base_solved = [r["solved"] for r in sorted(base, key=lambda r: r["index"])]
    baseline = sum(base_solved) / len(base_solved)
    ceiling = load_eval_set("maze256-small-v1").budget_ceiling()
    runs = []
    for seed in args.seeds:
        directory = run_dir(args.root, seed)
        history = history_from_jsonl(directory / "metrics.jsonl", (GREEDY_KEY, "train/step_seconds"))
        evals = sorted((directory / "evals").glob("step_*.jsonl"))
        final_rows = sorted((json.loads(x) for x in evals[-1].read_text().splitlines()), key=lambda r: r["index"])
        solved = [r["solved"] for r in final_rows]
        fixed = sum(s and not b for s, b in zip(solved, base_solved, strict=True))
        broken = sum(b and not s for s, b in zip(solved, base_solved, strict=True))
        trained = json.loads((directory / "train_result.json").read_text())
        load = json.loads((directory / "load.json").read_text()) if (directory / "load.json").is_file() else None
        runs.append(
            {
                "seed": seed,
                "curve": history[GREEDY_KEY],
                "final": sum(solved) / len(solved),
                "fixed": fixed,
                "broken": broken,
                "p": exact_mcnemar_p(fixed, broken),
                "step_seconds": sum(v for _, v in history["train/step_seconds"]),
                "steps": len(history["train/step_seconds"]),
                "wall_seconds": trained["wall_seconds"],
                "kinds": kinds_of(final_rows),
                "mistakes": mistakes_of(final_rows),
                "load": load,
            }
        )
    finals = [r["final"] for r in runs]
    config = json.loads((run_dir(args.root, args.seeds[0]) / "train_config.json").read_text())
    before = kinds_of(base)
    mistakes_before = mistakes_of(base)
    steps = sorted({s for r in runs for s, _ in r["curve"]})
    curve_rows = [
        f"| {step} | " + " | ".join(next((f"{v:.1%}" for s, v in r["curve"] if s == step), "") for r in runs) + " |"
        for step in steps
    ]
    kind_rows = [
        f"| {kind} | {before[kind]} | " + " | ".join(str(r["kinds"][kind]) for r in runs) + " |" for kind in before
    ]
    mistake_rows = [
        f"| {mistake} | {count} | " + " | ".join(str(r["mistakes"][mistake]) for r in runs) + " |"
        for mistake, count in mistakes_before.items()
    ]
    spread = statistics.stdev(finals) if len(finals) > 1 else 0.0
    seeds = cells(runs, lambda r: f"seed {r['seed']}")
    rule = cells(runs, lambda _: "---:")
    finals_cells = cells(runs, lambda r: "**{:.1%}**".format(r["final"]))
    fixed_cells = cells(runs, lambda r: "{} / {}".format(r["fixed"], r["broken"]))
    p_cells = cells(runs, lambda r: "{:.1g}".format(r["p"]))
    grpo = config["grpo"]
    body = "\n".join(
        [
            f"## The embedded recipe over {len(runs)} training seed{'s' if len(runs) > 1 else ''} "
            "(`bench/learning_result.py`)",
            "",
            f"`mazerl.training.recipes.EMBEDDED_TRAINING`: {config['steps']} steps of {config['mazes_per_step']} mazes x "
            f"{grpo['samples_per_maze']} samples, {epochs_words(grpo)}"
            f"{'' if grpo.get('stop_token_loss', True) else ' (the stop token out of the loss)'}, "
            f"{retry_words(config)}{shaping_words(grpo)}"
            f"learning rate {config['learning_rate']:g} "
            f"({config.get('lr_schedule', 'constant')}), temperature {grpo['temperature']:g}, "
            f"LoRA rank {config['lora']['rank']} {lora_words(config)}, {config['torch_threads']} torch "
            f"thread(s), context: {context_words(config)}. Training seeds "
            f"{', '.join(str(s) for s in args.seeds)} from the same starter; greedy success on all 256 held-out "
            f"mazes of `maze256-small-v1` (budget ceiling {ceiling:.1%}).",
            "",
            f"| | baseline | {seeds} |",
            f"| --- | ---: | {rule} |",
            f"| greedy success | {baseline:.1%} | {finals_cells} |",
            f"| fixed / broken mazes | | {fixed_cells} |",
            f"| exact McNemar p | | {p_cells} |",
            "| training s (steps; with evals) | | "
            + " | ".join(f"{r['step_seconds']:.0f}; {r['wall_seconds']:.0f}" for r in runs)
            + " |",
            "| load average (start, end) | | "
            + " | ".join(f"{r['load'][0]:.1f}, {r['load'][1]:.1f}" if r["load"] else "" for r in runs)
            + " |",
            "",
            f"Mean over seeds **{statistics.mean(finals):.1%}** (standard deviation {spread * 100:.1f} points, "
            f"range {min(finals):.1%}-{max(finals):.1%}): **{(statistics.mean(finals) - baseline) * 100:+.1f} "
            "points** over the baseline.",
            "",
            "![greedy success by step](img/embedded_recipe_curve.png)",
            "",
            f"| step | {seeds} |",
            f"| ---: | {rule} |",
            f"| 0 (baseline) | {cells(runs, lambda _: f'{baseline:.1%}')} |",
            *curve_rows,
            "",
            "Failure kinds of the 256 mazes (`mazerl.evaluation.failures`; each failed maze counted once):",
            "",
            f"| kind | baseline | {seeds} |",
            f"| --- | ---: | {rule} |",
            *kind_rows,
            "",
            "Where each failure began: its first reply that is not the solver's move "
            "(`mazerl.evaluation.failures.first_mistake`):",
            "",
            f"| first mistake | baseline | {seeds} |",
            f"| --- | ---: | {rule} |",
            *mistake_rows,
        ]
    )
    print(body)
    if args.write:  # the figure too: a trial arm's report must not replace the recipe's
        plot(runs, baseline, DOCS / "img" / "embedded_recipe_curve.png")
        write_section("learning_result", body)


def lora_words(config: dict) -> str:
    """Where the adapters are: the language model only, or the vision tower too (``freeze_vision``)."""
    return (
        "on the language model (vision frozen)"
        if config.get("freeze_vision", True)
        else "on the language model and the vision tower"
    )


def retry_words(config: dict) -> str:
    """``retry_share`` in words, or nothing for the plain per-epoch order."""
    share = config.get("retry_share", 0.0)
    return f"{share:.0%} of each step's mazes retries of split mazes (`retry_share`), " if share else ""


def shaping_words(grpo: dict) -> str:
    """The training-only shaping terms and how they are credited, or nothing when there are none."""
    terms = [
        f"{label} {grpo.get(key, 0.0):g}"
        for key, label in (("progress_reward", "progress reward"), ("bump_cost", "bump cost"))
        if grpo.get(key, 0.0)
    ]
    if not terms:
        return ""
    credit = "each turn's own" if grpo.get("credit") == "turn" else "the episode's"
    return f"{' and '.join(terms)} per turn ({credit} credit; training only), "


def context_words(config: dict) -> str:
    """The context mode in words (``history_images`` and ``history_text`` of the run)."""
    frames = "every frame" if config["history_images"] == "all" else f"the last {config['history_images']} frame(s)"
    text = config["history_text"]
    if text == "feedback":
        return f"the task prompt, {frames} and the last feedback line after a reply that got nowhere (`feedback`)"
    if text == "tried":
        return (
            f"the task prompt, {frames}, the last feedback line after a reply that got nowhere and the replies given "
            "before on the same frame (`tried`)"
        )
    if text == "all":
        return f"the whole text history and {frames}"
    return f"the task prompt, the last {text} exchange(s) and {frames}"


def cells(runs: list[dict], text) -> str:
    return " | ".join(text(run) for run in runs)


def plot(runs: list[dict], baseline: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=110)
    for run in runs:
        steps, values = zip(*([(0, baseline), *run["curve"]]), strict=True)
        axes.plot(steps, values, "o-", ms=3, lw=1.5, label=f"seed {run['seed']}: {run['final']:.1%}")
    axes.axhline(baseline, color="tab:gray", ls="--", lw=1, label=f"baseline (same 256 mazes) {baseline:.1%}")
    axes.set_xlabel("training step")
    axes.set_ylabel("greedy success, 256 held-out mazes")
    axes.set_ylim(0, 1)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(exist_ok=True)
    figure.savefig(path)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("train", "report"))
    parser.add_argument("--model", type=Path, required=True, help="the starter directory")
    parser.add_argument("--root", type=Path, required=True, help="data root of the runs")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--training", default="{}", help="JSON overrides of the recipe (train)")
    parser.add_argument("--write", action="store_true", help="write the docs section (report)")
    args = parser.parse_args()
    args.root = args.root.resolve()
    args.model = args.model.resolve()
    train(args) if args.command == "train" else report(args)


if __name__ == "__main__":
    main()
