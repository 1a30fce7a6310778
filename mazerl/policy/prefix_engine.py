"""The ``hf`` engine: transformers generation that computes each distinct context once.

A GRPO step plays 128 episodes of 16 mazes, and most of what they show the policy repeats:
the 8 samples of a maze share their first context; with a Markov context mode
(``history_text`` 0) every visit of a state shows the same context, in whatever turn; with
the full history every context extends the previous one plus its reply. This engine turns
that into saved compute, on any device (CPU or one GPU; nothing here is CPU-specific):

1. **A context is computed once.** Requests are grouped by content (token ids and frame
   bytes); one prefill serves every request of a group. Every prefilled context stays in a
   bounded store (its KV cache by reference, and its next-token logits), so a context seen in
   an earlier call (a state revisited at a later turn) is not computed again at all.
2. **Replies share their prefixes.** Decoding walks a tree: each cache row is one distinct
   (context, reply so far); every request on a row draws its own next token, and the rows of
   the next step are the distinct (row, token) pairs, whose caches are their parents' rows.
   Eight samples that all answer ``('move', 0)`` cost one row, not eight.
3. **A context that extends a stored sequence continues its KV cache**: the longest stored
   context, or finished context + reply, that it starts with (the full-history modes; also
   the task prompt every context of a call starts with, computed once for all). Such a
   continued chunk carries a new frame, so its 3-D rope positions come from
   :func:`mazerl.policy.attention.context_positions` over the whole context, and the batch
   (cached parts and new parts of different lengths, both left-padded) runs under an
   explicit additive mask.

Decoding is a plain loop over ``model.forward`` with the cache: on a model as small as the
starter, per-call overhead, not arithmetic, dominates, and ``generate``'s is larger. Sampling
follows transformers' order (suppressed special tokens, temperature, top-p; no top-k), seeded
per call (``settings.seed`` with the chunk index), so rollouts are reproducible; greedy
replies equal :class:`~mazerl.policy.engines.HFEngine`'s (the ``generate``-based oracle) maze
by maze (tests/test_prefix_engine.py, bench/engine_equality.py). Each reply token's log-prob
(log-softmax of the raw logits over the temperature, as the trainer scores it) comes back
with the result.

The store assumes the weights do not change between calls: make a new engine (or call
:meth:`PrefixCachingEngine.reset`) after an optimizer step. ``stats`` counts what was asked
for and what was computed (the train-step benchmark reports it).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mazerl.policy.attention import additive_mask, context_positions, shared_text_prefix, text_chunk_inputs
from mazerl.policy.chat import image_token_id, pad_id, pixel_inputs
from mazerl.policy.engines import GenerationRequest, GenerationResult, GenerationSettings, banned_token_ids, stop_ids

Spans = list[tuple[int, int]]  # real key columns of a cache row, in order: [start, end) ranges


def frame_digest(frame: np.ndarray) -> bytes:
    frame = np.ascontiguousarray(frame)
    return hashlib.blake2b(frame.tobytes() + str(frame.shape).encode(), digest_size=16).digest()


@dataclass
class EngineStats:
    """Tokens asked for (each request's context and reply, as a per-request engine computes them) and computed."""

    requests: int = 0
    contexts: int = 0  # distinct contexts per call, summed over calls
    stored_hits: int = 0  # of those, found whole in the store (nothing computed)
    context_tokens: int = 0  # sum of every request's context length
    prefill_tokens: int = 0  # context tokens actually computed
    reused_tokens: int = 0  # context tokens of computed contexts taken from a stored prefix
    reply_tokens: int = 0  # sum of every request's reply length
    decode_tokens: int = 0  # rows forwarded while decoding (one per distinct reply prefix and step)
    forward_calls: int = 0


@dataclass
class _Entry:
    """A computed sequence: its KV as columns of one row of some forward's cache (kept by reference)."""

    ids: tuple[int, ...]
    digests: tuple[bytes, ...]
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # (R, H, K, D) keys and values per layer
    row: int
    spans: Spans
    last_position: int  # rope position of the last token (text: all three components)
    logits: torch.Tensor | None = None  # (V,) after the last token, for a prefilled context
    _compact: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(H, len(ids), D) keys and values in ``layer``, padding removed (computed once)."""
        if layer not in self._compact:
            keys, values = self.layers[layer]
            self._compact[layer] = tuple(
                torch.cat([t[self.row, :, a:b] for a, b in self.spans], dim=1) for t in (keys, values)
            )
        return self._compact[layer]


@dataclass
class _Context:
    ids: list[int]
    images: list[np.ndarray]
    digests: tuple[bytes, ...]
    members: list[int] = field(default_factory=list)  # request indices
    prefix: _Entry | None = None  # the stored sequence it continues
    whole: _Entry | None = None  # the stored entry of this very context (nothing to compute)


class PrefixCachingEngine:
    """Batched generation over distinct contexts and reply prefixes, with a KV store across calls.

    ``max_batch_size`` bounds the distinct contexts of one chunk (larger calls are cut into
    chunks in order; chunk ``i`` samples with seed ``(seed, i)``); ``max_stored_tokens``
    bounds the store (least recently used entries go first).
    """

    def __init__(
        self, model: torch.nn.Module, processor: Any, max_batch_size: int = 256, max_stored_tokens: int = 200_000
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} must be >= 1")
        self.model = model
        self.processor = processor
        self.max_batch_size = max_batch_size
        self.max_stored_tokens = max_stored_tokens
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.eos_ids = sorted(stop_ids(model, processor))
        self.pad_id = pad_id(processor)
        self.image_pad = image_token_id(processor)
        self.suppressed = torch.tensor(banned_token_ids(processor, self.eos_ids), dtype=torch.long, device=self.device)
        self.stats = EngineStats()
        self.reset()

    @staticmethod
    def from_policy(policy: Any, max_batch_size: int = 256) -> PrefixCachingEngine:
        return PrefixCachingEngine(policy.model, policy.processor, max_batch_size)

    def reset(self) -> None:
        """Forget the stored caches (after the weights changed)."""
        self._store: OrderedDict[tuple, _Entry] = OrderedDict()
        self._stored_tokens = 0
        self._lengths: dict[int, int] = {}  # stored sequence length -> entries of that length

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
        for key, context in contexts.items():
            stored = self._store.get(key)
            if stored is not None and stored.logits is not None:
                context.whole = stored
                self._store.move_to_end(key)
            else:
                context.prefix = self._longest_prefix(context)
        distinct = list(contexts.values())
        replies: list[list[int]] = [[] for _ in requests]
        log_probs: list[list[float]] = [[] for _ in requests]
        for chunk_index, start in enumerate(range(0, len(distinct), self.max_batch_size)):
            chunk = distinct[start : start + self.max_batch_size]
            self._generate_chunk(chunk, settings, self._generator(settings, chunk_index), replies, log_probs)
        self.stats.requests += len(requests)
        self.stats.contexts += len(distinct)
        self.stats.stored_hits += sum(c.whole is not None for c in distinct)
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

    # ---- the store -------------------------------------------------------------------

    def _longest_prefix(self, context: _Context) -> _Entry | None:
        """The longest stored sequence that the context strictly extends (same tokens, same frames)."""
        for length in sorted(self._lengths, reverse=True):
            if length >= len(context.ids):
                continue
            prefix = context.ids[:length]
            frames = sum(
                token == self.image_pad and (i == 0 or prefix[i - 1] != self.image_pad)
                for i, token in enumerate(prefix)
            )  # one run of image pads per frame
            key = (tuple(prefix), context.digests[:frames])
            entry = self._store.get(key)
            if entry is not None:
                self._store.move_to_end(key)
                return entry
        return None

    def _put(self, entry: _Entry) -> None:
        key = (entry.ids, entry.digests)
        old = self._store.get(key)
        if old is not None and old.logits is not None and entry.logits is None:
            return  # a stored context with its logits is worth more than the same tokens without
        if old is not None:
            self._forget(self._store.pop(key))
        self._store[key] = entry
        self._stored_tokens += len(entry.ids)
        self._lengths[len(entry.ids)] = self._lengths.get(len(entry.ids), 0) + 1
        while self._stored_tokens > self.max_stored_tokens and len(self._store) > 1:
            self._forget(self._store.popitem(last=False)[1])

    def _forget(self, entry: _Entry) -> None:
        self._stored_tokens -= len(entry.ids)
        self._lengths[len(entry.ids)] -= 1
        if not self._lengths[len(entry.ids)]:
            del self._lengths[len(entry.ids)]

    # ---- one chunk: prefill what is new, assemble the rows, decode as a tree -----------

    def _generate_chunk(
        self,
        chunk: list[_Context],
        settings: GenerationSettings,
        generator: torch.Generator | None,
        replies: list[list[int]],
        log_probs: list[list[float]],
    ) -> None:
        todo = [c for c in chunk if c.whole is None]
        if todo:
            for entry in self._prefill(todo):
                self._put(entry)
        entries = [c.whole if c.whole is not None else self._store[(tuple(c.ids), c.digests)] for c in chunk]
        cache, spans, logits, last_position = self._rows(entries)
        rows: list[list[int]] = [context.members for context in chunk]  # the requests on each cache row
        row_context: list[int] = list(range(len(chunk)))
        row_reply: list[list[int]] = [[] for _ in chunk]
        for step in range(settings.max_new_tokens):
            scores = logits.float()  # (R, V)
            token_log_probs = torch.log_softmax(scores / settings.temperature, dim=-1)  # the trainer's definition
            tokens = self._next_tokens(scores, rows, settings, generator)  # one per request, in row order
            layers = [(layer.keys, layer.values) for layer in cache.layers]
            children: dict[tuple[int, int], list[int]] = {}
            finished: set[int] = set()
            cursor = 0
            for row, members in enumerate(rows):
                for member in members:
                    token = tokens[cursor]
                    cursor += 1
                    replies[member].append(token)
                    log_probs[member].append(float(token_log_probs[row, token]))
                    if token in self.eos_ids or step + 1 == settings.max_new_tokens:
                        finished.add(row)
                    else:
                        children.setdefault((row, token), []).append(member)
            for row in finished:  # context + reply so far: a prefix the next turn's context may extend
                context = chunk[row_context[row]]
                ids = tuple(context.ids + row_reply[row])
                if row_reply[row]:
                    self._put(_Entry(ids, context.digests, layers, row, spans[row], int(last_position[row])))
            if not children:
                break
            parents = [row for row, _ in children]
            if parents != list(range(len(rows))):  # rows split or finished: the children's caches are their parents'
                cache.batch_select_indices(torch.tensor(parents, device=self.device))
                last_position = last_position[torch.tensor(parents, device=self.device)]
            width = cache.layers[0].keys.shape[2]
            spans = [[*spans[row], (width, width + 1)] for row in parents]
            last_position = last_position + 1
            row_context = [row_context[row] for row in parents]
            row_reply = [row_reply[row] + [token] for row, token in children]
            rows = list(children.values())
            input_ids = torch.tensor([[token] for _, token in children], device=self.device)  # (R, 1)
            positions = last_position.view(1, -1, 1).expand(3, -1, -1)  # text: all three components equal
            allowed = self._real(spans, width + 1).unsqueeze(1)  # (R, 1, K)
            logits, cache = self._forward(input_ids, allowed, positions, cache)
            self.stats.decode_tokens += len(children)

    def _real(self, spans: list[Spans], width: int) -> torch.Tensor:
        real = torch.zeros(len(spans), width, dtype=torch.bool)
        for row, row_spans in enumerate(spans):
            for a, b in row_spans:
                real[row, a:b] = True
        return real.to(self.device)

    def _rows(self, entries: list[_Entry]) -> tuple[Any, list[Spans], torch.Tensor, torch.Tensor]:
        """One decode batch from the chunk's context entries: cache, real spans, logits (R, V), last positions."""
        from transformers import DynamicCache

        logits = torch.stack([entry.logits for entry in entries])
        last_position = torch.tensor([entry.last_position for entry in entries], device=self.device)
        source = entries[0].layers
        if all(e.layers is source for e in entries) and [e.row for e in entries] == list(range(len(source[0][0]))):
            # the rows of one prefill, in order: use its cache as it is
            return DynamicCache(ddp_cache_data=source), [e.spans for e in entries], logits, last_position
        longest = max(len(e.ids) for e in entries)
        layers = []
        for layer in range(len(source)):
            sample = source[layer][0]
            keys = sample.new_zeros((len(entries), sample.shape[1], longest, sample.shape[3]))
            values = torch.zeros_like(keys)
            for row, entry in enumerate(entries):
                k, v = entry.kv(layer)
                keys[row, :, longest - k.shape[1] :] = k
                values[row, :, longest - v.shape[1] :] = v
            layers.append((keys, values))
        spans = [[(longest - len(e.ids), longest)] for e in entries]
        return DynamicCache(ddp_cache_data=layers), spans, logits, last_position

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

    def _prefill(self, todo: list[_Context]) -> list[_Entry]:
        """Compute the contexts (continuing their stored prefixes); one stored entry per context."""
        from transformers import DynamicCache

        shared = self._shared_text_prefix(todo)
        for context in todo:
            if shared is not None and (context.prefix is None or len(context.prefix.ids) < len(shared.ids)):
                context.prefix = shared
        past_lengths = [len(c.prefix.ids) if c.prefix is not None else 0 for c in todo]
        new_ids = [c.ids[p:] for c, p in zip(todo, past_lengths, strict=True)]
        longest_past, longest_new = max(past_lengths), max(len(ids) for ids in new_ids)
        width = longest_past + longest_new
        full_positions = context_positions(self.model, self.processor, [c.ids for c in todo], [c.images for c in todo])
        input_ids = torch.full((len(todo), longest_new), self.pad_id, dtype=torch.long)
        positions = torch.zeros((3, len(todo), longest_new), dtype=torch.long)
        spans: list[Spans] = []
        new_frames: list[np.ndarray] = []
        for row, (context, past, ids) in enumerate(zip(todo, past_lengths, new_ids, strict=True)):
            input_ids[row, longest_new - len(ids) :] = torch.tensor(ids)
            positions[:, row, longest_new - len(ids) :] = full_positions[row][:, past:]
            spans.append([(longest_past - past, longest_past)] * bool(past) + [(width - len(ids), width)])
            new_frames += context.images[len(context.prefix.digests) if context.prefix else 0 :]
        # Queries of the new part see the real past and the real new keys up to themselves (and
        # themselves always, so a padding query is never left with nothing to attend to).
        real = self._real(spans, width).cpu()
        causal = torch.ones(longest_new, width, dtype=torch.bool).tril(longest_past)
        allowed = real.unsqueeze(1) & causal.unsqueeze(0)  # (R, Q, K)
        allowed[:, :, longest_past:] |= torch.eye(longest_new, dtype=torch.bool)
        cache = DynamicCache(ddp_cache_data=self._past(todo, longest_past)) if longest_past else DynamicCache()
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
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        last = positions[0, :, -1].tolist()
        return [
            _Entry(tuple(c.ids), c.digests, layers, row, spans[row], last[row], logits[row])
            for row, c in enumerate(todo)
        ]

    def _past(self, todo: list[_Context], longest: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (R, H, longest, D) keys and values of the rows' prefixes, left-padded with zeros."""
        layers = []
        reference = next(c.prefix for c in todo if c.prefix is not None)
        for layer in range(len(reference.layers)):
            sample = reference.layers[layer][0]
            keys = sample.new_zeros((len(todo), sample.shape[1], longest, sample.shape[3]))
            values = torch.zeros_like(keys)
            for row, context in enumerate(todo):
                if context.prefix is not None:
                    k, v = context.prefix.kv(layer)
                    keys[row, :, longest - k.shape[1] :] = k
                    values[row, :, longest - v.shape[1] :] = v
            layers.append((keys, values))
        return layers

    def _shared_text_prefix(self, todo: list[_Context]) -> _Entry | None:
        """The text all contexts to compute start with (the chat template's opening and the task
        prompt), computed once as a one-row forward (or found in the store), or None when not worth it."""
        first = todo[0].ids
        # every context keeps a token to compute
        length = shared_text_prefix([c.ids for c in todo], self.image_pad, min(len(c.ids) for c in todo) - 1)
        covered = sum(len(c.prefix.ids) >= length for c in todo if c.prefix is not None)
        if length < 2 or len(todo) - covered < 2:
            return None
        stored = self._store.get((tuple(first[:length]), ()))
        if stored is not None:
            return stored
        from transformers import DynamicCache

        ids = torch.tensor([first[:length]], device=self.device)
        positions, allowed = text_chunk_inputs(length, self.device)
        _, cache = self._forward(ids, allowed, positions, DynamicCache())
        self.stats.prefill_tokens += length
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        entry = _Entry(tuple(first[:length]), (), layers, 0, [(0, length)], length - 1)
        self._put(entry)
        return entry

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
