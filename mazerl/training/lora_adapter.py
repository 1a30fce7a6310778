"""Where the local engine's LoRA adapters go, and the base model wrapped with one (fresh or saved).

The adapters sit on the text decoder's ``lora.target_modules`` only, never the vision tower,
unless ``freeze_vision: false`` puts them on the tower too (:func:`lora_pattern`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from mazerl.training.config import TrainConfig, TrainingConfigError


def language_model_lora_pattern(target_modules: tuple[str, ...]) -> str:
    """peft regex that puts adapters on the text decoder only, never the vision tower; ``lm_head``
    among the names adapts the output head as well (it sits beside the decoder, not inside it)."""
    names = "|".join(name for name in target_modules if name != OUTPUT_HEAD)
    pattern = rf".*language_model.*\.({names})"
    return f"({pattern})|{OUTPUT_HEAD}" if OUTPUT_HEAD in target_modules else pattern


OUTPUT_HEAD = "lm_head"


# The vision tower's linear layers (Qwen3-VL): each block's attention and MLP, the merger that
# turns patches into image tokens, and the deepstack mergers that feed early text layers.
VISION_LORA_PATTERN = (
    r".*visual\.(blocks\.\d+\.(attn\.(qkv|proj)|mlp\.linear_fc[12])"
    r"|merger\.linear_fc[12]|deepstack_merger_list\.\d+\.linear_fc[12])"
)


def lora_pattern(config: TrainConfig) -> str:
    """Where the adapters go: the language model's ``lora.target_modules``, and with ``freeze_vision: false``
    the vision tower too (so the tower can learn to put what the policy must read, the walls around
    the agent, into the agent's own image token)."""
    text = language_model_lora_pattern(config.lora.target_modules)
    return text if config.freeze_vision else f"({text})|({VISION_LORA_PATTERN})"


def attach_lora(model: torch.nn.Module, config: TrainConfig, adapter_dir: Path | None = None) -> torch.nn.Module:
    """Wrap the base model with a fresh or saved LoRA adapter (trainable) where :func:`lora_pattern` puts it."""
    from peft import LoraConfig, PeftModel, get_peft_model  # heavy: imported when a run builds its model

    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
    else:
        lora = LoraConfig(
            r=config.lora.rank,
            lora_alpha=config.lora.alpha,
            lora_dropout=config.lora.dropout,
            target_modules=lora_pattern(config),
            bias="none",
        )
        model = get_peft_model(model, lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trainable == 0:
        raise TrainingConfigError(
            f"lora.target_modules {list(config.lora.target_modules)} matched no layer of the language model; "
            "use names such as q_proj, v_proj, gate_proj"
        )
    return model
