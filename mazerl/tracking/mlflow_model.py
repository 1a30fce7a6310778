"""The merged policy as an MLflow model (the ``transformers`` flavour), so the registry holds a real model.

What MLflow 3's transformers flavour can and cannot do for an image-text-to-text model such
as Qwen3-VL decides the layout:

- It refuses to build a ``Pipeline`` for a model logged with a ``processor`` and cannot guess
  one for an image-text-to-text pipeline without it, so the model loads as components only::

      components = mlflow.transformers.load_model("models:/maze-vlm@champion", return_type="components")
      # {"task", "model", "tokenizer" (with the chat template), "image_processor"}

  The processor's parts are logged as the pipeline's components: the tokenizer and the image
  processor (the PIL one where torchvision is missing, which loads everywhere).
- Its local-checkpoint mode (a path instead of a pipeline) fails with transformers 5, so the
  model is loaded once here to be saved.
- The ``python_function`` flavour it adds would fail to load for the same reason (no pipeline),
  so it is removed: ``mlflow models serve`` cannot serve this task with MLflow 3.

The model is written where the merged weights are, by the merge's Ray job
(:func:`write_mlflow_model`, called from ``mazerl.merge.job_entry``): saving loads the whole
model, which a flow-run pod has no memory for. The merge task then only uploads the directory.

``model/`` also gets the processor files, so it is a complete Hugging Face directory that
mazerl's loader (and vLLM) read as is. Above the artifact size limit the weights stay where
they are: ``model/`` is dropped and the flavour names the directory as
``local_base_model_path`` (MLflow's own key for weights outside the artifact; ``load_model``
takes ``base_model_path=`` where the shared storage is mounted elsewhere).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.models import Model, infer_signature

from envs.evalset import load
from envs.maze import MazeEnv
from envs.skyrl_env import image_message
from mazerl.atomic import install_dir, temporary_sibling
from mazerl.paths import dir_size_mb
from mazerl.tracking.artifacts import check_no_secrets
from mazerl.tracking.store import client_for

FLAVOR = "transformers"
TASK = "image-text-to-text"
MODEL_SUBDIR = "model"  # MLflow's name for the weights directory inside the model
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def input_example(eval_set: str) -> dict[str, Any]:
    """The policy's first turn on maze 0 of ``eval_set``: the task text and the frame as a data URI."""
    loaded = load(eval_set)
    layout = loaded.layouts[0]
    env = MazeEnv(size=layout.size, cell_px=loaded.cell_px, max_moves=loaded.max_moves)
    frame, _ = env.reset(layout=layout)
    return {"messages": [image_message(env.prompt(), frame)]}


def _model_card(model_dir: Path, record: dict[str, Any]) -> Any:
    """A model card written here: MLflow would otherwise ask the Hugging Face Hub for one."""
    from huggingface_hub import ModelCard  # comes with transformers; loaded only when a model is saved

    lines = [
        "---",
        "tags: [mazerl, grpo, lora, maze]",
        "---",
        "# Merged mazerl maze policy",
        "",
        f"LoRA adapter of checkpoint step {record.get('checkpoint_step')} merged into `{record.get('base_model_dir')}`.",
        f"Merged directory: `{model_dir}`. Load it with `mlflow.transformers.load_model(uri, return_type='components')`.",
    ]
    return ModelCard("\n".join(lines) + "\n")


def save_transformers_model(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    processor: Any,
    eval_set: str,
    keep_weights: bool = True,
    record: dict[str, Any] | None = None,
) -> Path:
    """Save the Hugging Face directory ``model_dir`` as an MLflow transformers model in ``out_dir``.

    ``processor`` is the directory's own (``mazerl.policy.loader.load_processor``: the PIL image
    processor where torchvision is missing). ``keep_weights=False`` leaves the weights in ``model_dir`` and records that path instead
    (for models too large to copy into the tracking store). Returns ``out_dir``.
    """
    # mlflow.transformers, torch and transformers take seconds to import: only the merge job saves a model
    import mlflow.transformers
    import torch
    import transformers

    model_dir, out_dir = Path(model_dir).resolve(), Path(out_dir)
    pipeline = transformers.pipeline(TASK, model=str(model_dir), processor=processor, dtype="auto")
    example = input_example(eval_set)
    mlflow.transformers.save_model(
        pipeline,
        str(out_dir),
        model_card=_model_card(model_dir, record or {}),
        input_example=example,
        signature=infer_signature(example, "('move', 0)"),  # the reply: one action as text
        pip_requirements=[
            f"transformers=={transformers.__version__}",
            f"torch=={torch.__version__.split('+')[0]}",
            "pillow",
        ],
    )
    del pipeline
    weights = out_dir / MODEL_SUBDIR
    for path in model_dir.iterdir():  # the processor files, so model/ is a complete HF directory
        if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES) and not (weights / path.name).exists():
            shutil.copy2(path, weights / path.name)
    mlmodel = Model.load(str(out_dir))
    mlmodel.flavors.pop("python_function", None)
    if not keep_weights:
        shutil.rmtree(weights)
        flavor = mlmodel.flavors[FLAVOR]
        flavor.pop("model_binary", None)
        flavor["local_base_model_path"] = str(model_dir)
    mlmodel.save(str(out_dir / "MLmodel"))
    return out_dir


