"""Training data: the per-step order over the pool of training mazes.

The pool itself (distinct layouts of the eval set's world, never one of the eval set's) is
:func:`envs.pool.training_pool`; the starter's warm-start draws from it too. The order is a
pure function of (seed, step): epoch ``e`` is a permutation of the pool seeded by ``(seed, e)``,
and step ``s`` takes the next ``mazes_per_step`` entries. A resumed run therefore sees exactly
the mazes an uninterrupted run would have seen.
"""

from __future__ import annotations

import numpy as np


def step_indices(step: int, mazes_per_step: int, pool_size: int, seed: int) -> list[int]:
    """Pool indices used by 1-based ``step``: consecutive slices of per-epoch permutations."""
    start = (step - 1) * mazes_per_step
    indices = []
    for position in range(start, start + mazes_per_step):
        epoch, offset = divmod(position, pool_size)
        order = np.random.default_rng([seed, epoch]).permutation(pool_size)
        indices.append(int(order[offset]))
    return indices


def epoch_of_step(step: int, mazes_per_step: int, pool_size: int) -> int:
    """The (0-based) epoch in which ``step`` starts."""
    return (step - 1) * mazes_per_step // pool_size
