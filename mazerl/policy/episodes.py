"""The multi-turn episode runner shared by eval and the local GRPO trainer.

Each episode is a conversation with one maze: the task prompt and first frame, then for
every turn the policy's reply, the env's feedback and the next frame. All unfinished
episodes advance together: one engine call per turn carries every active episode's
context, so a batch of 128 rollouts costs 15 batched calls, not 1,920 single ones.

Every turn records exactly the context the policy was given (token ids and frames, see
``chat.render``) and the ids it produced, which is what the trainer scores. An episode
ends when the policy says stop or the move budget is spent; unparseable replies cost a
move. ``solved`` counts only a stop on the target; a training format bonus
(:func:`envs.reward.episode_reward`, the skyrl-gym adapter's rule too) goes into ``reward``
and never into ``solved``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from envs.maze import ActionFormat, Layout, MazeEnv, optimal_moves, target_distances
from envs.reward import Shaping, check_format_bonus, episode_reward, turn_shaping
from mazerl.policy.chat import Conversation, render
from mazerl.policy.context_mode import HistoryImages, HistoryText, check_context_mode
from mazerl.policy.engines import (
    GenerationRequest,
    GenerationResult,
    GenerationSettings,
    InferenceEngine,
)


@dataclass
class Turn:
    input_ids: list[int]  # the full context at this turn (chat template applied, image pads expanded)
    images: list[np.ndarray]  # the frames whose image tokens appear in input_ids, in order
    response_ids: list[int]  # generated tokens, the end-of-turn token included when produced
    response_text: str
    parse_ok: bool
    log_probs: list[float] | None = None  # per reply token, where the engine reports them
    shaping: float = 0.0  # the turn's training-only shaping reward (envs.reward.turn_shaping), 0 without shaping

    def context_key(self) -> str:
        """A digest of everything the policy saw at this turn (its tokens and frames): equal keys, equal
        inputs, so the policy's choice there is one distribution (GiGPO's anchor state, ``credit: anchor``)."""
        digest = hashlib.blake2b(np.asarray(self.input_ids, dtype=np.int64).tobytes(), digest_size=16)
        for frame in self.images:
            digest.update(np.ascontiguousarray(frame).tobytes())
        return digest.hexdigest()


@dataclass
class Episode:
    maze_id: str  # "<eval set>/<index>" or "train/<seed>"
    layout: Layout
    turns: list[Turn]
    actions: list[str]  # response texts in order
    solved: bool  # stopped on the target (never a format bonus)
    reward: float  # task reward (+ format bonus when training asks for one)
    moves: int
    parse_failures: int
    optimal_moves: int
    frames: list[np.ndarray] | None  # kept only when GIFs are requested

    @property
    def shaping(self) -> float:
        """The episode's shaping rewards summed over its turns (training only, never success)."""
        return sum(turn.shaping for turn in self.turns)

    @property
    def response_tokens(self) -> int:
        """Generated tokens over all turns."""
        return sum(len(turn.response_ids) for turn in self.turns)

    @property
    def context_tokens(self) -> int:
        """Length of the longest context the policy was given (the last turn's)."""
        return max((len(turn.input_ids) for turn in self.turns), default=0)


@dataclass
class _Running:
    """An episode in progress."""

    env: MazeEnv
    conversation: Conversation
    turns: list[Turn]
    frames: list[np.ndarray] | None
    distances: np.ndarray | None  # moves to the target from every cell, when shaping is asked for
    reward: float = 0.0
    solved: bool = False
    done: bool = False


