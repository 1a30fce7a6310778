"""Prompt rendering (mazerl.policy.chat): token ids, image pads, history, model inputs."""

import numpy as np
import pytest

from envs.maze import DIRECTIONS, MazeEnv, action_text
from mazerl.policy.chat import ChatError, Conversation, end_of_turn_id, image_token_id, model_inputs, render
from mazerl.policy.context_mode import ContextModeError
from mazerl.policy.loader import load_processor
from mazerl.starter.states import REVERSE

CELLS = 49  # 7x7 world at 16 px with 16 px patches and no merging: one image token per cell


def walk_contexts(processor, env, frame, actions, history_text):
    """Play ``actions`` from ``frame``; the conversation and the context rendered before each turn and after the last."""
    conversation = Conversation.start(env.prompt(), frame)
    contexts = [render(processor, conversation, 1, history_text)]
    for action in actions:
        text = action_text(action)
        ids = [*processor.tokenizer(text, add_special_tokens=False)["input_ids"], end_of_turn_id(processor)]
        frame, _, _, _, info = env.step(text)
        conversation.add_reply(ids, text)
        conversation.add_observation(info["feedback"], frame)
        contexts.append(render(processor, conversation, 1, history_text))
    return conversation, contexts


@pytest.fixture(scope="module")
def processor(starter_model_dir):
    return load_processor(starter_model_dir)


def play(processor, turns: int, reply_eot: bool = True) -> tuple[Conversation, list[int]]:
    """A conversation of ``turns`` solver moves on seed 3; returns it and each reply's ids."""
    env = MazeEnv(size=7, cell_px=16, max_moves=50)
    frame, _ = env.reset(seed=3)
    conversation = Conversation.start(env.prompt(), frame)
    replies = []
    for _ in range(turns):
        text = action_text(0)
        ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = [*ids, end_of_turn_id(processor)] if reply_eot else ids
        frame, _, _, _, info = env.step(text)
        conversation.add_reply(ids, text)
        conversation.add_observation(info["feedback"], frame)
        replies.append(ids)
    return conversation, replies


def test_first_turn_is_the_template_with_one_frame_of_49_image_tokens(processor):
    # given the task prompt and the first frame
    conversation, _ = play(processor, 0)
    # when it is rendered
    ids, images = render(processor, conversation, history_images=1)
    # then the ids are the chat template's text with the image pad expanded to one token per cell
    assert len(images) == 1
    assert ids.count(image_token_id(processor)) == CELLS, "expected 49 image tokens (one per maze cell)"
    text = processor.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\nYou are in a 7x7 maze."), text[:60]
    assert text.endswith("<|vision_end|><|im_end|>\n<|im_start|>assistant\n"), text[-60:]


def test_with_all_images_each_context_extends_the_previous_context_and_reply(processor):
    # given a conversation of 4 turns, rendered after each turn with every frame kept
    conversation, replies = play(processor, 4)
    contexts = []
    for turns in range(5):
        partial = Conversation(conversation.observations[: turns + 1], conversation.replies[:turns])
        contexts.append(render(processor, partial, history_images="all")[0])
    # then context t+1 starts with context t followed by reply t, token for token
    for turn in range(4):
        prefix = contexts[turn] + replies[turn]
        assert contexts[turn + 1][: len(prefix)] == prefix, f"turn {turn + 1} does not extend turn {turn}"


def test_a_reply_without_end_of_turn_is_closed_by_the_template(processor):
    # given a reply cut off before its end-of-turn token
    conversation, replies = play(processor, 1, reply_eot=False)
    ids, _ = render(processor, conversation, history_images="all")
    first, _ = render(processor, Conversation(conversation.observations[:1], []), history_images="all")
    # then the reply's ids follow the first context and the template's <|im_end|> closes the turn
    assert ids[len(first) : len(first) + len(replies[0])] == replies[0]
    assert ids[len(first) + len(replies[0])] == end_of_turn_id(processor)


