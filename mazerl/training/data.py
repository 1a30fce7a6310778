"""Training data: the per-step order over the pool of training mazes.

The pool itself (distinct layouts of the eval set's world, never one of the eval set's) is
:func:`envs.pool.training_pool`; the starter's warm-start draws from it too. The order is a
pure function of (seed, step): epoch ``e`` is a permutation of the pool seeded by ``(seed, e)``,
and step ``s`` takes the next ``mazes_per_step`` entries. A resumed run therefore sees exactly
the mazes an uninterrupted run would have seen.

Retries (``retry_share > 0``): late in a run most groups solve every sample and carry no
advantage, so a step's gradient comes from a few mazes. A retry replaces the last entries of a
step's slice with pool mazes whose last group was split (some samples solved, some not): the
mazes known to carry a gradient. Which ones is a function of (seed, step) and the record of
each maze's last group success, which every checkpoint saves, so a resumed run still sees the
mazes an uninterrupted one would.
"""

from __future__ import annotations

import numpy as np

RETRY_STREAM = 7  # keeps the retry draws' random stream apart from the epoch permutations'


def step_indices(step: int, mazes_per_step: int, pool_size: int, seed: int) -> list[int]:
    """Pool indices used by 1-based ``step``: consecutive slices of per-epoch permutations."""
    start = (step - 1) * mazes_per_step
    indices = []
    for position in range(start, start + mazes_per_step):
        epoch, offset = divmod(position, pool_size)
        order = np.random.default_rng([seed, epoch]).permutation(pool_size)
        indices.append(int(order[offset]))
    return indices


def retry_count(mazes_per_step: int, retry_share: float) -> int:
    """How many of a step's mazes may be retries: ``retry_share`` of them, rounded down."""
    return int(mazes_per_step * retry_share)


def split_mazes(last_success: dict[int, float]) -> list[int]:
    """Pool indices whose last group solved some samples and failed others, in index order."""
    return sorted(index for index, rate in last_success.items() if 0.0 < rate < 1.0)


def step_mazes(
    step: int, mazes_per_step: int, pool_size: int, seed: int, retry_share: float, last_success: dict[int, float]
) -> tuple[list[int], int]:
    """(pool indices of ``step``, how many of them are retries).

    The step's own slice (:func:`step_indices`), its last entries replaced by up to
    ``retry_count`` split mazes not already in the step, drawn without replacement by
    ``(seed, step)``. With ``retry_share`` 0 or no split maze, the slice itself.
    """
    fresh = step_indices(step, mazes_per_step, pool_size, seed)
    wanted = retry_count(mazes_per_step, retry_share)
    if wanted == 0:
        return fresh, 0
    candidates = [index for index in split_mazes(last_success) if index not in fresh]
    rng = np.random.default_rng([seed, step, RETRY_STREAM])
    retries = [int(index) for index in rng.permutation(candidates)[:wanted]]
    return fresh[: mazes_per_step - len(retries)] + retries, len(retries)


def record_success(last_success: dict[int, float], indices: list[int], solved: list[bool], group_size: int) -> None:
    """Record each maze's group success rate; ``solved`` holds ``group_size`` episodes per index, in order."""
    if len(solved) != len(indices) * group_size:
        raise ValueError(f"record_success: {len(solved)} episodes for {len(indices)} mazes x {group_size} samples")
    for position, index in enumerate(indices):
        group = solved[position * group_size : (position + 1) * group_size]
        last_success[index] = sum(group) / group_size


def order_state(
    step: int, seed: int, mazes_per_step: int, pool_size: int, last_success: dict[int, float]
) -> dict[str, dict]:
    """What a checkpoint after ``step`` keeps of the data order: the plain order's inputs and the record."""
    return {
        "data_order": {
            "seed": seed,
            "mazes_per_step": mazes_per_step,
            "pool_size": pool_size,
            "epoch": epoch_of_step(step, mazes_per_step, pool_size),
            "next_step": step + 1,
        },
        "maze_success": {str(index): rate for index, rate in sorted(last_success.items())},
    }


def recorded_success(state: dict) -> dict[int, float]:
    """The record :func:`order_state` saved; a checkpoint from before retries has none (an empty one)."""
    return {int(index): float(rate) for index, rate in state.get("maze_success", {}).items()}


def epoch_of_step(step: int, mazes_per_step: int, pool_size: int) -> int:
    """The (0-based) epoch in which ``step`` starts."""
    return (step - 1) * mazes_per_step // pool_size
