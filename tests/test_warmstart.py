"""The warm-start's data: the solver's answers, the noisy demonstrator's, on mazes checked by hand."""

import numpy as np
import pytest
from small_mazes import ROUND_THE_CORNER

from envs.maze import DIRECTIONS, Action, Layout, solve_actions
from mazerl.starter.config import StarterConfig
from mazerl.starter.states import demonstrator_action, exploring_walk, tried_at

LAYOUT = ROUND_THE_CORNER  # the way leads round: right, right, down, down
WALLS = LAYOUT.walls


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ((1, 1), Action.RIGHT),  # right and down both close in on the target; the lower action id wins
        ((3, 1), Action.UP),  # the dead end's only open move
        ((1, 3), Action.DOWN),
        ((2, 3), Action.DOWN),
        ((3, 3), Action.STOP),
    ],
)
def test_the_demonstrator_heads_for_the_target(cell, expected):
    assert demonstrator_action(LAYOUT, cell) == expected


def test_the_demonstrator_differs_from_the_solver_where_the_way_leads_round():
    # Given the cell (2, 1) below the start: the solver goes back up, the demonstrator down into the dead end.
    cell = (2, 1)
    assert solve_actions(Layout(WALLS, cell, LAYOUT.target))[0] == Action.UP
    assert demonstrator_action(LAYOUT, cell) == Action.DOWN


def test_the_demonstrator_passes_over_the_moves_tried_from_the_cell():
    # at (2, 1) it heads down into the dead end, unless it went down from there before
    assert demonstrator_action(LAYOUT, (2, 1), frozenset({Action.DOWN})) == Action.UP
    # at the start right wins the tie, unless right was tried; with every open move tried it heads on as before
    assert demonstrator_action(LAYOUT, (1, 1), frozenset({Action.RIGHT})) == Action.DOWN
    assert demonstrator_action(LAYOUT, (1, 1), frozenset({Action.RIGHT, Action.DOWN})) == Action.RIGHT


def _end(layout: Layout, walk: list[int]) -> tuple[int, int]:
    position = layout.agent
    for action in walk:
        move = (position[0] + DIRECTIONS[action][0], position[1] + DIRECTIONS[action][1])
        position = position if layout.walls[move] else move
    return position


def test_exploring_walks_end_on_their_cell_and_never_tried_the_answer_there():
    # given every open cell of the maze, walked to with much noise from many seeds
    tried_dead_end = 0
    for row, col in zip(*np.nonzero(WALLS == 0), strict=True):
        cell = (int(row), int(col))
        answer = solve_actions(LAYOUT, start=cell)[0]
        for seed in range(40):
            walk = exploring_walk(LAYOUT, cell, 0.8, np.random.default_rng(seed))
            # then the walk ends on the cell, and the solver's answer is not among the moves taken from it
            assert _end(LAYOUT, walk) == cell
            tried = tried_at(LAYOUT, cell, walk)
            assert answer not in tried, (cell, seed, walk)
            tried_dead_end += cell == LAYOUT.agent and Action.DOWN in tried
    # and at the start some walks back out of the dead end below it before answering
    assert tried_dead_end > 0


def test_answer_noise_is_a_probability():
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="answer_noise"):
            StarterConfig(answer_noise=bad)


def test_a_longer_schedule_stops_the_warm_start_mid_schedule_with_the_learning_rate_still_high():
    from mazerl.starter.warmstart import lr_factor, schedule_steps

    # Given 8,615 warm-start states in batches of 16, and the same 0.8 epoch once with its own schedule
    # and once as the first 0.8 of a 2-epoch schedule,
    own = StarterConfig(epochs=0.8, schedule_epochs=None)
    longer = StarterConfig(epochs=0.8, schedule_epochs=2.0)
    steps, schedule = schedule_steps(own, 8615)
    assert (steps, schedule) == (431, 431)
    assert schedule_steps(longer, 8615) == (431, 1077)
    # then both take the same steps, and share the warm-up,
    assert lr_factor(5, 431, 20) == lr_factor(5, 1077, 20)
    # but at the last step the own schedule has decayed to nothing while the longer one is still high.
    assert lr_factor(steps - 1, 431, 20) < 0.001
    assert lr_factor(steps - 1, 1077, 20) > 0.6


def test_a_schedule_shorter_than_the_warm_start_is_refused():
    with pytest.raises(ValueError, match="schedule_epochs=0.5 is shorter than epochs=0.8"):
        StarterConfig(epochs=0.8, schedule_epochs=0.5)
