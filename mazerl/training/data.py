"""Training data: the pool of training mazes and the per-step order over it.

The pool holds distinct layouts drawn from seeds ``TRAIN_SEED_OFFSET`` upwards and never
a layout of the eval set, so eval numbers measure mazes the policy was not trained on.
The order is a pure function of (seed, step): epoch ``e`` is a permutation of the pool
seeded by ``(seed, e)``, and step ``s`` takes the next ``mazes_per_step`` entries. A
resumed run therefore sees exactly the mazes an uninterrupted run would have seen.
"""

from __future__ import annotations

import numpy as np

from envs.evalset import EvalSet
from envs.maze import Layout

TRAIN_SEED_OFFSET = 1_000_000


def training_pool(eval_set: EvalSet, pool_size: int, max_tries_factor: int = 50) -> list[tuple[int, Layout]]:
    """``pool_size`` (seed, layout) pairs of the eval set's world, disjoint from its layouts."""
    excluded = set(eval_set.layouts)
    pool: list[tuple[int, Layout]] = []
    seen: set[Layout] = set()
    seed = TRAIN_SEED_OFFSET
    limit = TRAIN_SEED_OFFSET + max_tries_factor * pool_size
    while len(pool) < pool_size:
        if seed >= limit:
            raise ValueError(
                f"train_pool_size ({pool_size}) is more than the {eval_set.size}x{eval_set.size} world offers outside "
                f"the eval set {eval_set.name} (found {len(pool)} distinct mazes in {limit - TRAIN_SEED_OFFSET} seeds); "
                f"lower train_pool_size to at most {len(pool)}"
            )
        layout = Layout.generate(seed, eval_set.size)
        if layout not in excluded and layout not in seen:
            seen.add(layout)
            pool.append((seed, layout))
        seed += 1
    return pool


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
