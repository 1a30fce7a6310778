"""Credit: each turn's advantage in a GRPO step, from its episode's group and, by ``grpo.credit``, its own part.

- ``episode`` (SkyRL's GRPO): the shaping terms join the episode's reward; every turn shares its
  episode's advantage.
- ``turn``: the outcome's advantage plus the turn's own shaping reward less its group's mean
  (:func:`~mazerl.training.grpo.turn_advantages`); its progress term needs the maze's solver.
- ``anchor`` (GiGPO): the episode's advantage plus the turn's discounted return normalised
  among the group's turns from the same state (:func:`~mazerl.training.grpo.anchor_advantages`);
  a turn's rewards are its shaping (a bump's cost) and, at the last turn, the episode's outcome.
  No solver is needed.
"""

from __future__ import annotations

from collections.abc import Sequence

from mazerl.policy.episodes import Episode
from mazerl.training.config import GrpoConfig
from mazerl.training.grpo import anchor_advantages, group_advantages, turn_advantages


def turn_credit(episodes: Sequence[Episode], groups: Sequence[object], grpo: GrpoConfig) -> list[list[float]]:
    """One advantage per turn of each episode; ``groups``: each episode's GRPO group (its maze)."""
    if grpo.credit == "turn":
        outcome = group_advantages([episode.reward for episode in episodes], groups).tolist()
        return turn_advantages(outcome, [[t.shaping for t in e.turns] for e in episodes], groups)
    shared = group_advantages([episode.reward + episode.shaping for episode in episodes], groups).tolist()
    if grpo.credit == "anchor":
        rewards = [
            [t.shaping for t in e.turns[:-1]] + [e.turns[-1].shaping + e.reward] if e.turns else [] for e in episodes
        ]
        states = [[turn.context_key() for turn in episode.turns] for episode in episodes]
        return anchor_advantages(shared, rewards, states, groups, grpo.anchor_discount, grpo.anchor_weight)
    return [[advantage] * len(episode.turns) for advantage, episode in zip(shared, episodes, strict=True)]
