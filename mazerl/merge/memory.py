"""How much memory a LoRA merge needs, and whether the machine it runs on has it.

The merge (:mod:`mazerl.merge.lora`) holds one copy of the base model in the checkpoint's own
dtype, merges the adapter into it in place, and writes it out in shards of at most
:data:`SAVE_SHARD_BYTES` (safetensors serialises a shard in memory before writing it). So::

    need = weights + min(weights, SAVE_SHARD_BYTES) + OVERHEAD_BYTES

``OVERHEAD_BYTES`` covers torch and transformers themselves, the probe batch's logits (a few
hundred tokens x the vocabulary, kept for four comparisons) and the per-module LoRA deltas of the
proof. For Qwen3-VL-8B in bfloat16 (16.3 GiB of weights) that is about 23 GiB: far beyond a 2 CPU /
8 GiB flow-run pod, well within the HyperPod head (420 GiB) or a GPU worker (440 GiB). The
pipeline therefore runs the merge as a Ray job that asks Ray for this much memory
(``entrypoint_memory``), and the job checks it again on its node before loading anything.

"Available" is what the OS could hand this process now: ``MemAvailable``, capped by the
container's cgroup limit minus what the container already uses (a Kubernetes pod sees the node's
whole RAM in ``/proc/meminfo`` but is killed at its cgroup limit).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil  # a Ray dependency

GIB = 1024**3
SAVE_SHARD_BYTES = 5 * GIB  # the merged model is saved in shards of at most this size ("5GB" releases)
SAVE_SHARD = "5GB"  # the same, as save_pretrained's max_shard_size
OVERHEAD_BYTES = 2 * GIB
# Torch threads the merge job asks Ray for at most (its CPU forward passes, the reload, the MLflow save):
# docs/performance.md ("LoRA merge: threads") has the measured scaling and the extrapolation to 8B.
MAX_MERGE_CPUS = 16
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


class MergeMemoryError(RuntimeError):
    """This machine lacks the memory the merge needs (raised before the model is loaded)."""


@dataclass(frozen=True)
class MemoryNeed:
    weights_bytes: int
    save_buffer_bytes: int
    overhead_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.save_buffer_bytes + self.overhead_bytes

    def describe(self) -> str:
        return (
            f"about {self.total_bytes / GIB:.1f} GiB ({self.weights_bytes / GIB:.1f} GiB of weights, up to "
            f"{self.save_buffer_bytes / GIB:.1f} GiB of save buffers, {self.overhead_bytes / GIB:.1f} GiB for "
            "torch, transformers and the proofs)"
        )


def weights_bytes(model_dir: str | os.PathLike) -> int:
    """Bytes of the weight files of a Hugging Face model directory (the model's size in its dtype)."""
    root = Path(model_dir)
    files = {path for pattern in WEIGHT_PATTERNS for path in root.glob(pattern)}
    return sum(path.stat().st_size for path in files)


def merge_memory(weights: int) -> MemoryNeed:
    """The merge's memory for a model of ``weights`` bytes (stored dtype = merge dtype)."""
    return MemoryNeed(weights, min(weights, SAVE_SHARD_BYTES), OVERHEAD_BYTES)


def merge_cpus(need: MemoryNeed, nodes: list[dict]) -> int:
    """CPUs the merge job asks Ray for (``entrypoint_num_cpus``), and so its torch threads: as many as the
    largest ALIVE node that has the merge's memory offers, at most :data:`MAX_MERGE_CPUS`; 1 when no
    node is known (the job then runs as before, on one thread).

    ``nodes``: Ray's state API node records (``state``, ``resources_total``), e.g.
    :func:`mazerl.cluster.client.cluster_nodes`. A Ray job driver gets ``OMP_NUM_THREADS=1`` unless it
    asks for CPUs, which left the merge of an 8B model on one core of a 64-core head.
    """
    roomy = [
        float((node.get("resources_total") or {}).get("CPU", 0))
        for node in nodes
        if node.get("state") == "ALIVE"
        and float((node.get("resources_total") or {}).get("memory", 0)) >= need.total_bytes
    ]
    return max(1, min(MAX_MERGE_CPUS, int(max(roomy, default=1))))


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by the container's cgroup CPU quota."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            count = min(count, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, count)


def available_memory() -> tuple[int, str]:
    """(bytes this process can still get, where the limit comes from)."""
    host = psutil.virtual_memory().available
    cgroup = _cgroup_room()
    if cgroup is not None and cgroup[0] < host:
        return cgroup
    return host, "MemAvailable of this machine"


def check_merge_memory(need: MemoryNeed, available: tuple[int, str] | None = None, where: str = "") -> None:
    """Refuse, with the numbers, a merge that would not fit; before any weight is loaded."""
    room, source = available if available is not None else available_memory()
    if room < need.total_bytes:
        host = where or os.uname().nodename
        raise MergeMemoryError(
            f"merge_lora needs {need.describe()} but {host} has {room / GIB:.1f} GiB available ({source}); "
            "run the merge where the memory is: the pipeline submits it as a Ray job asking for that much "
            "memory (the Ray head or a GPU worker on HyperPod), or free memory on this machine"
        )


def _cgroup_room() -> tuple[int, str] | None:
    """Limit minus non-reclaimable usage of this container's memory cgroup (v2, else v1)."""
    for limit_file, usage_file, stat_file, inactive_key in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat", "inactive_file"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
            "/sys/fs/cgroup/memory/memory.stat",
            "total_inactive_file",
        ),
    ):
        try:
            limit_text = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or int(limit_text) >= 2**60:  # v1 writes a huge number for "no limit"
            return None
        inactive = 0
        try:
            for line in Path(stat_file).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == inactive_key:
                    inactive = int(value)
        except (OSError, ValueError):
            pass
        limit = int(limit_text)
        used = max(0, usage - inactive)
        return max(0, limit - used), f"cgroup limit {limit / GIB:.1f} GiB, {used / GIB:.1f} GiB in use"
    return None
