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
    "history_text": "tried",
    "max_turns": 3,
    "steps": 2,
    "mazes_per_step": 1,
    "train_pool_size": 8,
    "checkpoint_interval": 1,
    "torch_threads": 1,
    "lora": {"rank": 4, "alpha": 8},
    "grpo": {"samples_per_maze": 2, "max_new_tokens": 8, "temperature": 0.7, "format_bonus": 1.0},
}

# The embedded learning recipe. Each value's why in one line; the measurements behind them are in
# docs/training.md's recipe table, which links each into docs/performance.md.
EMBEDDED_TRAINING: dict[str, Any] = {
    "history_images": 1,
    "history_text": "tried",  # as maze-starter-v6 was warm-started: back at a junction it can take another branch
    "steps": 300,  # the greedy curve still rose from 200 to 300 steps
    "mazes_per_step": 16,
    "train_pool_size": 512,
    "learning_rate": 1e-3,
    "lr_schedule": "cosine",  # decays to 0: the last checkpoint, the model, settles instead of swinging
    "checkpoint_interval": 50,
    "checkpoints_kept": 2,
    "eval_interval": 50,  # six greedy evals: the curve to watch
    "eval_mazes": 64,  # a fixed quarter of the set (a quarter of the time); the final eval plays all 256
    "torch_threads": 2,  # the trainer is the only heavy process while it runs
    "freeze_vision": False,  # frozen, most failures were a wall misread (the SkyRL backend refuses it)
    "grpo": {
        "samples_per_maze": 8,
        "update_epochs": 1,  # one plain policy-gradient step per batch
        "temperature": 0.7,
        "max_new_tokens": 12,
        "stop_token_loss": False,  # in the loss, an outcome-only update taught replies not to end
        "credit": "turn",  # each move its own credit: a wrong branch is blamed on the reply that took it
        "progress_reward": 0.5,  # +0.5 for the solver's move, -0.5 for another (training only; 0.3: 1.4 points less over 3 seeds)
        "bump_cost": 0.1,  # -0.1 for a reply that left the agent where it was
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
