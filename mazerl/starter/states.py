"""The warm-start's data: one supervised state per (maze, agent cell), rendered as the runner renders it.

One state per (maze, agent cell): the agent stands on any open cell, the context is
the conversation an episode would have had walking there from the start (the task
prompt, the replies and the env's feedback kept by ``history_text``, the frames kept by
``history_images``), and the answer is the solver's next action from that cell (``('stop', 'stop')`` on the target).
The walk arrives on the cell from a random open neighbour, with random wall bumps and
excursions mixed in (``history_noise``; see :func:`noisy_walk` for why). Contexts are rendered by
``chat.render`` through the real processor and chat template, so the starter learns on
exactly what the runner shows it. States whose walk already spends the budget are left out.
Each state also carries the noisy demonstrator's answer (:func:`demonstrator_action`) and the
per-cell targets of the auxiliary heads; :mod:`mazerl.starter.warmstart` trains on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.evalset import EvalSet
from envs.maze import DIRECTIONS, Action, Layout, MazeEnv, action_text, solve_actions
from envs.pool import training_pool, world_capacity
from mazerl.policy.chat import Conversation, end_of_turn_id, render

WALL_CLASS = 5  # per-cell classes: 0-3 move, 4 stop (the target), 5 wall


@dataclass(frozen=True)
class State:
    """One supervised example: a rendered context and the answer to learn."""

    input_ids: list[int]
    images: list[np.ndarray]
    answer_ids: list[int]  # the solver's action
    demo_ids: list[int]  # the noisy demonstrator's (heads for the target): see demonstrator_action
    cell_classes: np.ndarray  # (cells,) per-cell solver action or WALL_CLASS, row-major over the frame's grid
    agent_cell: int  # row-major index of the agent's cell


def training_mazes(eval_set: EvalSet, which: str) -> list[Layout]:
    """The warm-start's mazes: the GRPO training pool (every maze outside the eval set), plus the eval set for 'all'."""
    if eval_set.size != 7:
        raise ValueError(
            f"the warm-start enumerates the 7x7 world, but eval set {eval_set.name} is {eval_set.size}x{eval_set.size}; "
            "build the starter for maze256-small-v1"
        )
    pool = [layout for _, layout in training_pool(eval_set, world_capacity(eval_set))]  # all 512 outside the set
    return pool + list(eval_set.layouts) if which == "all" else pool


def cell_classes(layout: Layout) -> np.ndarray:
    """(H*W,) the solver's action from every open cell (STOP on the target), WALL_CLASS elsewhere."""
    classes = np.full(layout.walls.shape, WALL_CLASS, dtype=np.int64)
    for row, col in zip(*np.nonzero(layout.walls == 0), strict=True):
        classes[row, col] = solve_actions(layout, start=(int(row), int(col)))[0]
    return classes.reshape(-1)


def _reply_ids(processor: Any, action: int, action_format: str) -> list[int]:
    ids = processor.tokenizer(action_text(action, action_format), add_special_tokens=False)["input_ids"]
    return list(ids) + [end_of_turn_id(processor)]


REVERSE = {0: 2, 1: 3, 2: 0, 3: 1}


def _around(cell: tuple[int, int]) -> dict[int, tuple[int, int]]:
    """Each move's destination from ``cell`` (a wall there or not): the walks' one step rule."""
    return {action: (cell[0] + dr, cell[1] + dc) for action, (dr, dc) in DIRECTIONS.items()}


def demonstrator_action(layout: Layout, cell: tuple[int, int], tried: frozenset[int] = frozenset()) -> int:
    """What a demonstrator who heads for the red square does at ``cell``: the open move that brings
    the agent nearest the target as the crow flies (Manhattan distance; ties: the lower action id),
    and stop on the target. Moves in ``tried`` (taken from this cell before: history_text "tried")
    are passed over while another is open, as someone who remembers a dead end would.

    Where the maze's way leads round, away from the target, this is not the solver's move: the
    warm-start's ``answer_noise`` mixes it into the answers there, so the starter's mistakes are
    near-ties between the two (what GRPO can sharpen) rather than confident errors.
    """
    if cell == layout.target:
        return int(Action.STOP)
    open_moves = [
        (abs(n[0] - layout.target[0]) + abs(n[1] - layout.target[1]), action)
        for action, n in _around(cell).items()
        if not layout.walls[n]
    ]
    untried = [move for move in open_moves if move[1] not in tried]
    return min(untried or open_moves)[1]


