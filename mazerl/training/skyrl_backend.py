"""TrainConfig -> SkyRL: config overrides, dataset tickets and metric names (no SkyRL import).

Everything here is plain Python so that it runs, and is tested, on Python 3.11 where SkyRL
(Python >= 3.12) is not installed. The entry module ``mazerl.training.skyrl_entry`` feeds
:func:`build_overrides` to ``SkyRLTrainConfig.from_cli_overrides`` on the cluster image.

Three translations live here, each one function:

* :func:`build_overrides` maps our config onto SkyRL's dotted field names. Every name is
  checked in CI against a snapshot of the real ``SkyRLTrainConfig`` of the pinned release
  (``skyrl_schema.json``, written by ``scripts/skyrl_schema_snapshot.py``, read by
  :mod:`mazerl.training.skyrl_schema`), so a field that SkyRL renames fails CI instead of a GPU job.
* :func:`dataset_rows` writes the "tickets" SkyRL's ``PromptDataset`` reads: one row per maze;
  every column but ``prompt``/``env_class`` reaches our env as ``extras``. SkyRL repeats each
  row ``n_samples_per_prompt`` times, so all samples of a GRPO group play the same maze.
* :func:`add_metric_aliases` copies SkyRL's metric names onto the names of docs/mlflow.md,
  so dashboards read ``train/success_rate`` whichever backend trained.

SkyRL's own behaviour this module relies on (verified in the 0.4.0 wheel, see docs/skyrl.md):
the generator sets ``extras["max_turns"]`` itself; the training dataloader shuffles with
``trainer.seed`` and drops the last partial batch; checkpoints go to
``trainer.ckpt_path/global_step_<N>/`` with ``latest_ckpt_global_step.txt`` written last.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.evalset import EvalSet
from envs.evalset import load as load_eval_set
from envs.pool import training_pool
from envs.skyrl_env import ENV_ID
from mazerl.atomic import temporary_sibling, write_text
from mazerl.training.config import TrainConfig

TRAIN_DATA_SOURCE = "maze2d-train"
# The ticket's prompt, as in SkyRL's VisGym example (examples/train/visgym/dataset.py): SkyRL's
# PromptDataset tokenizes it for its max_prompt_length filter and the VLM generator hands it to
# env.init(), where MazeTextEnv drops it and builds the real first message (task text + frame).
# A one-word placeholder always passes the filter; the real prompt's length is bounded by
# generator.max_input_length turn by turn.
PLACEHOLDER_PROMPT = [{"role": "user", "content": "placeholder"}]

# Our metric name -> the SkyRL 0.4 name it copies (trainer.py, generators/utils.py, evaluate.py,
# workers/worker.py). "environment/solved" is the mean of MazeTextEnv.get_metrics()["solved"]:
# success counts only a stop on the target, never a format bonus and never SkyRL's pass@n
# (which counts any positive reward).
METRIC_ALIASES: dict[str, str] = {
    "train/reward_mean": "reward/avg_raw_reward",
    "train/success_rate": "environment/solved",
    "train/response_tokens": "generate/avg_assistant_tokens",
    "train/policy_loss": "policy/policy_loss",
    "train/grad_norm": "policy/grad_norm",
    "train/clip_fraction": "policy/loss_metrics/clip_ratio",
    "train/step_seconds": "timing/step",
    "eval/success_rate": "eval/all/environment/solved",
}


# The ranks vLLM accepts as ``max_lora_rank``: vllm 0.30.0 (the release skyrl[fsdp] 0.4 pins),
# vllm/config/lora.py, ``MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]``. SkyRL
# hands ``trainer.policy.model.lora.rank`` to vLLM as ``max_lora_rank`` unchanged
# (skyrl 0.4.0, backends/skyrl_train/inference_servers/utils.py), so any other rank fails at
# vLLM start-up, after the GPUs were taken.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class SkyrlConfigError(ValueError):
    """A TrainConfig the SkyRL backend cannot run as asked (the entry exits with code 2)."""


@dataclass(frozen=True)
class SkyrlRunFiles:
    """Where the SkyRL backend keeps its files inside the run directory (on the shared mount)."""

    run_dir: Path

    @property
    def train_data(self) -> Path:
        return self.run_dir / "skyrl" / "train.parquet"

    @property
    def eval_data(self) -> Path:
        return self.run_dir / "skyrl" / "eval.parquet"

    @property
    def export_dir(self) -> Path:
        return self.run_dir / "skyrl" / "export"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "skyrl" / "logs"

    @property
    def resolved_config(self) -> Path:
        return self.run_dir / "skyrl" / "skyrl_overrides.json"


def run_files(config: TrainConfig) -> SkyrlRunFiles:
    return SkyrlRunFiles(config.run_dir)


def lora_sync_path(config: TrainConfig) -> str:
    """Where the trainer hands LoRA weights to vLLM: must be visible from every GPU node."""
    return config.skyrl.lora_sync_path or str(config.run_dir / "lora_sync")


def steps_per_epoch(config: TrainConfig) -> int:
    """SkyRL's dataloader drops the last partial batch: an epoch is pool // mazes_per_step steps."""
    return config.train_pool_size // config.mazes_per_step


