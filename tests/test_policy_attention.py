"""Rope positions of whole contexts (mazerl.policy.attention.context_positions) against the model's own."""

import pytest
import torch

from envs.maze import MazeEnv
from mazerl.policy.attention import context_positions, rope_index_owner
from mazerl.policy.chat import Conversation, image_token_id, pixel_inputs, render
from mazerl.policy.loader import load_policy


@pytest.fixture(scope="module")
def policy(starter_model_dir):
    return load_policy(starter_model_dir, device="cpu")


def contexts(processor):
    """Contexts of four layouts: one frame after the task prompt, the same with a feedback line
    (longer text), two frames (the full history), and the task prompt's text alone."""
    env = MazeEnv(size=7, cell_px=16, max_moves=50)
    frame, _ = env.reset(seed=3)
    conversation = Conversation.start(env.prompt(), frame)
    ids = processor.tokenizer("('move', 0)", add_special_tokens=False)["input_ids"]
    first = render(processor, conversation, 1, "all")
    frame, _, _, _, info = env.step("('move', 0)")
    conversation.add_reply(ids, "('move', 0)")
    conversation.add_observation(info["feedback"], frame)
    bumped = render(processor, conversation, 1, "feedback")
    both = render(processor, conversation, "all", "all")
    text = first[0][: first[0].index(image_token_id(processor))]
    return [first, bumped, both, (text, [])]


def test_positions_equal_the_models_and_each_layout_is_computed_once(policy):
    model, processor = policy.model, policy.processor
    owner = rope_index_owner(model)
    rope_index, calls = owner.get_rope_index, []
    owner.get_rope_index = lambda *args, **kwargs: calls.append(1) or rope_index(*args, **kwargs)
    try:
        given = contexts(processor)
        # a fifth context: the first one's layout with other text tokens (another task prompt)
        pad, text_token = image_token_id(processor), given[0][0][0]
        other = [token if token == pad else text_token for token in given[0][0]]
        given.append((other, given[0][1]))
        positions = context_positions(model, processor, [ids for ids, _ in given], [frames for _, frames in given])
        # then each equals the model's own positions for that context, computed fresh
        for (ids, frames), got in zip(given, positions, strict=True):
            input_ids = torch.tensor([ids])
            grid = pixel_inputs(processor, frames)["image_grid_thw"] if frames else None
            token_types = (input_ids == image_token_id(processor)).long()
            expected, _ = rope_index(input_ids, mm_token_type_ids=token_types, image_grid_thw=grid)
            assert torch.equal(got, expected[:, 0])
        # and the four layouts cost four calls (the fifth context shares the first one's)
        assert len(calls) == 4
        # and a caller that changes what it got does not change the next answer
        positions[0].zero_()
        again = context_positions(model, processor, [given[0][0]], [given[0][1]])[0]
        assert torch.equal(again, positions[4]) and again.max() > 0
        assert len(calls) == 4
    finally:
        del owner.get_rope_index
