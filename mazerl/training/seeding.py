"""The local engine's randomness: one seed per step, and the RNG states a checkpoint keeps.

Every source of randomness of step N is seeded from ``(seed, N)`` (:func:`step_seed`), so a run
resumed from the checkpoint of step N reproduces an uninterrupted run bit for bit on CPU with a
fixed thread count; the RNG states are saved with each checkpoint as well (:func:`rng_state`).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def step_seed(seed: int, step: int) -> int:
    """The seed of all randomness in ``step``; explicit so resume needs nothing else."""
    return int(np.random.default_rng([seed, step, 0x6772706F]).integers(2**31 - 1))


def seed_everything(value: int) -> None:
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)


def rng_state() -> dict[str, Any]:
    return {
        "python": list(random.getstate()[1]),
        "numpy": np.random.get_state()[1].tolist(),
        "torch": torch.get_rng_state(),
    }