@pytest.mark.parametrize(("history_images", "frames"), [(1, 1), (2, 2), (3, 3), ("all", 6), (10, 6)])
def test_history_images_keeps_the_last_k_frames_and_the_text_of_older_turns(processor, history_images, frames):
    # given 5 turns (6 observations)
    conversation, _ = play(processor, 5)
    # when rendered with the setting
    ids, images = render(processor, conversation, history_images=history_images)
    # then only the last K frames remain, in order, and every feedback text is still there
    assert len(images) == frames
    for got, observation in zip(images, conversation.observations[-frames:], strict=True):
        assert np.array_equal(got, observation.frame)
    assert ids.count(image_token_id(processor)) == CELLS * frames
    text = processor.tokenizer.decode(ids)
    for observation in conversation.observations[1:]:
        assert observation.text in text


@pytest.mark.parametrize("bad", [0, -1, "last", None, 1.5])
def test_bad_history_images_is_refused_with_the_fix(processor, bad):
    conversation, _ = play(processor, 0)
    with pytest.raises(ContextModeError, match="history_images"):
        render(processor, conversation, history_images=bad)


def test_model_inputs_left_pads_and_marks_image_tokens(processor):
    # given two contexts of different lengths
    short, _ = play(processor, 0)
    long, _ = play(processor, 3)
    batch = [render(processor, short, 1), render(processor, long, "all")]
    # when they become tensors
    inputs = model_inputs(processor, [ids for ids, _ in batch], [images for _, images in batch])
    # then rows are left-padded, masks are right, and pixel rows match the image tokens
    lengths = [len(ids) for ids, _ in batch]
    assert inputs["input_ids"].shape == (2, max(lengths))
    assert inputs["attention_mask"].sum(1).tolist() == lengths
    assert inputs["attention_mask"][0, -1] == 1 and inputs["attention_mask"][0, 0] == 0
    assert inputs["input_ids"][0, -lengths[0] :].tolist() == batch[0][0]
    assert inputs["mm_token_type_ids"].sum().item() == CELLS * 5
    assert inputs["image_grid_thw"].tolist() == [[1, 7, 7]] * 5
    assert inputs["pixel_values"].shape[0] == CELLS * 5


def test_model_inputs_refuses_frames_that_do_not_match_the_image_tokens(processor):
    conversation, _ = play(processor, 2)
    ids, images = render(processor, conversation, "all")
    with pytest.raises(ChatError, match="image tokens"):
        model_inputs(processor, [ids], [images[:1]])


def test_fifteen_frames_fit_the_model_context(processor, starter_model_dir):
    # given the longest reference conversation: 15 turns, every frame kept
    from transformers import AutoConfig

    conversation, _ = play(processor, 14)
    ids, images = render(processor, conversation, history_images="all")
    limit = AutoConfig.from_pretrained(starter_model_dir).text_config.max_position_embeddings
    # then it holds 15 frames and stays within the model's context
    assert len(images) == 15
    assert len(ids) < limit, f"{len(ids)} tokens exceed the context of {limit}"


def test_history_text_zero_makes_the_context_a_function_of_the_frame(processor):
    # given 6 turns back and forth (revisiting cells, bumping walls on the way)
    env = MazeEnv(size=7, cell_px=16, max_moves=50)
    frame, _ = env.reset(seed=3)
    conversation = Conversation.start(env.prompt(), frame)
    contexts = [render(processor, conversation, 1, 0)]
    for action in (0, 2, 3, 1, 0, 2):
        text = action_text(action)
        ids = [*processor.tokenizer(text, add_special_tokens=False)["input_ids"], end_of_turn_id(processor)]
        frame, _, _, _, info = env.step(text)
        conversation.add_reply(ids, text)
        conversation.add_observation(info["feedback"], frame)
        contexts.append(render(processor, conversation, 1, 0))
    # then each context is the task prompt with the current frame, one user message
    for (ids, images), observation in zip(contexts, conversation.observations, strict=True):
        assert len(images) == 1 and np.array_equal(images[0], observation.frame)
        assert processor.tokenizer.decode(ids).count("<|im_start|>") == 2  # the user message + the generation prompt
    # and the token ids never change: a context differs from another only by its frame, so
    # identical states give identical contexts
    assert len({tuple(ids) for ids, _ in contexts}) == 1
    assert len({images[0].tobytes() for _, images in contexts}) < len(contexts), "the walk revisits a state"