# lr_schedule -> SkyRL's optimizer_config.scheduler (constant_with_warmup at 0 warmup steps is constant, its default)
SKYRL_SCHEDULERS = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def check_supported(config: TrainConfig) -> None:
    """Refuse settings SkyRL cannot honour, before any file is written or GPU is requested."""
    if config.backend != "skyrl":
        raise SkyrlConfigError(f"backend is {config.backend!r}; the SkyRL entry runs only configs with backend: skyrl")
    _check_generation(config)
    _check_adapter(config)
    _check_sizes(config)


def _check_generation(config: TrainConfig) -> None:
    """Refuse what SkyRL's generator, GRPO and scheduler do otherwise than the local engine (context, credit, rate)."""
    if config.history_images != "all":
        raise SkyrlConfigError(
            f"history_images ({config.history_images!r}) is not supported by the SkyRL backend: its VLM "
            "generator keeps every frame in the conversation; set history_images: all or use backend: local"
        )
    if config.history_text != "all":
        raise SkyrlConfigError(
            f"history_text ({config.history_text!r}) is not supported by the SkyRL backend: its VLM generator "
            "keeps the whole conversation; set history_text: all or use backend: local"
        )
    if config.grpo.credit != "episode":
        raise SkyrlConfigError(
            f"grpo.credit ({config.grpo.credit!r}) is not supported by the SkyRL backend: its GRPO advantage sums "
            "a trajectory's step rewards into one value for every turn; set grpo.credit: episode (the shaping "
            "terms are then paid per step and summed) or use backend: local"
        )
    if not config.grpo.stop_token_loss:
        raise SkyrlConfigError(
            "grpo.stop_token_loss (False) is not supported by the SkyRL backend: its loss mask covers every "
            "generated token, the stop token included; set grpo.stop_token_loss: true or use backend: local"
        )
    if config.retry_share > 0:
        raise SkyrlConfigError(
            f"retry_share ({config.retry_share}) is not supported by the SkyRL backend: its dataloader walks the "
            "prompt dataset in a fixed order; set retry_share: 0 or use backend: local"
        )
    optimizer_steps = config.grpo.update_epochs * (
        config.mazes_per_step // (config.mini_batch_mazes or config.mazes_per_step)
    )
    if config.lr_schedule != "constant" and optimizer_steps > 1:
        raise SkyrlConfigError(
            f"lr_schedule ({config.lr_schedule!r}) with {optimizer_steps} optimizer steps per training step is not "
            "supported by the SkyRL backend: SkyRL advances its scheduler on every optimizer step over `steps` "
            "in all, so the rate would reach 0 early; set grpo.update_epochs: 1 and leave mini_batch_mazes unset, "
            "or lr_schedule: constant"
        )


