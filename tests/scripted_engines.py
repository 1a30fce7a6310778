"""Test engines without a model: the solver reading the frame, and a fixed reply.

They implement :class:`~mazerl.policy.engines.InferenceEngine`, so the episode runner and
the eval stage can be checked end to end where a model's answers would be unknown: the
solver policy must reach exactly the eval set's budget ceiling, and a policy that answers
garbage must solve nothing and fail to parse every time. The solver looks only at the
request's last frame (as a model would), never at hidden state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envs.maze import ActionFormat, Layout, action_text, solve_actions
from envs.render import AGENT_RGB, TARGET_RGB, WALL_RGB
from mazerl.policy.chat import end_of_turn_id
from mazerl.policy.engines import GenerationRequest, GenerationResult, GenerationSettings


def layout_from_frame(frame: np.ndarray, cell_px: int) -> Layout:
    """Read walls, target and agent back from a rendered frame (corner pixel: cell colour; centre: agent)."""
    size = frame.shape[0] // cell_px
    corners = frame[::cell_px, ::cell_px][:size, :size]  # (size, size, 3)
    centres = frame[cell_px // 2 :: cell_px, cell_px // 2 :: cell_px][:size, :size]
    walls = np.all(corners == WALL_RGB, axis=-1).astype(np.uint8)
    agent = tuple(int(v) for v in np.argwhere(np.all(centres == AGENT_RGB, axis=-1))[0])
    target = tuple(int(v) for v in np.argwhere(np.all(corners == TARGET_RGB, axis=-1))[0])
    return Layout(walls=walls, agent=agent, target=target)


class _TextEngine:
    """Answers with a text per request, tokenised like a model's reply (end-of-turn token included)."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.eot = end_of_turn_id(processor)

    def reply(self, request: GenerationRequest) -> str:
        raise NotImplementedError

    def generate(self, requests: list[GenerationRequest], settings: GenerationSettings) -> list[GenerationResult]:
        results = []
        for request in requests:
            text = self.reply(request)
            ids = self.processor.tokenizer(text, add_special_tokens=False)["input_ids"]
            results.append(GenerationResult(response_ids=[*ids, self.eot], text=text))
        return results


class SolverEngine(_TextEngine):
    """The shortest-path solver's next action, read off the request's current frame."""

    def __init__(self, processor: Any, cell_px: int, action_format: ActionFormat = "tuple") -> None:
        super().__init__(processor)
        self.cell_px = cell_px
        self.action_format = action_format

    def reply(self, request: GenerationRequest) -> str:
        layout = layout_from_frame(request.images[-1], self.cell_px)
        return action_text(solve_actions(layout)[0], self.action_format)


class FixedReplyEngine(_TextEngine):
    """The same text every turn (e.g. garbage, to check parse-failure accounting)."""

    def __init__(self, processor: Any, text: str) -> None:
        super().__init__(processor)
        self.text = text

    def reply(self, request: GenerationRequest) -> str:
        return self.text
