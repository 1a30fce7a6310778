"""Log-probabilities of replies in their recorded contexts, each distinct token computed once.

The GRPO update scores every reply of every episode in exactly the context the rollout
showed the policy. Scored one turn at a time (one left-padded sequence per turn, the
oracle in ``mazerl/training/per_turn_oracle.py``), a step of 128 episodes recomputes the
same tokens over and over: the 8 samples of a maze share their first context, a Markov
context repeats whenever a state is revisited, and with the full history every turn's
context is a prefix of the next. :func:`pack` lays the samples out so that each distinct
token is computed once:

- **rows**: one per distinct *trunk*, a context as a causal chain of tokens. A turn's trunk
  is its own context; where an episode's contexts extend each other (``history_images`` and
  ``history_text`` "all"), the whole episode is one trunk, its last context, and the earlier
  replies are read inside it (the episode scored in one pass).
- **branches**: the distinct replies that follow a trunk hang off its last token as a tree
  (replies sharing a prefix share its tokens). A branch token attends to the trunk and to
  its own ancestors only (an explicit mask), and sits at the position it has in its own
  context (the trunk's last position + its depth), so its logits are those of a fresh
  forward of that context and reply.
- **the task prompt**: every row starts with the same text (the chat template's opening and
  the task prompt, 41 of a Markov context's ~112 tokens), which each micro-batch computes
  once; every row continues from its keys and values (gradients summed back into it).

:class:`PackedScorer` runs rows in micro-batches and returns, per *sample*, its reply's
log-probs in the layout the loss expects (right-aligned, (B, R)), gathered from the shared
row logits. Each sample keeps its own advantage and its own clipped surrogate; the
gradient of a shared token is the sum over the samples that use it, which is what scoring
them separately gives (``tests/test_packed_scoring.py`` proves loss and gradients equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mazerl.policy.attention import additive_mask, context_positions, shared_text_prefix, text_chunk_inputs
from mazerl.policy.chat import image_token_id, pad_id, pixel_inputs
from mazerl.policy.prefix_engine import frame_digest

MICRO_BATCH_TOKENS = 8192  # padded row tokens per forward/backward chunk; bounds activation memory


@dataclass
class TurnSample:
    """One reply to learn from: the exact context shown, the reply, and its episode's advantage."""

    input_ids: list[int]
    images: list[np.ndarray]
    response_ids: list[int]
    advantage: float
    maze_id: str = ""  # the GRPO group (its maze); mini-batches hold whole groups
    episode: int = -1  # which episode of the step (its turns are scored together when contexts extend); -1: alone


@dataclass
class Row:
    """A trunk (a context, causal) and the tree of replies after it, flattened."""

    ids: list[int]
    parents: list[int]  # index of each token's predecessor in its own sequence (-1: the first token)
    positions: torch.Tensor  # (3, L) rope positions, each token's own
    frames: list[np.ndarray]  # the trunk's frames, in order
    trunk: int  # the first `trunk` tokens are the chain


@dataclass
class Packed:
    """Rows, and for every sample the row holding it and the row indices of its reply tokens."""

    rows: list[Row]
    sample_row: list[int]
    sample_tokens: list[list[int]]

    def samples_of(self, rows: Sequence[int]) -> list[int]:
        wanted = set(rows)
        return [s for s, row in enumerate(self.sample_row) if row in wanted]

    @property
    def tokens(self) -> int:
        """Tokens the rows compute (the packed cost)."""
        return sum(len(row.ids) for row in self.rows)


@dataclass
class _Trunk:
    ids: list[int]
    frames: list[np.ndarray]
    branches: dict = field(default_factory=dict)  # reply trie: token -> subtree
    inside: list[tuple[int, int]] = field(default_factory=list)  # (sample, reply start) read inside the trunk
    after: list[int] = field(default_factory=list)  # samples whose reply is a branch


def _key(ids: list[int], frames: list[np.ndarray]) -> tuple:
    return tuple(ids), tuple(frame_digest(frame) for frame in frames)


def _episode_extends(turns: list[TurnSample]) -> bool:
    """Every turn's context starts with the previous context + reply, frames included."""
    for before, after in zip(turns, turns[1:], strict=False):
        prefix = before.input_ids + before.response_ids
        if after.input_ids[: len(prefix)] != prefix or len(after.images) < len(before.images):
            return False
        if any(a is not b and not np.array_equal(a, b) for a, b in zip(before.images, after.images, strict=False)):
            return False
    return True


