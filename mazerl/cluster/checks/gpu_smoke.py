"""The GPU stack, tried on every GPU worker before the spend: ``verify_cluster``'s ``gpu.*`` rows.

The image's wheels are not known to carry kernels for the cluster's GPUs (ml.g7e is Blackwell,
sm_120), and no upstream recipe runs LoRA on a VLM through SkyRL, so a wrong wheel would show only
after the GPUs were taken. ``verify_cluster``'s probe job runs :func:`run_checks` once on each
ALIVE GPU worker (a Ray task pinned to the node, asking for one GPU) and turns each check into a
row across the workers (:func:`gpu_rows`); each failed row has its fix in
:data:`~mazerl.cluster.checks.fixes.CLUSTER_FIXES`.

The checks, each only where the run needs it (:func:`smoke_for`):

- ``gpu.compute_capability``: the device's compute capability (``sm_120``) against the
  architectures the image's torch was built for (``torch.cuda.get_arch_list()``);
- ``gpu.flash_attn``: one ``flash_attn_func`` call, compared with torch's attention (SkyRL's FSDP
  workers use flash-attn);
- ``gpu.vllm_generate``: the base model loaded by vLLM and one token generated from a maze's first turn with
  its frame (:func:`smoke_prompt`: the ``vllm`` engine's own multi-modal request), so the vision tower and
  vLLM's image processing run too, as in every eval and rollout;
- ``gpu.lora_adapter``: one token from that request through a LoRA adapter of the run's rank and target
  modules (all zeros, so it changes nothing), as SkyRL hands vLLM its adapter every step.

A check that fails reports the first line of its error (``no kernel image is available for
execution on the device`` for a wheel without the architecture). vLLM and flash-attn are imported
only here, on the GPU worker. ``checks_module`` lets the rehearsal (no GPU, no vLLM) put stand-ins
in the place of this module's :func:`run_checks`; nothing else does.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envs.maze import MazeEnv
from mazerl.cluster.checks.report import CheckRow

CHECKS = ("compute_capability", "flash_attn", "vllm_generate", "lora_adapter")
TIMEOUT_S = 900.0  # vLLM loads an 8B model from the shared mount on every GPU worker at once
GPU_FREE_WAIT_S = 60.0  # a worker whose GPUs another job holds is reported as not checked after this


@dataclass(frozen=True)
class GpuSmoke:
    """What the GPU smoke row tries on each GPU worker (plain values: it travels in the probe's request)."""

    checks: tuple[str, ...]
    base_model: str | None = None  # for vLLM; as the cluster's nodes see it
    lora_rank: int = 32
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    checks_module: str = "mazerl.cluster.checks.gpu_smoke"
    options: dict[str, Any] = field(default_factory=dict)  # for the checks module (stand-ins read theirs)
    timeout_s: float = TIMEOUT_S

    def __post_init__(self) -> None:
        unknown = sorted(set(self.checks) - set(CHECKS))
        if unknown:
            raise ValueError(f"unknown GPU checks {unknown}; choose from {CHECKS}")

    def request(self) -> dict[str, Any]:
        return asdict(self) | {"checks": list(self.checks), "lora_targets": list(self.lora_targets)}


def smoke_for(
    *,
    backend: str,
    local_gpus: int,
    eval_engine: str,
    eval_gpus: float,
    base_model: str | None,
    lora_rank: int,
    lora_targets: tuple[str, ...],
) -> GpuSmoke | None:
    """The checks a run needs on its GPU workers: SkyRL all four; the vLLM eval the device and a generate;
    torch on a GPU (the local backend, the hf engine) the device only. None: the run uses no GPU."""
    checks: list[str] = []
    if backend == "skyrl" or local_gpus or eval_gpus:
        checks.append("compute_capability")
    if backend == "skyrl":
        checks += ["flash_attn", "vllm_generate", "lora_adapter"]
    elif eval_engine == "vllm":
        checks.append("vllm_generate")
    if not checks:
        return None
    return GpuSmoke(tuple(checks), base_model=base_model, lora_rank=lora_rank, lora_targets=tuple(lora_targets))


GPU_EXPECTED = {
    "compute_capability": "the GPU's architecture is one the image's torch was built for",
    "flash_attn": "one flash_attn_func call matches torch's attention",
    "vllm_generate": "vLLM loads the base model and generates a token from a maze frame and its prompt",
    "lora_adapter": "vLLM generates from the maze frame through a LoRA adapter of the run's rank and target modules",
}


def gpu_rows(probe: dict, smoke: GpuSmoke) -> list[CheckRow]:
    """``verify_cluster``'s ``gpu.*`` rows: one per check, across the GPU workers (each ran a smoke actor)."""
    workers = probe.get("gpu_smoke") or []
    rows = []
    for check in smoke.checks:
        expected = f"on each GPU worker: {GPU_EXPECTED[check]}"
        if not workers:
            rows.append(CheckRow(f"gpu.{check}", expected, "no GPU worker to try it on", False))
            continue
        failed, passed, unchecked = [], [], []
        for worker in workers:
            if not worker["checked"]:
                unchecked.append(f"{worker['node']}: not checked, its GPUs stay taken by another job")
                continue
            result = (worker.get("checks") or {}).get(check)
            if result is None:
                failed.append(f"{worker['node']}: {worker.get('error') or 'the check did not run'}")
            else:
                (passed if result["ok"] else failed).append(
                    f"{worker['node']} GPU {','.join(worker.get('gpu_ids', []))}: {result['found']}"
                )
        found = "; ".join(failed + passed + unchecked)
        if failed:
            rows.append(CheckRow(f"gpu.{check}", expected, f"{len(failed)} of {len(workers)} failed: {found}", False))
        elif not passed:
            rows.append(CheckRow(f"gpu.{check}", expected, found, False, advisory=True))
        else:
            rows.append(
                CheckRow(f"gpu.{check}", expected, f"{len(passed)}/{len(workers)} GPU workers ok: {found}", True)
            )
    return rows


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def run_checks(request: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """On a GPU worker: ``{check: {"ok": bool, "found": str}}`` for every check the request names."""
    import torch

    checks = list(request["checks"])
    if not torch.cuda.is_available():
        visible = "no CUDA device visible to torch (torch.cuda.is_available() is False)"
        return {name: {"ok": False, "found": visible} for name in checks}
    results: dict[str, dict[str, Any]] = {}
    major, minor = torch.cuda.get_device_capability(0)
    device = f"{torch.cuda.get_device_name(0)} sm_{major}{minor}"
    if "compute_capability" in checks:
        archs = torch.cuda.get_arch_list()
        native = f"sm_{major}{minor}" in archs
        # PTX of an older architecture of the same major version is compiled for this one at load time
        ptx = [a for a in archs if a.startswith("compute_") and int(a.split("_")[1]) // 10 == major]
        results["compute_capability"] = {
            "ok": native or bool(ptx),
            "found": f"{device}; torch {torch.__version__} built for {' '.join(archs)}",
        }
    if "flash_attn" in checks:
        results["flash_attn"] = _try(lambda: _flash_attn_call(torch), device)
    if "vllm_generate" in checks or "lora_adapter" in checks:
        results.update(vllm_checks(request, checks, device))
    return results


def _try(check, device: str) -> dict[str, Any]:
    started = time.monotonic()
    try:
        detail = check()
    except Exception as exc:  # noqa: BLE001 - a failed check is a finding, not a crash
        return {"ok": False, "found": f"{device}: {_first_line(exc)}"}
    return {"ok": True, "found": f"{device}: {detail} ({time.monotonic() - started:.1f} s)"}


def _flash_attn_call(torch) -> str:
    from flash_attn import flash_attn_func  # only in the GPU image

    q, k, v = (torch.randn(1, 64, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    reference = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    error = float((out - reference).abs().max())
    if error > 5e-2:
        raise RuntimeError(f"flash_attn_func differs from torch's attention by {error:.3g}")
    return f"flash_attn_func ok (max diff {error:.1e} to torch's attention)"


def zero_adapter(base_model: str, rank: int, targets: list[str], out_dir: Path) -> Path:
    """A PEFT adapter of ``rank`` on ``targets`` for ``base_model`` whose matrices are all zero (it changes
    nothing): the model is built on the meta device for the module names and shapes, no weight is loaded."""
    import torch
    from accelerate import init_empty_weights
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForImageTextToText

    with init_empty_weights():
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(base_model))
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets))
    state = get_peft_model_state_dict(peft_model)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: torch.zeros(v.shape, dtype=torch.bfloat16) for k, v in state.items()}, out_dir / "adapter_model.safetensors"
    )
    peft_model.peft_config["default"].save_pretrained(str(out_dir))
    return out_dir


