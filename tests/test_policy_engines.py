"""The hf inference engine: batching with left padding, greedy and seeded sampling, stopping."""

import pytest
import torch

from envs.maze import MazeEnv
from mazerl.policy.chat import Conversation, end_of_turn_id, render
from mazerl.policy.engines import GenerationRequest, GenerationSettings, HFEngine
from mazerl.policy.loader import load_policy


@pytest.fixture(scope="module")
def engine(starter_model_dir):
    torch.set_num_threads(2)
    return HFEngine.from_policy(load_policy(starter_model_dir, device="cpu"), max_batch_size=3)


def requests(processor, seeds, history_turns=0):
    """First-turn (or later, after some fixed moves) contexts of a few mazes: different lengths."""
    out = []
    for index, seed in enumerate(seeds):
        env = MazeEnv(size=7, cell_px=16)
        frame, _ = env.reset(seed=seed)
        conversation = Conversation.start(env.prompt(), frame)
        for _ in range(history_turns * (index % 2)):
            text = "('move', 3)"
            frame, *_, info = env.step(text)
            ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"] + [end_of_turn_id(processor)]
            conversation.add_reply(ids, text)
            conversation.add_observation(info["feedback"], frame)
        out.append(GenerationRequest(*render(processor, conversation, history_images="all")))
    return out


def test_greedy_batched_generation_equals_one_request_at_a_time(engine):
    # given contexts of different lengths (so the batch is left-padded)
    batch = requests(engine.processor, range(5), history_turns=2)
    settings = GenerationSettings(greedy=True, max_new_tokens=12)
    # when generated as one padded batch and one by one
    together = engine.generate(batch, settings)
    alone = [engine.generate([request], settings)[0] for request in batch]
    # then the replies are identical
    assert [r.response_ids for r in together] == [r.response_ids for r in alone]


def test_replies_stop_at_end_of_turn_and_text_has_no_special_tokens(engine):
    results = engine.generate(requests(engine.processor, range(4)), GenerationSettings(max_new_tokens=24))
    eot = end_of_turn_id(engine.processor)
    for result in results:
        assert result.response_ids, "a reply has at least one token"
        assert eot not in result.response_ids[:-1], "nothing is kept after the end-of-turn token"
        assert "<|" not in result.text


def test_max_new_tokens_bounds_the_reply(engine):
    results = engine.generate(requests(engine.processor, range(3)), GenerationSettings(max_new_tokens=2))
    assert all(len(r.response_ids) <= 2 for r in results)


def test_seeded_sampling_is_reproducible_and_seeds_matter(engine):
    # given hot sampling (so replies vary), the same seed twice and another seed
    batch = requests(engine.processor, range(6))
    hot = GenerationSettings(greedy=False, temperature=3.0, top_p=1.0, max_new_tokens=8, seed=11)
    first = [r.response_ids for r in engine.generate(batch, hot)]
    again = [r.response_ids for r in engine.generate(batch, hot)]
    other = [r.response_ids for r in engine.generate(batch, GenerationSettings(**{**hot.__dict__, "seed": 12}))]
    # then the same seed reproduces every reply and another seed changes some
    assert first == again
    assert first != other


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": 0.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_bad_generation_settings_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        GenerationSettings(**fields)


def test_turn_seeds_differ_per_turn_and_stay_none_without_a_seed():
    settings = GenerationSettings(greedy=False, seed=5)
    assert settings.for_turn(0).seed != settings.for_turn(1).seed
    assert settings.for_turn(3) == settings.for_turn(3)
    assert GenerationSettings().for_turn(4).seed is None


def test_special_tokens_other_than_stops_are_never_generated(engine):
    # given replies sampled very hot (nearly uniform over the vocabulary)
    batch = requests(engine.processor, range(8))
    hot = GenerationSettings(greedy=False, temperature=50.0, max_new_tokens=16, seed=3)
    results = engine.generate(batch, hot)
    # then no reply holds an image pad, vision marker or turn opener
    banned = set(engine.banned_ids)
    assert {"<|image_pad|>", "<|im_start|>"} <= set(engine.processor.tokenizer.convert_ids_to_tokens(sorted(banned)))
    assert not any(banned & set(r.response_ids) for r in results)
