"""Memoised vision-tower outputs for a frozen tower: each distinct frame is encoded once.

A 7x7 maze has at most 17 agent positions, so a GRPO step (16 mazes x 8 samples x up to 15
turns, scored again in the update) shows the vision tower the same few hundred frames over
and over; on CPU the tower was a third of rollout time. While the tower's weights do not
change (LoRA on the language model only, ``freeze_vision``), its output for an image is a
pure function of the image's pixel patches, so it is cached by their bytes.

Missing images are encoded in groups of exactly ``group_size`` (a short group is padded with
copies of its first image), so every call of the tower has the same shape and an image's
result does not depend on what else was in its group, the batch or the cache: runs stay
bit-for-bit reproducible (a resumed run starts with an empty cache) and eval results do not
depend on chunking (``tests/test_vision_cache.py``). One image at a time gave the same
guarantee, but the tower's per-call overhead then cost a third of a training step.

Usage::

    cache = VisionCache()
    cache.attach(model)            # any Qwen3-VL model (also under PEFT); returns the model
"""

from __future__ import annotations

import hashlib
import types
from collections import OrderedDict
from typing import Any

import torch


class VisionCacheError(RuntimeError):
    """The model has no Qwen3-VL-style vision tower to attach to."""


def find_vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    """The module that turns pixel patches into image tokens (``...model.visual`` in Qwen3-VL)."""
    for name, module in model.named_modules():
        if name.split(".")[-1] == "visual" and hasattr(module, "deepstack_merger_list"):
            return module
    raise VisionCacheError(f"{type(model).__name__} has no Qwen3-VL vision tower ('visual' with deepstack mergers)")


class VisionCache:
    """Per-image outputs (merged embeddings + deepstack features), keyed by the image's patch bytes."""

    def __init__(self, max_images: int = 50_000, group_size: int = 8) -> None:
        if max_images < 1:
            raise ValueError(f"max_images={max_images} must be >= 1")
        if group_size < 1:
            raise ValueError(f"group_size={group_size} must be >= 1")
        self.max_images = max_images
        self.group_size = group_size
        self._store: OrderedDict[bytes, tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._store)

    def attach(self, model: torch.nn.Module) -> torch.nn.Module:
        """Freeze ``model``'s vision tower and route it through this cache.

        The caller promises the tower's weights do not change while the cache is attached (no
        adapter or optimizer touches them); the tower's parameters are set to not require grad.
        """
        tower = find_vision_tower(model)
        tower.requires_grad_(False)
        encode = getattr(tower, "_uncached_forward", tower.forward)
        cache = self

        def forward(self_tower: torch.nn.Module, hidden_states: torch.Tensor, grid_thw: torch.Tensor, **kwargs: Any):
            return cache._forward(self_tower, encode, hidden_states, grid_thw, **kwargs)

        tower._uncached_forward = encode
        tower.forward = types.MethodType(forward, tower)
        return model

    def _forward(self, tower: torch.nn.Module, encode, hidden_states: torch.Tensor, grid_thw: torch.Tensor, **kwargs):
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

        kwargs.pop("return_dict", None)
        patches = grid_thw.prod(-1).tolist()
        pieces = torch.split(hidden_states, patches)
        keys = []
        for piece, grid in zip(pieces, grid_thw, strict=True):
            digest = hashlib.blake2b(piece.detach().contiguous().cpu().numpy().tobytes(), digest_size=16)
            digest.update(grid.cpu().numpy().tobytes())
            keys.append(digest.digest())
        missing: dict[bytes, tuple[torch.Tensor, torch.Tensor]] = {}
        for key, piece, grid in zip(keys, pieces, grid_thw, strict=True):
            if key in self._store:
                self._store.move_to_end(key)
                self.hits += 1
            elif key not in missing:
                missing[key] = (piece, grid)
        self.misses += len(missing)
        by_grid: dict[tuple, list[bytes]] = {}  # a group holds images of one grid (one shape)
        for key, (_, grid) in missing.items():
            by_grid.setdefault(tuple(grid.tolist()), []).append(key)
        for group_keys in (
            keys_[i : i + self.group_size] for keys_ in by_grid.values() for i in range(0, len(keys_), self.group_size)
        ):
            pieces_ = [missing[key][0] for key in group_keys]
            pieces_ += [pieces_[0]] * (self.group_size - len(pieces_))  # padding: same shape every call
            grids = torch.stack([missing[group_keys[0]][1]] * self.group_size)
            with torch.no_grad():
                output = encode(torch.cat(pieces_), grid_thw=grids, return_dict=True, **kwargs)
            tokens = int(grids[0].prod()) // tower.spatial_merge_size**2
            for position, key in enumerate(group_keys):
                rows = slice(position * tokens, (position + 1) * tokens)
                self._store[key] = (
                    output.pooler_output[rows].detach().clone(),
                    tuple(feature[rows].detach().clone() for feature in output.deepstack_features),
                )
        entries = [self._store[key] for key in keys]
        while len(self._store) > self.max_images:
            self._store.popitem(last=False)
        deepstack_layers = len(entries[0][1])
        return BaseModelOutputWithDeepstackFeatures(
            last_hidden_state=None,
            pooler_output=torch.cat([pooled for pooled, _ in entries]),
            deepstack_features=[torch.cat([deep[i] for _, deep in entries]) for i in range(deepstack_layers)],
        )
