"""Load a vision-language policy from a Hugging Face model directory, optionally with a LoRA adapter.

One loader for every model the pipeline meets: ``Qwen/Qwen3-VL-8B-Instruct``-style
directories and SFT checkpoints on GPU machines, and the self-built tiny starter here.
``AutoProcessor`` + ``AutoModelForImageTextToText`` with ``trust_remote_code=False``;
float32 on CPU, bfloat16 on GPU unless told otherwise.

Where torchvision is missing (this repository's CPU environment: it cannot be installed
beside torch 2.13), the stock Qwen3-VL processor cannot be built because its video
processor needs torchvision. The loader then builds the same processor class without a
video processor, over the directory's own tokenizer, image processor (PIL backend) and
chat template; images and text are processed exactly as the stock processor would.

Every problem with the inputs is a :class:`ModelLoadError` (a ``ValueError``) that names
the path, what is wrong and how to fix it, raised before any weights are read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
IMAGE_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
# The model types the policy runtime is written for (Qwen chat tokens, deepstack vision tower, 3-D rope).
QWEN3_VL_MODEL_TYPES = ("qwen3_vl", "qwen3_vl_moe")


class ModelLoadError(ValueError):
    """A model or adapter directory that cannot be loaded as a mazerl policy."""


@dataclass
class Policy:
    """A loaded policy: the model (eval mode), its processor, and where it lives."""

    model: torch.nn.Module
    processor: Any
    device: torch.device
    dtype: torch.dtype
    model_dir: Path
    adapter_dir: Path | None = None


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on GPUs (what Qwen3-VL is trained in), float32 on CPU (bf16 matmuls are slow there)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _require_dir(path: str | os.PathLike, what: str, fix: str) -> Path:
    path = Path(path).expanduser()
    if not path.is_dir():
        raise ModelLoadError(f"{what}={str(path)!r} is not a directory; {fix}")
    return path.resolve()


def check_model_files(model_dir: Path) -> None:
    """The files a Qwen3-VL directory needs (config, tokenizer, image processor, weights), checked by
    name before anything is loaded; each one missing is refused naming it and the fix."""
    if not (model_dir / "config.json").is_file():
        raise ModelLoadError(
            f"model_dir={str(model_dir)!r} has no config.json, so it is not a Hugging Face model directory; "
            "point at the directory that save_pretrained wrote"
        )
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(
            f"model_dir={str(model_dir)!r} has no tokenizer files ({' or '.join(TOKENIZER_FILES)}); "
            "copy the tokenizer of the base model into it (processor.save_pretrained writes them)"
        )
    if not any((model_dir / name).is_file() for name in IMAGE_PROCESSOR_FILES):
        raise ModelLoadError(
            f"model_dir={str(model_dir)!r} has no image processor config ({' or '.join(IMAGE_PROCESSOR_FILES)}); "
            "copy the processor of the base model into it (processor.save_pretrained writes it)"
        )


def check_image_text_to_text(model_dir: Path) -> Any:
    """The directory's config, if it describes an image-text-to-text model (else a ModelLoadError)."""
    # transformers takes seconds to import: the CLIs' preflight imports this module and may not need it
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    except (ValueError, OSError, KeyError) as exc:
        raise ModelLoadError(f"model_dir={str(model_dir)!r}: config.json cannot be read ({exc})") from exc
    if config.model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        raise ModelLoadError(
            f"model_dir={str(model_dir)!r} holds a {config.model_type!r} model, which is not an image-text-to-text "
            "model; mazerl needs a vision-language model such as Qwen3-VL"
        )
    if config.model_type not in QWEN3_VL_MODEL_TYPES:
        raise ModelLoadError(
            f"model_dir={str(model_dir)!r} holds a {config.model_type!r} model (config.json model_type), a "
            "vision-language model mazerl does not run: its prompts, vision cache and rope positions are Qwen3-VL's; "
            f"use a Qwen3-VL model (model_type {' or '.join(QWEN3_VL_MODEL_TYPES)})"
        )
    expected = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[config.model_type]
    named = [name for name in (getattr(config, "architectures", None) or []) if name != expected]
    if named:
        raise ModelLoadError(
            f"model_dir={str(model_dir)!r}: config.json names the architecture {named[0]!r}, but a "
            f"{config.model_type!r} model loads as {expected}; the config was edited or belongs to another model: "
            "copy the model's own config.json"
        )
    return config


def image_only_processor_class() -> type:
    """Qwen3VLProcessor without its video processor (which needs torchvision)."""
    from transformers import Qwen3VLProcessor  # heavy: imported when a processor is built

    class Qwen3VLImageOnlyProcessor(Qwen3VLProcessor):
        """The stock processor, minus video: the attribute list comes from this signature."""

        def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **kwargs):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return Qwen3VLImageOnlyProcessor


def _read_chat_template(model_dir: Path, tokenizer: Any) -> str | None:
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    legacy = model_dir / "chat_template.json"
    if legacy.is_file():
        return json.loads(legacy.read_text())["chat_template"]
    return getattr(tokenizer, "chat_template", None)