def pack(samples: Sequence[TurnSample], model: torch.nn.Module, processor: Any) -> Packed:
    """Lay ``samples`` out as rows of distinct trunks with their reply trees (see the module docstring)."""
    trunks: dict[tuple, _Trunk] = {}
    placement: list[tuple[tuple, int | None]] = []  # per sample: (trunk key, reply start inside it or None)
    episodes: dict[int, list[int]] = {}
    for index, sample in enumerate(samples):
        if sample.episode >= 0:
            episodes.setdefault(sample.episode, []).append(index)
    in_chain: dict[int, tuple] = {}
    for members in episodes.values():
        turns = [samples[i] for i in members]
        if len(members) > 1 and _episode_extends(turns):
            last = turns[-1]
            key = _key(last.input_ids, last.images)
            trunks.setdefault(key, _Trunk(list(last.input_ids), list(last.images)))
            for i in members[:-1]:
                in_chain[i] = key
    for index, sample in enumerate(samples):
        if index in in_chain:
            placement.append((in_chain[index], len(sample.input_ids)))
            continue
        key = _key(sample.input_ids, sample.images)
        trunk = trunks.setdefault(key, _Trunk(list(sample.input_ids), list(sample.images)))
        node = trunk.branches
        for token in sample.response_ids:
            node = node.setdefault(token, {})
        placement.append((key, None))
    keys = list(trunks)
    positions = context_positions(model, processor, [trunks[k].ids for k in keys], [trunks[k].frames for k in keys])
    rows: list[Row] = []
    branch_index: list[dict[tuple[int, ...], int]] = []
    for key, trunk_positions in zip(keys, positions, strict=True):
        row, index_of = _flatten(trunks[key], trunk_positions)
        rows.append(row)
        branch_index.append(index_of)
    row_of_key = {key: position for position, key in enumerate(keys)}
    sample_row, sample_tokens = [], []
    for sample, (key, start) in zip(samples, placement, strict=True):
        row = row_of_key[key]
        sample_row.append(row)
        length = len(sample.response_ids)
        if start is not None:
            sample_tokens.append(list(range(start, start + length)))
        else:
            index_of = branch_index[row]
            sample_tokens.append([index_of[tuple(sample.response_ids[: depth + 1])] for depth in range(length)])
    return Packed(rows, sample_row, sample_tokens)


def _flatten(trunk: _Trunk, trunk_positions: torch.Tensor) -> tuple[Row, dict[tuple[int, ...], int]]:
    """The trunk as a chain, then its reply trie depth-first; returns the row and reply prefix -> token index."""
    ids = list(trunk.ids)
    parents = list(range(-1, len(ids) - 1))
    last = int(trunk_positions[0, -1])
    depth_positions: list[int] = []
    index_of: dict[tuple[int, ...], int] = {}
    stack = [(token, child, len(ids) - 1, (token,), 1) for token, child in reversed(trunk.branches.items())]
    while stack:
        token, children, parent, prefix, depth = stack.pop()
        index_of[prefix] = len(ids)
        ids.append(token)
        parents.append(parent)
        depth_positions.append(last + depth)
        here = len(ids) - 1
        stack += [(t, c, here, (*prefix, t), depth + 1) for t, c in reversed(children.items())]
    branch = torch.tensor(depth_positions, dtype=torch.long).view(1, -1).expand(3, -1)  # text: all components equal
    positions = torch.cat([trunk_positions, branch], dim=1)
    return Row(ids, parents, positions, list(trunk.frames), len(trunk.ids)), index_of


def length_batches(lengths: dict[int, int], max_tokens: int = MICRO_BATCH_TOKENS) -> list[list[int]]:
    """Keys of ``lengths`` (index -> sequence length) cut into micro-batches, shortest first, whose
    padded size (longest x count) stays under ``max_tokens``; a longer sequence gets a batch alone."""
    order = sorted(lengths, key=lambda key: lengths[key])
    batches, current, longest = [], [], 0
    for key in order:
        length = lengths[key]
        if current and max(longest, length) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(key)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


def _allowed(rows: list[Row], width: int) -> torch.Tensor:
    """(B, L, L) booleans: a token attends to itself and its ancestors (padding: to itself)."""
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    allowed = causal.unsqueeze(0).repeat(len(rows), 1, 1)
    for b, row in enumerate(rows):
        allowed[b, :, row.trunk :] = False  # past the trunk only ancestors count: rebuilt below
        for index in range(row.trunk, len(row.ids)):
            allowed[b, index] = allowed[b, row.parents[index]]
            allowed[b, index, index] = True
        allowed[b, len(row.ids) :] = False
        allowed[b, len(row.ids) :, len(row.ids) :] = torch.eye(width - len(row.ids), dtype=torch.bool)
    return allowed


