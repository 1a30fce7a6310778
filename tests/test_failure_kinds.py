"""Failure kinds of greedy episodes, from replayed actions (mazerl.evaluation.failures)."""

import pytest

from envs.maze import Layout, action_text, solve_actions
from mazerl.evaluation.failures import KINDS, failure_kind, kind_counts

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
