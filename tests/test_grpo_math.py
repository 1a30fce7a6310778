"""GRPO advantages and losses on hand-written tensors (SkyRL's definitions)."""

import math

import pytest
import torch

from mazerl.training.grpo import (
    LOSS_REDUCTIONS,
    anchor_advantages,
    clipped_surrogate,
    discounted_returns,
    group_advantages,
    k3_kl,
    turn_advantages,
)


def test_advantage_is_group_relative_with_unbiased_std():
    # Given two groups of 4 episodes, when rewards differ within a group, then each is
    # (r - mean) / (unbiased std + 1e-6).
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    groups = ["a"] * 4 + ["b"] * 4
    adv = group_advantages(rewards, groups)
    std_a = math.sqrt(((0.75**2) + 3 * (0.25**2)) / 3)
    assert adv[0].item() == pytest.approx(0.75 / (std_a + 1e-6))
    assert adv[1].item() == pytest.approx(-0.25 / (std_a + 1e-6))
    std_b = math.sqrt(4 * 0.25 / 3)
    assert adv[4].item() == pytest.approx(0.5 / (std_b + 1e-6))
    assert adv[4:].sum().item() == pytest.approx(0.0, abs=1e-6)


def test_uniform_group_has_zero_advantage_and_singleton_keeps_reward():
    adv = group_advantages([1.0, 1.0, 1.0, 0.7], ["g", "g", "g", "solo"])
    assert torch.equal(adv[:3], torch.zeros(3)), "all-equal rewards carry no signal"
    assert adv[3].item() == pytest.approx(0.7 / (1 + 1e-6)), "a group of one: mean 0, std 1 (SkyRL)"


@pytest.mark.parametrize("reward", [1.9, 4.8, 0.2])
def test_a_group_of_equal_rewards_that_do_not_average_exactly_still_has_zero_advantage(reward):
    # Given 8 equal rewards whose float32 mean is off by rounding (1.9: 1.2e-7 below), when normalised
    # in their group, then every advantage is exactly 0, not that rounding divided by 0 + 1e-6.
    assert torch.tensor([reward] * 8).mean().item() != torch.tensor(reward).item()
    assert torch.equal(group_advantages([reward] * 8, ["g"] * 8), torch.zeros(8))


def test_groups_need_not_be_contiguous():
    a = group_advantages([1.0, 0.0, 0.0, 1.0], [1, 2, 1, 2])
    b = group_advantages([1.0, 0.0, 0.0, 1.0], [1, 1, 2, 2])
    assert a[0] == b[0] and a[2] == b[1]


def test_clipped_surrogate_matches_hand_computation():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
    new = torch.log(torch.tensor([[0.5, 0.75, 0.25, 0.75]]))  # ratios 1, 1.5, 0.5, 1.5
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0]])
    loss, clipped = clipped_surrogate(new, old, adv, clip_low=0.2, clip_high=0.2)
    # ratio 1 -> -1; ratio 1.5, A>0 -> clipped at 1.2 -> -1.2; ratio 0.5, A>0 -> min(0.5, 0.8) = 0.5 -> -0.5;
    # ratio 1.5, A<0 -> min(-1.5, -1.2) = -1.5 -> 1.5
    assert loss[0].tolist() == pytest.approx([-1.0, -1.2, -0.5, 1.5])
    assert clipped.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_surrogate_gradient_vanishes_outside_the_clip():
    old = torch.zeros(1, 2)
    new = torch.tensor([[0.5, 0.05]], requires_grad=True)  # ratio e^0.5 = 1.65 (clipped), e^0.05 (inside)
    loss, _ = clipped_surrogate(new, old, torch.ones(1, 2), 0.2, 0.2)
    loss.sum().backward()
    assert new.grad[0, 0].item() == 0.0
    assert new.grad[0, 1].item() == pytest.approx(-math.exp(0.05))


