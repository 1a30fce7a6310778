"""skyrl-gym adapter: the maze as a multi-turn, image-observation ``BaseTextEnv``.

Dataset rows are tickets: their ``extras`` name the maze (``seed`` or a ``layout`` dict)
and the world (``size``, ``max_turns``, ``cell_px``, ``action_format``); the env builds
its own prompt and frames. Observations are OpenAI-style user messages whose content
is the feedback text plus the frame as a ``data:image/png;base64,`` ``image_url`` part.

The optional ``format_bonus`` (training only) is added to the terminal reward for the
share of replies that parsed (:func:`envs.reward.episode_reward`, the local runner's rule too);
it never enters the ``solved`` metric. The optional shaping terms (``progress_reward``,
``bump_cost``: :class:`envs.reward.Shaping`, the local runner's rule too) are paid per step;
SkyRL's GRPO sums a trajectory's step rewards into one advantage (the local backend's
``credit: episode``).

Register inside every Ray process that builds envs (SkyRL's generator does it by id)::

    from envs.skyrl_env import register_maze_env
    register_maze_env()          # id "maze2d"
"""

from __future__ import annotations

from typing import Any

import numpy as np
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from envs.maze import Layout, MazeEnv, target_distances
from envs.render import png_data_uri
from envs.reward import Shaping, check_format_bonus, episode_reward, turn_shaping

ENV_ID = "maze2d"
ENTRY_POINT = "envs.skyrl_env:MazeTextEnv"


def image_message(text: str, image: np.ndarray, role: str = "user") -> dict[str, Any]:
    """One OpenAI-format message with a text part and a PNG image part."""
    return {
        "role": role,
        "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": png_data_uri(image)}},
        ],
    }


def _get(source: Any, key: str, default: Any = None) -> Any:
    if source is None:
        return default
    if isinstance(source, dict):
        return source.get(key, default)
    return getattr(source, key, default)


class MazeTextEnv(BaseTextEnv):
    """One maze episode for SkyRL's generator; ``extras`` take precedence over ``env_config``."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = dict(extras or {})

        def setting(key: str, default: Any) -> Any:
            return extras.get(key, _get(env_config, key, default))

        layout = extras.get("layout")
        self.layout = Layout.from_dict(layout) if isinstance(layout, dict) else layout
        self.seed = extras.get("seed")
        if self.layout is None and self.seed is None:
            raise ValueError("MazeTextEnv needs extras['seed'] or extras['layout'] to know which maze to play")
        size = int(setting("size", self.layout.size if self.layout is not None else 9))
        self.max_turns = int(setting("max_turns", 15))
        self.format_bonus = float(setting("format_bonus", 0.0))
        check_format_bonus(self.format_bonus)
        self.shaping = Shaping(
            progress_reward=float(setting("progress_reward", 0.0)), bump_cost=float(setting("bump_cost", 0.0))
        )
        self.distances: np.ndarray | None = None
        self.env = MazeEnv(
            size=size,
            max_moves=self.max_turns,
            action_format=setting("action_format", "tuple"),
            cell_px=int(setting("cell_px", 25)),
        )
        self.parse_failures = 0
        self.solved = False

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """Ignore the placeholder prompt of the dataset row; show the task and the first frame."""
        image, _ = self.env.reset(seed=self.seed, layout=self.layout)
        self.distances = target_distances(self.env.layout) if self.shaping.active else None
        return [image_message(self.env.prompt(), image)], {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        before = self.env.agent
        image, reward, terminated, truncated, info = self.env.step(action)
        self.parse_failures += not info["parse_ok"]
        done = terminated or truncated
        if done:
            self.solved = reward > 0
            reward = episode_reward(reward, self.env.moves - self.parse_failures, self.env.moves, self.format_bonus)
        if self.distances is not None:
            reward += turn_shaping(
                self.shaping, int(self.distances[before]), int(self.distances[self.env.agent]), terminated
            )
        observations = [] if done else [image_message(info["feedback"], image)]
        return BaseTextEnvStepOutput(
            observations=observations,
            reward=float(reward),
            done=done,
            metadata={
                "feedback": info["feedback"],
                "parse_ok": info["parse_ok"],
                "moves": info["moves"],
                "terminated": terminated,
                "truncated": truncated,
            },
        )

    def get_metrics(self) -> dict[str, Any]:
        return {
            "moves": self.env.moves,
            "parse_failures": self.parse_failures,
            "solved": float(self.solved),
        }


def register_maze_env() -> None:
    """Register ``maze2d`` with skyrl-gym (idempotent)."""
    from skyrl_gym.envs.registration import register, registry

    if ENV_ID not in registry:
        register(id=ENV_ID, entry_point=ENTRY_POINT)
