"""Training recipes: named sets of TrainConfig values a pipeline run starts from, and the one
place a run's training config is resolved from a recipe, the user's overrides and the fields
the pipeline sets itself.

A recipe is a plain dict of TrainConfig fields (nested settings as nested dicts); the user's
``training`` overrides are deep-merged over it field by field, so ``{"grpo": {"temperature": 1.0}}``
changes one GRPO setting and keeps the recipe's others.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from mazerl.training.config import TrainConfig

# The miniature recipe: seconds per stage on 2 cores (3-move episodes, 1 maze x 2 samples, a
# rank-4 adapter). What the pipeline tests and the orchestration benchmark run; learns nothing.
# The smoke preset lays it over the run's recipe as overrides.
MINIATURE_TRAINING: dict[str, Any] = {
    "history_images": 1,
    "history_text": "feedback",
    "max_turns": 3,
    "steps": 2,
    "mazes_per_step": 1,
    "train_pool_size": 8,
    "checkpoint_interval": 1,
    "torch_threads": 1,
    "lora": {"rank": 4, "alpha": 8},
    "grpo": {"samples_per_maze": 2, "max_new_tokens": 8, "temperature": 0.7, "format_bonus": 1.0},
}

# The embedded learning recipe (docs/performance.md has its measured curve).
EMBEDDED_TRAINING: dict[str, Any] = {
    "history_images": 1,
    "history_text": "feedback",  # as maze-starter-v4 was warm-started
    # 300 steps with the rate decayed to 0 (cosine): at a constant 1e-3 the greedy curves from
    # maze-starter-v4 swung by 5-10 points between evals and one fresh-clone run fell to 28.9% at
    # step 50; the decay lets the last checkpoint, the run's model, settle. 100 steps ended at
    # 57.0-64.8% over 3 seeds, 200 at 66.4-67.6%, 300 at 68.4-71.5% (docs/performance.md, learning
    # search, 2026-12-02/03; 67.6-70.3% with the stop token out of the loss, on a Xeon); 300 steps
    # and 6 evals took 14-16 minutes on a 2-core Xeon with the vision tower frozen, 17-20 minutes
    # on a 2-core AMD EPYC with it trained (below), 17-19 minutes on a quiet 2-core Xeon with the
    # per-move credit too (2026-12-05).
    "steps": 300,
    "mazes_per_step": 16,
    "train_pool_size": 512,
    "learning_rate": 1e-3,
    "lr_schedule": "cosine",
    "checkpoint_interval": 50,
    "checkpoints_kept": 2,
    "eval_interval": 50,  # 6 evals of ~17 s: the curve, at a tenth of the run's time
    "eval_mazes": None,  # all 256: the periodic evals are on the same set as the baseline
    # both cores: the trainer is the only heavy process while it runs; a step of 128 episodes
    # takes 3.2 s instead of 4.6 s on a 2-core Xeon (2026-12-03; the same numbers to 1e-6)
    "torch_threads": 2,
    # LoRA on the vision tower too: most failures left with it frozen were one wall misread and
    # bumped into to the end of the budget; adapters on the tower's blocks and mergers took seeds
    # 0/1/2 to 70.7/72.7/69.9% (mean 71.1%) against 69.9/67.6/70.3% frozen, the steps ~15% slower
    # (no vision cache; docs/performance.md, 2026-12-04). The SkyRL backend refuses it.
    "freeze_vision": False,
    # the stop token out of the loss: with it in, a fresh-clone run on a 2-core Xeon stopped ending
    # its replies at step 85 (2 tokens per reply -> 12, the budget), and steps took 2-3x longer
    "grpo": {
        "samples_per_maze": 8,
        "update_epochs": 1,
        "temperature": 0.7,
        "max_new_tokens": 12,
        "stop_token_loss": False,
        # Each turn's own credit for the way it went (training only, never success): +0.3 for the
        # solver's move, -0.3 for any other move, -0.1 for a bump. Most failures left by the outcome
        # alone began with a wrong open branch at the start or at a junction (the outcome shares one
        # advantage over 8-15 turns); with this shaping seeds 0/1/2 ended at 73.8/73.0/72.7% against
        # 70.7/72.7/69.9% without, the curves without the mid-run dip, each step 35-50% dearer (every
        # turn carries an advantage; docs/performance.md, 2026-12-05).
        "credit": "turn",
        "progress_reward": 0.3,
        "bump_cost": 0.1,
    },
}

RecipeName = Literal["embedded", "defaults"]

# What each recipe name starts from: "defaults" is TrainConfig's own field defaults.
RECIPES: dict[str, dict[str, Any]] = {"embedded": EMBEDDED_TRAINING, "defaults": {}}

# Training fields the pipeline sets itself: an override of one is refused.
PIPELINE_SET_TRAINING_FIELDS = ("run_id", "base_model", "data_root", "backend", "eval_set", "mlflow")


def automatic_recipe(starter: bool, backend: str) -> RecipeName:
    """The recipe a run gets when it names none: the embedded recipe for the starter on the local
    backend (what it was tuned for), TrainConfig's defaults for any other model or backend."""
    return "embedded" if starter and backend == "local" else "defaults"


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``, nested dicts merged key by key."""
    merged = dict(base)
    for key, value in override.items():
        merged[key] = (
            deep_merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged


def resolve_train_config(
    recipe: RecipeName,
    overrides: dict[str, Any],
    *,
    run_id: str,
    base_model: Path,
    data_root: Path,
    backend: str,
    eval_set: str,
    tracking_uri: str,
    experiment: str,
    mlflow_run_id: str | None = None,
) -> TrainConfig:
    """The training config of one run: ``overrides`` over ``recipe``, plus the fields the pipeline
    sets (PIPELINE_SET_TRAINING_FIELDS). Errors are ValueErrors naming ``training.<field>``."""
    fixed = {
        "run_id": run_id,
        "base_model": str(base_model),
        "data_root": str(data_root),
        "backend": backend,
        "eval_set": eval_set,
        "mlflow": {"tracking_uri": tracking_uri, "experiment": experiment, "run_id": mlflow_run_id},
    }
    clash = sorted(set(overrides) & set(fixed))
    if clash:
        raise ValueError(f"training.{clash[0]} is set by the pipeline itself; remove it from the training overrides")
    try:
        return TrainConfig.model_validate({**deep_merge(RECIPES[recipe], overrides), **fixed})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(["training", *(str(part) for part in first["loc"])])
        raise ValueError(f"{field}: {first['msg'].removeprefix('Value error, ')}") from exc
