"""The prefix-caching hf engine against its oracles: transformers' generate and a fresh full forward.

Given the reduced starter, the engine must give the same greedy replies as HFEngine maze by
maze in every context mode (Markov contexts deduplicated, full-history contexts continuing
their KV cache across turns with new frames), and the log-probs it reports for sampled
replies must be those of a fresh forward of each context and reply. The same comparison
on all 256 mazes with the full starter is in bench/engine_equality.py.
"""

import pytest
import torch

from envs.evalset import load as load_eval_set
from mazerl.policy.engines import GenerationRequest, GenerationSettings, HFEngine
from mazerl.policy.episodes import run_episodes
from mazerl.policy.loader import load_policy
from mazerl.policy.prefix_engine import PrefixCachingEngine
from mazerl.training.per_turn_oracle import reply_log_probs
from mazerl.training.scoring import TurnSample

MODES = [(1, 1), (1, 0), (1, "feedback"), (1, "tried"), (1, "all"), ("all", "all")]  # (history_images, history_text)


@pytest.fixture(scope="module")
def policy(starter_model_dir):
    torch.set_num_threads(2)
    return load_policy(starter_model_dir, device="cpu")


@pytest.fixture(scope="module")
def layouts():
    return list(load_eval_set("maze256-small-v1").layouts[:12])


def play(engine, policy, layouts, settings, mode, max_moves=6):
    return run_episodes(
        engine, policy.processor, layouts, settings, max_moves=max_moves, history_images=mode[0], history_text=mode[1]
    )


@pytest.mark.parametrize("mode", MODES)
def test_greedy_replies_equal_generate_maze_by_maze(policy, layouts, mode):
    # given the same mazes played greedily through transformers' generate and the prefix-caching engine
    greedy = GenerationSettings(greedy=True, max_new_tokens=12)
    reference = play(HFEngine(policy.model, policy.processor, 32), policy, layouts, greedy, mode)
    engine = PrefixCachingEngine(policy.model, policy.processor)
    episodes = play(engine, policy, layouts, greedy, mode)
    # then every maze gets the same replies, token for token
    for maze, (a, b) in enumerate(zip(reference, episodes, strict=True)):
        assert [t.response_ids for t in a.turns] == [t.response_ids for t in b.turns], f"maze {maze} differs"
        assert [t.input_ids for t in a.turns] == [t.input_ids for t in b.turns]
    stats = engine.stats
    assert stats.prefill_tokens < stats.context_tokens, "shared prompt text (and kept prefixes) are not recomputed"
    if mode == ("all", "all"):
        # contexts extend the previous turn's: most of each context comes from the kept cache
        assert stats.reused_tokens > stats.context_tokens / 2, stats


@pytest.mark.parametrize("mode", MODES)
def test_sampled_reply_log_probs_equal_a_fresh_forward(policy, layouts, mode):
    # given 3 mazes x 4 samples at temperature 1 (shared first contexts, replies that diverge)
    settings = GenerationSettings(greedy=False, temperature=1.0, max_new_tokens=8, seed=5)
    group = [layout for layout in layouts[:3] for _ in range(4)]
    episodes = play(PrefixCachingEngine(policy.model, policy.processor), policy, group, settings, mode, max_moves=5)
    samples = [TurnSample(t.input_ids, t.images, t.response_ids, 0.0) for e in episodes for t in e.turns]
    reported = [t.log_probs for e in episodes for t in e.turns]
    # when every turn's context and reply are scored from scratch, one sequence each
    with torch.no_grad():
        fresh, mask = reply_log_probs(policy.model, policy.processor, samples, torch.device("cpu"), 1.0)
    # then the engine's log-probs agree within 1e-4, token by token
    for row, (sample, logps) in enumerate(zip(samples, reported, strict=True)):
        expected = fresh[row, -len(sample.response_ids) :].tolist()
        assert logps == pytest.approx(expected, abs=1e-4), f"turn {row}: {logps} vs {expected}"


def test_identical_requests_are_computed_once_and_sampling_is_seeded(policy, layouts):
    # given 8 copies of one first context and 2 of another
    first = play(HFEngine(policy.model, policy.processor), policy, layouts[:2], GenerationSettings(), (1, 1), 1)
    requests = [GenerationRequest(first[0].turns[0].input_ids, first[0].turns[0].images)] * 8
    requests += [GenerationRequest(first[1].turns[0].input_ids, first[1].turns[0].images)] * 2
    hot = GenerationSettings(greedy=False, temperature=3.0, max_new_tokens=6, seed=11)
    engine = PrefixCachingEngine(policy.model, policy.processor)
    once = engine.generate(requests, hot)
    # then two contexts were prefilled, each request drew its own reply, and the seed reproduces them
    assert engine.stats.contexts == 2 and engine.stats.requests == 10
    assert len({tuple(r.response_ids) for r in once[:8]}) > 1, "samples of one context draw independently"
    again = PrefixCachingEngine(policy.model, policy.processor).generate(requests, hot)
    assert [r.response_ids for r in once] == [r.response_ids for r in again]
    banned = set(engine.suppressed.tolist())
    assert not any(banned & set(r.response_ids) for r in once), "special tokens other than stops are never drawn"