FINAL_EXCURSION = 0.5  # exploring walks: chance of backing out of wrong branches at the walk's last cell
EXCURSION_DEPTH = 3  # exploring walks: the deepest an excursion goes before it turns back


def _excursion(layout: Layout, cell: tuple[int, int], first: int, rng: np.random.Generator) -> list[int]:
    """Into a branch by ``first`` and back: onwards at random (never reversing) until a dead end or
    EXCURSION_DEPTH moves, then the same way back to ``cell``."""
    out = [first]
    position = _around(cell)[first]
    while len(out) < EXCURSION_DEPTH:
        around = _around(position)
        onwards = [a for a, n in around.items() if a != REVERSE[out[-1]] and not layout.walls[n]]
        if not onwards:
            break
        out.append(int(rng.choice(onwards)))
        position = around[out[-1]]
    return out + [REVERSE[a] for a in reversed(out)]


def exploring_walk(layout: Layout, cell: tuple[int, int], noise: float, rng: np.random.Generator) -> list[int]:
    """Actions from the start to ``cell`` along the maze's way, backing out of wrong branches on the way.

    The walks of history_text "tried", whose contexts show what was answered before on the
    current frame: before each step (with chance ``noise``, and FINAL_EXCURSION at ``cell``) the
    walk bumps a wall or goes into a branch that is neither the way on nor the way it came, and
    back. The solver's answer at ``cell`` is therefore never among the moves tried there, so a
    starter learns that a tried move is not the answer: the memory is read, not copied (a random
    approach through ``cell`` and back, as :func:`noisy_walk` makes, would teach the opposite).
    """
    path = solve_actions(Layout(layout.walls, layout.agent, cell))[:-1]
    answer = solve_actions(layout, start=cell)[0]
    walk: list[int] = []
    position, came = layout.agent, None
    for step in [*path, None]:
        way_on = answer if step is None else step
        chance = FINAL_EXCURSION if step is None else noise
        if position != layout.target and rng.random() < chance:
            around = _around(position)
            blocked = [a for a, n in around.items() if layout.walls[n]]
            branches = [a for a, n in around.items() if not layout.walls[n] and a not in (way_on, came)]
            for side in rng.permutation(branches).tolist() if branches and rng.random() < 0.5 else []:
                walk += _excursion(layout, position, int(side), rng)
            if blocked and rng.random() < 0.5:
                walk.append(int(rng.choice(blocked)))
        if step is not None:
            walk.append(step)
            position = _around(position)[step]
            came = REVERSE[step]
    return walk


def tried_at(layout: Layout, cell: tuple[int, int], walk: list[int]) -> frozenset[int]:
    """The moves a walk took from ``cell`` (wall bumps included): what history_text "tried" shows there."""
    tried, position = set(), layout.agent
    for action in walk:
        if position == cell:
            tried.add(action)
        move = _around(position)[action]
        if not layout.walls[move]:
            position = move
    return frozenset(tried)


