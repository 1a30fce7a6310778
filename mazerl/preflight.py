"""Checks of a pipeline run's inputs that cost milliseconds and write nothing.

The first task of a pipeline run calls :func:`check_pipeline_inputs` before it builds the
starter, starts Ray or opens MLflow runs, so a run with a bad input leaves nothing behind
but its own failed flow run (the error record). What ``PipelineParams`` cannot check
itself, because it is also validated where the files do not exist (a deployment's
parameters, the UI's form), is checked here on the machine that runs the flow:

- ``data_root``: the directory can be created and written by this user;
- ``eval_set``: the file loads and its digest verifies (an edited set is refused);
- ``base_model``: a Hugging Face vision-language model directory (config, weights, tokenizer,
  processor; an image-text-to-text ``model_type``), read without executing any code from it.
  A path that does not exist here while the cluster is remote is left to ``verify_cluster``,
  which looks at it from a worker node;
- ``training.resume='required'``: the run already has a checkpoint to continue.

Every error is an :class:`InputError` naming the parameter, the value and the fix; retrying
cannot help, so the task does not retry it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:
    from mazerl.params import PipelineParams

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class InputError(ValueError):
    """A pipeline parameter that cannot work; ``field`` is its name (``training.resume`` for nested ones)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def check_data_root(root: Path) -> None:
    """The data root exists as a writable directory, or can be created (no file is written to find out)."""
    root = Path(root)
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    fix = "choose a directory you can write with data_root (--data-root) or MAZERL_HOME"
    if not existing.is_dir():
        raise InputError(
            "data_root", f"data_root={str(root)!r} cannot be created: {existing} is a file, not a directory; {fix}"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == root else f"cannot be created: {existing} is not writable"
        raise InputError("data_root", f"data_root={str(root)!r} {what} by this user (or is read-only); {fix}")


def check_eval_set(name: str) -> None:
    """The named set loads and its stored digest matches its content."""
    from envs.evalset import EvalSetError, load

    try:
        load(name)
    except EvalSetError as exc:
        raise InputError("eval_set", f"eval_set={name!r}: {exc}") from exc


def check_base_model(model_dir: Path) -> None:
    """A loadable vision-language model directory; only config files are read, no weights, no code."""
    from mazerl.cluster.probe import check_model_dir
    from mazerl.policy.loader import ModelLoadError, check_image_text_to_text

    found = check_model_dir(str(model_dir))
    if "the directory itself" in found["missing"]:
        raise InputError(
            "base_model",
            f"base_model={str(model_dir)!r} is not a directory; give the Hugging Face model directory "
            "(config.json, weights, tokenizer, processor), or leave base_model empty for the embedded starter",
        )
    if found["missing"]:
        raise InputError(
            "base_model",
            f"base_model={str(model_dir)!r} lacks {', '.join(found['missing'])}; copy the complete model directory "
            "(model.save_pretrained and processor.save_pretrained write all of it)",
        )
    try:
        check_image_text_to_text(model_dir)
    except ModelLoadError as exc:
        raise InputError("base_model", f"base_model: {exc}") from exc


def model_is_local(ray_address: str | None) -> bool:
    """Whether the cluster shares this machine's files (the embedded head, or a head on localhost)."""
    return ray_address is None or urlparse(ray_address).hostname in LOCAL_HOSTS


def check_resume(checkpoint_dir: Path, resume: str) -> None:
    """``resume='required'`` needs a checkpoint marker in this run's checkpoint directory."""
    from mazerl.training import checkpoints

    if resume == "required" and checkpoints.read_marker(checkpoint_dir) is None:
        raise InputError(
            "training.resume",
            f"training.resume='required' but {checkpoint_dir} holds no checkpoint (no {checkpoints.MARKER}); "
            "a new flow run starts a new run directory: set training.resume='latest' (the default) to train "
            "from scratch, or retry the failed flow run whose training you want to continue",
        )


def check_pipeline_inputs(params: PipelineParams, run_id: str) -> None:
    """All of the above for one pipeline run; raises the first :class:`InputError`."""
    root = params.root()
    check_data_root(root)
    check_eval_set(params.resolved_eval_set())
    if params.base_model is not None:
        model_dir = Path(params.base_model).expanduser().resolve()
        if model_dir.exists() or model_is_local(params.ray_address):
            check_base_model(model_dir)
    config = params.train_config(run_id, Path(params.base_model or "/starter"))
    check_resume(config.checkpoint_dir, config.resume)
