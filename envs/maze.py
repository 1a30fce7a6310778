"""The 2D maze world, compatible with VisGym's ``maze_2d`` task.

Description
    An odd square grid with a wall border. The interior is a perfect maze (a uniform
    spanning tree over the cells at odd coordinates) drawn with Wilson's algorithm, so
    exactly one path joins any two open cells. The agent starts in one interior corner
    and the target sits in the opposite one; which diagonal is chosen by the seed.

Actions (text, parsed by a pure function)
    tuple form   ``('move', d)`` with d = 0 right, 1 up, 2 left, 3 down; ``('stop', 'stop')``
    keyword form ``<action>right|up|left|down|stop</action>`` (for instruct models)
    Text that does not parse still costs a move; the feedback lists the accepted forms.

Observation
    An RGB frame (H x W x 3, uint8), ``cell_px`` pixels per cell: walls gray
    (169, 169, 169), paths white, target a red cell-sized square, agent a blue disc of
    radius ``cell_px / 4`` at its cell centre, drawn over the target when on it.

Reward
    1.0 when the agent says ``stop`` on the target; 0.0 for everything else.
    (A format bonus for training lives in ``envs.reward``, never here.)

Termination
    ``terminated`` on ``stop``; ``truncated`` when ``max_moves`` actions are spent.

Configurations
    easy: 9 x 9 (VisGym's ``maze_2d/easy``, 25 px cells); hard: 11 x 11;
    embedded: 7 x 7 at 16 px, one vision patch per cell for the tiny starter model.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal

import numpy as np

from envs.render import FrameRenderer


class Action(IntEnum):
    """Action ids, as in VisGym: the four moves are the ``d`` of ``('move', d)``; 4 is ``('stop', 'stop')``."""

    RIGHT = 0
    UP = 1
    LEFT = 2
    DOWN = 3
    STOP = 4


# Move id -> (d_row, d_col), and its word in the keyword format.
DIRECTIONS: dict[int, tuple[int, int]] = {
    Action.RIGHT.value: (0, 1),
    Action.UP.value: (-1, 0),
    Action.LEFT.value: (0, -1),
    Action.DOWN.value: (1, 0),
}
DIRECTION_WORDS: dict[int, str] = {move: Action(move).name.lower() for move in DIRECTIONS}
ActionFormat = Literal["tuple", "keyword"]


def action_text(action: int, action_format: ActionFormat = "tuple") -> str:
    """The canonical text of an action id (0-3 moves, 4 stop) in the given format."""
    if action_format == "keyword":
        word = "stop" if action == Action.STOP else DIRECTION_WORDS[action]
        return f"<action>{word}</action>"
    return "('stop', 'stop')" if action == Action.STOP else f"('move', {int(action)})"


_TUPLE_RE = re.compile(r"""\(\s*['"]?(move|stop)['"]?\s*,\s*(?:(\d+)|['"]?stop['"]?)\s*\)""")
_KEYWORD_RE = re.compile(r"<action>\s*(\w+)\s*</action>", re.IGNORECASE)
_WORD_TO_ACTION = {word: code for code, word in DIRECTION_WORDS.items()} | {"stop": Action.STOP}


def parse_tuple_action(text: str) -> tuple[int | None, bool]:
    """First ``('move', d)`` / ``('stop', 'stop')`` in the text -> (action id, matched)."""
    for match in _TUPLE_RE.finditer(text):
        name, payload = match.group(1), match.group(2)
        if name == "stop" and payload is None:
            return Action.STOP, True
        if name == "move" and payload is not None and int(payload) in DIRECTIONS:
            return int(payload), True
    return None, False


def parse_keyword_action(text: str) -> tuple[int | None, bool]:
    """Last ``<action>word</action>`` in the text -> (action id, matched)."""
    matches = _KEYWORD_RE.findall(text)
    if not matches:
        return None, False
    action = _WORD_TO_ACTION.get(matches[-1].lower())
    return action, action is not None


PARSERS = {"tuple": parse_tuple_action, "keyword": parse_keyword_action}
ACCEPTED_FORMS = {
    "tuple": "('move', 0) right, ('move', 1) up, ('move', 2) left, ('move', 3) down, ('stop', 'stop')",
    "keyword": "<action>right</action>, <action>up</action>, <action>left</action>, "
    "<action>down</action>, <action>stop</action>",
}


@dataclass(frozen=True)
class Layout:
    """One maze: the wall grid and where the agent and target start."""

    walls: np.ndarray = field(compare=False)  # (H, W) uint8, 1 = wall
    agent: tuple[int, int]
    target: tuple[int, int]

    def __post_init__(self) -> None:
        walls = np.ascontiguousarray(self.walls, dtype=np.uint8)
        walls.setflags(write=False)
        object.__setattr__(self, "walls", walls)
        object.__setattr__(self, "agent", (int(self.agent[0]), int(self.agent[1])))
        object.__setattr__(self, "target", (int(self.target[0]), int(self.target[1])))
        for name in ("agent", "target"):
            row, col = getattr(self, name)
            if not (0 <= row < walls.shape[0] and 0 <= col < walls.shape[1]) or walls[row, col]:
                raise ValueError(f"Layout.{name}={(row, col)} must be an open cell inside the grid")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return self.agent == other.agent and self.target == other.target and np.array_equal(self.walls, other.walls)

    def __hash__(self) -> int:
        return hash((self.walls.tobytes(), self.walls.shape, self.agent, self.target))

    @property
    def size(self) -> int:
        return int(self.walls.shape[0])

    @staticmethod
    def generate(seed: int, size: int = 9) -> Layout:
        """A maze drawn from ``seed``: Wilson's algorithm inside a wall border."""
        check_size(size)
        rng = np.random.default_rng(seed)
        walls = _wilson_walls(size, rng)
        lo, hi = 1, size - 2
        corners = [((lo, lo), (hi, hi)), ((hi, hi), (lo, lo)), ((hi, lo), (lo, hi)), ((lo, hi), (hi, lo))]
        agent, target = corners[int(rng.integers(len(corners)))]
        return Layout(walls=walls, agent=agent, target=target)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: wall rows as strings of '0'/'1', positions as lists."""
        return {
            "walls": ["".join(str(int(v)) for v in row) for row in self.walls],
            "agent": list(self.agent),
            "target": list(self.target),
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Layout:
        walls = np.array([[int(ch) for ch in row] for row in data["walls"]], dtype=np.uint8)
        return Layout(walls=walls, agent=tuple(data["agent"]), target=tuple(data["target"]))

    def to_text(self, agent: tuple[int, int] | None = None) -> str:
        """'#' walls, ' ' paths, 'T' target, 'A' agent (drawn over the target)."""
        chars = np.where(self.walls == 1, "#", " ").astype("<U1")
        chars[self.target] = "T"
        chars[agent if agent is not None else self.agent] = "A"
        return "\n".join("".join(row) for row in chars)


def check_size(size: int) -> None:
    """Maze sizes must be odd and at least 5 (a wall border around 2 x 2 cells or more)."""
    if not isinstance(size, int | np.integer) or size < 5 or size % 2 == 0:
        raise ValueError(f"size={size!r} is not a valid maze size: use an odd integer >= 5 (e.g. 7, 9, 11)")


def _wilson_walls(size: int, rng: np.random.Generator) -> np.ndarray:
    """Uniform spanning tree over the odd-coordinate cells, by loop-erased random walks."""
    walls = np.ones((size, size), dtype=np.uint8)
    cells = [(r, c) for r in range(1, size - 1, 2) for c in range(1, size - 1, 2)]
    in_tree = {cells[int(rng.integers(len(cells)))]}
    walls[next(iter(in_tree))] = 0
    steps = [(0, 2), (-2, 0), (0, -2), (2, 0)]
    for start in cells:
        if start in in_tree:
            continue
        # Random walk until the tree is hit; remembering only the last exit of each
        # cell erases the loops.
        exit_step: dict[tuple[int, int], tuple[int, int]] = {}
        cell = start
        while cell not in in_tree:
            while True:
                dr, dc = steps[int(rng.integers(4))]
                nxt = (cell[0] + dr, cell[1] + dc)
                if 1 <= nxt[0] <= size - 2 and 1 <= nxt[1] <= size - 2:
                    break
            exit_step[cell] = (dr, dc)
            cell = nxt
        cell = start
        while cell not in in_tree:
            dr, dc = exit_step[cell]
            in_tree.add(cell)
            walls[cell] = 0
            walls[cell[0] + dr // 2, cell[1] + dc // 2] = 0
            cell = (cell[0] + dr, cell[1] + dc)
    return walls


def solve_actions(layout: Layout, start: tuple[int, int] | None = None) -> list[int]:
    """Shortest action-id sequence from ``start`` (default: the agent) to the target, ending in ``Action.STOP``."""
    start = start or layout.agent
    previous: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == layout.target:
            break
        for action, (dr, dc) in DIRECTIONS.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if nxt not in previous and not layout.walls[nxt]:
                previous[nxt] = (cell, action)
                queue.append(nxt)
    if layout.target not in previous:
        raise ValueError(f"the target {layout.target} cannot be reached from {start}")
    actions = [Action.STOP]
    cell = layout.target
    while previous[cell] is not None:
        cell, action = previous[cell]
        actions.append(action)
    return actions[::-1]


def target_distances(layout: Layout) -> np.ndarray:
    """(H, W) moves from every open cell to the target along the maze (-1 on walls).

    The training shaping term ``envs.reward.Shaping.progress_reward`` pays the change of this distance
    per move; in a perfect maze a move lowers it by one exactly when it is the solver's move.
    """
    distances = np.full(layout.walls.shape, -1, dtype=np.int64)
    distances[layout.target] = 0
    queue = deque([layout.target])
    while queue:
        cell = queue.popleft()
        for dr, dc in DIRECTIONS.values():
            nxt = (cell[0] + dr, cell[1] + dc)
            if distances[nxt] < 0 and not layout.walls[nxt]:
                distances[nxt] = distances[cell] + 1
                queue.append(nxt)
    return distances


def solve(layout: Layout) -> list[str]:
    """Shortest sequence of action texts, ending with ``('stop', 'stop')``."""
    return [action_text(a) for a in solve_actions(layout)]


def optimal_moves(layout: Layout) -> int:
    """Moves on the shortest path (the final stop not counted)."""
    return len(solve_actions(layout)) - 1


class MazeEnv:
    """A gymnasium-style episode over one :class:`Layout` (see the module docstring for the spec)."""

    def __init__(
        self,
        size: int = 9,
        max_moves: int = 15,
        action_format: ActionFormat = "tuple",
        cell_px: int = 25,
        seed: int = 0,
    ) -> None:
        """``seed`` starts the stream of maze seeds that :meth:`reset` draws from when it is given
        neither a seed nor a layout, so two envs built alike play the same mazes."""
        check_size(size)
        if max_moves < 1:
            raise ValueError(f"max_moves={max_moves} must be >= 1 (the reference budget is 15)")
        if action_format not in PARSERS:
            raise ValueError(f"action_format={action_format!r} must be one of {sorted(PARSERS)}")
        if cell_px < 4:
            raise ValueError(f"cell_px={cell_px} must be >= 4 so the agent disc is visible (default 25)")
        self.size = size
        self.max_moves = max_moves
        self.action_format = action_format
        self.cell_px = cell_px
        self._parse = PARSERS[action_format]
        self._seed_rng = np.random.default_rng(seed)
        self.layout: Layout | None = None
        self.agent: tuple[int, int] = (0, 0)
        self.moves = 0
        self.done = False
        self._renderer: FrameRenderer | None = None

    def reset(self, seed: int | None = None, layout: Layout | None = None) -> tuple[np.ndarray, dict]:
        """Start an episode on ``layout``, or on the maze drawn from ``seed`` (if neither: the next
        seed of the env's own seeded stream)."""
        if layout is None:
            seed = int(self._seed_rng.integers(2**31)) if seed is None else seed
            layout = Layout.generate(seed, self.size)
        elif layout.size != self.size:
            raise ValueError(f"layout is {layout.size}x{layout.size} but the env was built with size={self.size}")
        self.layout = layout
        self.agent = layout.agent
        self.moves = 0
        self.done = False
        self._renderer = FrameRenderer(layout.walls, layout.target, self.cell_px)
        self._renderer.place_agent(self.agent)
        return self.render(), self._info("Episode started.", parse_ok=True)

    def step(self, action_text: str) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Apply one reply of the policy. Unparseable text is a wasted move, never an exception."""
        if self.layout is None or self.done:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        self.moves += 1
        action, parse_ok = self._parse(action_text)
        reward, terminated = 0.0, False
        if not parse_ok:
            feedback = f"Could not read an action. Reply with exactly one of: {ACCEPTED_FORMS[self.action_format]}."
        elif action == Action.STOP:
            terminated = True
            reward = 1.0 if self.agent == self.layout.target else 0.0
            feedback = "Stopped on the target." if reward else "Stopped away from the target."
        else:
            dr, dc = DIRECTIONS[action]
            nxt = (self.agent[0] + dr, self.agent[1] + dc)
            if self.layout.walls[nxt]:
                feedback = (
                    f"Cannot move {DIRECTION_WORDS[action]} into a wall."  # which way: a Markov policy can avoid it
                )
            else:
                self.agent = nxt
                self._renderer.place_agent(nxt)
                feedback = f"Moved {DIRECTION_WORDS[action]}."
        truncated = not terminated and self.moves >= self.max_moves
        if truncated:
            feedback += " The move budget is spent."
        self.done = terminated or truncated
        return self.render(), reward, terminated, truncated, self._info(feedback, parse_ok)

    def render(self) -> np.ndarray:
        """The current frame, (size*cell_px, size*cell_px, 3) uint8, a fresh copy."""
        if self._renderer is None:
            raise RuntimeError("call reset() before render()")
        return self._renderer.frame()

    def render_text(self) -> str:
        return self.layout.to_text(self.agent)

    def prompt(self) -> str:
        """The task description shown with the first frame."""
        n = self.size
        if self.action_format == "keyword":
            how = (
                "Reply with one action: <action>right</action>, <action>up</action>, "
                "<action>left</action>, <action>down</action> or <action>stop</action>."
            )
        else:
            how = (
                "Reply with one action: ('move', d) where d is 0 right, 1 up, 2 left, 3 down, "
                "or ('stop', 'stop'). Example: ('move', 3)."
            )
        return (
            f"You are in a {n}x{n} maze. Gray cells are walls, white cells are paths. "
            f"You are the blue circle; the red square is the target. {how} "
            f"You win only by stopping on the red square, within {self.max_moves} actions."
        )

    def _info(self, feedback: str, parse_ok: bool) -> dict:
        return {
            "agent": self.agent,
            "target": self.layout.target,
            "moves": self.moves,
            "feedback": feedback,
            "parse_ok": parse_ok,
        }


@dataclass(frozen=True)
class Replay:
    """An episode played again from its recorded replies: its frames and how it ended."""

    frames: list[np.ndarray]
    solved: bool
    moves: int


def replay(
    layout: Layout, replies: list[str], *, max_moves: int, action_format: ActionFormat = "tuple", cell_px: int = 25
) -> Replay:
    """Play ``replies`` (an eval's recorded action texts) on ``layout`` again, frame by frame.

    The world is deterministic, so an eval's per-maze row is enough to redraw its episode (for
    GIFs of mazes a run changed) without the model; ``solved`` and ``moves`` let the caller check
    that the replay ended as the recorded episode did.
    """
    env = MazeEnv(size=layout.size, max_moves=max_moves, action_format=action_format, cell_px=cell_px)
    frame, _ = env.reset(layout=layout)
    frames, solved = [frame], False
    for reply in replies:
        if env.done:
            break
        frame, reward, _, _, _ = env.step(reply)
        frames.append(frame)
        solved = reward > 0
    return Replay(frames=frames, solved=solved, moves=env.moves)
