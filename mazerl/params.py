"""The pipeline's parameters: one pydantic model, validated before any stage runs.

Every field has a default that gives the embedded run (this machine, local Ray, MLflow on
SQLite under the data root, the self-built starter model). A cluster run overrides the
model, the backend, the Ray address, the data root and the tracking URI.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, WithJsonSchema, model_validator

from envs.evalset import EMBEDDED_EVAL_SET, SPECS
from mazerl import paths
from mazerl.address_forms import check_ray_address_form, check_tracking_uri_form, control_character
from mazerl.evaluation.engines import EvalEngine, check_gpus_per_worker, gpus_per_worker
from mazerl.evaluation.settings import check_max_eval_mazes
from mazerl.training.config import PlainNumbers, TrainConfig
from mazerl.training.recipes import (
    MINIATURE_TRAINING,
    PIPELINE_SET_TRAINING_FIELDS,
    RecipeName,
    automatic_recipe,
    deep_merge,
    resolve_train_config,
)

REGISTERED_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\- ]*")  # whole name (fullmatch: "$" passes a "\n")


def _check_eval_set(value: str | None) -> str | None:
    if value is not None and value not in SPECS:
        raise ValueError(f"unknown eval set {value!r}; choose one of {sorted(SPECS)}")
    return value


def _check_registered_model(value: str | None) -> str | None:
    if value is not None and len(value) > MLFLOW_NAME_MAX_CHARS:
        raise ValueError(
            f"registered model name is {len(value)} characters; MLflow's database stores keep at most "
            f"{MLFLOW_NAME_MAX_CHARS}: give a shorter name, e.g. 'maze-vlm'"
        )
    if value is not None and not REGISTERED_MODEL_NAME.fullmatch(value):
        raise ValueError(
            f"registered model name {value!r} may use only letters, digits, '_', '-', '.' and spaces, "
            "starting with a letter or digit"
        )
    return value


# The smallest name limit of MLflow's stores: the experiments and registered_models tables' VARCHAR(256)
# (PostgreSQL and MySQL enforce it; MLflow's own check allows 500 and SQLite anything).
MLFLOW_NAME_MAX_CHARS = 256
# SageMaker's own pattern of a HyperPod cluster name (CreateCluster's ClusterName), and a cluster's ARN.
HYPERPOD_CLUSTER_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
HYPERPOD_CLUSTER_ARN = re.compile(r"arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:[0-9]{12}:cluster/[a-z0-9]{12}")


def _check_experiment(value: str) -> str:
    if not value.strip():
        raise ValueError(f"experiment ({value!r}) is empty; give an MLflow experiment name, e.g. 'vlm-maze-grpo'")
    char = control_character(value)
    if char:
        raise ValueError(
            f"experiment {value!r} holds a control character ({char}); give a name of printable characters, "
            "e.g. 'vlm-maze-grpo'"
        )
    if len(value) > MLFLOW_NAME_MAX_CHARS:
        raise ValueError(
            f"experiment is {len(value)} characters; MLflow's database stores keep at most {MLFLOW_NAME_MAX_CHARS}: "
            "give a shorter name, e.g. 'vlm-maze-grpo'"
        )
    return value


def _check_hyperpod_cluster(value: str | None) -> str | None:
    if value is not None and not (HYPERPOD_CLUSTER_NAME.fullmatch(value) or HYPERPOD_CLUSTER_ARN.fullmatch(value)):
        raise ValueError(
            f"hyperpod_cluster {value!r} is not a HyperPod cluster name (1-63 letters, digits and hyphens, starting "
            "and ending with a letter or digit) or cluster ARN; copy it from aws sagemaker list-clusters"
        )
    return value


def _no_control_characters(values: Any, where: str = "") -> None:
    """Refuse a NUL, newline or other control character in any string of the parameters (paths and
    names that would fail much later, or be written into file names and MLflow as given)."""
    items = values.items() if isinstance(values, dict) else enumerate(values) if isinstance(values, list) else ()
    for key, value in items:
        field = f"{where}.{key}" if where and isinstance(key, str) else f"{where}[{key}]" if where else str(key)
        if isinstance(value, str):
            char = control_character(value)
            if char:
                raise ValueError(f"{field} holds a control character ({char}): {value!r}; remove it")
        elif isinstance(value, dict | list):
            _no_control_characters(value, field)


EvalSetName = Annotated[str | None, AfterValidator(_check_eval_set)]
RegisteredModelName = Annotated[str | None, AfterValidator(_check_registered_model)]
TrackingUri = Annotated[str | None, AfterValidator(check_tracking_uri_form)]
RayAddress = Annotated[str | None, AfterValidator(check_ray_address_form)]
ExperimentName = Annotated[str, AfterValidator(_check_experiment)]
HyperPodCluster = Annotated[str | None, AfterValidator(_check_hyperpod_cluster)]


# Named starting points for a run's parameters (``mazerl run --preset NAME``, or ``"preset"`` in a
# deployment's parameters); whatever else is given overrides them.
PRESETS: dict[str, dict[str, Any]] = {
    # every stage once, in about 2 minutes on 2 cores once the starter is built: the miniature
    # recipe and a 16-maze eval (numbers that say the plumbing works, not that the policy learned)
    "smoke": {"training": MINIATURE_TRAINING, "max_eval_mazes": 16},
}


def training_overrides_schema() -> dict[str, Any]:
    """The JSON schema of ``training`` as Prefect's run form shows it: every TrainConfig field a
    user may override, with its description, type and bounds, none required.

    The value stays a plain dict of overrides at run time (validated against TrainConfig by
    :meth:`PipelineParams.train_config`, so errors name ``training.<field>``); only the schema is
    typed. Defaults move into the descriptions: a form that pre-filled them would send them as
    overrides of the recipe's own values. References are inlined because the form reads one
    self-contained object schema per parameter.
    """
    schema = TrainConfig.model_json_schema()
    definitions = schema.pop("$defs", {})

    def plain(node: Any) -> Any:
        if isinstance(node, list):
            return [plain(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return plain(
                {**definitions[node["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}}
            )
        node = {
            key: plain(value) for key, value in node.items() if key not in ("required", "title", "additionalProperties")
        }
        if "default" in node:
            default = node.pop("default")
            if not isinstance(default, dict):  # nested settings: their fields say their own defaults
                node["description"] = f"{node.get('description', '')} Default: {json.dumps(default)}.".strip()
        return node

    properties = {key: plain(value) for key, value in schema["properties"].items()}
    for key in PIPELINE_SET_TRAINING_FIELDS:
        properties.pop(key)
    return {"type": "object", "properties": properties}


class EvalEngineParams(PlainNumbers):
    """Where and how the evals generate: the engine, and the GPUs each eval worker (Ray actor) takes."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    eval_engine: EvalEngine = Field(
        "hf",
        description="Inference engine of the evals: hf (transformers; CPU, or a GPU when the worker has one) "
        "or vllm (GPU workers only; the hyperpod deployment's choice for 8B models).",
    )
    eval_gpus_per_worker: float | None = Field(
        None,
        ge=0,
        description="GPUs each eval worker asks Ray for; None: 1 for vllm, 0 for hf. Fractions below 1 share a "
        "GPU between workers; above 1 it must be a whole number.",
    )

    @model_validator(mode="after")
    def _engine_gets_gpus(self) -> EvalEngineParams:
        check_gpus_per_worker(self.eval_engine, self.resolved_eval_gpus())
        return self

    def resolved_eval_gpus(self) -> float:
        """GPUs per eval worker, the engine's default filled in."""
        return gpus_per_worker(self.eval_engine, self.eval_gpus_per_worker)