def _check_adapter(config: TrainConfig) -> None:
    """Refuse LoRA settings SkyRL cannot train or vLLM cannot serve (they would fail after the GPUs were taken)."""
    if not config.freeze_vision:
        raise SkyrlConfigError(
            "freeze_vision (False) is not supported by the SkyRL backend: it trains LoRA adapters on "
            "lora.target_modules only (the language model's projections); set freeze_vision: true"
        )
    if "lm_head" in config.lora.target_modules:
        raise SkyrlConfigError(
            "lora.target_modules includes lm_head, which the SkyRL backend cannot train: vLLM serves LoRA adapters "
            "on the decoder's projections only; remove lm_head or use backend: local"
        )
    if config.lora.rank not in VLLM_LORA_RANKS:
        allowed = ", ".join(map(str, VLLM_LORA_RANKS))
        raise SkyrlConfigError(
            f"lora.rank ({config.lora.rank}) is not a rank vLLM 0.30 serves: SkyRL passes it to vLLM as "
            f"max_lora_rank, which must be one of {allowed}; use one of those (the reference run uses 32)"
        )
    if not float(config.lora.alpha).is_integer():
        raise SkyrlConfigError(
            f"lora.alpha ({config.lora.alpha}) must be a whole number for the SkyRL backend "
            "(SkyRL's trainer.policy.model.lora.alpha is an int); e.g. 64"
        )


def _check_sizes(config: TrainConfig) -> None:
    """Refuse batch sizes that do not split evenly over the GPUs, and token budgets too small for a conversation."""
    s = config.skyrl
    if config.mazes_per_step > config.train_pool_size:
        raise SkyrlConfigError(
            f"mazes_per_step ({config.mazes_per_step}) exceeds train_pool_size ({config.train_pool_size}): "
            "SkyRL needs at least one full batch of distinct mazes; raise train_pool_size"
        )
    dp_size = s.num_gpus * s.num_nodes  # FSDP data-parallel ranks (no sequence parallelism)
    samples = config.mazes_per_step * config.group_size
    if samples % dp_size:
        raise SkyrlConfigError(
            f"mazes_per_step*samples_per_maze ({config.mazes_per_step}*{config.group_size}={samples}) must be "
            f"divisible by the GPU count skyrl.num_gpus*num_nodes ({dp_size}); otherwise SkyRL silently drops "
            "the tail of every batch; change mazes_per_step or the GPU count"
        )
    mini_samples = (config.mini_batch_mazes or config.mazes_per_step) * config.group_size
    if mini_samples % dp_size:
        raise SkyrlConfigError(
            f"mini_batch_mazes*samples_per_maze ({mini_samples}) must be divisible by the GPU count "
            f"skyrl.num_gpus*num_nodes ({dp_size}): each optimizer step is split evenly over the GPUs; "
            "change mini_batch_mazes"
        )
    per_gpu = mini_samples // dp_size
    if per_gpu % s.micro_batch_size_per_gpu:
        raise SkyrlConfigError(
            f"episodes per GPU per optimizer step ({per_gpu}) must be divisible by skyrl.micro_batch_size_per_gpu "
            f"({s.micro_batch_size_per_gpu}); pick a micro batch that divides {per_gpu}"
        )
    if s.max_input_length < s.max_prompt_length:
        raise SkyrlConfigError(
            f"skyrl.max_input_length ({s.max_input_length}) must be >= skyrl.max_prompt_length "
            f"({s.max_prompt_length}) for multi-turn generation"
        )
    if s.max_model_len < s.max_input_length + config.grpo.max_new_tokens:
        raise SkyrlConfigError(
            f"skyrl.max_model_len ({s.max_model_len}) must hold a whole conversation plus one reply: "
            f"max_input_length + grpo.max_new_tokens = {s.max_input_length + config.grpo.max_new_tokens}"
        )


def placement_bundles(config: TrainConfig) -> tuple[list[dict[str, float]], str]:
    """(bundles, strategy) of the placement group SkyRL 0.4 reserves for our colocated run
    (``BasePPOExp.get_colocate_pg``): one ``{GPU: 1, CPU: 1}`` bundle per GPU slot of the inference
    engines (engines x tensor parallel size; pipeline and data parallel are 1 here), packed."""
    slots = config.skyrl.num_engines * config.skyrl.tensor_parallel_size
    return [{"GPU": 1.0, "CPU": 1.0} for _ in range(slots)], "PACK"


def build_overrides(config: TrainConfig) -> dict[str, Any]:
    """Our TrainConfig as ``{dotted SkyRL field: value}`` for ``SkyRLTrainConfig.from_cli_overrides``."""
    check_supported(config)
    return {**_policy_overrides(config), **_generator_overrides(config), **_run_overrides(config)}


