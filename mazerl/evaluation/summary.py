"""Per-maze result rows (written and read back) -> the eval summary.

Success counts only an episode that stopped on the target; a format bonus never counts.
The success rate comes with a 95% Wilson score interval (sound at 0% and 100% and for
small n, where the normal approximation is not), and every summary states the budget
ceiling: the share of the set's mazes the shortest-path solver finishes within the budget.
Two evals of the same mazes compare by the exact McNemar test on the mazes one solved and
the other did not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mazerl.policy.episodes import Episode

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0, 1) when n == 0."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes ({successes}) <= n ({n})")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z**2 / n
    centre = (p + z**2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def exact_mcnemar_p(fixed: int, broken: int) -> float:
    """Two-sided exact McNemar test of two evals on the same mazes, from the discordant pairs
    (``fixed``: failed before, solved after; ``broken``: the reverse): binomial(n, 1/2) tail, doubled."""
    n = fixed + broken
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(fixed, broken) + 1)) / 2**n
    return min(1.0, 2 * tail)


def result_row(index: int, seed: int | None, episode: Episode) -> dict[str, Any]:
    """One line of results.jsonl."""
    return {
        "index": index,
        "maze_id": episode.maze_id,
        "seed": seed,
        "solved": episode.solved,
        "moves": episode.moves,
        "optimal_moves": episode.optimal_moves,
        "parse_failures": episode.parse_failures,
        "reward": episode.reward,
        "response_tokens": episode.response_tokens,
        "context_tokens": episode.context_tokens,
        "actions": episode.actions,
    }


def summarize(rows: Sequence[dict[str, Any]], budget_ceiling: float) -> dict[str, Any]:
    """The headline numbers of an eval over ``rows`` (one per maze)."""
    n = len(rows)
    solved = [row for row in rows if row["solved"]]
    low, high = wilson_interval(len(solved), n)
    moves = sum(row["moves"] for row in rows)
    # A solved episode's moves include the final stop; the optimum does not count it.
    ratios = [(row["moves"] - 1) / row["optimal_moves"] for row in solved if row["optimal_moves"] > 0]
    return {
        "n": n,
        "solved": len(solved),
        "success_rate": len(solved) / n if n else 0.0,
        "success_ci95": [low, high],
        "avg_moves": moves / n if n else 0.0,  # per maze, solved or not (MLflow's eval/avg_moves)
        "mean_moves_solved": sum(row["moves"] for row in solved) / len(solved) if solved else None,
        "moves_over_optimal": sum(ratios) / len(ratios) if ratios else None,
        "parse_failure_rate": sum(row["parse_failures"] for row in rows) / moves if moves else 0.0,
        "budget_ceiling": budget_ceiling,
        "mean_response_tokens": sum(row["response_tokens"] for row in rows) / n if n else 0.0,
    }