class PipelineParams(EvalEngineParams):
    """Parameters of one pipeline run (the Prefect flow's single argument)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    preset: Literal["smoke"] | None = Field(
        None,
        description="Named defaults under the other parameters, which override them: 'smoke' runs every stage "
        "once in about 2 minutes on 2 cores (the miniature training recipe, 16 eval mazes); None: the full run.",
    )
    base_model: str | None = Field(
        None, description="HF model directory of the starting policy; None: the embedded starter (built if missing)."
    )
    eval_set: EvalSetName = Field(
        None, description=f"Eval set name; None: {EMBEDDED_EVAL_SET} for the starter, maze64-easy-v1 otherwise."
    )
    backend: Literal["local", "skyrl"] = Field("local", description="Training backend (both run as Ray jobs).")
    recipe: RecipeName | None = Field(
        None,
        description="Training recipe the training overrides apply to (mazerl/training/recipes.py): 'embedded' (tuned "
        "for the starter on the local backend) or 'defaults' (the defaults each training field names); None: "
        "embedded for the starter on the local backend, else defaults.",
    )
    training: Annotated[dict[str, Any], WithJsonSchema(training_overrides_schema())] = Field(
        default_factory=dict,
        description="Overrides of the training recipe (mazerl/training/config.py), e.g. {'steps': 50}; a field left "
        "out keeps the recipe's value.",
    )
    ray_address: RayAddress = Field(
        None, description="Ray dashboard address (http://host:8265, sagemaker_ray://...); None: start local Ray."
    )
    data_root: str | None = Field(None, description="Root of models, runs and the embedded MLflow store.")
    tracking_uri: TrackingUri = Field(None, description="MLflow tracking URI; None: sqlite:///<data_root>/mlflow.db.")
    experiment: ExperimentName = Field("vlm-maze-grpo", description="MLflow experiment.")
    registered_model: Annotated[str, AfterValidator(_check_registered_model)] = Field(
        "maze-vlm", description="MLflow registered model for the merged adapters."
    )
    promotion_threshold: float = Field(
        0.0, ge=0, le=1, description="Minimum final success rate before the champion alias may move."
    )
    hyperpod_cluster: HyperPodCluster = Field(None, description="SageMaker HyperPod cluster name to health-check.")
    gpu_smoke: bool = Field(
        True,
        description="verify_cluster tries the GPU stack on every GPU worker when the run uses GPUs (the device's "
        "architecture against torch's, a flash-attn call, a one-token vLLM generate, a LoRA adapter through vLLM, "
        "as the backend and eval engine need them; minutes for an 8B model). false skips those rows.",
    )
    eval_workers: int = Field(2, ge=1, description="Parallel eval workers (Ray tasks).")
    max_eval_mazes: int | None = Field(None, ge=1, description="Evaluate only the first N mazes (smoke runs).")
    gif_count: int = Field(4, ge=0, description="Episode GIFs kept per eval (solved and failed).")
    train_retries: int = Field(3, ge=0, description="Retries of the train stage on infrastructure failures.")
    resource_wait_s: float = Field(
        2700.0,
        ge=0,
        description="Before each retry of the train stage, wait up to this long for the cluster to have the GPUs "
        "the job asks for (a lost node being replaced: HyperPod needs many minutes); then give up naming what is "
        "missing. 0: resubmit without waiting.",
    )
    local_train_gpus: int = Field(
        0,
        ge=0,
        le=1,
        description="GPUs the local backend's training job asks Ray for: 0 trains where Ray starts the job (the "
        "head; CPU unless it has a GPU); 1 starts it on a GPU node and trains there. SkyRL places its own workers.",
    )
    hang_timeout_s: float = Field(
        1800.0, gt=0, description="Stop and retry a training job with no new step for this long."
    )
    ray_jobs_on_stop: Literal["auto", "stop", "keep"] = Field(
        "auto",
        description="What a flow process stopped gracefully (SIGTERM: a pod eviction, kill; Ctrl-C) does with its "
        "stage's running Ray job: 'stop' it (the laptop: `mazerl run` again resumes from the checkpoint), or "
        "'keep' it running for the retry of the flow run to re-attach to (a deployment: no step is lost); "
        "'auto': keep for a deployment's flow run, stop otherwise. Cancelling a flow run always stops its job.",
    )
    max_artifact_mb: float = Field(
        512.0, ge=0, description="Merged models above this size are logged as a pointer, not copied into MLflow."
    )

    @model_validator(mode="before")
    @classmethod
    def _preset_under_the_given_values(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _no_control_characters(data)
        if isinstance(data, dict) and isinstance(data.get("preset"), str) and data["preset"] in PRESETS:
            return deep_merge(PRESETS[data["preset"]], data)
        return data

    @model_validator(mode="after")
    def _cross_field_rules(self) -> PipelineParams:
        """Check ``training`` and the rules between fields now, before any stage. The starter's directory is
        known once ``prepare`` has it, and validation reads no file, so the models directory stands in for it."""
        self.train_config("validation", Path(self.base_model or paths.models_dir(self.root())))
        check_max_eval_mazes(self.max_eval_mazes, self.resolved_eval_set())
        if self.local_train_gpus and self.backend != "local":
            raise ValueError(
                f"local_train_gpus ({self.local_train_gpus}) applies to backend 'local' only: SkyRL places its own "
                "GPU workers (training.skyrl.num_gpus / num_nodes); remove local_train_gpus"
            )
        return self

    def root(self) -> Path:
        return paths.data_root(self.data_root)

    def resolved_tracking_uri(self) -> str:
        return self.tracking_uri or paths.mlflow_db_uri(self.root())

    def resolved_eval_set(self) -> str:
        if self.eval_set:
            return self.eval_set
        return EMBEDDED_EVAL_SET if self.base_model is None else "maze64-easy-v1"

    def training_recipe(self) -> RecipeName:
        """The recipe the ``training`` overrides apply to: the one named, else the automatic choice."""
        return self.recipe or automatic_recipe(starter=self.base_model is None, backend=self.backend)

    def train_config(self, run_id: str, base_model: Path, mlflow_run_id: str | None = None) -> TrainConfig:
        """The training config this pipeline run trains with; errors name ``training.<field>``.

        The pipeline resolves it once, in ``prepare``, and passes the file it writes to the stages.
        """
        return resolve_train_config(
            self.training_recipe(),
            self.training,
            run_id=run_id,
            base_model=base_model,
            data_root=self.root(),
            backend=self.backend,
            eval_set=self.resolved_eval_set(),
            tracking_uri=self.resolved_tracking_uri(),
            experiment=self.experiment,
            mlflow_run_id=mlflow_run_id,
        )


class EvalParams(EvalEngineParams):
    """Parameters of the eval-only flow: a model directory or a registered model version."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model_dir: str | None = Field(None, description="HF model directory to evaluate.")
    registered_model: RegisteredModelName = Field(None, description="Registered model name (instead of model_dir).")
    version: str = Field("champion", description="Version number or alias of the registered model.")
    eval_set: EvalSetName = Field(EMBEDDED_EVAL_SET, description="Eval set name.")
    ray_address: RayAddress = Field(None, description="Ray dashboard address; None: start a local head.")
    data_root: str | None = Field(None, description="Root for eval outputs and the embedded MLflow store.")
    tracking_uri: TrackingUri = Field(None, description="MLflow tracking URI; None: the embedded store.")
    experiment: ExperimentName = Field("vlm-maze-eval", description="MLflow experiment of eval-only runs.")
    eval_workers: int = Field(2, ge=1, description="Parallel eval workers.")
    max_eval_mazes: int | None = Field(None, ge=1, description="Evaluate only the first N mazes.")
    gif_count: int = Field(4, ge=0, description="Episode GIFs kept.")

    @model_validator(mode="before")
    @classmethod
    def _printable(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _no_control_characters(data)
        return data

    @model_validator(mode="after")
    def _one_model(self) -> EvalParams:
        if (self.model_dir is None) == (self.registered_model is None):
            raise ValueError("give exactly one of model_dir or registered_model (with version, default 'champion')")
        check_max_eval_mazes(self.max_eval_mazes, self.eval_set)
        return self

    def root(self) -> Path:
        return paths.data_root(self.data_root)

    def resolved_tracking_uri(self) -> str:
        return self.tracking_uri or paths.mlflow_db_uri(self.root())
