"""The training reward: the task reward plus an optional format bonus.

The maze pays 1.0 for a stop on the target and nothing else (``envs.maze``). Training may
add a format bonus for the share of replies that parsed, so that a policy that has not yet
learned the action syntax still gets a signal. Both runners call :func:`episode_reward` (the
local engine's ``mazerl.policy.episodes`` and the skyrl-gym adapter ``envs.skyrl_env``), so the
two backends can never pay different rewards for the same episode. The bonus never enters
success: only the task reward says whether the maze was solved. The per-turn shaping terms
(:class:`Shaping`) are training-only in the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def check_format_bonus(format_bonus: float) -> None:
    """A negative bonus would punish parsed replies; 0 disables the bonus."""
    if not format_bonus >= 0:
        raise ValueError(f"format_bonus={format_bonus} must be >= 0 (0 disables it)")


def episode_reward(task_reward: float, parsed_replies: int, replies: int, format_bonus: float) -> float:
    """The terminal reward of an episode of ``replies`` replies, ``parsed_replies`` of which parsed."""
    check_format_bonus(format_bonus)
    if not 0 <= parsed_replies <= replies or replies < 1:
        raise ValueError(f"parsed_replies={parsed_replies} must lie in [0, replies={replies}] and replies must be >= 1")
    return float(task_reward) + format_bonus * (parsed_replies / replies)


@dataclass(frozen=True)
class Shaping:
    """Training-only per-turn terms that pay for what the outcome reward cannot see (never success).

    The task reward comes only at a stop on the target and is shared by every turn of the
    episode: a run that bumped three walls before it got there is paid like a clean one, and
    a group that all fails carries no gradient at all. These terms give each turn its own
    signal:

    - ``progress_reward``: per move, ``progress_reward * (distance before - distance after)``, the
      distance being moves to the target along the maze (:func:`envs.maze.target_distances`). In a
      perfect maze a move is worth ``+progress_reward`` exactly when it is the solver's move and
      ``-progress_reward`` otherwise; a stop is worth ``+progress_reward`` on the target (the
      solver's action there) and ``-progress_reward`` anywhere else.
    - ``bump_cost``: per reply that leaves the agent where it was without ending the episode
      (a wall bump, an unreadable reply), ``-bump_cost``.
    """

    progress_reward: float = 0.0  # the training setting's own name (grpo.progress_reward)
    bump_cost: float = 0.0

    def __post_init__(self) -> None:
        for name in ("progress_reward", "bump_cost"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"shaping {name}={value!r} must be a finite number >= 0 (0 disables it)")

    @property
    def active(self) -> bool:
        return bool(self.progress_reward or self.bump_cost)


def turn_shaping(shaping: Shaping, distance_before: int, distance_after: int, stopped: bool) -> float:
    """The shaping reward of one turn that took the agent from ``distance_before`` to ``distance_after``
    (moves to the target); ``stopped``: the reply was a stop, the solver's action on the target
    (``+progress_reward``) and a wrong one anywhere else (``-progress_reward``), so that every turn that did what
    the solver would have done earns the same, the last one included."""
    if stopped:
        return shaping.progress_reward if distance_before == 0 else -shaping.progress_reward
    if distance_after == distance_before:
        return -shaping.bump_cost
    return shaping.progress_reward * (distance_before - distance_after)
