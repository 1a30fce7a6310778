"""The training pool: distinct mazes of an eval set's world that are not in the eval set.

The pool holds layouts drawn from seeds ``TRAIN_SEED_OFFSET`` upwards and never a layout of
the eval set, so eval numbers measure mazes the policy was not trained on. GRPO training
(``mazerl.training``) and the starter's warm-start (``mazerl.starter.states``) both draw from
it; it lives with the world because it is a fact about the world (how many mazes it has, and
which ones lie outside a set).
"""

from __future__ import annotations

from functools import cache

from envs.evalset import EvalSet
from envs.maze import Layout

TRAIN_SEED_OFFSET = 1_000_000
CORNER_PLACEMENTS = 4  # Layout.generate puts the agent in one of 4 corners, the target opposite


@cache
def spanning_trees(cells_per_side: int) -> int:
    """Spanning trees of the ``k x k`` grid graph (Kirchhoff's matrix-tree theorem, exact integers).

    A maze of the world is one spanning tree of its cell grid (Wilson's algorithm draws them
    uniformly), so this counts the world's wall layouts: 192 for 3 x 3 cells (7x7 mazes).
    """
    k = cells_per_side
    n = k * k
    laplacian = [[0] * n for _ in range(n)]
    for r in range(k):
        for c in range(k):
            for dr, dc in ((0, 1), (1, 0)):
                if r + dr < k and c + dc < k:
                    a, b = r * k + c, (r + dr) * k + c + dc
                    laplacian[a][b] = laplacian[b][a] = -1
                    laplacian[a][a] += 1
                    laplacian[b][b] += 1
    # Any cofactor of the Laplacian; Bareiss elimination keeps every entry an exact integer.
    m = [row[1:] for row in laplacian[1:]]
    size, previous = n - 1, 1
    for i in range(size):
        if m[i][i] == 0:
            swap = next(j for j in range(i + 1, size) if m[j][i] != 0)
            m[i], m[swap] = m[swap], m[i]
        for j in range(i + 1, size):
            for col in range(i + 1, size):
                m[j][col] = (m[j][col] * m[i][i] - m[j][i] * m[i][col]) // previous
        previous = m[i][i]
    return abs(m[size - 1][size - 1]) if size else 1


def world_capacity(eval_set: EvalSet) -> int:
    """Distinct mazes of the eval set's world that are not in the set: the largest possible training pool."""
    cells = (eval_set.size - 1) // 2
    return CORNER_PLACEMENTS * spanning_trees(cells) - len(set(eval_set.layouts))


def training_pool(eval_set: EvalSet, pool_size: int, max_tries_factor: int = 50) -> list[tuple[int, Layout]]:
    """``pool_size`` (seed, layout) pairs of the eval set's world, disjoint from its layouts."""
    capacity = world_capacity(eval_set)
    if pool_size > capacity:
        raise ValueError(
            f"train_pool_size ({pool_size}) is more than the {eval_set.size}x{eval_set.size} world offers outside "
            f"the eval set {eval_set.name} ({capacity} distinct mazes); lower train_pool_size to at most {capacity}, "
            "or leave it unset for the largest pool the world allows"
        )
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