def run_episodes(
    engine: InferenceEngine,
    processor: object,
    layouts: Sequence[Layout],
    settings: GenerationSettings,
    *,
    maze_ids: Sequence[str] | None = None,
    max_moves: int = 15,
    action_format: ActionFormat = "tuple",
    cell_px: int = 16,
    history_images: HistoryImages = 1,
    history_text: HistoryText = "all",
    keep_frames: bool = False,
    format_bonus: float = 0.0,
    shaping: Shaping | None = None,
    on_turn: Callable[[int, int], None] | None = None,
) -> list[Episode]:
    """Play every layout once with the policy behind ``engine``; episodes come back in input order.

    ``engine`` is an :class:`~mazerl.policy.engines.InferenceEngine` (wrap a bare model in
    :class:`~mazerl.policy.engines.HFEngine`). ``settings.seed`` (if set) is combined with the turn index, so a
    sampled batch is reproducible on CPU. ``on_turn(turn, active)`` is called before each
    turn's generation (for progress output). ``shaping`` (training only) records each turn's
    shaping reward in ``Turn.shaping``; it never enters ``reward`` or ``solved``.
    """
    if isinstance(engine, torch.nn.Module):  # a transformers model has a generate() too, with another signature
        raise TypeError(f"engine is a bare {type(engine).__name__}; pass an engine, e.g. HFEngine(model, processor)")
    check_context_mode(history_images, history_text)
    check_format_bonus(format_bonus)
    if maze_ids is not None and len(maze_ids) != len(layouts):
        raise ValueError(f"maze_ids has {len(maze_ids)} entries for {len(layouts)} layouts; give one per layout")
    shaping = shaping if shaping is not None and shaping.active else None
    running = [_start(layout, max_moves, action_format, cell_px, keep_frames, shaping) for layout in layouts]
    for turn in range(max_moves):
        active = [episode for episode in running if not episode.done]
        if not active:
            break
        if on_turn is not None:
            on_turn(turn, len(active))
        contexts = [render(processor, episode.conversation, history_images, history_text) for episode in active]
        requests = [GenerationRequest(input_ids=ids, images=images) for ids, images in contexts]
        results = engine.generate(requests, settings.for_turn(turn))
        for episode, (ids, images), result in zip(active, contexts, results, strict=True):
            _advance(episode, ids, images, result, format_bonus, shaping)
    ids = maze_ids if maze_ids is not None else [f"maze/{index}" for index in range(len(layouts))]
    return [_finish(episode, maze_id) for episode, maze_id in zip(running, ids, strict=True)]


def _start(
    layout: Layout,
    max_moves: int,
    action_format: ActionFormat,
    cell_px: int,
    keep_frames: bool,
    shaping: Shaping | None,
) -> _Running:
    env = MazeEnv(size=layout.size, max_moves=max_moves, action_format=action_format, cell_px=cell_px)
    frame, _ = env.reset(layout=layout)
    return _Running(
        env=env,
        conversation=Conversation.start(env.prompt(), frame),
        turns=[],
        frames=[frame] if keep_frames else None,
        distances=target_distances(layout) if shaping is not None else None,
    )


def _advance(
    episode: _Running,
    input_ids: list[int],
    images: list[np.ndarray],
    result: GenerationResult,
    format_bonus: float,
    shaping: Shaping | None,
) -> None:
    text = result.text
    before = episode.env.agent
    frame, reward, terminated, truncated, info = episode.env.step(text)
    turn = Turn(input_ids, images, list(result.response_ids), text, bool(info["parse_ok"]), result.log_probs)
    if shaping is not None:
        distances = episode.distances
        turn.shaping = turn_shaping(shaping, int(distances[before]), int(distances[episode.env.agent]), terminated)
    episode.turns.append(turn)
    episode.conversation.add_reply(result.response_ids, text)
    if episode.frames is not None:
        episode.frames.append(frame)
    episode.done = terminated or truncated
    if episode.done:
        parsed = sum(turn.parse_ok for turn in episode.turns)
        episode.solved = reward > 0  # the env pays 1.0 only for a stop on the target
        episode.reward = episode_reward(reward, parsed, len(episode.turns), format_bonus)
    else:
        episode.conversation.add_observation(info["feedback"], frame)


def _finish(episode: _Running, maze_id: str) -> Episode:
    layout = episode.env.layout
    return Episode(
        maze_id=maze_id,
        layout=layout,
        turns=episode.turns,
        actions=[turn.response_text for turn in episode.turns],
        solved=episode.solved,
        reward=episode.reward,
        moves=episode.env.moves,
        parse_failures=sum(not turn.parse_ok for turn in episode.turns),
        optimal_moves=optimal_moves(layout),
        frames=episode.frames,
    )


def rollout_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """What a training step's rollout did, as its ``train/`` metrics: reward, success, reply length,
    unparsed replies, moves, shaping."""
    return {
        "train/reward_mean": float(np.mean([e.reward for e in episodes])),
        "train/success_rate": float(np.mean([e.solved for e in episodes])),
        "train/response_tokens": float(np.mean([sum(len(t.response_ids) for t in e.turns) for e in episodes])),
        "train/parse_failure_rate": float(
            sum(e.parse_failures for e in episodes) / max(sum(e.moves for e in episodes), 1)
        ),
        "train/moves_mean": float(np.mean([e.moves for e in episodes])),
        "train/shaping_mean": float(np.mean([e.shaping for e in episodes])),
    }
