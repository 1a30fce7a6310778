"""Why a greedy episode failed: each failed maze gets one kind, from its replayed actions.

Kinds, checked in this order (the first that applies):

- ``wrong stop``: the policy said stop away from the target;
- ``wall bumps``: the budget ran out and the policy moved into a wall at least twice;
- ``loop``: the budget ran out, at most one bump, and the agent came back to a cell it had
  left (walking in circles or back and forth);
- ``unparsed``: the budget ran out on replies that did not parse (at least half of them);
- ``budget spent``: the budget ran out on a walk that never revisited a cell (too long a
  way round, or a maze whose shortest path does not fit the budget).

The replay uses the env itself (:class:`envs.maze.MazeEnv`), so a reply counts as a move,
a bump or a stop exactly as it did in the episode.

Where a failure began (:func:`first_mistake`): the first reply that is not the solver's action
from the cell the agent was on. With one frame of context a greedy policy that took a wrong
branch rarely comes back (at the junction it takes the same branch again), so this first
mistake, not the kind above, says whether the policy misread a wall or chose the wrong way out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from envs.maze import DIRECTIONS, PARSERS, ActionFormat, Layout, MazeEnv, solve_actions

KINDS = ("solved", "wrong stop", "wall bumps", "loop", "unparsed", "budget spent")
MISTAKES = ("start branch", "junction branch", "reversal", "into a wall", "stop or unparsed")


def failure_kind(layout: Layout, actions: Sequence[str], max_moves: int, action_format: ActionFormat = "tuple") -> str:
    """The episode's kind (one of :data:`KINDS`) from its reply texts."""
    env = MazeEnv(size=layout.size, max_moves=max_moves, action_format=action_format)
    env.reset(layout=layout)
    cells = [env.agent]
    bumps = unparsed = 0
    for text in actions:
        before = env.agent
        _, reward, terminated, truncated, info = env.step(text)
        if not info["parse_ok"]:
            unparsed += 1
        elif terminated and info["feedback"].startswith("Stopped"):
            return "solved" if reward > 0 else "wrong stop"
        elif env.agent == before:
            bumps += 1
        else:
            cells.append(env.agent)
        if terminated or truncated:
            break
    if bumps >= 2:
        return "wall bumps"
    if len(set(cells)) < len(cells):
        return "loop"
    if unparsed * 2 >= max(len(actions), 1):
        return "unparsed"
    return "budget spent"


def first_mistake(layout: Layout, actions: Sequence[str], action_format: ActionFormat = "tuple") -> str | None:
    """The first reply that is not the solver's, as one of :data:`MISTAKES`; None if there is none.

    ``start branch``: another open way out of the start cell; ``junction branch``: another open
    way out of a cell with three or four, not back; ``reversal``: back to the cell the agent
    came from; ``into a wall``: a move the frame shows is blocked (a misread);
    ``stop or unparsed``: a stop away from the target, or a reply that did not parse.
    """
    parse = PARSERS[action_format]
    cell, previous = layout.agent, None
    for text in actions:
        action, _ = parse(text)
        right = action == solve_actions(layout, start=cell)[0]
        if action not in DIRECTIONS:  # a stop (the solver's only on the target) or no action at all
            return None if right else "stop or unparsed"
        dr, dc = DIRECTIONS[action]
        after = (cell[0] + dr, cell[1] + dc)
        if right:
            cell, previous = after, cell
        elif layout.walls[after]:
            return "into a wall"
        elif after == previous:
            return "reversal"
        else:
            return "start branch" if cell == layout.agent else "junction branch"
    return None


def kind_counts(kinds: Iterable[str]) -> dict[str, int]:
    """Counts of every kind, zeros included, in :data:`KINDS` order."""
    counts = Counter(kinds)
    unknown = set(counts) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown failure kinds {sorted(unknown)}; expected some of {KINDS}")
    return {kind: counts.get(kind, 0) for kind in KINDS}
