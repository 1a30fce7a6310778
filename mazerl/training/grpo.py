"""GRPO's math as free functions, following SkyRL's definitions so both backends agree.

- Advantage (SkyRL ``compute_grpo_outcome_advantage``): an episode's summed reward minus
  its group mean, divided by the group's unbiased standard deviation + 1e-6. A group of
  one gets mean 0 and std 1. Every response token of the episode carries that value.
  One deviation: a group whose rewards are all equal gets exactly 0 (:func:`centred`). Computed,
  the mean of equal floats is off by rounding, which divided by 0 + 1e-6 became an advantage of
  up to 0.3 (8 equal float32 rewards of 4.8) where upstream's formula means 0.
- Policy loss (SkyRL ``ppo_policy_loss``, ``regular``): ``-min(r*A, clip(r, 1-eps_low,
  1+eps_high)*A)`` with ``r = exp(logp - logp_old)`` (log-ratio clamped at 20).
- Reduction ``token_mean``: the sum of per-token losses divided by the number of
  response tokens in the whole mini-batch (not per micro-batch), so splitting a batch
  into micro-batches for memory does not change the gradient.
- Turn credit (optional, ``credit: turn``; ours, not SkyRL's): each turn's advantage is its
  episode's advantage plus the turn's own shaping reward minus the mean shaping reward of
  the group's turns (DeepSeekMath's process-supervision GRPO, with the immediate reward of
  the turn instead of the reward-to-go: in a perfect maze a move's own progress already says
  whether it was the solver's move).
- Anchor credit (optional, ``credit: anchor``; GiGPO, arXiv 2505.10978): each turn's advantage is
  its episode's advantage plus ``weight`` times its step advantage: the turn's discounted return
  (its own reward and every later turn's, the outcome at the last turn), normalised among the
  turns of its group that start from the same state (an anchor-state group). The context the
  policy sees is a function of the state here, so turns with identical contexts are exactly the
  turns from one state; a state met once carries no step advantage. It needs no solver.
- KL (optional, ``kl_coef > 0``): SkyRL's default ``k3`` estimator against the reference
  policy, ``exp(ref - logp) - (ref - logp) - 1``, added per token.
- Mini-batches (``mini_batch_mazes``, SkyRL's policy_mini_batch_size): whole mazes per
  optimizer step, in rollout order (:func:`mini_batches`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from mazerl.training.config import GrpoConfig
    from mazerl.training.scoring import TurnSample

ADVANTAGE_EPSILON = 1e-6
LOG_RATIO_CLAMP = 20.0


def centred(values: torch.Tensor) -> torch.Tensor:
    """``(values - mean) / (unbiased std + 1e-6)`` over a group of two or more, exactly 0 where all are equal.

    Equal values mean no preference, but their computed mean is off by rounding (8 float32 copies of 1.9
    average 1.2e-7 below 1.9), and divided by a standard deviation of 0 + 1e-6 that rounding was a sizeable
    advantage (0.11 there) pushing every reply of the group the same way.
    """
    if bool((values == values[0]).all()):
        return torch.zeros_like(values)
    return (values - values.mean()) / (values.std(unbiased=True) + ADVANTAGE_EPSILON)


def group_advantages(rewards: Sequence[float], group_ids: Sequence[object]) -> torch.Tensor:
    """(N,) rewards and group labels -> (N,) advantages, normalised within each group."""
    scores = torch.as_tensor(rewards, dtype=torch.float32)
    advantages = torch.empty_like(scores)
    groups: dict[object, list[int]] = {}
    for index, group in enumerate(group_ids):
        groups.setdefault(group, []).append(index)
    for members in groups.values():
        group_scores = scores[members]
        if len(members) == 1:  # SkyRL: mean 0, std 1
            advantages[members] = (group_scores - torch.tensor(0.0)) / (torch.tensor(1.0) + ADVANTAGE_EPSILON)
        else:
            advantages[members] = centred(group_scores)
    return advantages


def turn_advantages(
    episode_advantages: Sequence[float], turn_rewards: Sequence[Sequence[float]], group_ids: Sequence[object]
) -> list[list[float]]:
    """Per-turn advantages: ``episode_advantages[e] + turn_rewards[e][t] - mean(turn rewards of e's group)``.

    The group mean is over every turn of every episode of the group (the same maze), so a
    turn is credited relative to what the policy did elsewhere on that maze; a group whose
    turns all earned the same keeps its episode advantages exactly (:func:`exact_mean`), so
    where those are 0 too (every episode solved, every move the solver's) the trainer skips
    the turns as carrying no gradient instead of scoring them for an advantage of 1e-17.
    """
    if not len(episode_advantages) == len(turn_rewards) == len(group_ids):
        raise ValueError(
            f"turn_advantages: {len(episode_advantages)} advantages, {len(turn_rewards)} reward lists and "
            f"{len(group_ids)} group ids; give one of each per episode"
        )
    totals: dict[object, list[float]] = {}
    for rewards, group in zip(turn_rewards, group_ids, strict=True):
        totals.setdefault(group, []).extend(rewards)
    means = {group: exact_mean(values) for group, values in totals.items()}
    return [
        [float(advantage) + float(reward) - means[group] for reward in rewards]
        for advantage, rewards, group in zip(episode_advantages, turn_rewards, group_ids, strict=True)
    ]


def exact_mean(values: Sequence[float]) -> float:
    """The mean, and exactly the value where all are equal: ``sum([0.3] * 10) / 10`` is 0.29999999999999993,
    so a turn of 0.3 less it would be 5.6e-17 rather than 0 (0 for an empty list)."""
    if not values:
        return 0.0
    if all(value == values[0] for value in values):
        return float(values[0])
    return sum(values) / len(values)


def discounted_returns(rewards: Sequence[float], discount: float) -> list[float]:
    """Each turn's return: its reward plus ``discount`` times the next turn's return."""
    returns, running = [], 0.0
    for reward in reversed(rewards):
        running = float(reward) + discount * running
        returns.append(running)
    return returns[::-1]


def anchor_advantages(
    episode_advantages: Sequence[float],
    turn_rewards: Sequence[Sequence[float]],
    turn_states: Sequence[Sequence[object]],
    group_ids: Sequence[object],
    discount: float,
    weight: float,
) -> list[list[float]]:
    """Per-turn advantages of GiGPO: ``episode_advantages[e] + weight * step[e][t]``, where ``step`` is the
    turn's discounted return normalised (mean, unbiased std + 1e-6) within its anchor group: the turns of
    the same group (maze) whose state key is equal, across episodes and within one. A group of one turn,
    or of equal returns, gets 0."""
    if not len(episode_advantages) == len(turn_rewards) == len(turn_states) == len(group_ids):
        raise ValueError(
            f"anchor_advantages: {len(episode_advantages)} advantages, {len(turn_rewards)} reward lists, "
            f"{len(turn_states)} state lists and {len(group_ids)} group ids; give one of each per episode"
        )
    returns = [discounted_returns(rewards, discount) for rewards in turn_rewards]
    anchors: dict[tuple[object, object], list[tuple[int, int]]] = {}
    for episode, (states, group) in enumerate(zip(turn_states, group_ids, strict=True)):
        if len(states) != len(returns[episode]):
            raise ValueError(
                f"anchor_advantages: episode {episode} has {len(states)} states for {len(returns[episode])} turns"
            )
        for turn, state in enumerate(states):
            anchors.setdefault((group, state), []).append((episode, turn))
    step = [[0.0] * len(episode_returns) for episode_returns in returns]
    for members in anchors.values():
        if len(members) < 2:
            continue
        normalised = centred(torch.tensor([returns[e][t] for e, t in members], dtype=torch.float64))
        for (e, t), value in zip(members, normalised.tolist(), strict=True):
            step[e][t] = value
    return [
        [float(advantage) + weight * value for value in steps]
        for advantage, steps in zip(episode_advantages, step, strict=True)
    ]


def clipped_surrogate(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss and a clipped-token indicator, both shaped like ``log_probs`` (B, T)."""
    log_ratio = (log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = (-clipped > -unclipped).float()
    return loss, was_clipped


def k3_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Per-token low-variance KL estimate of KL(policy || reference), >= 0."""
    delta = (ref_log_probs - log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(delta) - delta - 1


def reduce_token_mean(per_token: torch.Tensor, mask: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """Sum over masked tokens / ``total_tokens`` of the whole mini-batch (SkyRL ``token_mean``)."""
    return (per_token * mask).sum() / max(total_tokens, 1)


def reduce_sequence_mean(per_token: torch.Tensor, mask: torch.Tensor, total_sequences: int) -> torch.Tensor:
    """Mean over tokens within each sequence, then sum / ``total_sequences`` of the mini-batch."""
    per_sequence = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_sequence.sum() / max(total_sequences, 1)


def count_tokens(masks: Sequence[torch.Tensor]) -> int:
    return int(sum(mask.sum().item() for mask in masks))


def count_sequences(masks: Sequence[torch.Tensor]) -> int:
    return sum(mask.shape[0] for mask in masks)


# name -> (reduce one micro-batch, normaliser over all micro-batch masks of the mini-batch)
LOSS_REDUCTIONS = {
    "token_mean": (reduce_token_mean, count_tokens),
    "sequence_mean": (reduce_sequence_mean, count_sequences),
}


def micro_batch_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    grpo: GrpoConfig,
    total: int,
) -> tuple[torch.Tensor, float, float]:
    """One micro-batch's share of the mini-batch loss: (loss to backpropagate, clipped tokens, KL sum).

    Each sample's own clipped surrogate with its own advantage (B,) (never summed advantages),
    plus ``kl_coef`` times the k3 KL against the reference when ``kl_coef > 0``, reduced by
    ``loss_reduction`` over ``total`` (the whole mini-batch's normaliser, see :data:`LOSS_REDUCTIONS`).
    """
    per_token, was_clipped = clipped_surrogate(
        log_probs, old_log_probs, advantages.unsqueeze(1), grpo.clip_low, grpo.clip_high
    )
    kl_sum = 0.0
    if grpo.kl_coef > 0:
        kl = k3_kl(log_probs, ref_log_probs)
        per_token = per_token + grpo.kl_coef * kl
        kl_sum = float((kl.detach() * mask).sum())
    reduce, _ = LOSS_REDUCTIONS[grpo.loss_reduction]
    return reduce(per_token, mask, total), float((was_clipped * mask).sum()), kl_sum


def mini_batches(samples: list[TurnSample], mazes_per_batch: int | None) -> list[list[TurnSample]]:
    """Samples split into batches of ``mazes_per_batch`` whole mazes, in rollout order (None: one batch).

    Counted over the mazes that left samples: a group with no advantage leaves none, and
    SkyRL's zero-gradient share of such a mini-batch is not worth a forward pass here.
    """
    if mazes_per_batch is None:
        return [samples]
    mazes = list(dict.fromkeys(s.maze_id for s in samples))
    batch_of = {maze: position // mazes_per_batch for position, maze in enumerate(mazes)}
    batches: dict[int, list[TurnSample]] = {}
    for sample in samples:
        batches.setdefault(batch_of[sample.maze_id], []).append(sample)
    return [batches[key] for key in sorted(batches)]
