"""Conversations -> token ids + images: the one place where prompts are rendered.

Both the episode runner (rollouts, eval) and the starter's warm-start build their model
contexts here, and the trainer turns recorded contexts back into tensors with
:func:`model_inputs`, so what the policy is trained on is exactly what it saw.

A conversation is the task prompt with the first frame, then alternating assistant
replies and observations (the env's feedback text with the next frame). Rendering applies
the model's own chat template to the messages and then splices in each reply's *generated
token ids* verbatim instead of re-tokenising its text, so a recorded context always
extends the previous turn's context plus its reply, token for token, whatever the
tokenizer would have made of the decoded text.

Two settings say how much of the past a context shows (the *context mode*):

- ``history_text``: how many past exchanges (a reply and the feedback after it) stay in the
  context as text. ``"all"`` (the reference) keeps every one; K keeps the task prompt and the
  last K exchanges; 0 keeps the task prompt alone, with the current frame attached to it.
  ``"feedback"`` is 0 plus the last feedback line when the last reply left the frame unchanged
  (a wall bump, an unreadable reply: "Cannot move up into a wall."), and no reply. With 0, 1 or
  ``"feedback"`` a context is a function of the state the policy is in (its frame; with
  ``"feedback"`` also whether the last reply got nowhere; with 1 the last reply and feedback), so
  identical states give identical contexts, which the inference and scoring paths compute once
  (a Markov policy: the maze's optimal action depends on the frame alone). With 0 a greedy
  policy that bumps a wall sees the same context again and bumps forever; with ``"feedback"``
  the context after a bump differs, so the policy can answer differently. A successful move's
  line ("Moved up.") is left out on purpose: the last move gives the answer away in every dead
  end ("go back"), which taught a starter trained with 1 to swing back and forth.
  ``"tried"`` is ``"feedback"`` plus a memory line naming the replies given earlier in the episode
  on the same frame ("Answered on this frame before: ('move', 3)."): back at a junction after a
  dead end, the context differs from the first visit's, so a policy that took the wrong branch
  can take another (with one frame it sees the same context and repeats itself). The context is
  then a function of the state and of what was tried from it.
- ``history_images``: the frames of the last K shown observations (``"all"``: every frame, as
  the reference does); older shown observations keep their feedback text only.

User messages put the text before the image (as the skyrl-gym adapter does), so dropping an
old frame never changes the tokens before it. With both settings ``"all"`` every context
extends the previous context plus its reply, token for token.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from mazerl.policy.context_mode import CURRENT_FRAME_MODES, HistoryImages, HistoryText, check_context_mode
from mazerl.policy.memo import memo_of

# Private-use characters: never produced by a tokenizer's decode of ordinary text, and
# passed through unchanged by chat templates.
_REPLY_MARKER = "\ue000mazerl-reply-{}\ue001"


class ChatError(ValueError):
    """A conversation or token sequence that cannot be turned into model inputs."""


@dataclass
class Observation:
    """What the environment showed: feedback (or the task prompt) and the frame."""

    text: str
    frame: np.ndarray


@dataclass
class Reply:
    """What the policy answered: the generated ids (end-of-turn token included when produced)."""

    response_ids: list[int]
    text: str


@dataclass
class Conversation:
    """One episode's dialogue; ``observations[i]`` precedes ``replies[i]``."""

    observations: list[Observation] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)

    @staticmethod
    def start(prompt: str, frame: np.ndarray) -> Conversation:
        return Conversation(observations=[Observation(prompt, frame)])

    def add_reply(self, response_ids: list[int], text: str) -> None:
        if len(self.replies) != len(self.observations) - 1:
            raise ChatError("add_reply: the conversation does not end with an observation")
        self.replies.append(Reply(list(response_ids), text))

    def add_observation(self, text: str, frame: np.ndarray) -> None:
        if len(self.replies) != len(self.observations):
            raise ChatError("add_observation: the conversation does not end with a reply")
        self.observations.append(Observation(text, frame))


def _special_id(tokenizer: Any, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ChatError(f"the tokenizer has no {token!r} token; mazerl needs a Qwen-VL style tokenizer")
    return int(token_id)


def image_token_id(processor: Any) -> int:
    return int(getattr(processor, "image_token_id", None) or _special_id(processor.tokenizer, "<|image_pad|>"))


def end_of_turn_id(processor: Any) -> int:
    """The token that closes an assistant reply (``<|im_end|>`` for Qwen chat templates)."""
    return _special_id(processor.tokenizer, "<|im_end|>")


def pad_id(processor: Any) -> int:
    tokenizer = processor.tokenizer
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_of_turn_id(processor))