def row_log_probs(
    model: torch.nn.Module,
    processor: Any,
    packed: Packed,
    rows: list[int],
    device: torch.device,
    temperature: float,
    share_prefix: bool = True,
) -> tuple[list[int], torch.Tensor, torch.Tensor, int]:
    """One forward of ``rows``: (samples on them, their reply log-probs (B, R) right-aligned, mask (B, R),
    tokens computed); ``share_prefix`` as :func:`_row_logits`."""
    batch = [packed.rows[r] for r in rows]
    width = max(len(row.ids) for row in batch)
    samples = packed.samples_of(rows)
    local = {row: b for b, row in enumerate(rows)}
    # Logits only where a reply token is predicted (at each reply token's parent): a (B, L) mask,
    # which the model applies before its head, so the head runs on those positions alone.
    keep = torch.zeros(len(batch), width, dtype=torch.bool)
    for s in samples:
        row = packed.rows[packed.sample_row[s]]
        for token in packed.sample_tokens[s]:
            keep[local[packed.sample_row[s]], row.parents[token]] = True
    flat = torch.full((len(batch), width), -1, dtype=torch.long)
    flat[keep] = torch.arange(int(keep.sum()))
    logits, computed = _row_logits(model, processor, batch, keep, device, share_prefix)
    log_softmax = torch.log_softmax(logits / temperature, dim=-1)
    longest = max(len(packed.sample_tokens[s]) for s in samples)
    at, targets, out_rows, out_cols = [], [], [], []
    for out, s in enumerate(samples):
        row = packed.rows[packed.sample_row[s]]
        tokens = packed.sample_tokens[s]
        for depth, token in enumerate(tokens):
            at.append(int(flat[local[packed.sample_row[s]], row.parents[token]]))
            targets.append(row.ids[token])
            out_rows.append(out)
            out_cols.append(longest - len(tokens) + depth)
    gathered = log_softmax[torch.tensor(at, device=device), torch.tensor(targets, device=device)]
    where = (torch.tensor(out_rows, device=device), torch.tensor(out_cols, device=device))
    log_probs = torch.zeros(len(samples), longest, device=device, dtype=gathered.dtype).index_put(where, gathered)
    mask = torch.zeros(len(samples), longest, device=device).index_put(where, torch.ones_like(gathered))
    return samples, log_probs, mask, computed


def _row_logits(
    model: torch.nn.Module,
    processor: Any,
    batch: list[Row],
    keep: torch.Tensor,
    device: torch.device,
    share_prefix: bool,
) -> tuple[torch.Tensor, int]:
    """The rows' logits where ``keep`` (B, L) is true, (kept positions, V), and the tokens computed.

    With ``share_prefix`` the text every row starts with (the task prompt, a third of a Markov
    context) is computed once, as a one-row forward whose keys and values every row continues
    from (:func:`_prefix_cache`); its gradient is the sum over the rows, as if each had
    computed it. Off: each row computes it (the plain path, the oracle tests compare against).
    """
    width = keep.shape[1]
    input_ids = torch.full((len(batch), width), pad_id(processor), dtype=torch.long)
    positions = torch.zeros((3, len(batch), width), dtype=torch.long)
    for b, row in enumerate(batch):
        input_ids[b, : len(row.ids)] = torch.tensor(row.ids)
        positions[:, b, : len(row.ids)] = row.positions
    extra: dict[str, torch.Tensor] = {}
    frames = [frame for row in batch for frame in row.frames]
    dtype = next(model.parameters()).dtype
    if frames:
        pixels = pixel_inputs(processor, frames)
        extra = {
            "pixel_values": pixels["pixel_values"].to(device, dtype),
            "image_grid_thw": pixels["image_grid_thw"].to(device),
        }
    prefix = 0
    if share_prefix:
        first_kept = int(keep.any(dim=0).nonzero()[0])  # a kept logit is computed in the rows' own forward
        prefix = shared_text_prefix([row.ids for row in batch], image_token_id(processor), first_kept)
    cache = _prefix_cache(model, batch[0].ids[:prefix], len(batch), device, dtype)
    if cache is None:
        prefix = 0
    logits = model(
        input_ids=input_ids[:, prefix:].to(device),
        attention_mask=additive_mask(_allowed(batch, width)[:, prefix:].to(device), dtype),
        position_ids=positions[:, :, prefix:].to(device),
        logits_to_keep=keep[:, prefix:].to(device),
        cache=cache,
        use_cache=cache is not None,
        **extra,
    ).logits.float()
    return logits, sum(len(row.ids) for row in batch) - (len(batch) - 1) * prefix


