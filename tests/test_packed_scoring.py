"""The packed GRPO scoring against the per-turn oracle: same loss, same gradients, fewer tokens;
with the shared task prompt computed once per micro-batch and without.

Recorded episodes of the reduced starter (4 samples of each of 2 mazes, so contexts and
replies repeat) are scored both ways under a LoRA adapter with non-zero weights. Each
sample has its own advantage (signs differ between samples of one context) and its own
old log-probs (so the clip is active for some tokens): a packing that summed advantages
of shared tokens, or mixed up which sample a log-prob belongs to, would change the loss.
"""

from functools import partial

import pytest
import torch

from envs.evalset import load as load_eval_set
from mazerl.policy.engines import GenerationSettings
from mazerl.policy.episodes import run_episodes
from mazerl.policy.loader import load_policy
from mazerl.policy.prefix_engine import PrefixCachingEngine
from mazerl.training.grpo import clipped_surrogate, reduce_token_mean
from mazerl.training.lora_adapter import language_model_lora_pattern
from mazerl.training.per_turn_oracle import PerTurnScorer
from mazerl.training.scoring import PackedScorer, TurnSample

LOSS_TOLERANCE = 1e-6  # absolute, on a loss of order 0.1-1 (float32 sums in another order)
GRAD_TOLERANCE = 1e-6  # absolute, on gradients of order 1e-2


@pytest.fixture(scope="module")
def lora_model(starter_model_dir):
    from peft import LoraConfig, get_peft_model

    torch.set_num_threads(2)
    policy = load_policy(starter_model_dir, device="cpu")
    torch.manual_seed(0)
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=language_model_lora_pattern(("q_proj", "v_proj", "down_proj")),
        init_lora_weights=False,
    )
    model = get_peft_model(policy.model, config)
    model.train()
    return model, policy.processor


def recorded(model, processor, mode):
    layouts = [layout for layout in load_eval_set("maze256-small-v1").layouts[:2] for _ in range(4)]
    settings = GenerationSettings(greedy=False, temperature=1.0, max_new_tokens=6, seed=3)
    with torch.no_grad():
        episodes = run_episodes(
            PrefixCachingEngine(model, processor), processor, layouts, settings, max_moves=5,
            history_images=mode[0], history_text=mode[1],
        )  # fmt: skip
    return [
        TurnSample(t.input_ids, t.images, t.response_ids, (-1.0) ** number * (1 + number / 8), e.maze_id, number)
        for number, e in enumerate(episodes)
        for t in e.turns
    ]


def loss_and_gradients(model, processor, scorer_class, samples):
    """Token-mean clipped surrogate over all samples; old log-probs = current ones shifted per sample."""
    scorer = scorer_class(model, processor, torch.device("cpu"), 1.0)
    total = sum(len(s.response_ids) for s in samples)
    model.zero_grad(set_to_none=True)
    loss_sum, log_probs_of = 0.0, {}
    for chunk in scorer.prepare(samples):
        log_probs, mask = scorer.log_probs(chunk)  # (B, R), right-aligned replies
        width = log_probs.shape[1]
        index = torch.tensor(chunk.samples, dtype=torch.float32).unsqueeze(1)
        shift = 0.3 * torch.sin(7 * index + torch.arange(width) - width)  # depends on (sample, token) only
        advantages = torch.tensor([samples[i].advantage for i in chunk.samples]).unsqueeze(1)
        per_token, _ = clipped_surrogate(log_probs, log_probs.detach() + shift, advantages, 0.2, 0.2)
        loss = reduce_token_mean(per_token, mask, total)
        loss.backward()
        loss_sum += loss.item()
        for row, i in enumerate(chunk.samples):
            log_probs_of[i] = log_probs[row, width - len(samples[i].response_ids) :].detach()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    return loss_sum, gradients, log_probs_of, scorer.stats


@pytest.mark.parametrize("mode", [(1, 1), (1, 0), (1, "feedback"), (1, "tried"), (1, "all"), ("all", "all")])
def test_packed_loss_and_gradients_equal_per_turn_scoring(lora_model, mode):
    model, processor = lora_model
    samples = recorded(model, processor, mode)
    oracle = loss_and_gradients(model, processor, PerTurnScorer, samples)
    plain = loss_and_gradients(model, processor, partial(PackedScorer, share_prefix=False), samples)
    packed = loss_and_gradients(model, processor, PackedScorer, samples)
    assert any(g.abs().max() > 1e-4 for g in oracle[1].values()), "the gradients compared are not all zero"
    for scored, what in ((plain, "plain packing"), (packed, "prompt shared")):
        assert scored[0] == pytest.approx(oracle[0], abs=LOSS_TOLERANCE), f"loss, {what}"
        for name, expected in oracle[1].items():
            assert torch.allclose(scored[1][name], expected, atol=GRAD_TOLERANCE, rtol=0), f"gradient of {name}, {what}"
        for i, expected in oracle[2].items():
            assert torch.allclose(scored[2][i], expected, atol=1e-5), f"log-probs of sample {i}, {what}"
    # the packing computed fewer tokens than exist (shared first contexts at least), and sharing
    # the task prompt fewer again
    assert plain[3]["tokens_computed"] < plain[3]["tokens_existing"] == oracle[3]["tokens_computed"]
    assert packed[3]["tokens_computed"] < plain[3]["tokens_computed"], "the task prompt was computed once per batch"


def test_an_extending_episode_is_one_row(lora_model):
    from mazerl.training.scoring import pack

    model, processor = lora_model
    samples = recorded(model, processor, ("all", "all"))
    packed = pack(samples, model, processor)
    episodes = {s.episode for s in samples}
    assert len(packed.rows) <= len(episodes), "each episode's turns are read inside one trunk"
    for sample, row, tokens in zip(samples, packed.sample_row, packed.sample_tokens, strict=True):
        assert [packed.rows[row].ids[t] for t in tokens] == sample.response_ids