@pytest.mark.parametrize("history_text", [1, 2, 3])
def test_history_text_k_keeps_the_prompt_and_the_last_k_exchanges(processor, history_text):
    # given 5 turns (replies are all "move right", feedback lines differ by wall bumps)
    conversation, replies = play(processor, 5)
    ids, images = render(processor, conversation, 1, history_text)
    text = processor.tokenizer.decode(ids)
    # then the prompt, K replies and the last K feedback lines are there, and the current frame
    assert text.startswith("<|im_start|>user\n" + conversation.observations[0].text)
    assert text.count("<|im_start|>assistant\n") == history_text + 1  # K replies + the generation prompt
    assert np.array_equal(images[-1], conversation.observations[-1].frame) and len(images) == 1
    for observation in conversation.observations[-history_text:]:
        assert observation.text in text
    # and it is the tail of the full-history context: the same last K exchanges, token for token
    full, _ = render(processor, conversation, 1, "all")
    tail = ids[ids.index(end_of_turn_id(processor)) + 2 :]  # after the prompt message's <|im_end|>\n
    assert full[-len(tail) :] == tail


@pytest.mark.parametrize("bad", [-1, "last", None, 1.5, True])
def test_bad_history_text_is_refused_with_the_fix(processor, bad):
    conversation, _ = play(processor, 0)
    with pytest.raises(ContextModeError, match="history_text"):
        render(processor, conversation, history_images=1, history_text=bad)


def test_history_text_feedback_adds_the_last_feedback_line_only_after_a_reply_that_got_nowhere(processor):
    # given a walk with wall bumps and moves (seed 3: "up" from the start is a wall)
    env = MazeEnv(size=7, cell_px=16, max_moves=50)
    frame, _ = env.reset(seed=3)
    conversation, contexts = walk_contexts(processor, env, frame, (0, 1, 2, 3, 0, 1, 2, 3), "feedback")
    prompt = conversation.observations[0].text
    observations = conversation.observations
    bumps = 0
    for turn, ((ids, images), observation) in enumerate(zip(contexts, observations, strict=True)):
        text = processor.tokenizer.decode(ids)
        # then each context is one user message with the current frame and no past reply
        assert text.count("<|im_start|>") == 2, text  # the user message + the generation prompt
        assert len(images) == 1 and np.array_equal(images[0], observation.frame)
        # and the feedback line follows the prompt exactly when the last reply left the frame unchanged
        stuck = turn > 0 and np.array_equal(observation.frame, observations[turn - 1].frame)
        bumps += stuck
        expected = f"{prompt}\n{observation.text}" if stuck else prompt
        assert text.startswith(f"<|im_start|>user\n{expected}<|vision_start|>"), text[:300]
        assert ("into a wall." in text) == stuck
    assert 0 < bumps < len(contexts) - 1, "the walk both bumps and moves"
    # and a context is a function of (frame, stuck): equal pairs give equal token ids
    keyed: dict[tuple, tuple] = {}
    for turn, (ids, images) in enumerate(contexts):
        stuck = turn > 0 and np.array_equal(images[0], contexts[turn - 1][1][0])
        assert keyed.setdefault((images[0].tobytes(), stuck), tuple(ids)) == tuple(ids)


def test_history_text_feedback_with_more_than_one_frame_is_refused_with_the_fix(processor):
    conversation, _ = play(processor, 1)
    with pytest.raises(ContextModeError, match="history_images: 1"):
        render(processor, conversation, history_images=2, history_text="feedback")


