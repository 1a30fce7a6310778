"""Every input check of one pipeline run (:func:`check_pipeline_inputs`), and the ones only a run makes: the eval
set, ``training.resume``, whether the cluster shares this machine's files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from envs.evalset import EvalSetError, load
from mazerl import paths
from mazerl.cluster.head.loopback import is_loopback_host
from mazerl.preflight.data_root import check_data_root, check_root_env
from mazerl.preflight.input_error import InputError
from mazerl.preflight.model_dir import check_base_model, check_starter_copy
from mazerl.preflight.tracking_store import check_tracking_uri

if TYPE_CHECKING:
    from mazerl.params import PipelineParams
    from mazerl.training.config import TrainConfig


def check_eval_set(name: str) -> None:
    """The named set loads and its stored digest matches its content."""
    try:
        load(name)
    except EvalSetError as exc:
        raise InputError("eval_set", f"eval_set={name!r}: {exc}") from exc


def model_is_local(ray_address: str | None) -> bool:
    """Whether the cluster shares this machine's files (the embedded head, or a head on localhost)."""
    return ray_address is None or is_loopback_host(urlparse(ray_address).hostname)


def check_resume(checkpoint_dir: Path, resume: str) -> None:
    """``resume='required'`` needs a checkpoint marker in this run's checkpoint directory."""
    from mazerl.training import checkpoints  # lazy: it imports torch (seconds)

    if resume == "required" and checkpoints.read_marker(checkpoint_dir) is None:
        raise InputError(
            "training.resume",
            f"training.resume='required' but {checkpoint_dir} holds no checkpoint (no {checkpoints.MARKER}); "
            "a new flow run starts a new run directory: set training.resume='latest' (the default) to train "
            "from scratch, or retry the failed flow run whose training you want to continue",
        )


def check_pipeline_inputs(params: PipelineParams, config: TrainConfig | None = None) -> None:
    """Every check of :mod:`mazerl.preflight` for one pipeline run; raises the first :class:`InputError`.

    ``config``: the run's training config, as ``prepare`` resolved it (the one the run trains
    with: its checkpoint directory is checked for ``training.resume``). None: a run that does not
    exist yet (``mazerl run`` before it starts its flow run), which has no checkpoint to resume.
    """
    root = params.root()
    check_data_root(root, check_root_env(params.data_root))
    check_eval_set(params.resolved_eval_set())
    if params.base_model is not None:
        model_dir = paths.absolute_path(params.base_model)
        if model_dir.exists() or model_is_local(params.ray_address):
            check_base_model(model_dir)
    else:
        check_starter_copy(root)
    check_tracking_uri(params.resolved_tracking_uri(), params.experiment, embedded=params.tracking_uri is None)
    if config is not None:
        check_resume(config.checkpoint_dir, config.resume)
    elif params.train_config("new-run", Path(params.base_model or paths.models_dir(root))).resume == "required":
        raise InputError(
            "training.resume",
            "training.resume='required' but a new pipeline run has no checkpoint to continue; set "
            "training.resume='latest' (the default) to train from scratch, or retry the failed flow run whose "
            "training you want to continue (prefect flow-run retry <id>)",
        )
