"""Stand-ins for CUDA and vLLM in the GPU smoke row (``GpuSmoke(checks_module="tests.gpu_smoke_standins")``).

The rehearsal cluster declares GPUs that do not exist, so the real checks
(:func:`mazerl.cluster.checks.gpu_smoke.run_checks`) would find no CUDA device. This module answers
in their place, on the GPU worker Ray placed it on, as an ml.g7e GPU (Blackwell, sm_120) would
with the image's wheels: every check passes, except those named in ``options["fail"]``, which
fail with the error a wheel without the architecture (or vLLM refusing the adapter) gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEVICE = "NVIDIA RTX PRO 6000 Blackwell Server Edition sm_120"
NO_KERNEL = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
FAILURES = {
    "compute_capability": f"{DEVICE}; torch 2.13.0+cu126 built for sm_80 sm_86 sm_90",
    "flash_attn": f"{DEVICE}: {NO_KERNEL}",
    "vllm_generate": f"{DEVICE}: {NO_KERNEL}",
    "lora_adapter": f"{DEVICE}: ValueError: LoRA rank 4 is not in vLLM's max_lora_rank choices",
}
PASSES = {
    "compute_capability": f"{DEVICE}; torch 2.13.0+cu130 built for sm_80 sm_90 sm_100 sm_120",
    "flash_attn": f"{DEVICE}: flash_attn_func ok (stand-in)",
    "vllm_generate": f"{DEVICE}: one token [42] (stand-in)",
    "lora_adapter": f"{DEVICE}: adapter token [42] (stand-in)",
}


def run_checks(request: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    import ray

    if not ray.get_gpu_ids():  # the row must run where Ray gave a GPU
        return {name: {"ok": False, "found": "no GPU assigned by Ray"} for name in request["checks"]}
    fail = set(request.get("options", {}).get("fail", ()))
    return {
        name: {"ok": name not in fail, "found": FAILURES[name] if name in fail else PASSES[name]}
        for name in request["checks"]
    }