def test_history_text_tried_names_the_replies_given_before_on_the_same_frame(processor):
    # given a walk that leaves the start, bumps a wall, comes back, bumps a wall there and leaves again
    env = MazeEnv(size=7, cell_px=16, max_moves=50)
    frame, _ = env.reset(seed=3)
    walls, start = env.layout.walls, env.layout.agent
    out = next(a for a, (dr, dc) in DIRECTIONS.items() if not walls[start[0] + dr, start[1] + dc])
    beyond = (start[0] + DIRECTIONS[out][0], start[1] + DIRECTIONS[out][1])
    bump_beyond = next(a for a, (dr, dc) in DIRECTIONS.items() if walls[beyond[0] + dr, beyond[1] + dc])
    bump_start = next(a for a, (dr, dc) in DIRECTIONS.items() if walls[start[0] + dr, start[1] + dc])
    actions = (out, bump_beyond, REVERSE[out], bump_start, out)
    conversation, contexts = walk_contexts(processor, env, frame, actions, "tried")
    texts = [processor.tokenizer.decode(ids) for ids, _ in contexts]
    frames = [observation.frame for observation in conversation.observations]
    assert np.array_equal(frames[3], frames[0]) and np.array_equal(frames[4], frames[0]), "back at the start"
    # then the first visit of a frame has no memory line, and the feedback mode's context is kept
    assert "Answered on this frame before" not in texts[0]
    assert texts[1] == processor.tokenizer.decode(
        render(processor, conversation_upto(conversation, 1), 1, "feedback")[0]
    )
    # and back at the start, the line names each reply given there before, once, in order
    assert f"Answered on this frame before: {action_text(out)}." in texts[3], texts[3][:400]
    assert f"Answered on this frame before: {action_text(out)}; {action_text(bump_start)}." in texts[4], texts[4][:400]
    # and the feedback line of the bump comes before it
    assert texts[4].index("into a wall.") < texts[4].index("Answered on this frame before")
    # and each context is still one user message with the current frame
    for (_, images), frame in zip(contexts, frames, strict=True):
        assert len(images) == 1 and np.array_equal(images[0], frame)


def conversation_upto(conversation: Conversation, turns: int) -> Conversation:
    """The first ``turns`` exchanges of a conversation."""
    return Conversation(conversation.observations[: turns + 1], conversation.replies[:turns])


def test_history_text_tried_with_more_than_one_frame_is_refused_with_the_fix(processor):
    conversation, _ = play(processor, 1)
    with pytest.raises(ContextModeError, match="history_images: 1"):
        render(processor, conversation, history_images=2, history_text="tried")


def test_a_reply_free_context_seen_before_is_taken_from_memory_as_the_template_renders_it(starter_model_dir):
    # given a processor of its own (an empty memo) that counts its chat-template calls
    processor = load_processor(starter_model_dir)
    template, calls = processor.apply_chat_template, []
    processor.apply_chat_template = lambda *args, **kwargs: calls.append(1) or template(*args, **kwargs)
    # and a walk out of the start and back, twice, in two one-frame modes
    env = MazeEnv(size=7, cell_px=16, max_moves=50)
    frame, _ = env.reset(seed=3)
    walls, start = env.layout.walls, env.layout.agent
    out = next(a for a, (dr, dc) in DIRECTIONS.items() if not walls[start[0] + dr, start[1] + dc])
    actions = (out, REVERSE[out], out, REVERSE[out])
    for history_text in (0, "tried"):
        calls.clear()
        conversation, contexts = walk_contexts(processor, env, env.reset(seed=3)[0], actions, history_text)
        # then each context reads as a never-used processor renders it (the template applied afresh)
        for turns, (ids, _) in enumerate(contexts):
            fresh = load_processor(starter_model_dir)
            assert ids == render(fresh, conversation_upto(conversation, turns), 1, history_text)[0]
        # and a text seen before cost no template call (the frame counts by its size alone): with 0
        # every context reads the task prompt; with "tried" the first visits read it too (known from
        # the walk with 0), the two returns add a memory line each, and the start's third visit
        # repeats its memory line (the same reply, named once)
        assert len(calls) == {0: 1, "tried": 2}[history_text], history_text
    # and a caller that changes the ids it got does not change what the next render returns
    conversation, contexts = walk_contexts(processor, env, env.reset(seed=3)[0], actions[:1], 0)
    contexts[0][0].append(-1)
    assert render(processor, conversation_upto(conversation, 0), 1, 0)[0] == contexts[0][0][:-1]