def image_tokens_per_frame(processor: Any, height: int, width: int) -> int:
    """How many ``<|image_pad|>`` tokens one frame of this size becomes."""
    image_processor = processor.image_processor
    patches = image_processor.get_number_of_image_patches(height, width, {})
    return int(patches // image_processor.merge_size**2)


TRIED_PREFIX = "Answered on this frame before: "  # history_text "tried": the memory line's opening words


def answered_on_frame(conversation: Conversation) -> list[str]:
    """The distinct replies given earlier in the episode on the frame the policy sees now, in order.

    A frame shows the whole maze and the agent, so an identical frame is the same cell: this is
    the memory a branch can be undone with (a dead end's way back leads to a junction whose
    frame the policy has answered before), taken from the policy's own frames and replies.
    """
    observations = conversation.observations
    frame = observations[-1].frame
    answered: list[str] = []
    for reply, seen in zip(conversation.replies, observations, strict=False):
        text = " ".join(reply.text.split())
        if text and text not in answered and np.array_equal(seen.frame, frame):
            answered.append(text)
    return answered


def _messages(
    conversation: Conversation, history_images: HistoryImages, history_text: HistoryText
) -> tuple[list[dict], list[np.ndarray], list[int]]:
    """Chat messages of the context, its frames in order, and the indices of the replies it shows."""
    observations = conversation.observations
    current = len(observations) - 1
    if history_text in CURRENT_FRAME_MODES:
        frame = observations[current].frame
        lines = [observations[0].text]
        if current > 0 and np.array_equal(frame, observations[current - 1].frame):
            lines.append(observations[current].text)  # the last reply got nowhere: say why
        if history_text == "tried" and (answered := answered_on_frame(conversation)):
            lines.append(f"{TRIED_PREFIX}{'; '.join(answered)}.")
        return (
            [{"role": "user", "content": [{"type": "text", "text": "\n".join(lines)}, {"type": "image"}]}],
            [observations[current].frame],
            [],
        )
    first_exchange = 0 if history_text == "all" or current <= history_text else current - history_text
    # Shown observations: the task prompt, then the one after each shown reply. With no exchange
    # shown (history_text 0, after the first turn) the current frame joins the task prompt.
    shown = [0, *range(first_exchange + 1, current + 1)]
    framed = shown if history_images == "all" else shown[-history_images:]
    messages: list[dict] = []
    images: list[np.ndarray] = []
    for position, index in enumerate(shown):
        if position > 0:
            messages.append({"role": "assistant", "content": _REPLY_MARKER.format(index - 1)})
        content: list[dict] = [{"type": "text", "text": observations[index].text}]
        if index in framed:
            frame = observations[current if len(shown) == 1 else index].frame
            content.append({"type": "image"})
            images.append(frame)
        messages.append({"role": "user", "content": content})
    return messages, images, [index - 1 for index in shown[1:]]


def render(
    processor: Any,
    conversation: Conversation,
    history_images: HistoryImages = "all",
    history_text: HistoryText = "all",
) -> tuple[list[int], list[np.ndarray]]:
    """The context the policy sees next: token ids (image pads expanded) and its frames, in order."""
    check_context_mode(history_images, history_text)
    if len(conversation.observations) != len(conversation.replies) + 1:
        raise ChatError("render: the conversation must end with an observation (the policy's turn)")
    messages, images, shown_replies = _messages(conversation, history_images, history_text)
    if shown_replies:
        return _template_ids(processor, conversation, messages, images, shown_replies), images
    # No reply spliced in (a current-frame mode, or a first turn): the ids are a function of the
    # messages and the frame sizes alone, and a rollout renders the same few contexts over and
    # over (a revisited state): the chat template and tokenizer were a seventh of its time.
    memo = memo_of(processor, "rendered", _RENDERED_KEPT)
    key = (repr(messages), tuple(image.shape[:2] for image in images))
    ids = memo.get(key)
    if ids is None:
        ids = memo[key] = _template_ids(processor, conversation, messages, images, [])
    return list(ids), images


# Rendered ids of reply-free contexts kept per processor (whose chat template and tokenizer do not
# change once loaded): a few MB; a step revisits a few thousand contexts.
_RENDERED_KEPT = 16_384


def _template_ids(
    processor: Any,
    conversation: Conversation,
    messages: list[dict],
    images: list[np.ndarray],
    shown_replies: list[int],
) -> list[int]:
    """The chat template over ``messages``, with each shown reply's generated ids spliced in verbatim."""
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    tokenizer = processor.tokenizer
    eot = end_of_turn_id(processor)
    ids: list[int] = []
    rest = text
    for index in shown_replies:
        reply = conversation.replies[index]
        before, found, rest = rest.partition(_REPLY_MARKER.format(index))
        if not found:
            raise ChatError(f"the chat template dropped assistant reply {index}; mazerl needs one that renders them")
        ids += tokenizer(before, add_special_tokens=False)["input_ids"]
        ids += reply.response_ids
        if reply.response_ids and reply.response_ids[-1] == eot:
            # The reply already closed its turn; the template's own end-of-turn token is redundant.
            rest = rest.removeprefix(tokenizer.convert_ids_to_tokens(eot))
    ids += tokenizer(rest, add_special_tokens=False)["input_ids"]
    return _expand_image_pads(processor, ids, images)


def _expand_image_pads(processor: Any, ids: list[int], images: list[np.ndarray]) -> list[int]:
    pad = image_token_id(processor)
    positions = [i for i, token in enumerate(ids) if token == pad]
    if len(positions) != len(images):
        raise ChatError(f"the rendered text holds {len(positions)} image placeholders for {len(images)} frames")
    expanded: list[int] = []
    start = 0
    for position, image in zip(positions, images, strict=True):
        expanded += ids[start:position]
        expanded += [pad] * image_tokens_per_frame(processor, image.shape[0], image.shape[1])
        start = position + 1
    return expanded + ids[start:]


# --------------------------------------------------------------------------------------
# Recorded contexts -> tensors (engines and the trainer both call this)
# --------------------------------------------------------------------------------------


def _preprocessed(image_processor: Any, frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One frame's (pixel_values, image_grid_thw), kept by content per image processor.

    Rollouts re-send the same frames turn after turn (a 7x7 maze has only 17 agent positions,
    and with ``history_images="all"`` every past frame is sent again), and preprocessing costs
    about 1 ms per frame, so the most recently used 256 MiB of them are kept.
    """
    memo = memo_of(image_processor, "pixels", _PIXELS_KEPT_BYTES, getsizeof=lambda value: value[0].nbytes)
    frame = np.ascontiguousarray(frame, dtype=np.uint8)
    key = (frame.shape, hashlib.blake2b(frame.tobytes(), digest_size=16).digest())
    value = memo.get(key)
    if value is None:
        out = image_processor(images=[frame], return_tensors="np")
        value = memo[key] = (np.asarray(out["pixel_values"], dtype=np.float32), np.asarray(out["image_grid_thw"]))
    return value


_PIXELS_KEPT_BYTES = 256 * 2**20


def frame_grids(processor: Any, frames: list[np.ndarray]) -> torch.Tensor:
    """``image_grid_thw`` (images, 3) of frames in order, without assembling their pixels."""
    return torch.from_numpy(np.concatenate([_preprocessed(processor.image_processor, f)[1] for f in frames])).long()


def pixel_inputs(processor: Any, frames: list[np.ndarray]) -> dict[str, torch.Tensor]:
    """``pixel_values`` (patches, dim) and ``image_grid_thw`` (images, 3) for frames in order."""
    parts = [_preprocessed(processor.image_processor, frame) for frame in frames]
    return {
        "pixel_values": torch.from_numpy(np.concatenate([p for p, _ in parts])),
        "image_grid_thw": torch.from_numpy(np.concatenate([g for _, g in parts])).long(),
    }


def model_inputs(
    processor: Any,
    batch_of_input_ids: list[list[int]],
    batch_of_images: list[list[np.ndarray]],
    padding_side: Literal["left", "right"] = "left",
) -> dict[str, torch.Tensor]:
    """Recorded contexts -> ``input_ids``, ``attention_mask``, ``mm_token_type_ids``, ``pixel_values``, ``image_grid_thw``.

    Left padding (the default) puts every sequence's last token in the last column, which
    generation and reply scoring (``logits_to_keep``) both rely on. Frames are preprocessed
    with the model's own image processor, row by row in order, so image features land on
    the right ``<|image_pad|>`` runs. ``mm_token_type_ids`` (1 on image tokens) lets
    Qwen3-VL compute its 3-D rope positions.
    """
    if len(batch_of_input_ids) != len(batch_of_images):
        raise ChatError(f"{len(batch_of_input_ids)} token sequences but {len(batch_of_images)} image lists")
    if not batch_of_input_ids or any(len(ids) == 0 for ids in batch_of_input_ids):
        raise ChatError("model_inputs needs at least one non-empty token sequence")
    if padding_side not in ("left", "right"):
        raise ChatError(f"padding_side={padding_side!r} must be 'left' or 'right'")
    pad, image_pad = pad_id(processor), image_token_id(processor)
    width = max(len(ids) for ids in batch_of_input_ids)
    input_ids = torch.full((len(batch_of_input_ids), width), pad, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(batch_of_input_ids):
        span = slice(width - len(ids), width) if padding_side == "left" else slice(0, len(ids))
        input_ids[row, span] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, span] = 1
    mm_token_type_ids = ((input_ids == image_pad) & attention_mask.bool()).long()
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "mm_token_type_ids": mm_token_type_ids}
    frames = [frame for images in batch_of_images for frame in images]
    if frames:
        inputs |= pixel_inputs(processor, frames)
        grid = inputs["image_grid_thw"]
        expected = int((grid.prod(-1) // processor.image_processor.merge_size**2).sum())
        if int(mm_token_type_ids.sum()) != expected:
            raise ChatError(
                f"the sequences hold {int(mm_token_type_ids.sum())} image tokens but their {len(frames)} frames "
                f"need {expected}; pass each context's frames exactly as the renderer returned them"
            )
    elif int(mm_token_type_ids.sum()):
        raise ChatError("the sequences hold image tokens but no frames were given")
    return inputs