def smoke_prompt(base_model: str) -> dict[str, Any]:
    """A maze's first turn (the task prompt and one frame, in the model's chat template) as the ``vllm`` engine
    sends it: ``vllm_prompt``'s token prompt with the frame as multi-modal data."""
    # lazy: the policy runtime imports torch and transformers (seconds); only the GPU worker builds the prompt
    from mazerl.policy.chat import Conversation, image_token_id, render
    from mazerl.policy.engines import GenerationRequest
    from mazerl.policy.loader import load_processor
    from mazerl.policy.vllm_engine import vllm_prompt

    env = MazeEnv(size=7, cell_px=16)
    frame, _ = env.reset(seed=0)
    processor = load_processor(base_model)
    input_ids, images = render(processor, Conversation.start(env.prompt(), frame))
    return vllm_prompt(GenerationRequest(input_ids, images), image_token_id(processor))


def vllm_checks(request: Mapping[str, Any], checks: list[str], device: str) -> dict[str, dict[str, Any]]:
    """The ``vllm_generate`` and ``lora_adapter`` checks (those ``checks`` names) on whatever device vLLM runs on."""
    results: dict[str, dict[str, Any]] = {}
    base = request.get("base_model")
    if not base:
        return {
            name: {"ok": False, "found": "no base_model given to load"}
            for name in ("vllm_generate", "lora_adapter")
            if name in checks
        }
    with_lora = "lora_adapter" in checks
    # lazy: the policy runtime imports torch (seconds); only the GPU worker runs vLLM
    from mazerl.policy.vllm_engine import shutdown_llm

    try:
        from vllm import LLM, SamplingParams  # only in the GPU image
        from vllm.lora.request import LoRARequest

        started = time.monotonic()
        kwargs: dict[str, Any] = {
            "model": base,
            "dtype": "bfloat16",
            "max_model_len": 2048,
            "gpu_memory_utilization": 0.5,
            "enforce_eager": True,  # no CUDA-graph capture: seconds, not minutes
            "limit_mm_per_prompt": {"image": 1},
        }
        if with_lora:
            kwargs |= {"enable_lora": True, "max_loras": 1, "max_lora_rank": int(request["lora_rank"])}
        prompt = smoke_prompt(base)
        llm = LLM(**kwargs)
        one = SamplingParams(max_tokens=1, temperature=0.0)
        (out,) = llm.generate([prompt], one)
        tokens = list(out.outputs[0].token_ids) if out.outputs else []
        results["vllm_generate"] = {
            "ok": bool(tokens),
            "found": f"{device}: one token {tokens} after a maze frame and "
            f"{len(prompt['prompt_token_ids'])} prompt tokens in {time.monotonic() - started:.1f} s",
        }
    except Exception as exc:  # noqa: BLE001 - a failed load is the finding
        found = {"ok": False, "found": f"{device}: {_first_line(exc)}"}
        return {name: found for name in ("vllm_generate", "lora_adapter") if name in checks}
    if with_lora:

        def through_adapter() -> str:
            with tempfile.TemporaryDirectory(prefix="mazerl-smoke-lora-") as scratch:
                adapter = zero_adapter(base, int(request["lora_rank"]), list(request["lora_targets"]), Path(scratch))
                lora = LoRARequest(lora_name="smoke", lora_int_id=1, lora_path=str(adapter))
                (through,) = llm.generate([prompt], one, lora_request=lora)
            return f"rank {request['lora_rank']} adapter on {', '.join(request['lora_targets'])}: {list(through.outputs[0].token_ids)}"

        results["lora_adapter"] = _try(through_adapter, device)
    shutdown_llm(llm)  # the GPU is free again at once, not when the actor ends
    return results
