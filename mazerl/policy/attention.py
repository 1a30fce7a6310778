"""Explicit positions and attention masks for Qwen3-VL forwards that are not one causal batch.

A plain left-padded batch lets the model derive everything itself: its 3-D rope positions
(``get_rope_index`` over the image grids) and its causal mask. The prefix-caching engine
(a chunk continuing a cached prefix) and the packed scorer (one row holding a context and a
tree of replies) need both from outside:

- **positions**: Qwen3-VL derives mrope positions by itself only for a chunk that starts at
  position 0. A continued chunk, or a reply branch that does not follow its context in the
  row, gets its positions from :func:`context_positions`, computed over the whole context
  with the model's own ``get_rope_index``, so they are exactly what a fresh forward of that
  context would use. Text tokens carry the same value in all three components, so the token
  after a text token is at ``position + 1``.
- **masks**: a boolean (B, Q, K) "query may attend to key" tensor becomes the additive
  (B, 1, Q, K) float mask the model takes as is (:func:`additive_mask`); it works with both
  the ``sdpa`` and the ``eager`` attention. A query row with nothing to attend to would
  give NaNs, so padding queries attend to themselves.

Nothing here is CPU-specific: the same tensors go to a GPU model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mazerl.policy.chat import frame_grids, image_token_id
from mazerl.policy.memo import memo_of


def rope_index_owner(model: torch.nn.Module) -> Any:
    """The module that holds ``get_rope_index`` (Qwen3VLModel, also under a PEFT wrapper)."""
    for module in model.modules():
        if hasattr(module, "get_rope_index"):
            return module
    raise TypeError(f"{type(model).__name__} has no get_rope_index; the prefix-caching path needs a Qwen3-VL model")


def context_positions(
    model: torch.nn.Module, processor: Any, contexts: list[list[int]], images: list[list[np.ndarray]]
) -> list[torch.Tensor]:
    """(3, L) rope positions of each whole context, as a fresh forward starting at position 0 computes them.

    ``get_rope_index`` reads only which tokens are image pads and the frames' grids, and a
    rollout's contexts share a few such layouts (every one-frame context of a length), so each
    layout is computed once per model (the Python loop was a fourteenth of a rollout).
    """
    owner = rope_index_owner(model)
    image_pad = image_token_id(processor)
    memo = memo_of(owner, "rope positions", _POSITIONS_KEPT)
    out: list[torch.Tensor] = []
    for ids, frames in zip(contexts, images, strict=True):
        input_ids = torch.tensor([ids], dtype=torch.long)
        token_types = (input_ids == image_pad).long()
        grid = frame_grids(processor, frames) if frames else None
        key = (token_types.numpy().tobytes(), None if grid is None else grid.numpy().tobytes())
        positions = memo.get(key)
        if positions is None:
            batch_positions, _ = owner.get_rope_index(input_ids, mm_token_type_ids=token_types, image_grid_thw=grid)
            positions = memo[key] = batch_positions[:, 0]  # (3, L)
        out.append(positions.clone())
    return out


# Rope position layouts (image-pad pattern and grids) kept per module that owns get_rope_index.
_POSITIONS_KEPT = 4096


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, Q, K) booleans -> (B, 1, Q, K) additive float mask (0 where allowed, the dtype's minimum elsewhere)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.unsqueeze(1)


def text_chunk_inputs(length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rope positions (3, 1, n) and the causal "may attend" mask (1, n, n) of one row of n text
    tokens at positions 0..n-1: the shared task prompt's forward, computed once for a batch."""
    positions = torch.arange(length, device=device).view(1, 1, -1).expand(3, 1, -1)
    allowed = torch.ones(length, length, dtype=torch.bool, device=device).tril().unsqueeze(0)
    return positions, allowed


def shared_text_prefix(sequences: list[list[int]], image_pad: int, limit: int) -> int:
    """How many leading tokens every sequence shares before its first frame, at most ``limit``.

    That text (the chat template's opening and the task prompt) reads the same in every
    context of a batch, so a forward can compute it once and continue every row from its
    cache: its positions are plain 0..n-1 in all rows, and no frame's rope shift precedes it."""
    first = sequences[0]
    length = min(limit, *(len(ids) for ids in sequences))
    for ids in sequences[1:]:
        length = next((i for i in range(length) if ids[i] != first[i]), length)
    return first.index(image_pad) if image_pad in first[:length] else length
