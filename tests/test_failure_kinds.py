"""Failure kinds of greedy episodes, from replayed actions (mazerl.evaluation.failures)."""

import numpy as np
import pytest
from small_mazes import ROUND_THE_CORNER

from envs.maze import PARSERS, Layout, action_text, solve_actions
from mazerl.evaluation.failures import KINDS, failure_kind, first_mistake, kind_counts

LAYOUT = Layout.generate(0, 7)  # agent on the top-left interior corner: up (1) and left (2) are walls
REVERSE = {0: 2, 1: 3, 2: 0, 3: 1}
PATH = solve_actions(LAYOUT)  # ends in Action.STOP (4)
FIRST = PATH[0]


@pytest.mark.parametrize(
    ("actions", "kind"),
    [
        ([action_text(a) for a in PATH], "solved"),
        ([action_text(4)], "wrong stop"),
        ([action_text(1)] * 15, "wall bumps"),
        ([action_text(1), action_text(FIRST), action_text(1), action_text(REVERSE[FIRST])] * 4, "wall bumps"),
        ([action_text(FIRST), action_text(REVERSE[FIRST])] * 8, "loop"),
        (["no idea"] * 15, "unparsed"),
        ([action_text(a) for a in PATH[:-1]] + ["no idea"] * 15, "budget spent"),
    ],
)
def test_each_episode_gets_its_kind(actions, kind):
    assert failure_kind(LAYOUT, actions[:15], max_moves=15) == kind


def test_counts_list_every_kind_and_refuse_unknown_ones():
    assert kind_counts(["loop", "loop", "solved"]) == {k: {"loop": 2, "solved": 1}.get(k, 0) for k in KINDS}
    with pytest.raises(ValueError, match="unknown failure kinds"):
        kind_counts(["lost"])


# A 7x7 maze with one junction on the way: from (1, 1) right, right, down, down to (3, 3), where
# a dead-end branch goes left and the way goes right, then down to the target (5, 5).
JUNCTION = Layout(
    walls=np.array(
        [
            [1, 1, 1, 1, 1, 1, 1],
            [1, 0, 0, 0, 1, 1, 1],
            [1, 1, 1, 0, 1, 1, 1],
            [1, 0, 0, 0, 0, 0, 1],
            [1, 1, 1, 1, 1, 0, 1],
            [1, 1, 1, 1, 1, 0, 1],
            [1, 1, 1, 1, 1, 1, 1],
        ],
        dtype=np.uint8,
    ),
    agent=(1, 1),
    target=(5, 5),
)
RIGHT, UP, LEFT, DOWN, STOP = (action_text(a) for a in range(5))


@pytest.mark.parametrize(
    ("layout", "actions", "mistake"),
    [
        (ROUND_THE_CORNER, [DOWN, DOWN], "start branch"),  # the dead end below the start
        (ROUND_THE_CORNER, [UP] * 3, "into a wall"),
        (ROUND_THE_CORNER, [RIGHT, LEFT, RIGHT, LEFT], "reversal"),
        (ROUND_THE_CORNER, [RIGHT, RIGHT, DOWN, DOWN, LEFT], "into a wall"),  # on the target, a wall to its left
        (ROUND_THE_CORNER, [RIGHT, STOP], "stop or unparsed"),
        (ROUND_THE_CORNER, ["no idea"], "stop or unparsed"),
        (ROUND_THE_CORNER, [RIGHT, RIGHT, DOWN, DOWN, STOP], None),
        (JUNCTION, [RIGHT, RIGHT, DOWN, DOWN, LEFT, LEFT, RIGHT], "junction branch"),
        (JUNCTION, [RIGHT, RIGHT, DOWN, DOWN, UP], "reversal"),
        (JUNCTION, [RIGHT, RIGHT, DOWN, DOWN, DOWN], "into a wall"),
        (JUNCTION, [RIGHT, RIGHT, DOWN, DOWN, RIGHT, RIGHT, DOWN, DOWN, STOP], None),
    ],
)
def test_the_first_mistake_is_where_the_episode_left_the_solvers_way(layout, actions, mistake):
    assert first_mistake(layout, actions) == mistake
    keyword = [action_text(PARSERS["tuple"](a)[0], "keyword") if PARSERS["tuple"](a)[1] else a for a in actions]
    assert first_mistake(layout, keyword, action_format="keyword") == mistake
