"""What a training run needs of a cluster: its placement (nodes, GPUs per node) and the disk it writes.

``verify_cluster`` checks the cluster against these before any GPU hour is spent:
:func:`requirements_for` turns a :class:`~mazerl.training.config.TrainConfig` into its keyword
arguments, and :class:`DiskFootprint` is the run's peak footprint under the data root
(``storage.free_space``), from its backend's real layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1024**3
# Where a model's config names no dimensions (no LoRA size can be computed), a checkpoint's adapter
# and optimizer state are taken as this share of the weights (rank 32 on all seven projections of
# Qwen3-VL-8B: 87 M parameters, 1.0 GB in fp32 with AdamW's two moments, 6% of its 16.3 GiB).
ADAPTER_STATE_SHARE = 0.06
# Bytes per LoRA parameter in a checkpoint: the adapter in fp32 and AdamW's two fp32 moments.
ADAPTER_STATE_BYTES = 4 + 8
# SkyRL 0.4.0 builds the policy in fp32 (bf16=cfg.policy.inference_only_init, False when training)
# and FSDP2 keeps fp32 shards, so its checkpoint holds every weight in 4 bytes, twice a bf16 model's files.
FSDP_STATE_BYTES_PER_PARAM = 4
# The shared file system's write and read rate the estimates assume: FSx for Lustre as docs/hyperpod.md
# sets it up (1.2 TiB, PERSISTENT_2 at 125 MB/s per TiB of storage: about 150 MB/s for the whole file system).
STORAGE_MB_PER_S = 150
# SkyRL's own wait for its vLLM servers to answer (skyrl.env_vars, 0.4.0)
SKYRL_HEALTH_TIMEOUT_DEFAULT_S = 600
# The linear layers of a Qwen3-VL language-model block, as (in, out) in its config's dimensions.
LORA_SHAPES = {
    "q_proj": ("hidden", "q"),
    "k_proj": ("hidden", "kv"),
    "v_proj": ("hidden", "kv"),
    "o_proj": ("q", "hidden"),
    "gate_proj": ("hidden", "intermediate"),
    "up_proj": ("hidden", "intermediate"),
    "down_proj": ("intermediate", "hidden"),
}


@dataclass(frozen=True)
class DiskFootprint:
    """What a run writes under the data root, from its backend's real layout (``storage.free_space``).

    - checkpoints: ``checkpoints_kept + 1`` at the peak (the newest is complete before the oldest is
      pruned). SkyRL's FSDP checkpoint holds the whole sharded model state on every rank, in fp32,
      so one checkpoint is the weights at 4 bytes each (about 35 GB for the 8B model, whose files
      are bf16) plus the adapter with its optimizer state and the exported adapter; the local
      backend's holds the adapter, its optimizer state and RNG state only.
    - the merged model: one copy of the weights;
    - the MLflow copy: the MLflow model beside it holds the weights up to ``max_artifact_mb`` (a
      pointer above), and an embedded MLflow store under the data root copies them once more.
    """

    backend: str
    checkpoints: int
    lora_rank: int
    lora_targets: tuple[str, ...]
    mlflow_copy_max_bytes: int
    mlflow_store_in_data_root: bool = False
    stored_bytes_per_param: int = 2  # the base model's files (bf16); the probe reads it from config.json

    def adapter_state_bytes(self, weights: int, dims: dict[str, int] | None) -> int:
        parameters = lora_parameters(dims or {}, self.lora_rank, self.lora_targets)
        return parameters * ADAPTER_STATE_BYTES if parameters else int(weights * ADAPTER_STATE_SHARE)

    def checkpoint_bytes(self, weights: int, dims: dict[str, int] | None) -> int:
        state = self.adapter_state_bytes(weights, dims)
        if self.backend == "skyrl":  # the fp32 FSDP model state (every weight), its optimizer's, the exported adapter
            return weights * FSDP_STATE_BYTES_PER_PARAM // self.stored_bytes_per_param + state + state // 3
        return state

    def write_minutes(self, weights: int, dims: dict[str, int] | None) -> float:
        """Minutes one checkpoint takes to write at :data:`STORAGE_MB_PER_S`."""
        return self.checkpoint_bytes(weights, dims) / (STORAGE_MB_PER_S * 1e6) / 60

    def parts(self, weights: int, dims: dict[str, int] | None) -> list[tuple[str, int]]:
        """(what, bytes) of the peak footprint, in the order the run writes them."""
        checkpoint = self.checkpoint_bytes(weights, dims)
        copies = (1 + int(self.mlflow_store_in_data_root)) if weights <= self.mlflow_copy_max_bytes else 0
        kind = "SkyRL FSDP state: the whole model in fp32" if self.backend == "skyrl" else "adapter + optimizer"
        minutes = self.write_minutes(weights, dims)
        written = f", about {minutes:.0f} min each at {STORAGE_MB_PER_S} MB/s" if minutes >= 1 else ""
        return [
            (
                f"{self.checkpoints} checkpoints x {checkpoint / GIB:.2f} GiB ({kind}{written})",
                self.checkpoints * checkpoint,
            ),
            (f"merged model {weights / GIB:.2f} GiB", weights),
            (
                f"MLflow copy {copies} x {weights / GIB:.2f} GiB"
                if copies
                else f"MLflow copy 0 (above max_artifact_mb {self.mlflow_copy_max_bytes / 2**20:g}: a pointer)",
                copies * weights,
            ),
        ]


def lora_parameters(dims: dict[str, int], rank: int, targets: tuple[str, ...]) -> int:
    """LoRA parameters of ``targets`` over every language-model block: rank x (in + out) per module.
    0 when the config lacks a dimension (the caller estimates instead)."""
    try:
        heads, kv_heads = dims["num_attention_heads"], dims["num_key_value_heads"]
        head_dim = dims.get("head_dim") or dims["hidden_size"] // heads
        size = {
            "hidden": dims["hidden_size"],
            "intermediate": dims["intermediate_size"],
            "q": heads * head_dim,
            "kv": kv_heads * head_dim,
        }
        layers = dims["num_hidden_layers"]
    except (KeyError, TypeError, ZeroDivisionError):
        return 0
    per_block = sum(rank * (size[LORA_SHAPES[t][0]] + size[LORA_SHAPES[t][1]]) for t in targets if t in LORA_SHAPES)
    return per_block * layers


def inference_start_timeout_s(weights_bytes: int, nodes: int) -> int:
    """How long SkyRL waits for its vLLM servers (``SKYRL_WAIT_UNTIL_INFERENCE_SERVER_HEALTHY_TIMEOUT_S``).

    It starts every server at once, and each node reads the weights from the shared file system:
    ``nodes x weights`` at :data:`STORAGE_MB_PER_S`, twice over for slack, plus five minutes for the
    engines themselves (CUDA graphs, the KV cache). A timeout fails every retry the same way, so the
    wait is never below SkyRL's own default (600 s), which an 8B model on a small FSx can outlast.
    """
    read_s = nodes * weights_bytes / (STORAGE_MB_PER_S * 1e6)
    return max(SKYRL_HEALTH_TIMEOUT_DEFAULT_S, int(2 * read_s) + 300)


def requirements_for(
    config, local_gpus: int = 0, max_artifact_mb: float = 512.0, mlflow_store_in_data_root: bool = False
) -> dict[str, Any]:
    """The placement and disk a :class:`~mazerl.training.config.TrainConfig` needs, as ``verify_cluster`` kwargs.

    local: one node, with ``local_gpus`` GPUs (the pipeline's ``local_train_gpus``). skyrl:
    ``num_nodes`` nodes with ``num_gpus`` GPUs each (FSDP workers and colocated vLLM engines,
    ``engines x tensor_parallel_size`` GPUs in all). ``footprint``: :class:`DiskFootprint`.
    """
    footprint = DiskFootprint(
        backend=config.backend,
        checkpoints=config.checkpoints_kept + 1,
        lora_rank=config.lora.rank,
        lora_targets=tuple(config.lora.target_modules),
        mlflow_copy_max_bytes=int(max_artifact_mb * 2**20),
        mlflow_store_in_data_root=mlflow_store_in_data_root,
    )
    if config.backend == "skyrl":
        return {
            "required_nodes": config.skyrl.num_nodes,
            "required_gpus": config.skyrl.num_gpus * config.skyrl.num_nodes,
            "gpus_per_node": config.skyrl.num_gpus,
            "footprint": footprint,
        }
    return {"required_nodes": 1, "required_gpus": local_gpus, "gpus_per_node": local_gpus, "footprint": footprint}