def _policy_overrides(config: TrainConfig) -> dict[str, Any]:
    """What the trainer learns from and how: data, model and adapter, GRPO, batches and optimizer."""
    s, grpo, files = config.skyrl, config.grpo, run_files(config)
    epochs = math.ceil(config.steps / steps_per_epoch(config))
    use_kl = grpo.kl_coef > 0
    return {
        # data: our tickets, written by write_datasets
        "data.train_data": [str(files.train_data)],
        "data.val_data": [str(files.eval_data)],
        "environment.env_class": ENV_ID,
        # model and adapter
        "trainer.strategy": "fsdp",
        "trainer.policy.model.path": str(config.base_model),
        "trainer.policy.model.lora.rank": config.lora.rank,
        "trainer.policy.model.lora.alpha": int(config.lora.alpha),
        "trainer.policy.model.lora.dropout": config.lora.dropout,
        "trainer.policy.model.lora.target_modules": list(config.lora.target_modules),
        "trainer.policy.model.lora.lora_sync_path": lora_sync_path(config),
        # GRPO
        "trainer.algorithm.advantage_estimator": "grpo",
        "trainer.algorithm.grpo_norm_by_std": True,
        "trainer.algorithm.policy_loss_type": "regular",
        "trainer.algorithm.eps_clip_low": grpo.clip_low,
        "trainer.algorithm.eps_clip_high": grpo.clip_high,
        "trainer.algorithm.loss_reduction": grpo.loss_reduction,
        "trainer.algorithm.use_kl_loss": use_kl,
        "trainer.algorithm.kl_loss_coef": grpo.kl_coef,
        "trainer.algorithm.use_kl_in_reward": False,
        "trainer.update_epochs_per_batch": grpo.update_epochs,
        # batches: one step = mazes_per_step mazes x samples_per_maze episodes, one optimizer step per epoch
        "trainer.train_batch_size": config.mazes_per_step,
        "trainer.policy_mini_batch_size": config.mini_batch_mazes or config.mazes_per_step,
        "trainer.micro_train_batch_size_per_gpu": s.micro_batch_size_per_gpu,
        "trainer.micro_forward_batch_size_per_gpu": s.micro_batch_size_per_gpu,
        "trainer.epochs": epochs,
        "trainer.max_training_steps": config.steps,
        "trainer.seed": config.seed,
        "trainer.policy.optimizer_config.lr": config.learning_rate,
        # transformers' get_scheduler over max_training_steps (= steps), advanced once per optimizer step
        "trainer.policy.optimizer_config.scheduler": SKYRL_SCHEDULERS[config.lr_schedule],
        "trainer.policy.optimizer_config.num_warmup_steps": 0,
        "trainer.policy.optimizer_config.weight_decay": config.weight_decay,
        "trainer.policy.optimizer_config.max_grad_norm": config.max_grad_norm,
        "trainer.max_prompt_length": s.max_prompt_length,
        "trainer.remove_microbatch_padding": False,
    }


def _generator_overrides(config: TrainConfig) -> dict[str, Any]:
    """How rollouts are sampled, and where the FSDP policy and the vLLM engines run."""
    s, grpo = config.skyrl, config.grpo
    return {
        # rollouts
        "generator.n_samples_per_prompt": config.group_size,
        "generator.max_turns": config.max_turns,
        "generator.max_input_length": s.max_input_length,
        "generator.vision_language_generator": True,
        "generator.batched": False,
        "generator.use_conversation_multi_turn": True,
        "generator.sampling_params.temperature": grpo.temperature,
        "generator.sampling_params.top_p": grpo.top_p,
        "generator.sampling_params.max_generate_length": grpo.max_new_tokens,
        "generator.eval_sampling_params.temperature": 0.0,
        "generator.eval_sampling_params.max_generate_length": grpo.max_new_tokens,
        "generator.eval_n_samples_per_prompt": 1,
        # placement: FSDP policy and vLLM engines share every GPU
        "trainer.placement.colocate_all": True,
        "trainer.placement.policy_num_nodes": s.num_nodes,
        "trainer.placement.policy_num_gpus_per_node": s.num_gpus,
        "trainer.placement.ref_num_nodes": s.num_nodes,
        "trainer.placement.ref_num_gpus_per_node": s.num_gpus,
        "generator.inference_engine.backend": "vllm",
        "generator.inference_engine.num_engines": s.num_engines,
        "generator.inference_engine.tensor_parallel_size": s.tensor_parallel_size,
        "generator.inference_engine.gpu_memory_utilization": s.gpu_memory_utilization,
        "generator.inference_engine.enable_prefix_caching": True,
        "generator.inference_engine.engine_init_kwargs.max_model_len": s.max_model_len,
    }


