"""The training configuration shared by both backends, validated once at construction.

Every field says what it trades off. The same file (JSON or YAML) configures the local
engine's and the SkyRL backend's ``python -m`` entrypoints, is saved with every
checkpoint and is logged to MLflow.
"""

from __future__ import annotations

import hashlib
import json
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from envs.evalset import EvalSetError, load
from envs.pool import world_capacity
from mazerl import atomic, paths
from mazerl.policy.context_mode import HistoryImages, HistoryText, check_context_mode

MAX_STEPS = 1_000_000
MAX_DEFAULT_POOL = 4096
# Upper bounds: each far past anything a run can use, so a value above one is a typo (an extra digit), refused
# before a run starts instead of ending it hours later (or never). Each field's description says why its bound.
MAX_TURNS = 1000
MAX_NEW_TOKENS = 4096
MAX_SAMPLES_PER_MAZE = 256
MAX_TORCH_THREADS = 256
MAX_SEED = 2**32 - 1  # numpy's seeding takes 0 .. 2**32 - 1 (the maze world, the starter's build, the trainer)


def _is_number_type(annotation: Any) -> bool:
    """int or float (alone or in a union) and not bool: the fields where pydantic would read true as 1."""
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = typing.get_args(annotation)
        return bool not in members and any(member in (int, float) for member in members)
    return False


class TrainingConfigError(ValueError):
    """A problem with the configuration or its inputs: retrying will not help (exit code 2)."""


