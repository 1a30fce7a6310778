"""The ``hf`` engine: transformers generation that computes each distinct context once.

A GRPO step plays 128 episodes of 16 mazes, and most of what they show the policy repeats:
the 8 samples of a maze share their first context; with a Markov context mode
(``history_text`` 0 or 1) every visit of a state shows the same context; with the full
history every context extends the previous one plus its reply. This engine turns that
into saved compute, on any device (CPU or one GPU; nothing here is CPU-specific):

1. **Identical contexts are computed once.** Requests are grouped by content (token ids and
   frame bytes); one prefill serves every request of a group.
2. **Replies share their prefixes.** Decoding walks a tree: each row of the KV cache is one
   distinct (context, reply so far); every request on a row draws its own next token, and
   the rows of the next step are the distinct (row, token) pairs, whose caches are the
   parent rows' (``index_select``). Eight samples that all answer ``('move', 0)`` cost one
   row, not eight.
3. **A context that extends one of the previous call's sequences continues its KV cache**
   (with ``history_images`` and ``history_text`` "all"): after each call the engine keeps
   (by reference) the cache of every finished (context + reply); the next call looks up, per
   context, the longest kept sequence it starts with and computes only the rest. Such a
   continued chunk carries a new frame, so its 3-D rope positions come from
   :func:`mazerl.policy.attention.context_positions` over the whole context, and the batch
   (cached parts of different lengths, new parts of different lengths, both left-padded) runs
   under an explicit additive mask.

Decoding is a plain loop over ``model.forward`` with the cache: on a model as small as the
starter, per-call overhead, not arithmetic, dominates, and ``generate``'s is larger. Sampling
follows transformers' order (suppressed special tokens, temperature, top-p; no top-k), seeded
per call (``settings.seed`` with the chunk index), so rollouts are reproducible; greedy
replies equal :class:`~mazerl.policy.engines.HFEngine`'s (the ``generate``-based oracle) maze
by maze (tests/test_prefix_engine.py). Each reply token's log-prob (log-softmax of the raw
logits over the temperature, as the trainer scores it) comes back with the result.

The kept caches assume the weights do not change between calls: make a new engine (or call
:meth:`PrefixCachingEngine.reset`) after an optimizer step. ``stats`` counts what was asked
for and what was computed (the train-step benchmark reports it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mazerl.policy.attention import additive_mask, context_positions
from mazerl.policy.chat import image_token_id, pad_id, pixel_inputs
from mazerl.policy.engines import GenerationRequest, GenerationResult, GenerationSettings, banned_token_ids, stop_ids


def frame_digest(frame: np.ndarray) -> bytes:
    frame = np.ascontiguousarray(frame)
    return hashlib.blake2b(frame.tobytes() + str(frame.shape).encode(), digest_size=16).digest()


@dataclass
class EngineStats:
    """Tokens asked for (each request's context and reply, as a per-request engine computes them) and computed."""

    requests: int = 0
    contexts: int = 0  # distinct contexts prefilled
    context_tokens: int = 0  # sum of every request's context length
    prefill_tokens: int = 0  # context tokens actually computed (cached prefixes and duplicates skipped)
    reused_tokens: int = 0  # context tokens taken from a kept cache
    reply_tokens: int = 0  # sum of every request's reply length
    decode_tokens: int = 0  # rows forwarded while decoding (one per distinct reply prefix and step)
    forward_calls: int = 0

    def add(self, other: EngineStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class _Kept:
    """A finished sequence's KV cache: a row of some step's cache tensors (kept by reference)."""

    ids: tuple[int, ...]
    digests: tuple[bytes, ...]
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # that step's (keys, values) per layer, (R, H, K, D)
    row: int
    real: torch.Tensor  # (K,) bool: which key columns of the row are real tokens

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(H, len(ids), D) keys and values of this sequence in ``layer``, padding removed."""
        keys, values = self.layers[layer]
        return keys[self.row][:, self.real], values[self.row][:, self.real]


@dataclass
class _Context:
    ids: list[int]
    images: list[np.ndarray]
    digests: tuple[bytes, ...]
    members: list[int] = field(default_factory=list)  # request indices
    prefix: _Kept | None = None  # the kept sequence this context continues


class PrefixCachingEngine:
    """Batched generation over distinct contexts and reply prefixes, with KV reuse across calls.

    ``max_batch_size`` bounds the distinct contexts prefilled together (larger calls are cut
    into chunks in order; chunk ``i`` samples with seed ``(seed, i)``).
    """

    def __init__(self, model: torch.nn.Module, processor: Any, max_batch_size: int = 256) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} must be >= 1")
        self.model = model
        self.processor = processor
        self.max_batch_size = max_batch_size
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.eos_ids = sorted(stop_ids(model, processor))
        self.pad_id = pad_id(processor)
        self.image_pad = image_token_id(processor)
        self.suppressed = torch.tensor(banned_token_ids(processor, self.eos_ids), dtype=torch.long, device=self.device)
        self.stats = EngineStats()
        self._kept: dict[tuple[int, ...], list[_Kept]] = {}
        self._kept_lengths: list[int] = []

    @staticmethod
    def from_policy(policy: Any, max_batch_size: int = 256) -> PrefixCachingEngine:
        return PrefixCachingEngine(policy.model, policy.processor, max_batch_size)

    def reset(self) -> None:
        """Forget the kept caches (after the weights changed)."""
        self._kept, self._kept_lengths = {}, []

    # ---- the call --------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, requests: list[GenerationRequest], settings: GenerationSettings) -> list[GenerationResult]:
        contexts: dict[tuple, _Context] = {}
        for index, request in enumerate(requests):
            digests = tuple(frame_digest(frame) for frame in request.images)
            key = (tuple(request.input_ids), digests)
            if key not in contexts:
                contexts[key] = _Context(list(request.input_ids), list(request.images), digests)
            contexts[key].members.append(index)
        distinct = list(contexts.values())
        for context in distinct:
            context.prefix = self._longest_kept_prefix(context)
        replies: list[list[int]] = [[] for _ in requests]
        log_probs: list[list[float]] = [[] for _ in requests]
        kept: list[_Kept] = []
        for chunk_index, start in enumerate(range(0, len(distinct), self.max_batch_size)):
            chunk = distinct[start : start + self.max_batch_size]
            generator = self._generator(settings, chunk_index)
            kept += self._generate_chunk(chunk, settings, generator, replies, log_probs)
        self._keep(kept)
        self.stats.requests += len(requests)
        self.stats.contexts += len(distinct)
        self.stats.context_tokens += sum(len(r.input_ids) for r in requests)
        self.stats.reply_tokens += sum(len(reply) for reply in replies)
        decode = self.processor.tokenizer.decode
        return [
            GenerationResult(response_ids=reply, text=decode(reply, skip_special_tokens=True), log_probs=logps)
            for reply, logps in zip(replies, log_probs, strict=True)
        ]

    def _generator(self, settings: GenerationSettings, chunk_index: int) -> torch.Generator | None:
        if settings.greedy:
            return None
        generator = torch.Generator(device=self.device)
        if settings.seed is not None:
            generator.manual_seed(int(np.random.SeedSequence([settings.seed, chunk_index]).generate_state(1)[0]))
        else:
            generator.seed()
        return generator

    # ---- kept caches across calls ----------------------------------------------------

    def _longest_kept_prefix(self, context: _Context) -> _Kept | None:
        """The longest kept sequence that the context strictly extends (same tokens, same frames)."""
        for length in self._kept_lengths:
            if length >= len(context.ids):
                continue
            for candidate in self._kept.get(tuple(context.ids[:length]), ()):
                if context.digests[: len(candidate.digests)] == candidate.digests:
                    return candidate
        return None

    def _keep(self, kept: list[_Kept]) -> None:
        self._kept = {}
        for entry in kept:
            self._kept.setdefault(entry.ids, []).append(entry)
        self._kept_lengths = sorted({len(ids) for ids in self._kept}, reverse=True)

    # ---- prefill and decode of one chunk ---------------------------------------------

    def _generate_chunk(
        self,
        chunk: list[_Context],
        settings: GenerationSettings,
        generator: torch.Generator | None,
        replies: list[list[int]],
        log_probs: list[list[float]],
    ) -> list[_Kept]:
        logits, cache, real, last_position = self._prefill(chunk)
        # Decoding state, one entry per cache row: the requests on it and their shared reply so far.
        rows: list[list[int]] = [context.members for context in chunk]
        row_context: list[int] = list(range(len(chunk)))
        row_reply: list[list[int]] = [[] for _ in chunk]
        kept: list[_Kept] = []
        for step in range(settings.max_new_tokens):
            scores = logits.float()  # (R, V)
            token_log_probs = torch.log_softmax(scores / settings.temperature, dim=-1)  # the trainer's definition
            tokens = self._next_tokens(scores, rows, settings, generator)  # one per request, in row order
            layers = [(layer.keys, layer.values) for layer in cache.layers]
            children: dict[tuple[int, int], list[int]] = {}
            cursor = 0
            for row, members in enumerate(rows):
                for member in members:
                    token = tokens[cursor]
                    cursor += 1
                    replies[member].append(token)
                    log_probs[member].append(float(token_log_probs[row, token]))
                    if token in self.eos_ids or step + 1 == settings.max_new_tokens:
                        context = chunk[row_context[row]]
                        ids = tuple(context.ids + row_reply[row])
                        kept.append(_Kept(ids, context.digests, layers, row, real[row]))
                    else:
                        children.setdefault((row, token), []).append(member)
            if not children:
                break
            parents = [row for row, _ in children]
            if parents != list(range(len(rows))):  # rows split or finished: the children's caches are their parents'
                index = torch.tensor(parents, device=self.device)
                cache.batch_select_indices(index)
                real, last_position = real[index], last_position[index]
            real = torch.cat([real, torch.ones(len(children), 1, dtype=torch.bool, device=self.device)], 1)
            last_position = last_position + 1
            row_context = [row_context[row] for row in parents]
            row_reply = [row_reply[row] + [token] for row, token in children]
            rows = list(children.values())
            input_ids = torch.tensor([[token] for _, token in children], device=self.device)  # (R, 1)
            positions = last_position.view(1, -1, 1).expand(3, -1, -1)  # text: all three components equal
            logits, cache = self._forward(input_ids, real.unsqueeze(1), positions, cache)
            self.stats.decode_tokens += len(children)
        return self._dedupe(kept)

    @staticmethod
    def _dedupe(kept: list[_Kept]) -> list[_Kept]:
        """One kept entry per finished sequence (requests that finished on the same row share it)."""
        seen: dict[tuple, _Kept] = {}
        for entry in kept:
            seen.setdefault((entry.ids, entry.digests), entry)
        return list(seen.values())

    def _next_tokens(
        self,
        scores: torch.Tensor,
        rows: list[list[int]],
        settings: GenerationSettings,
        generator: torch.Generator | None,
    ) -> list[int]:
        """One token per request (in row order): transformers' processing order, then argmax or a draw."""
        scores = scores.clone()
        if len(self.suppressed):
            scores[:, self.suppressed] = -float("inf")
        row_of_member = torch.tensor([row for row, members in enumerate(rows) for _ in members], device=self.device)
        if settings.greedy:
            return scores.argmax(-1)[row_of_member].tolist()
        scores = scores / settings.temperature
        if settings.top_p < 1.0:  # transformers' TopPLogitsWarper, min_tokens_to_keep 1
            ordered, order = torch.sort(scores, descending=False)
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            remove = cumulative <= (1 - settings.top_p)
            remove[..., -1:] = False
            scores = scores.masked_fill(remove.scatter(1, order, remove), -float("inf"))
        probs = torch.softmax(scores, dim=-1)[row_of_member]  # (members, V)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1).tolist()

    def _prefill(self, chunk: list[_Context]) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """Logits after each context (R, V), the chunk's cache, its real-key mask (R, K) and last positions (R,)."""
        from transformers import DynamicCache

        shared = self._shared_text_prefix(chunk)
        for context in chunk:
            if shared is not None and (context.prefix is None or len(context.prefix.ids) < len(shared.ids)):
                context.prefix = shared
        past_lengths = [len(c.prefix.ids) if c.prefix is not None else 0 for c in chunk]
        new_ids = [c.ids[p:] for c, p in zip(chunk, past_lengths, strict=True)]
        longest_past, longest_new = max(past_lengths), max(len(ids) for ids in new_ids)
        rows = len(chunk)
        full_positions = context_positions(
            self.model, self.processor, [c.ids for c in chunk], [c.images for c in chunk]
        )
        input_ids = torch.full((rows, longest_new), self.pad_id, dtype=torch.long)
        positions = torch.zeros((3, rows, longest_new), dtype=torch.long)
        real = torch.zeros((rows, longest_past + longest_new), dtype=torch.bool)
        new_frames: list[np.ndarray] = []
        for row, (context, past, ids) in enumerate(zip(chunk, past_lengths, new_ids, strict=True)):
            input_ids[row, longest_new - len(ids) :] = torch.tensor(ids)
            positions[:, row, longest_new - len(ids) :] = full_positions[row][:, past:]
            real[row, longest_past - past : longest_past] = True
            real[row, longest_past + longest_new - len(ids) :] = True
            new_frames += context.images[len(context.prefix.digests) if context.prefix else 0 :]
        # Queries of the new part see the real past and the real new keys up to themselves (and
        # themselves always, so a padding query is never left with nothing to attend to).
        causal = torch.ones(longest_new, longest_past + longest_new, dtype=torch.bool).tril(longest_past)
        allowed = real.unsqueeze(1) & causal.unsqueeze(0)  # (R, Q, K)
        allowed[:, :, longest_past:] |= torch.eye(longest_new, dtype=torch.bool)
        cache = DynamicCache()
        if longest_past:
            cache = DynamicCache(ddp_cache_data=self._past(chunk, longest_past))
        extra: dict[str, torch.Tensor] = {}
        if new_frames:
            pixels = pixel_inputs(self.processor, new_frames)
            extra = {
                "pixel_values": pixels["pixel_values"].to(self.device, self.dtype),
                "image_grid_thw": pixels["image_grid_thw"].to(self.device),
            }
        logits, cache = self._forward(
            input_ids.to(self.device), allowed.to(self.device), positions.to(self.device), cache, **extra
        )
        self.stats.prefill_tokens += sum(len(ids) for ids in new_ids)
        self.stats.reused_tokens += sum(past_lengths)
        return logits, cache, real.to(self.device), positions[0, :, -1].to(self.device)

    def _past(self, chunk: list[_Context], longest: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (R, H, longest, D) keys and values of the rows' prefixes, left-padded with zeros."""
        layers = []
        reference = next(c.prefix for c in chunk if c.prefix is not None)
        for layer in range(len(reference.layers)):
            sample = reference.layers[layer][0]
            keys = sample.new_zeros((len(chunk), sample.shape[1], longest, sample.shape[3]))
            values = torch.zeros_like(keys)
            for row, context in enumerate(chunk):
                if context.prefix is not None:
                    k, v = context.prefix.kv(layer)
                    keys[row, :, longest - k.shape[1] :] = k
                    values[row, :, longest - v.shape[1] :] = v
            layers.append((keys, values))
        return layers

    def _shared_text_prefix(self, chunk: list[_Context]) -> _Kept | None:
        """The text all contexts of the chunk start with (the chat template's opening and the task
        prompt), computed once as a one-row forward, or None when it is not worth a call."""
        first = chunk[0].ids
        length = len(first)
        for context in chunk[1:]:
            length = min(length, len(context.ids))
            length = next((i for i in range(length) if context.ids[i] != first[i]), length)
        if self.image_pad in first[:length]:
            length = first.index(self.image_pad)
        length = min(length, min(len(c.ids) for c in chunk) - 1)  # every context keeps a token to compute
        covered = sum(len(c.prefix.ids) >= length for c in chunk if c.prefix is not None)
        if length < 2 or len(chunk) - covered < 2:
            return None
        from transformers import DynamicCache

        ids = torch.tensor([first[:length]], device=self.device)
        positions = torch.arange(length, device=self.device).view(1, 1, -1).expand(3, 1, -1)
        allowed = torch.ones(length, length, dtype=torch.bool, device=self.device).tril().unsqueeze(0)
        _, cache = self._forward(ids, allowed, positions, DynamicCache())
        self.stats.prefill_tokens += length
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        return _Kept(tuple(first[:length]), (), layers, 0, torch.ones(length, dtype=torch.bool, device=self.device))

    def _forward(
        self, input_ids: torch.Tensor, allowed: torch.Tensor, positions: torch.Tensor, cache: Any, **extra: Any
    ) -> tuple[torch.Tensor, Any]:
        """Last-token logits (R, V) and the grown cache."""
        output = self.model(
            input_ids=input_ids,
            attention_mask=additive_mask(allowed, self.dtype),
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
            **extra,
        )
        self.stats.forward_calls += 1
        return output.logits[:, -1], output.cache