def _run_overrides(config: TrainConfig) -> dict[str, Any]:
    """Where the run keeps its checkpoints, exports and logs, when it evaluates, and how it is tracked."""
    files = run_files(config)
    return {
        # checkpoints (docs/architecture.md, "The data root": <run dir>/checkpoints, marker written last by SkyRL)
        "trainer.ckpt_path": str(config.checkpoint_dir),
        "trainer.ckpt_interval": config.checkpoint_interval,
        "trainer.max_ckpts_to_keep": config.checkpoints_kept,
        "trainer.resume_mode": "none" if config.resume == "none" else "latest",
        "trainer.export_path": str(files.export_dir),
        # merge_lora builds the merged model from the adapter; a full HF export per step is waste
        "trainer.hf_save_interval": -1,
        "trainer.log_path": str(files.log_dir),
        # SkyRL's example print shows the ticket's prompt, which is PLACEHOLDER_PROMPT (the env builds the
        # real one), beside a real reply: a misleading pair every step. 0 turns it off for training and eval
        # (skyrl 0.4.0 trainer.py and evaluate.py print only when the interval is > 0); our step line stays.
        "trainer.print_example_interval": 0,
        # eval (greedy, on the fixed set); the pipeline's baseline_eval stage covers step 0
        "trainer.eval_interval": config.eval_interval if config.eval_interval > 0 else -1,
        "trainer.eval_before_train": False,
        # tracking
        "trainer.logger": "mlflow",
        "trainer.project_name": config.mlflow.experiment,
        "trainer.run_name": config.run_id,
    }


def _ticket(config: TrainConfig, eval_set: EvalSet, data_source: str, maze_id: str, seed: int) -> dict[str, Any]:
    return {
        "prompt": PLACEHOLDER_PROMPT,
        "env_class": ENV_ID,
        "data_source": data_source,
        "maze_id": maze_id,
        "seed": int(seed),
        "size": eval_set.size,
        "cell_px": eval_set.cell_px,
        "action_format": config.action_format,
    }


def dataset_rows(config: TrainConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, eval rows). Train rows name a pool seed; eval rows carry the set's exact layout."""
    eval_set = load_eval_set(config.eval_set)
    train = [
        {
            **_ticket(config, eval_set, TRAIN_DATA_SOURCE, f"train/{seed}", seed),
            "format_bonus": config.grpo.format_bonus,
            "progress_reward": config.grpo.progress_reward,
            "bump_cost": config.grpo.bump_cost,
        }
        for seed, _ in training_pool(eval_set, config.train_pool_size)
    ]
    count = min(config.eval_mazes or len(eval_set), len(eval_set))
    evaluation = [
        {
            **_ticket(config, eval_set, eval_set.name, f"{eval_set.name}/{index}", eval_set.seeds[index]),
            "format_bonus": 0.0,  # eval reward is task success only
            "layout": eval_set.layouts[index].to_dict(),
        }
        for index in range(count)
    ]
    return train, evaluation


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)  # pyarrow writes to a path of its own: atomic.write_bytes would need the bytes in memory


def write_datasets(config: TrainConfig) -> SkyrlRunFiles:
    """Write both parquet files atomically; rewriting on resume gives identical rows (pure of config)."""
    files = run_files(config)
    train, evaluation = dataset_rows(config)
    _write_parquet(train, files.train_data)
    _write_parquet(evaluation, files.eval_data)
    return files


def save_overrides(overrides: Mapping[str, Any], path: Path) -> None:
    write_text(path, json.dumps(dict(overrides), indent=2, sort_keys=True))


def add_metric_aliases(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """SkyRL's metrics plus a copy under each of our names whose SkyRL source is present."""
    out = dict(metrics)
    for ours, theirs in METRIC_ALIASES.items():
        if theirs in metrics:
            out[ours] = metrics[theirs]
    return out