def noisy_walk(layout: Layout, cell: tuple[int, int], noise: float, rng: np.random.Generator) -> list[int]:
    """Actions from the start to ``cell``, arriving from a random open neighbour, with noise mixed in.

    Why not the maze's path: on path histories the last action gives the answer away (on
    the way to the target "continue" is right, in a dead-end branch "go back" always is),
    so a model learns to read the history instead of the frame and, once it strays, swings
    back and forth. Here the walk goes to a random open neighbour of ``cell`` first (through
    ``cell`` when that neighbour lies beyond it) and then steps onto ``cell``, so the last
    move says nothing about the answer; before each step, with probability ``noise / 2``
    each, it also bumps into a wall or steps into a side cell and back.
    """
    neighbours = [n for n in _around(cell).values() if not layout.walls[n]]
    if cell == layout.agent and rng.random() < 0.5:
        path: list[int] = []  # the episode's very first turn
    else:
        before = neighbours[int(rng.integers(len(neighbours)))]
        to_before = [] if before == layout.agent else solve_actions(Layout(layout.walls, layout.agent, before))[:-1]
        back = next(a for a, n in _around(before).items() if n == cell)
        path = [*to_before, back]
    walk: list[int] = []
    position = layout.agent
    for step in [*path, None]:
        draw = rng.random()
        around = _around(position)
        blocked = [a for a, n in around.items() if layout.walls[n]]
        sides = [a for a, n in around.items() if not layout.walls[n] and a != step]
        if draw < noise / 2 and blocked:
            walk.append(int(rng.choice(blocked)))
        elif draw < noise and sides:
            side = int(rng.choice(sides))
            walk += [side, REVERSE[side]]
        if step is not None:
            walk.append(step)
            position = around[step]
    return walk


def state_cells(
    layouts: list[Layout], max_moves: int, noise: float, seed: int, exploring: bool = False
) -> list[tuple[int, tuple[int, int], list[int]]]:
    """(maze index, agent cell, walk from the start) of every state whose walk leaves a move to spare.
    ``exploring``: :func:`exploring_walk` (history_text "tried") instead of :func:`noisy_walk`."""
    walker = exploring_walk if exploring else noisy_walk
    cells = []
    for maze, layout in enumerate(layouts):
        for row, col in zip(*np.nonzero(layout.walls == 0), strict=True):
            cell = (int(row), int(col))
            rng = np.random.default_rng([seed, 3, maze, int(row), int(col)])
            walk = walker(layout, cell, noise, rng)
            if len(walk) + 1 > max_moves:
                walk = walker(layout, cell, 0.0, rng)  # without the noise, if that fits
            if len(walk) + 1 <= max_moves:
                cells.append((maze, cell, walk))
    return cells


def build_states(
    processor: Any,
    layouts: list[Layout],
    cell_px: int,
    max_moves: int,
    action_format: str,
    history_images: int | str,
    max_states: int | None = None,
    seed: int = 0,
    noise: float = 0.0,
    history_text: int | str = "all",
) -> list[State]:
    """The states of ``layouts`` (a seeded subset of ``max_states`` if given), rendered through the chat template.

    Walks are replayed through :class:`MazeEnv`, so feedback texts and frames are the env's own.
    """
    exploring = history_text == "tried"
    cells = state_cells(layouts, max_moves, noise, seed, exploring)
    if max_states is not None and max_states < len(cells):
        chosen = np.random.default_rng([seed, 1]).permutation(len(cells))[:max_states]
        cells = [cells[i] for i in sorted(chosen.tolist())]
    replies = {action: _reply_ids(processor, action, action_format) for action in range(5)}
    env = MazeEnv(size=layouts[0].size, max_moves=max_moves + 1, action_format=action_format, cell_px=cell_px)
    classes = {maze: cell_classes(layouts[maze]) for maze in sorted({maze for maze, _, _ in cells})}
    states = []
    for maze, cell, walk in cells:
        layout = layouts[maze]
        frame, _ = env.reset(layout=layout)
        conversation = Conversation.start(env.prompt(), frame)
        for action in walk:
            text = action_text(action, action_format)
            frame, _, _, _, info = env.step(text)
            conversation.add_reply(replies[action], text)
            conversation.add_observation(info["feedback"], frame)
        assert env.agent == cell, f"walk to {cell} ended at {env.agent}"
        input_ids, images = render(processor, conversation, history_images, history_text)
        index = cell[0] * layout.walls.shape[1] + cell[1]
        answer = int(classes[maze][index])
        demo = demonstrator_action(layout, cell, tried_at(layout, cell, walk) if exploring else frozenset())
        states.append(State(input_ids, images, replies[answer], replies[demo], classes[maze], index))
    return states
