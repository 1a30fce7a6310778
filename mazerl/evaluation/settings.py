"""What decides an eval's outcome besides the model: one frozen value, named as the parameters name it.

The pipeline's parameters (``PipelineParams``: ``eval_engine``, ``eval_workers``,
``max_eval_mazes``, ``gif_count``, ...) become an :class:`EvalSettings` once per run; the same
value is the baseline's cache key, goes to the eval job as JSON (:func:`eval_request`), and
reaches the workers unchanged. ``mazerl eval`` builds one from its flags. Torch-free, so the
orchestrator and the commands can build and check it without loading a model.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from envs.evalset import SPECS
from mazerl.evaluation.engines import ENGINES, check_gpus_per_worker, gpus_per_worker


@dataclass(frozen=True)
class EvalSettings:
    """Everything besides the model that decides an eval's outcome (a pipeline run's, or ``mazerl eval``'s)."""

    eval_set: str
    eval_workers: int = 1
    max_eval_mazes: int | None = None  # None: the whole set
    gif_count: int = 4
    eval_engine: str = "hf"
    max_new_tokens: int = 24
    eval_gpus_per_worker: float | None = None  # None: the engine's default (engines.gpus_per_worker)
    # The context mode (None: the model's recorded one). A pipeline run evaluates in the mode it
    # trains in, so its baseline and final evals and its training all see the same contexts.
    history_images: int | str | None = None
    history_text: int | str | None = None

    def check(self) -> None:
        """Refuse values no eval can run with, naming the field (before any model is loaded)."""
        if self.eval_engine not in ENGINES:
            raise ValueError(f"eval_engine={self.eval_engine!r} must be one of {ENGINES} (vllm needs a GPU)")
        for name, minimum in (("eval_workers", 1), ("gif_count", 0), ("max_new_tokens", 1)):
            if getattr(self, name) < minimum:
                raise ValueError(f"{name}={getattr(self, name)} must be >= {minimum}")
        if self.max_eval_mazes is not None and self.max_eval_mazes < 1:
            raise ValueError(f"max_eval_mazes={self.max_eval_mazes} must be >= 1 (or None for the whole set)")
        check_gpus_per_worker(self.eval_engine, self.gpus_per_worker())

    def gpus_per_worker(self) -> float:
        """The GPUs each eval worker asks Ray for: ``eval_gpus_per_worker``, or the engine's default."""
        return gpus_per_worker(self.eval_engine, self.eval_gpus_per_worker)

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> EvalSettings:
        """The settings an eval request carries; an unknown or missing field is a ValueError naming it."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"eval settings: unknown field(s) {unknown}; known: {sorted(known)}")
        if "eval_set" not in values:
            raise ValueError("eval settings: eval_set is missing")
        return cls(**values)


def check_max_eval_mazes(max_eval_mazes: int | None, eval_set: str | None, field: str = "max_eval_mazes") -> None:
    """A cap above the eval set's size is refused: the eval would play the whole set while the run's
    parameters (and its MLflow record) said fewer, and a typo (3000 for 300) would go unnoticed.
    ``field``: the name the user gave it by (``--max-eval-mazes`` for ``mazerl eval``)."""
    spec = SPECS.get(eval_set or "")
    if max_eval_mazes is not None and spec is not None and max_eval_mazes > spec.count:
        raise ValueError(
            f"{field} ({max_eval_mazes}) is more than eval set {eval_set} holds ({spec.count} mazes); lower {field} "
            f"to at most {spec.count}, or leave it out for the whole set"
        )


def eval_request(
    model_dir: str | os.PathLike,
    settings: EvalSettings,
    out_dir: str | os.PathLike,
    adapter: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """The eval job's request (JSON): the model, where the report goes, and the settings. Paths are
    made absolute here: the job runs in another working directory, maybe on another node."""
    return {
        "model_dir": str(Path(model_dir).expanduser().resolve()),
        "adapter": str(Path(adapter).expanduser().resolve()) if adapter is not None else None,
        "out_dir": str(Path(out_dir).expanduser().resolve()),
        "settings": asdict(settings),
    }


def read_eval_request(request: dict[str, Any]) -> dict[str, Any]:
    """``evaluate()``'s arguments from an :func:`eval_request`; a malformed one is a ValueError."""
    expected = {"model_dir", "adapter", "out_dir", "settings"}
    if not isinstance(request, dict) or set(request) != expected:
        got = sorted(request) if isinstance(request, dict) else type(request).__name__
        raise ValueError(f"an eval request has the keys {sorted(expected)}, got {got}")
    return request | {"settings": EvalSettings.from_json(request["settings"])}
