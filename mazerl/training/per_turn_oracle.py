"""The per-turn scoring the packed scorer replaced: kept only as the oracle it is proved against.

Every turn of every episode is scored as its own sequence: its recorded context and reply,
left-padded so replies end in the last column and only their logits are computed. Simple
and obviously right, and several times the work of :mod:`mazerl.training.scoring` (each
context is computed once per sample and turn that shows it). Tests compare the two loss for
loss and gradient for gradient; ``bench/train_step.py`` times both side by side. Training
never uses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mazerl.policy.chat import model_inputs
from mazerl.training.scoring import Chunk, TurnSample, length_batches, reply_mask


def reply_log_probs(
    model: torch.nn.Module,
    processor: Any,
    samples: Sequence[TurnSample],
    device: torch.device,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of each sample's reply, (B, R) with mask (B, R), R = longest reply."""
    sequences = [s.input_ids + s.response_ids for s in samples]
    inputs = model_inputs(processor, sequences, [s.images for s in samples], padding_side="left")
    inputs = {k: v.to(device) if hasattr(v, "to") else v for k, v in inputs.items()}
    longest = max(len(s.response_ids) for s in samples)
    logits = model(**inputs, logits_to_keep=longest + 1).logits[:, :-1].float()  # (B, R, V)
    targets = inputs["input_ids"][:, -longest:]  # (B, R)
    log_probs = torch.log_softmax(logits / temperature, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return log_probs, reply_mask(samples, device)


class PerTurnScorer:
    """The same interface as :class:`mazerl.training.scoring.PackedScorer`, one sequence per turn."""

    def __init__(self, model: torch.nn.Module, processor: Any, device: torch.device, temperature: float) -> None:
        self.model, self.processor, self.device, self.temperature = model, processor, device, temperature
        self.stats = {"tokens_existing": 0, "tokens_computed": 0}

    def prepare(self, samples: Sequence[TurnSample]) -> list[Chunk]:
        return [
            Chunk(batch, [samples[i] for i in batch])
            for batch in length_batches({i: len(s.input_ids) + len(s.response_ids) for i, s in enumerate(samples)})
        ]

    def log_probs(self, chunk: Chunk) -> tuple[torch.Tensor, torch.Tensor]:
        batch = chunk.work
        log_probs, mask = reply_log_probs(self.model, self.processor, batch, self.device, self.temperature)
        tokens = sum(len(s.input_ids) + len(s.response_ids) for s in batch)
        self.stats["tokens_computed"] += tokens
        self.stats["tokens_existing"] += tokens
        return log_probs, mask
