"""``<run dir>/train_config.json``: the training config a run trains with, written beside its checkpoints.

The pipeline's train stage writes it before its job starts, and the job reads it. A resumed run
keeps the settings it started with, so the file is checked before it is written again: an edit
made by hand would otherwise be overwritten without a word, and the resumed steps would not
train what the user believes (:func:`check_unedited`).
"""

from __future__ import annotations

from pathlib import Path

from mazerl.training.config import TrainConfig, TrainingConfigError, load_config, save_config


def check_unedited(config: TrainConfig) -> None:
    """Refuse to resume a run whose ``train_config.json`` was edited after the run wrote it.

    A pipeline run's settings come from its parameters, and the train stage writes them into that
    file for its job: an edit there would be overwritten without a word, and the resumed steps
    would not train what the user believes. Only the settings count (not the names a run gives it).
    """
    path = config.run_dir / "train_config.json"
    try:
        recorded = load_config(path)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        recorded, problem = None, f"cannot be read as a training config ({exc})"
    if recorded is not None:
        if recorded.identity()["config_digest"] == config.identity()["config_digest"]:
            return
        theirs, ours = recorded.model_dump(mode="json"), config.model_dump(mode="json")
        changed = sorted(key for key in ours if key not in ("run_id", "mlflow") and theirs.get(key) != ours[key])
        problem = f"was edited after the run wrote it ({', '.join(changed)} differ from the run's parameters)"
    raise TrainingConfigError(
        f"{path} {problem}; a run keeps the settings it started with: undo the edit (or delete the file: the run "
        "writes it again from its parameters), or start a new run with the new settings (--training "
        "'{\"<field>\": <value>}' --fresh)"
    )


def record_config(config: TrainConfig) -> Path:
    """``<run dir>/train_config.json``: the config a run trains with, beside its checkpoints.

    The pipeline's train stage writes it before its job starts (the job reads that file); the
    trainer writes it only where it is missing or says something else (a bench or test that
    handed the trainer a config file of its own), so the stage's file is never rewritten.
    """
    path = config.run_dir / "train_config.json"
    try:
        if load_config(path) == config:
            return path
    except (OSError, ValueError):  # missing, or not this config's file
        pass
    return save_config(config, path)