def load_processor(model_dir: str | os.PathLike) -> Any:
    """The directory's processor (stock where torchvision exists, image-only where it does not)."""
    from transformers import AutoProcessor, AutoTokenizer, Qwen2VLImageProcessorPil  # heavy: see above

    model_dir = _require_dir(model_dir, "model_dir", "pass a Hugging Face model directory")
    check_model_files(model_dir)
    try:
        processor = AutoProcessor.from_pretrained(model_dir, trust_remote_code=False)
    except ImportError as exc:
        if "torchvision" not in str(exc).lower():
            raise
        config = check_image_text_to_text(model_dir)
        if config.model_type != "qwen3_vl":
            raise ModelLoadError(
                f"model_dir={str(model_dir)!r}: the {config.model_type!r} processor needs torchvision, which is not "
                "installed; install torchvision matching your torch, or use a Qwen3-VL model"
            ) from exc
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
        # Qwen3-VL's PIL image processor, named directly: it is what AutoImageProcessor(backend="pil") picks
        # for qwen3_vl, and transformers <= 5.16 gates AutoImageProcessor itself behind torchvision.
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
        processor = image_only_processor_class()(
            image_processor, tokenizer, chat_template=_read_chat_template(model_dir, tokenizer)
        )
    if getattr(processor, "chat_template", None) is None:
        raise ModelLoadError(
            f"model_dir={str(model_dir)!r} has no chat template (chat_template.jinja); mazerl renders every "
            "conversation with the model's own template, so copy it from the base model"
        )
    return processor


def check_adapter_fits(model: torch.nn.Module, adapter_dir: Path) -> None:
    """Every LoRA matrix must attach to a module of the base with matching in/out features (else a ModelLoadError).

    Read from the adapter's safetensors header, so a mismatch is named (module, side, sizes)
    before PEFT attaches anything.
    """
    modules = dict(model.named_modules())
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), framework="pt") as handle:
        for key in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
            if ".lora_A." not in key and ".lora_B." not in key:
                continue
            path, kind = (key.split(".lora_A.")[0], "A") if ".lora_A." in key else (key.split(".lora_B.")[0], "B")
            path = path.removeprefix("base_model.model.")
            base = modules.get(path)
            shape = handle.get_slice(key).get_shape()
            if base is None:
                raise ModelLoadError(
                    f"adapter_dir={str(adapter_dir)!r} adapts module {path!r}, which the base model does not have; "
                    "the adapter was trained for a different base model: load it on that model"
                )
            expected = getattr(base, "in_features", None) if kind == "A" else getattr(base, "out_features", None)
            actual = shape[1] if kind == "A" else shape[0]
            if expected is not None and expected != actual:
                side = "input" if kind == "A" else "output"
                raise ModelLoadError(
                    f"adapter_dir={str(adapter_dir)!r} does not fit the base model: module {path!r} has {side} size "
                    f"{expected} but the adapter expects {actual}; the adapter was trained for a different base model"
                )


def check_adapter_dir(adapter_dir: str | os.PathLike) -> Path:
    """The adapter directory, resolved, once it holds both PEFT files (else a ModelLoadError)."""
    adapter_dir = _require_dir(adapter_dir, "adapter_dir", "pass the policy/lora_adapter directory of a checkpoint")
    missing = [name for name in ADAPTER_FILES if not (adapter_dir / name).is_file()]
    if missing:
        raise ModelLoadError(
            f"adapter_dir={str(adapter_dir)!r} lacks {', '.join(missing)}; a PEFT adapter directory holds "
            f"{' and '.join(ADAPTER_FILES)}"
        )
    return adapter_dir


def read_adapter_config(adapter_dir: str | os.PathLike) -> dict[str, Any]:
    """The adapter's config, checked for what loading, resuming and merging a LoRA adapter need.

    Read before any model loads (PEFT's own error would come after the load, and be obscure);
    a ModelLoadError names the file and the field.
    """
    path = check_adapter_dir(adapter_dir) / "adapter_config.json"
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(
            f"{path} is not valid JSON ({exc}); the adapter is corrupt: use another checkpoint"
        ) from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} holds {type(config).__name__}, not a JSON object; the adapter is corrupt")
    problems = []
    if config.get("peft_type") != "LORA":
        problems.append(f"peft_type is {config.get('peft_type')!r}, not 'LORA'")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        problems.append(f"r is {rank!r}, not a positive integer")
    if not config.get("target_modules"):
        problems.append("target_modules is empty")
    if problems:
        raise ModelLoadError(f"{path} is not a usable LoRA config: {'; '.join(problems)}")
    return config


def load_policy(
    model_dir: str | os.PathLike,
    adapter_dir: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    merge_adapter: bool = False,
    attn_implementation: str | None = None,
) -> Policy:
    """Load model + processor (+ adapter) for inference; the model is returned in eval mode.

    ``merge_adapter`` folds the LoRA weights into the base (faster generation, no PEFT
    wrapper); leave it off to keep the adapter separable.
    """
    from transformers import AutoModelForImageTextToText  # heavy: see check_image_text_to_text

    model_dir = _require_dir(
        model_dir, "model_dir", "build the starter with `mazerl build-starter` or pass a Hugging Face model directory"
    )
    check_model_files(model_dir)
    check_image_text_to_text(model_dir)
    adapter = check_adapter_dir(adapter_dir) if adapter_dir is not None else None
    device = torch.device(device) if device is not None else default_device()
    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ModelLoadError(f"dtype={dtype!r} is not a torch dtype; use e.g. 'float32' or 'bfloat16'")
        dtype = getattr(torch, dtype)
    dtype = dtype or default_dtype(device)
    processor = load_processor(model_dir)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype, trust_remote_code=False, **kwargs)
    if adapter is not None:
        from peft import PeftModel  # heavy, and only for an adapter

        check_adapter_fits(model, adapter)
        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=False)
        if merge_adapter:
            model = model.merge_and_unload()
    model = model.to(device).eval()
    return Policy(
        model=model, processor=processor, device=device, dtype=dtype, model_dir=model_dir, adapter_dir=adapter
    )
