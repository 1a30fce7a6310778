"""The training reward: the task reward plus an optional format bonus.

The maze pays 1.0 for a stop on the target and nothing else (``envs.maze``). Training may
add a format bonus for the share of replies that parsed, so that a policy that has not yet
learned the action syntax still gets a signal. Both runners call :func:`episode_reward` (the
local engine's ``mazerl.policy.episodes`` and the skyrl-gym adapter ``envs.skyrl_env``), so the
two backends can never pay different rewards for the same episode. The bonus never enters
success: only the task reward says whether the maze was solved.
"""

from __future__ import annotations


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