class PlainNumbers(BaseModel):
    """No unknown keys, finite numbers only, no booleans for numbers: pydantic alone would take
    ``steps: true`` as 1 and ``learning_rate: Infinity`` as given."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _is_number_type(field.annotation):
            raise ValueError(f"{info.field_name} ({value}) must be a number, not a boolean")
        return value


class StrictModel(PlainNumbers):
    """Frozen, and :class:`PlainNumbers`' rules: a typo in a config file is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class LoraConfig(StrictModel):
    rank: int = Field(32, description="LoRA rank r; the reference run used 32. Higher: more capacity, more memory.")
    alpha: float = Field(64.0, gt=0, description="LoRA scaling numerator (scale = alpha / rank).")
    dropout: float = Field(
        0.0, ge=0, lt=1, description="Dropout on the LoRA input; 0 keeps rollouts and updates identical."
    )
    target_modules: tuple[str, ...] = Field(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        description="Linear layer names of the language model that get adapters; lm_head adds the output head "
        "(local backend). The vision tower gets adapters only with freeze_vision: false.",
    )

    @field_validator("target_modules")
    @classmethod
    def _some_target(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or any(not name.strip() for name in value):
            raise ValueError(
                "lora.target_modules is empty (or names an empty module): LoRA would adapt no layer, so training "
                "would change nothing and the merge would have nothing to merge; name the linear layers to adapt, "
                'e.g. ["q_proj", "k_proj", "v_proj", "o_proj"], or leave it out for the recipe\'s'
            )
        return value

    @field_validator("rank")
    @classmethod
    def _positive_rank(cls, value: int) -> int:
        if value < 1:
            raise ValueError(
                f"lora.rank ({value}) must be >= 1: a rank-{value} adapter has no weights to train or to merge "
                "into the base model; the reference uses 32"
            )
        return value


class GrpoConfig(StrictModel):
    samples_per_maze: int = Field(
        8,
        le=MAX_SAMPLES_PER_MAZE,
        description="Episodes per maze (the GRPO group). Advantages are relative within a group, so >= 2; at most "
        f"{MAX_SAMPLES_PER_MAZE} (32 times the reference's 8): a group is rolled out and scored in one step, and a "
        "group mean over more samples changes nothing.",
    )
    clip_low: float = Field(0.2, gt=0, lt=1, description="PPO clip epsilon below 1 (SkyRL eps_clip_low).")
    clip_high: float = Field(0.2, gt=0, description="PPO clip epsilon above 1 (SkyRL eps_clip_high).")
    kl_coef: float = Field(
        0.0, ge=0, description="KL-to-reference loss coefficient; 0 (default) needs no reference model."
    )
    loss_reduction: Literal["token_mean", "sequence_mean"] = Field(
        "token_mean", description="How per-token losses are averaged (SkyRL's token_mean: over all response tokens)."
    )
    update_epochs: int = Field(
        2, ge=1, description="Optimizer passes over each rollout batch; >1 makes the clip matter (PPO-style)."
    )
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of training rollouts (eval is greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling for training rollouts.")
    max_new_tokens: int = Field(
        24,
        ge=1,
        le=MAX_NEW_TOKENS,
        description=f"Token budget of one reply; an action needs about 8 tokens. At most {MAX_NEW_TOKENS}: every "
        "turn's reply is kept in the conversation, which skyrl.max_model_len must hold.",
    )
    format_bonus: float = Field(
        0.0, ge=0, description="Training-only reward for replies that parse (never counted as success)."
    )
    progress_reward: float = Field(
        0.0,
        ge=0,
        description="Training-only shaping per move: this times the moves it took the agent closer to the target "
        "along the maze (+ for the solver's move, - for a step away; never counted as success). 0 disables it.",
    )
    bump_cost: float = Field(
        0.0,
        ge=0,
        description="Training-only cost of a reply that leaves the agent where it was (a wall bump, an unreadable "
        "reply); 0 disables it.",
    )
    stop_token_loss: bool = Field(
        True,
        description="true (SkyRL): the reply's end-of-turn token is trained like its other tokens; false (local "
        "backend): it is left out of the loss (the normaliser still counts it, so the other tokens' gradients are "
        "unchanged). The stop token ends every reply, and longer failed episodes carry more of it, so an "
        "outcome-only update pushes it down step after step until replies stop ending and run to max_new_tokens.",
    )
    credit: Literal["episode", "turn", "anchor"] = Field(
        "episode",
        description="episode (SkyRL's GRPO): the shaping terms join the episode's reward and every turn shares one "
        "advantage; turn (local backend): each turn adds its own shaping reward, less its group's mean, to the "
        "episode's advantage, so a bump is blamed on the reply that made it; anchor (local backend, GiGPO): each "
        "turn adds anchor_weight times its discounted return normalised among the group's turns that saw the same "
        "context (an anchor state), which needs no solver.",
    )
    anchor_discount: float = Field(
        0.95, gt=0, le=1, description="credit: anchor: the discount of a turn's return (GiGPO's gamma)."
    )
    anchor_weight: float = Field(
        1.0, ge=0, description="credit: anchor: the weight of a turn's anchor-state advantage (GiGPO's omega)."
    )

    @model_validator(mode="after")
    def _anchor_credit_is_solver_free(self) -> GrpoConfig:
        if self.credit == "anchor" and self.progress_reward > 0:
            raise ValueError(
                f"grpo.progress_reward ({self.progress_reward}) needs the maze's solver, which credit: anchor is "
                "meant to do without (the cluster's SkyRL backend has none); set progress_reward: 0 with "
                "credit: anchor, or use credit: turn"
            )
        return self

    @field_validator("samples_per_maze")
    @classmethod
    def _group_of_two(cls, value: int) -> int:
        if value < 2:
            raise ValueError(
                f"grpo.samples_per_maze ({value}) must be >= 2: GRPO's advantage is the reward minus its group "
                "mean, so a group of 1 has zero advantage and learns nothing; the reference uses 8"
            )
        return value


class MlflowSettings(StrictModel):
    tracking_uri: str | None = Field(
        None, description="MLflow tracking URI; None means the embedded SQLite store under the data root."
    )
    experiment: str = Field("vlm-maze-grpo", description="MLflow experiment name.")
    run_id: str | None = Field(
        None, description="The child run `train` to log into (created by the orchestrator); None: a new run."
    )


class SkyrlSettings(StrictModel):
    num_gpus: int = Field(8, ge=1, description="GPUs for policy training (FSDP) and colocated vLLM engines.")
    num_nodes: int = Field(1, ge=1, description="Nodes the GPUs are spread over.")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM tensor parallelism per engine.")
    gpu_memory_utilization: float = Field(0.8, gt=0, le=1, description="vLLM's share of GPU memory when colocated.")
    micro_batch_size_per_gpu: int = Field(4, ge=1, description="Micro batch for forward/backward passes.")
    max_prompt_length: int = Field(2048, ge=64, description="Token limit of the first prompt (text + image).")
    max_input_length: int = Field(8192, ge=256, description="Token limit of a whole multi-turn conversation.")
    max_model_len: int = Field(60000, ge=1024, description="vLLM context length.")
    lora_sync_path: str | None = Field(
        None, description="Where LoRA weights are exchanged with vLLM; default: <run dir>/lora_sync on shared storage."
    )

    @property
    def num_engines(self) -> int:
        return self.num_gpus * self.num_nodes // self.tensor_parallel_size


class TrainConfig(StrictModel):
    """One training run. Construct it from a file with :func:`load_config`."""

    run_id: str = Field(description="Identifier of the run; checkpoints go to <data_root>/runs/<run_id>/checkpoints.")
    data_root: Path = Field(
        default_factory=paths.data_root, description="Root for models, runs and the embedded MLflow store."
    )
    base_model: Path = Field(description="Hugging Face model directory of the starting policy (the SFT checkpoint).")
    backend: Literal["local", "skyrl"] = Field(
        "local", description="local: torch+transformers+peft on one machine; skyrl: SkyRL with vLLM+FSDP on GPUs."
    )
    eval_set: str = Field("maze64-easy-v1", description="Name of the fixed eval set (envs/data); also fixes the world.")
    action_format: Literal["tuple", "keyword"] = Field(
        "tuple", description="Action syntax the policy is asked for: VisGym tuples (SFT) or <action> keywords."
    )
    max_turns: int = Field(
        15,
        le=MAX_TURNS,
        description=f"Move budget per episode, the stop included (reference: 15). At most {MAX_TURNS}: each turn "
        "adds a frame and a reply to the conversation, so a longer episode outgrows any model's context.",
    )
    history_images: HistoryImages = Field(
        "all",
        description="Frames kept in the conversation: all (reference) or the last K, earlier turns kept as text.",
    )
    history_text: HistoryText = Field(
        "all",
        description="Past exchanges (reply + feedback) kept as text: all (reference) or the last K; 0: the task "
        "prompt and the current frame only; feedback: also the last feedback line (needs history_images 1). 0, 1 "
        "or feedback make identical states give identical contexts (computed once); "
        "a starter records the value it was warm-started with, and training it should use the same.",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="Adapter settings.")
    grpo: GrpoConfig = Field(default_factory=GrpoConfig, description="GRPO algorithm settings.")
    steps: int = Field(
        100,
        ge=1,
        le=MAX_STEPS,
        description=f"Optimizer steps (rollout batches) in the whole run (at most {MAX_STEPS:,}: more is a typo).",
    )
    mazes_per_step: int = Field(16, ge=1, description="Distinct mazes per step; each is played samples_per_maze times.")
    mini_batch_mazes: int | None = Field(
        None,
        ge=1,
        description="Mazes per optimizer step inside an update epoch (SkyRL's policy_mini_batch_size); "
        "None: the whole step, one optimizer step per epoch. Must divide mazes_per_step.",
    )
    train_pool_size: int = Field(
        MAX_DEFAULT_POOL,
        ge=1,
        description="Distinct training mazes, from seeds 10^6 upwards, never a layout of the eval set. Unset: "
        f"every maze the world offers outside the eval set, at most {MAX_DEFAULT_POOL} (the 7x7 world has 768 "
        "mazes in all, so 512 there); a larger value than the world offers is refused.",
    )
    retry_share: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Share of each step's mazes drawn again from the pool mazes whose last group was split (some "
        "samples solved, some not), in place of the step's last fresh mazes: late in a run most groups solve every "
        "sample and carry no gradient. 0: the plain per-epoch order (local backend; SkyRL refuses other values).",
    )
    learning_rate: float = Field(1e-4, description="AdamW learning rate for the LoRA weights.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="Learning rate over the run's steps (transformers' schedules, SkyRL's optimizer_config.scheduler): "
        "constant, or a decay from learning_rate towards 0 at the last step (linear, cosine), so the last "
        "checkpoint, the run's model, is where the updates have settled.",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    freeze_vision: bool = Field(
        True,
        description="true: adapters on the language model only (the vision tower frozen, each frame encoded once); "
        "false (local backend): adapters on the vision tower's blocks and mergers too, so it can learn to see what "
        "the policy misreads, at the cost of encoding frames anew every step.",
    )
    checkpoint_interval: int = Field(10, ge=1, description="Save a checkpoint every N steps (and always at the end).")
    checkpoints_kept: int = Field(2, ge=1, description="Keep the last K checkpoints; older ones are deleted.")
    eval_interval: int = Field(0, ge=0, description="Greedy eval on the eval set every N steps; 0 disables.")
    eval_mazes: int | None = Field(None, ge=1, description="Evaluate on the first N mazes of the set during training.")
    seed: int = Field(
        0,
        ge=0,
        le=MAX_SEED,
        description="Seeds data order, sampling and initialisation; same seed, same run on CPU. 0 to 2**32 - 1, "
        "numpy's range: a larger seed would be folded into it (seed and seed + 2**32 would share numpy's stream).",
    )
    resume: Literal["latest", "none", "required"] = Field(
        "latest",
        description="latest: continue from the checkpoint marker if there is one; none: refuse to reuse a dir; "
        "required: continue from the marker and refuse to start without one.",
    )
    torch_threads: int | None = Field(
        None,
        ge=1,
        le=MAX_TORCH_THREADS,
        description=f"torch CPU threads (local backend); None: torch default. At most {MAX_TORCH_THREADS}: more "
        "threads than cores only make them wait for each other.",
    )
    mlflow: MlflowSettings = Field(default_factory=MlflowSettings, description="Where metrics go.")
    skyrl: SkyrlSettings = Field(default_factory=SkyrlSettings, description="GPU cluster settings (skyrl backend).")

    @model_validator(mode="before")
    @classmethod
    def _pool_from_the_world(cls, data: Any) -> Any:
        """An unset train_pool_size is the world's whole pool outside the eval set, at most MAX_DEFAULT_POOL."""
        if isinstance(data, dict) and data.get("train_pool_size") is None:
            capacity = _world_capacity(data.get("eval_set", cls.model_fields["eval_set"].default))
            data = {k: v for k, v in data.items() if k != "train_pool_size"}
            if capacity is not None:
                data["train_pool_size"] = min(MAX_DEFAULT_POOL, capacity)
        return data

    @field_validator("max_turns")
    @classmethod
    def _positive_budget(cls, value: int) -> int:
        if value < 1:
            raise ValueError(
                f"max_turns ({value}) must be >= 1: it is the move budget per episode, the final stop included; "
                "the eval sets use 15"
            )
        return value

    @field_validator("learning_rate")
    @classmethod
    def _positive_lr(cls, value: float) -> float:
        if not value > 0:
            raise ValueError(
                f"learning_rate ({value}) must be > 0; the embedded recipe uses 1e-3, the TrainConfig default is 1e-4"
            )
        return value

    @field_validator("run_id")
    @classmethod
    def _safe_run_id(cls, value: str) -> str:
        if not value or any(
            c not in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_." for c in value
        ):
            raise ValueError(f"run_id ({value!r}) may use only letters, digits, '-', '_' and '.'")
        return value

    @field_validator("data_root", "base_model")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return paths.absolute_path(value)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> TrainConfig:
        check_context_mode(self.history_images, self.history_text)  # the runner's own rule (no torch)
        if self.mini_batch_mazes is not None and self.mazes_per_step % self.mini_batch_mazes:
            raise ValueError(
                f"mini_batch_mazes ({self.mini_batch_mazes}) must divide mazes_per_step ({self.mazes_per_step}) "
                "so every optimizer step sees whole GRPO groups; e.g. set it to a divisor such as "
                f"{max(d for d in range(1, self.mazes_per_step + 1) if self.mazes_per_step % d == 0 and d <= self.mini_batch_mazes)}"
            )
        capacity = _world_capacity(self.eval_set)
        if capacity is not None and self.train_pool_size > capacity:
            raise ValueError(
                f"train_pool_size ({self.train_pool_size}) is more than the world of eval set {self.eval_set} offers "
                f"outside the set ({capacity} distinct mazes); lower train_pool_size to at most {capacity}, or leave "
                "it unset for the largest pool the world allows"
            )
        if self.backend == "skyrl":
            placement = self.skyrl.num_gpus * self.skyrl.num_nodes
            if placement % self.skyrl.tensor_parallel_size:
                raise ValueError(
                    f"skyrl.num_gpus*num_nodes ({placement}) must be divisible by skyrl.tensor_parallel_size "
                    f"({self.skyrl.tensor_parallel_size}) so every vLLM engine gets whole GPUs"
                )
        return self

    def identity(self) -> dict[str, str]:
        """What makes two training jobs the same training (the submitter's cross-run re-attach):
        a digest of every setting except the names a pipeline run gives it (``run_id``, the MLflow
        run), the data root, and the run directory it writes into (``run_id``)."""
        settings = self.model_dump(mode="json", exclude={"run_id": True, "mlflow": {"run_id"}})
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
        return {"config_digest": digest, "data_root": str(self.data_root), "run_id": self.run_id}

    # Derived locations (docs/architecture.md, "The data root").
    @property
    def run_dir(self) -> Path:
        return paths.run_dir(self.data_root, self.run_id)

    @property
    def checkpoint_dir(self) -> Path:
        return paths.checkpoints_dir(self.data_root, self.run_id)

    @property
    def tracking_uri(self) -> str:
        return self.mlflow.tracking_uri or paths.mlflow_db_uri(self.data_root)

    @property
    def group_size(self) -> int:
        return self.grpo.samples_per_maze


def _world_capacity(eval_set: str) -> int | None:
    """Mazes of the named set's world outside it; None if the set does not load (its own check reports that)."""
    try:
        return world_capacity(load(eval_set))
    except (EvalSetError, TypeError, KeyError, ValueError):
        return None


def load_config(path: str | os.PathLike) -> TrainConfig:
    """Read a JSON or YAML config file; errors name the file and the offending field."""
    path = Path(path)
    text = path.read_text()
    data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    return TrainConfig.model_validate(data)


def save_config(config: TrainConfig, path: str | os.PathLike) -> Path:
    """Write the config as JSON atomically (temp name, then rename)."""
    return atomic.write_text(Path(path), config.model_dump_json(indent=2))
