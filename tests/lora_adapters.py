"""Real PEFT LoRA adapters on a base model, saved as the trainer saves them (tests/test_merge.py, the vllm tests)."""

from __future__ import annotations

from pathlib import Path

import torch

from mazerl.policy.loader import load_policy

# The trainer's pattern for the text decoder (mazerl.training.lora_adapter), three module kinds.
LANGUAGE_TARGETS = r".*language_model.*\.(q_proj|v_proj|down_proj)"


def make_adapter(base_dir: Path, out: Path, scale: float = 0.05, targets: str = LANGUAGE_TARGETS) -> Path:
    """A peft LoRA adapter on the base with random lora_B (zero when scale is 0: PEFT's own start, which changes
    nothing), saved like the trainer saves it."""
    from peft import LoraConfig, get_peft_model

    policy = load_policy(base_dir, device="cpu")
    with torch.random.fork_rng():  # PEFT draws lora_A from torch's global generator: the same adapter every run
        torch.manual_seed(7)
        model = get_peft_model(policy.model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    generator = torch.Generator().manual_seed(7)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            parameter.data = torch.randn(parameter.shape, generator=generator) * scale
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def vision_tower_targets(base_dir: Path) -> str:
    """Where the trainer puts its adapters with ``freeze_vision: false``: the text decoder and the vision tower."""
    from mazerl.training.config import TrainConfig
    from mazerl.training.lora_adapter import lora_pattern

    return lora_pattern(TrainConfig(run_id="tower", base_model=base_dir, freeze_vision=False))
