"""Checks of a pipeline run's inputs that cost milliseconds and write nothing.

The first task of a pipeline run calls :func:`check_pipeline_inputs` before it builds the
starter, starts Ray or opens MLflow runs, so a run with a bad input leaves nothing behind
but its own failed flow run (the error record). What ``PipelineParams`` cannot check
itself, because it is also validated where the files do not exist (a deployment's
parameters, the UI's form), is checked here on the machine that runs the flow:

- ``data_root``: the directory can be created and written by this user (tried, not guessed
  from permission bits: root passes ``os.access`` on ``/proc``);
- ``eval_set``: the file loads and its digest verifies against the one pinned in code;
- ``base_model``: a Hugging Face vision-language model directory (config, weights whose
  safetensors headers match their sizes, tokenizer, processor; an image-text-to-text
  ``model_type``), read without executing any code from it and without reading the weights.
  A path that does not exist here while the cluster is remote is left to ``verify_cluster``,
  which looks at it from a worker node;
- ``tracking_uri``: an MLflow server answers within seconds (MLflow's own client would retry
  for minutes);
- ``training.resume='required'``: the run already has a checkpoint to continue.

``mazerl run`` calls the same checks before it starts Prefect or the Ray head, and adds
:func:`check_ray_address` for a cluster address.

Every error is an :class:`InputError` naming the parameter, the value and the fix; retrying
cannot help, so the task does not retry it.
"""

from __future__ import annotations

import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from envs.evalset import EvalSetError, load
from mazerl import paths
from mazerl.cluster.probe import check_model_dir
from mazerl.cluster.ray_local import is_loopback_host

if TYPE_CHECKING:
    from mazerl.params import PipelineParams

ANSWER_TIMEOUT_S = 5.0  # a server on the network answers /health or /api/version in milliseconds


class InputError(ValueError):
    """A pipeline parameter that cannot work; ``field`` is its name (``training.resume`` for nested ones)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def check_data_root(root: Path, field: str = "data_root") -> None:
    """The directory exists and is writable, or can be created (tried, and nothing is left to find out).

    ``field`` is the name the user gave it by (``data_root``; ``--out`` for a command's output).
    """
    root = Path(root)
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    fix = (
        "choose a directory you can write with data_root (--data-root) or MAZERL_HOME"
        if field == "data_root"
        else f"choose a directory you can write for {field}"
    )
    if not existing.is_dir():
        raise InputError(
            field, f"{field}={str(root)!r} cannot be created: {existing} is a file, not a directory; {fix}"
        )
    what = "is not writable" if existing == root else f"cannot be created: {existing} is not writable"
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(field, f"{field}={str(root)!r} {what} by this user (or is read-only); {fix}")
    try:  # the permission bits can pass where creating fails (root on /proc, some network mounts)
        os.rmdir(tempfile.mkdtemp(prefix=".mazerl-probe-", dir=existing))
    except OSError as exc:
        raise InputError(field, f"{field}={str(root)!r} {what} ({exc.strerror}); {fix}") from None


def check_eval_set(name: str) -> None:
    """The named set loads and its stored digest matches its content."""
    try:
        load(name)
    except EvalSetError as exc:
        raise InputError("eval_set", f"eval_set={name!r}: {exc}") from exc


def check_base_model(model_dir: Path, field: str = "base_model") -> None:
    """A loadable vision-language model directory; config files and weight headers are read, no weights, no code.

    ``field`` is the name the user gave it by (``base_model``, or ``--model`` for ``mazerl eval``).
    """
    found = check_model_dir(str(model_dir))
    if "the directory itself" in found["missing"]:
        starter = ", or leave base_model empty for the embedded starter" if field == "base_model" else ""
        raise InputError(
            field,
            f"{field}={str(model_dir)!r} is not a directory; give the Hugging Face model directory "
            f"(config.json, weights, tokenizer, processor){starter}",
        )
    if found["missing"]:
        raise InputError(
            field,
            f"{field}={str(model_dir)!r} lacks {', '.join(found['missing'])}; copy the complete model directory "
            "(model.save_pretrained and processor.save_pretrained write all of it)",
        )
    # lazy: the loader imports torch (seconds), which `mazerl run --help` and the UI's parameter form do not need
    from mazerl.policy.loader import ModelLoadError, check_image_text_to_text

    try:
        check_image_text_to_text(model_dir)
    except ModelLoadError as exc:
        raise InputError(field, f"{field}: {exc}") from exc


def check_tracking_uri(uri: str) -> None:
    """An MLflow server (http/https) answers within seconds; file and database stores are left to MLflow."""
    if urlparse(uri).scheme not in ("http", "https"):
        return
    problem = _no_answer(uri.rstrip("/") + "/health")
    if problem:
        raise InputError(
            "tracking_uri",
            f"tracking_uri={uri!r}: the MLflow server {problem}; start it (e.g. mlflow server --host 127.0.0.1 "
            "--port 5000), correct tracking_uri (--tracking-uri), or leave it empty for the embedded store under "
            "the data root",
        )


def check_ray_address(address: str) -> None:
    """A Ray dashboard (job server) answers at ``address`` (http/https; ``sagemaker_ray://`` is left to Ray)."""
    if urlparse(address).scheme not in ("http", "https"):
        return
    problem = _no_answer(address.rstrip("/") + "/api/version", ray=True)
    if problem:
        raise InputError(
            "ray_address",
            f"ray_address={address!r}: the address {problem}; check that the head is running and that the address "
            "is its dashboard (http://<head>:8265), or leave ray_address (--ray-address) empty to start a local head",
        )


def _no_answer(url: str, ray: bool = False) -> str | None:
    """Why ``url`` did not answer within ANSWER_TIMEOUT_S (a clause "did not answer ..."), or None when it did.

    Any HTTP answer counts (authentication is checked later), except a 404 from a Ray address:
    that is a server that is not a Ray job server, or a network gateway answering for an
    address it cannot route.
    """
    try:
        with urllib.request.urlopen(url, timeout=ANSWER_TIMEOUT_S):
            return None
    except urllib.error.HTTPError as exc:
        if ray and exc.code == 404:
            return f"did not answer as a Ray job server (HTTP 404 for {urlparse(url).path})"
        return None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"did not answer ({getattr(exc, 'reason', exc)}; waited at most {ANSWER_TIMEOUT_S:.0f} s)"


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


def check_pipeline_inputs(params: PipelineParams, run_id: str | None = None) -> None:
    """All of the above for one pipeline run; raises the first :class:`InputError`.

    ``run_id`` None: a run that does not exist yet (``mazerl run`` before it starts its flow run),
    which has no checkpoint to resume.
    """
    root = params.root()
    check_data_root(root)
    check_eval_set(params.resolved_eval_set())
    if params.base_model is not None:
        model_dir = Path(params.base_model).expanduser().resolve()
        if model_dir.exists() or model_is_local(params.ray_address):
            check_base_model(model_dir)
    check_tracking_uri(params.resolved_tracking_uri())
    # the run's own config is resolved in ``prepare`` once the model is there; its resume setting
    # and checkpoint directory do not depend on the model
    config = params.train_config(run_id or "new-run", Path(params.base_model or paths.models_dir(root)))
    if run_id is not None:
        check_resume(config.checkpoint_dir, config.resume)
    elif config.resume == "required":
        raise InputError(
            "training.resume",
            "training.resume='required' but a new pipeline run has no checkpoint to continue; set "
            "training.resume='latest' (the default) to train from scratch, or retry the failed flow run whose "
            "training you want to continue (prefect flow-run retry <id>)",
        )