def write_mlflow_model(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    processor: Any,
    eval_set: str,
    max_artifact_mb: float,
    record: dict[str, Any] | None = None,
) -> Path:
    """:func:`save_transformers_model` into ``out_dir`` under a temporary name, then renamed into place.

    Weights up to ``max_artifact_mb`` go into the model; a larger model keeps them in
    ``model_dir`` (a pointer). A previous ``out_dir`` is replaced, so a retried merge never
    leaves a model that names other weights.
    """
    if max_artifact_mb < 0:
        raise ValueError(f"max_artifact_mb={max_artifact_mb} must be >= 0 (0: always log a pointer)")
    out_dir = Path(out_dir)
    tmp = temporary_sibling(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    keep_weights = dir_size_mb(model_dir) <= max_artifact_mb
    try:
        save_transformers_model(
            model_dir, tmp, processor=processor, eval_set=eval_set, keep_weights=keep_weights, record=record
        )
        install_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def holds_weights(model_path: str | os.PathLike) -> bool:
    """Whether a saved MLflow transformers model carries its weights (False: it points at them)."""
    return not Model.load(str(Path(model_path))).flavors[FLAVOR].get("local_base_model_path")


def weights_dir(model_path: str | os.PathLike) -> Path | None:
    """The Hugging Face directory of a saved MLflow transformers model (``model/`` or the external
    weights it names); None if ``model_path`` is not one."""
    model_path = Path(model_path)
    if not (model_path / "MLmodel").is_file():
        return None
    flavor = Model.load(str(model_path)).flavors.get(FLAVOR)
    if flavor is None:
        return None
    if flavor.get("local_base_model_path"):
        return Path(flavor["local_base_model_path"])
    return model_path / flavor.get("model_binary", MODEL_SUBDIR)


# --------------------------------------------------------------------------------------
# Logging it on the merge run
# --------------------------------------------------------------------------------------

MERGED_MODEL_ARTIFACT = "merged_model"  # the logged model's name prefix (older runs: the run artifact's name)
TAG_LOGGED_MODEL = "mazerl.logged_model_id"  # on the merge run: its merged model's MLflow 3 logged model
# The merge record's fields that describe the model (the logged model's params); the numbers are metrics.
MODEL_PARAMS = ("base_model_dir", "base_fingerprint", "adapter_dir", "adapter_sha256", "checkpoint_step", "save_dtype")


@dataclass(frozen=True)
class LoggedModel:
    """Where the merged model went: ``source`` is the artifact URI to register as a model version."""

    source: str
    uploaded: bool  # False: the MLflow model names ``local_path`` for its weights instead of holding them
    local_path: str
    size_mb: float
    model_id: str | None = None  # the MLflow 3 logged model (the experiment's Models tab)


def _logged_model_for(client: Any, run_id: str, name: str, params: dict[str, str]) -> Any:
    """The merge run's logged model: the one a first attempt created (a retried merge task), else a new one."""
    from mlflow.entities import LoggedModelStatus

    run = client.get_run(run_id)
    existing = run.data.tags.get(TAG_LOGGED_MODEL)
    if existing:
        try:
            model = client.get_logged_model(existing)
        except MlflowException:  # deleted by hand: make a new one
            model = None
        if model is not None and model.status != LoggedModelStatus.FAILED:
            return model
    model = client.create_logged_model(
        run.info.experiment_id,
        name=name,
        source_run_id=run_id,
        params=params,
        model_type=TASK,
        tags={"mazerl.run_id": run.data.tags.get("mazerl.run_id", ""), "mazerl.flavor": FLAVOR},
    )
    client.set_tag(run_id, TAG_LOGGED_MODEL, model.model_id)
    return model


def log_merged_model(
    tracking_uri: str,
    run_id: str,
    merged_dir: str | os.PathLike,
    mlflow_model_dir: str | os.PathLike,
) -> LoggedModel:
    """Log the MLflow transformers model the merge job wrote (``mlflow_model_dir``) as an MLflow 3
    logged model of run ``run_id`` (the ``merge_lora`` run): the experiment's *Models* tab lists it,
    the run shows it as its output, and its files are the logged model's artifacts
    (``<artifact root>/models/<model id>/artifacts``), the source the registry version points at.

    Nothing is loaded here: the merge job saved the model beside the weights
    (:func:`mazerl.tracking.mlflow_model.write_mlflow_model`). A model that only points at its
    weights (above ``max_artifact_mb``) also tags the run with ``mazerl.merged_model_path``.
    The merge record's proofs are logged as ``merge/*`` metrics, its identity (base model, adapter
    and their digests, checkpoint step) as the logged model's params. A retried merge task logs
    into the same logged model.
    """
    from mlflow.entities import LoggedModelOutput

    merged_dir, model_path = Path(merged_dir).resolve(), Path(mlflow_model_dir)
    if not (merged_dir / "config.json").is_file():
        raise FileNotFoundError(f"merged_dir={str(merged_dir)!r} is not a model directory (no config.json)")
    if not (model_path / "MLmodel").is_file():
        raise FileNotFoundError(f"{model_path} holds no MLflow model (no MLmodel); the merge job writes it")
    check_no_secrets(merged_dir)
    client = client_for(tracking_uri)
    record_path = merged_dir / "merge_record.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    numeric = {
        f"merge/{key}": float(value)
        for key, value in record.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and key != "checkpoint_step"
    }
    now_ms = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(key, value, now_ms, 0) for key, value in numeric.items()])
    uploaded = holds_weights(model_path)
    params = {key: str(record[key]) for key in MODEL_PARAMS if record.get(key) is not None}
    name = f"{MERGED_MODEL_ARTIFACT}-{client.get_run(run_id).data.tags.get('mazerl.run_id', run_id)}"
    model = _logged_model_for(client, run_id, name, params)
    client.log_model_artifacts(model.model_id, str(model_path))
    client.finalize_logged_model(model.model_id, "READY")
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])
    if not uploaded:
        client.set_tag(run_id, "mazerl.merged_model_path", str(merged_dir))
    return LoggedModel(model.artifact_location, uploaded, str(merged_dir), dir_size_mb(merged_dir), model.model_id)