def test_token_mean_over_micro_batches_equals_one_big_batch():
    # Given per-token losses split into two micro-batches of different lengths, the
    # token_mean over the mini-batch equals the mean over all unmasked tokens.
    reduce, normaliser = LOSS_REDUCTIONS["token_mean"]
    l1, m1 = torch.tensor([[1.0, 2.0, 9.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    l2, m2 = torch.tensor([[3.0], [4.0]]), torch.tensor([[1.0], [1.0]])
    total = normaliser([m1, m2])
    assert total == 4
    combined = reduce(l1, m1, total) + reduce(l2, m2, total)
    assert combined.item() == pytest.approx((1 + 2 + 3 + 4) / 4)


def test_sequence_mean_averages_within_then_across_sequences():
    reduce, normaliser = LOSS_REDUCTIONS["sequence_mean"]
    losses = torch.tensor([[1.0, 3.0, 0.0], [6.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert reduce(losses, mask, normaliser([mask])).item() == pytest.approx((2.0 + 6.0) / 2)


def test_k3_kl_is_zero_at_equality_and_positive_otherwise():
    logp = torch.log(torch.tensor([0.2, 0.5, 0.9]))
    assert torch.allclose(k3_kl(logp, logp), torch.zeros(3))
    assert (k3_kl(logp, torch.log(torch.tensor([0.4, 0.3, 0.8]))) > 0).all()


def test_turn_advantages_add_each_turns_shaping_less_its_group_mean():
    # Given two episodes of one maze (outcome advantages +1 and -1) and one of another maze,
    # with hand-picked per-turn shaping rewards.
    outcome = [1.0, -1.0, 0.5]
    shaping = [[0.5, -0.5], [0.5, 0.5, -0.5, -0.5], [0.25]]
    groups = ["a", "a", "b"]
    # When the turn advantages are computed,
    advantages = turn_advantages(outcome, shaping, groups)
    # then each turn gets its episode's advantage + its own reward - the mean over the group's turns
    # (group a: six turns summing to 0, mean 0; group b: one turn, mean 0.25).
    assert advantages == [[1.5, 0.5], [-0.5, -0.5, -1.5, -1.5], [0.5]]


def test_turn_advantages_keep_the_outcome_when_every_turn_earned_the_same():
    advantages = turn_advantages([0.7, -0.7], [[0.5, 0.5], [0.5]], ["g", "g"])
    assert advantages == [[pytest.approx(0.7)] * 2, [pytest.approx(-0.7)]]


def test_a_perfect_group_gets_exactly_zero_turn_advantages_so_the_trainer_skips_it():
    # Given a maze whose 8 episodes all solved (outcome advantages 0) with every move the solver's
    # (+0.3 each, 5 turns): sum([0.3] * 40) / 40 is not 0.3 in floating point,
    assert sum([0.3] * 40) / 40 != 0.3
    # when the turn advantages are computed, then every one is exactly 0 (the trainer skips a
    # turn of advantage 0: no gradient), and a group beside it with mixed rewards keeps its credit.
    advantages = turn_advantages([0.0] * 8 + [0.5, -0.5], [[0.3] * 5] * 8 + [[0.3], [-0.3]], ["g"] * 8 + ["h"] * 2)
    assert all(value == 0.0 for episode in advantages[:8] for value in episode)
    assert advantages[8:] == [[pytest.approx(0.8)], [pytest.approx(-0.8)]]


def test_turn_advantages_refuse_mismatched_lengths():
    with pytest.raises(ValueError, match="one of each per episode"):
        turn_advantages([1.0], [[0.0], [0.0]], ["g"])


def test_discounted_returns_are_each_turns_reward_plus_the_discounted_rest():
    assert discounted_returns([0.0, -0.1, 1.0], 0.5) == [pytest.approx(0.2), pytest.approx(0.4), 1.0]


def test_anchor_advantages_normalise_each_turns_return_among_the_turns_from_the_same_state():
    # Given one maze's two episodes: the first leaves the start S, passes X and solves at T; the second
    # bumps at S (-0.1), goes to Y, comes back to S and ends at Z unsolved; and another maze's episode,
    # also at a state keyed S (a different maze: a different anchor group). Discount 0.5, weight 2.
    rewards = [[0.0, 0.0, 1.0], [-0.1, 0.0, 0.0, 0.0], [1.0]]
    states = [["S", "X", "T"], ["S", "Y", "S", "Z"], ["S"]]
    advantages = anchor_advantages([1.0, -1.0, 0.0], rewards, states, ["a", "a", "b"], discount=0.5, weight=2.0)
    # Returns: first 0.25 / 0.5 / 1; second -0.1 / 0 / 0 / 0. The anchor group (a, S) holds the three turns
    # from S: 0.25, -0.1 and 0 (mean 0.05, unbiased std sqrt(0.0325)); every other state was met once (no step
    # advantage), the other maze's S included.
    std = math.sqrt(((0.25 - 0.05) ** 2 + (-0.1 - 0.05) ** 2 + (0 - 0.05) ** 2) / 2) + 1e-6
    expected = [
        [1.0 + 2 * (0.25 - 0.05) / std, 1.0, 1.0],
        [-1.0 + 2 * (-0.1 - 0.05) / std, -1.0, -1.0 + 2 * (0.0 - 0.05) / std, -1.0],
        [0.0],
    ]
    assert advantages == [[pytest.approx(value) for value in episode] for episode in expected]


def test_anchor_advantages_without_a_revisited_state_are_the_episodes():
    advantages = anchor_advantages([0.5, -0.5], [[1.0], [0.0, 0.0]], [["A"], ["B", "C"]], ["g", "g"], 0.9, 1.0)
    assert advantages == [[0.5], [-0.5, -0.5]]
    with pytest.raises(ValueError, match="one of each per episode"):
        anchor_advantages([0.5], [[1.0]], [["A"], ["B"]], ["g"], 0.9, 1.0)


def test_the_decision_mask_is_the_reply_mask_less_the_stop_tokens():
    from mazerl.training.scoring import TurnSample, decision_mask, reply_mask

    # Given replies right-aligned in the loss layout: one that ended (action, stop), one cut off
    # at the token budget (no stop), one with a stop id inside it (the starter's pad id is a stop too),
    def sample(reply):
        return TurnSample(input_ids=[1], images=[], response_ids=reply, advantage=0.0)

    # and an empty reply (the stop token alone),
    samples = [sample([423, 2]), sample([423, 7, 7, 7]), sample([0, 423, 2]), sample([2])]
    # then every reply token is kept but the stop tokens, except one that opens a reply: the empty reply's
    # only token is its decision, and leaving it out would leave nothing to train empty replies away,
    assert decision_mask(samples, {2, 0}, torch.device("cpu")).tolist() == [
        [0.0, 0.0, 1.0, 0.0],
        [1.0, 1.0, 1.0, 1.0],
        [0.0, 1.0, 1.0, 0.0],
        [0.0, 0.0, 0.0, 1.0],
    ]
    # inside the reply mask's positions.
    assert reply_mask(samples, torch.device("cpu")).tolist() == [[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1]]


def test_anchor_credit_is_refused_with_the_solvers_progress_term():
    from mazerl.training.config import GrpoConfig

    with pytest.raises(ValueError, match=r"progress_reward \(0.3\) needs the maze's solver.*credit: anchor"):
        GrpoConfig(credit="anchor", progress_reward=0.3)
    assert GrpoConfig(credit="anchor", bump_cost=0.1).anchor_discount == 0.95