def _prefix_cache(
    model: torch.nn.Module, ids: list[int], rows: int, device: torch.device, dtype: torch.dtype
) -> Any | None:
    """The keys and values of ``ids`` (text at positions 0..n-1), computed once with gradients and
    expanded to ``rows`` rows (a view, so backward sums the rows' gradients into the one forward);
    None when fewer than 2 tokens or rows would share it."""
    if len(ids) < 2 or rows < 2:
        return None
    from transformers import DynamicCache

    positions, allowed = text_chunk_inputs(len(ids), device)
    output = model(
        input_ids=torch.tensor([ids], device=device),
        attention_mask=additive_mask(allowed, dtype),
        position_ids=positions,
        logits_to_keep=1,
        use_cache=True,
    )
    layers = [
        (layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1)) for layer in output.cache.layers
    ]
    return DynamicCache(ddp_cache_data=layers)


def reply_mask(samples: Sequence[TurnSample], device: torch.device) -> torch.Tensor:
    """(B, R) 1.0 on reply tokens: each reply is right-aligned, R = longest reply (the loss layout)."""
    lengths = torch.tensor([len(s.response_ids) for s in samples], device=device)
    longest = int(lengths.max())
    return (torch.arange(longest, device=device).unsqueeze(0) >= (longest - lengths).unsqueeze(1)).float()


def decision_mask(samples: Sequence[TurnSample], stop_ids: set[int], device: torch.device) -> torch.Tensor:
    """:func:`reply_mask` less the stop tokens that end the replies: what ``grpo.stop_token_loss: false`` trains.

    A stop token that opens a reply stays in: that reply is the stop token alone, an empty reply
    (an unparsed move), and leaving it out would leave nothing to push it down, so a policy that
    drifts into empty replies could never be trained out of them."""
    longest = max(len(s.response_ids) for s in samples)
    padded = [[-1] * (longest - len(s.response_ids)) + list(s.response_ids) for s in samples]
    ids = torch.tensor(padded, device=device)
    opening = torch.zeros_like(ids, dtype=torch.bool)
    for row, sample in enumerate(samples):
        if sample.response_ids:
            opening[row, longest - len(sample.response_ids)] = True
    ending = torch.isin(ids, torch.tensor(sorted(stop_ids), device=device)) & ~opening
    return ((ids >= 0) & ~ending).float()


def log_probs_before_update(
    scorer: PackedScorer, model: torch.nn.Module, minis: list[list[Chunk]], reference: bool
) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
    """Per mini-batch and chunk, the old log-probs and (``reference``) the base model's, without grad.

    With one mini-batch the first update epoch runs before any optimizer step, so its own
    forward pass gives the old log-probs (left empty here, filled in detached by the update).
    With several, later mini-batches would see an already-updated policy, so a scoring pass
    comes first. The reference is the model with its adapters off (the KL term's anchor).
    """
    old: list[list[torch.Tensor]] = [[] for _ in minis]
    ref: list[list[torch.Tensor]] = [[] for _ in minis]
    with torch.no_grad():
        if len(minis) > 1:
            old = [[scorer.log_probs(chunk)[0] for chunk in chunks] for chunks in minis]
        if reference:
            with model.disable_adapter():
                ref = [[scorer.log_probs(chunk)[0] for chunk in chunks] for chunks in minis]
    return old, ref


@dataclass(frozen=True)
class Chunk:
    """One micro-batch of a scorer: the samples it scores (indices, in its output rows' order) and its work."""

    samples: list[int]
    work: Any


class PackedScorer:
    """The update's scoring: samples packed into rows once per step, rows scored in micro-batches.

    ``prepare(samples)`` packs them (once: the packing holds for every update epoch) and returns
    the micro-batches; ``log_probs(chunk)`` runs one and returns its samples' reply log-probs
    (B, R) and mask (B, R). ``stats`` counts tokens that exist (each sample's context and reply,
    what per-turn scoring computes) and tokens computed.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        processor: Any,
        device: torch.device,
        temperature: float,
        share_prefix: bool = True,
    ) -> None:
        self.model, self.processor, self.device, self.temperature = model, processor, device, temperature
        self.share_prefix = share_prefix
        self.stats = {"tokens_existing": 0, "tokens_computed": 0}

    def prepare(self, samples: Sequence[TurnSample]) -> list[Chunk]:
        packed = pack(samples, self.model, self.processor)
        existing = [len(s.input_ids) + len(s.response_ids) for s in samples]
        return [
            Chunk(packed.samples_of(rows), (packed, rows, sum(existing[i] for i in packed.samples_of(rows))))
            for rows in length_batches({r: len(row.ids) for r, row in enumerate(packed.rows)})
        ]

    def log_probs(self, chunk: Chunk) -> tuple[torch.Tensor, torch.Tensor]:
        packed, rows, existing = chunk.work
        indices, log_probs, mask, computed = row_log_probs(
            self.model, self.processor, packed, rows, self.device, self.temperature, self.share_prefix
        )
        assert indices == chunk.samples, "row_log_probs returns the chunk's samples in order"
        self.stats["tokens_computed"] += computed
        self.stats["tokens_existing"] += existing
        return log_probs, mask
