"""Inference engines: token-level requests in, generated token ids out.

Engines take the contexts the episode runner rendered (token ids with image pads already
expanded, plus the frames) rather than chat messages, so the HF engine here and the vLLM
engine (``vllm_engine.py``) are handed identical inputs and the trainer can score exactly
what was generated.

The ``hf`` engine batches requests through ``transformers``' ``generate`` with left
padding, greedy or temperature/top-p sampling (no top-k, as vLLM's defaults), stopping at
the model's end-of-turn token; special tokens other than the stop tokens are suppressed. It does not reuse the KV cache across turns: the requests
of one call are different episodes with different left padding, and with
``history_images`` < all an old frame leaves the context, so the previous turn's cache is
not a prefix of the next context; within a turn ``generate`` caches as usual. vLLM's
automatic prefix caching gives cross-turn reuse where it is possible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from mazerl.policy.chat import end_of_turn_id, model_inputs, pad_id


@dataclass(frozen=True)
class GenerationRequest:
    """One context: token ids (chat template applied, image pads expanded) and its frames in order."""

    input_ids: list[int]
    images: list[np.ndarray] = field(default_factory=list)


@dataclass(frozen=True)
class GenerationSettings:
    """How replies are decoded. Eval is greedy; training samples with a seed (reproducible on CPU)."""

    greedy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 24
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1 (an action needs about 8 tokens)")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature} must be > 0; use greedy=True for argmax decoding")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must lie in (0, 1]; 1.0 disables nucleus sampling")

    def for_turn(self, turn: int) -> GenerationSettings:
        """The same settings with a seed derived from (seed, turn), so every turn samples differently."""
        if self.seed is None:
            return self
        derived = int(np.random.SeedSequence([self.seed, turn]).generate_state(1)[0])
        return GenerationSettings(self.greedy, self.temperature, self.top_p, self.max_new_tokens, derived)


@dataclass(frozen=True)
class GenerationResult:
    """Generated ids (end-of-turn token included when produced) and their text without special tokens.

    ``log_probs``: per reply token, log-softmax of the raw logits over the sampling temperature
    (what the trainer scores), where the engine reports them.
    """

    response_ids: list[int]
    text: str
    log_probs: list[float] | None = None


class InferenceEngine(Protocol):
    def generate(self, requests: list[GenerationRequest], settings: GenerationSettings) -> list[GenerationResult]: ...


def stop_ids(model: torch.nn.Module, processor: Any) -> set[int]:
    """The end-of-turn token and the model's configured end-of-sequence tokens."""
    return stop_ids_from(processor, getattr(getattr(model, "generation_config", None), "eos_token_id", None))


def stop_ids_from(processor: Any, configured_eos: int | list[int] | None) -> set[int]:
    """The end-of-turn token plus ``configured_eos`` (a generation config's ``eos_token_id``: one id, a list or None).

    The one home of the stop set, so the ``hf``, prefix and ``vllm`` engines stop on the same tokens.
    """
    ids = {end_of_turn_id(processor)}
    if configured_eos is not None:
        ids |= {int(configured_eos)} if isinstance(configured_eos, int) else {int(i) for i in configured_eos}
    return ids


def banned_token_ids(processor: Any, stop_ids: list[int]) -> list[int]:
    """Special tokens a reply must never contain: vision placeholders, turn openers (all but the stop tokens).

    An ``<|image_pad|>`` in a reply would enter the next context as an image without a frame.
    The one home of the set: the ``hf``, prefix and ``vllm`` engines all ban these.
    """
    special = {int(i) for i, token in processor.tokenizer.added_tokens_decoder.items() if token.special}
    return sorted(special - set(stop_ids))


class HFEngine:
    """``transformers`` generation, batched across requests (CPU or GPU).

    ``max_batch_size`` bounds the requests per ``generate`` call; larger calls are split
    into chunks in order, and chunk ``i`` samples with seed ``(seed, i)``.
    """

    def __init__(self, model: torch.nn.Module, processor: Any, max_batch_size: int = 64) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} must be >= 1")
        self.model = model
        self.processor = processor
        self.max_batch_size = max_batch_size
        self.device = next(model.parameters()).device
        self.eos_ids = sorted(stop_ids(model, processor))
        self.pad_id = pad_id(processor)
        self.banned_ids = banned_token_ids(processor, self.eos_ids)

    @staticmethod
    def from_policy(policy: Any, max_batch_size: int = 64) -> HFEngine:
        return HFEngine(policy.model, policy.processor, max_batch_size)

    def generate(self, requests: list[GenerationRequest], settings: GenerationSettings) -> list[GenerationResult]:
        results: list[GenerationResult] = []
        for chunk_index, start in enumerate(range(0, len(requests), self.max_batch_size)):
            chunk = requests[start : start + self.max_batch_size]
            results += self._generate_chunk(chunk, settings, chunk_index)
        return results

    @torch.no_grad()
    def _generate_chunk(
        self, requests: list[GenerationRequest], settings: GenerationSettings, chunk_index: int
    ) -> list[GenerationResult]:
        inputs = model_inputs(self.processor, [r.input_ids for r in requests], [r.images for r in requests])
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
        options: dict[str, Any] = {
            "max_new_tokens": settings.max_new_tokens,
            "eos_token_id": self.eos_ids,
            "pad_token_id": self.pad_id,
            "suppress_tokens": self.banned_ids or None,
        }
        if settings.greedy:
            options |= {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        else:
            options |= {"do_sample": True, "temperature": settings.temperature, "top_p": settings.top_p, "top_k": 0}
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            if settings.seed is not None:
                torch.manual_seed(int(np.random.SeedSequence([settings.seed, chunk_index]).generate_state(1)[0]))
            output = self.model.generate(**inputs, **options)
        generated = output[:, inputs["input_ids"].shape[1] :].tolist()  # (B, new tokens)
        return [self._result(row) for row in generated]

    def _result(self, row: list[int]) -> GenerationResult:
        for index, token in enumerate(row):
            if token in self.eos_ids:
                row = row[: index + 1]
                break
        text = self.processor.tokenizer.decode(row, skip_special_tokens=True)
        return GenerationResult(response_ids=row, text=text)
