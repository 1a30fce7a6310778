"""Dynamics, parsing, generation and solving of the maze world."""

import numpy as np
import pytest

from envs.evalset import load
from envs.maze import (
    Action,
    Layout,
    MazeEnv,
    action_text,
    optimal_moves,
    parse_keyword_action,
    parse_tuple_action,
    solve,
    solve_actions,
)

# A hand-made 7x7 maze: agent top-left, target bottom-right.
#   #######
#   #A    #
#   ##### #
#   #     #
#   # #####
#   #    T#
#   #######
CORRIDOR = Layout.from_dict(
    {
        "walls": ["1111111", "1000001", "1111101", "1000001", "1011111", "1000001", "1111111"],
        "agent": [1, 1],
        "target": [5, 5],
    }
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("('move', 0)", (0, True)),
        ('("move", 3)', (3, True)),
        ("I will go up: ('move', 1) now", (1, True)),
        ("(move, 2)", (2, True)),
        ("('stop', 'stop')", (Action.STOP, True)),
        ("('move', 4)", (None, False)),
        ("('move', 'up')", (None, False)),
        ("move right", (None, False)),
        ("", (None, False)),
    ],
)
def test_tuple_parser_table(text, expected):
    assert parse_tuple_action(text) == expected, f"parse_tuple_action({text!r}) should be {expected}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<action>left</action>", (2, True)),
        ("<action> UP </action>", (1, True)),
        ("<action>down</action> then <action>stop</action>", (Action.STOP, True)),
        ("<action>jump</action>", (None, False)),
        ("('move', 0)", (None, False)),
    ],
)
def test_keyword_parser_table(text, expected):
    assert parse_keyword_action(text) == expected


def test_direction_mapping_moves_as_visgym():
    # Given the open cell (3, 3) of a plain room, when moving in each direction, then
    # 0 = right, 1 = up, 2 = left, 3 = down.
    walls = np.ones((7, 7), dtype=np.uint8)
    walls[1:6, 1:6] = 0
    room = Layout(walls=walls, agent=(3, 3), target=(1, 1))
    expected = {0: (3, 4), 1: (2, 3), 2: (3, 2), 3: (4, 3)}
    for direction, cell in expected.items():
        env = MazeEnv(size=7)
        env.reset(layout=room)
        _, _, _, _, info = env.step(action_text(direction))
        assert info["agent"] == cell, f"direction {direction} should lead to {cell}"


def test_wall_bump_keeps_agent_and_costs_a_move():
    env = MazeEnv(size=7)
    env.reset(layout=CORRIDOR)
    _, reward, terminated, truncated, info = env.step("('move', 1)")  # up into the border
    assert info["agent"] == (1, 1)
    assert info["moves"] == 1
    assert info["feedback"] == "Cannot move up into a wall.", "the feedback names the move that failed"
    assert (reward, terminated, truncated) == (0.0, False, False)


def test_border_is_never_crossed():
    env = MazeEnv(size=7, max_moves=100)
    env.reset(layout=CORRIDOR)
    for _ in range(10):
        _, _, _, _, info = env.step("('move', 2)")
    assert info["agent"] == (1, 1)


def test_stop_on_target_rewards_and_stop_elsewhere_does_not():
    env = MazeEnv(size=7, max_moves=50)
    env.reset(layout=CORRIDOR)
    _, reward, terminated, _, _ = env.step("('stop', 'stop')")
    assert (reward, terminated) == (0.0, True)
    env.reset(layout=CORRIDOR)
    for text in solve(CORRIDOR):
        _, reward, terminated, truncated, info = env.step(text)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["agent"] == CORRIDOR.target


def test_reaching_target_without_stop_is_not_success():
    env = MazeEnv(size=7, max_moves=len(solve(CORRIDOR)) - 1)
    env.reset(layout=CORRIDOR)
    for text in solve(CORRIDOR)[:-1]:
        _, reward, terminated, truncated, info = env.step(text)
    assert info["agent"] == CORRIDOR.target
    assert (reward, terminated, truncated) == (0.0, False, True), "the budget ends before the stop"


def test_move_budget_truncates_and_then_refuses_steps():
    env = MazeEnv(size=7, max_moves=3)
    env.reset(layout=CORRIDOR)
    results = [env.step("('move', 1)") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    with pytest.raises(RuntimeError):
        env.step("('move', 0)")


def test_parse_failure_costs_a_move_and_names_accepted_forms():
    env = MazeEnv(size=7)
    env.reset(layout=CORRIDOR)
    _, reward, terminated, truncated, info = env.step("go right please")
    assert info["parse_ok"] is False
    assert info["moves"] == 1 and info["agent"] == (1, 1)
    assert "('move', 0)" in info["feedback"] and "('stop', 'stop')" in info["feedback"]
    assert (reward, terminated, truncated) == (0.0, False, False)


def test_keyword_format_plays_a_full_episode():
    env = MazeEnv(size=7, action_format="keyword", max_moves=50)
    env.reset(layout=CORRIDOR)
    for action in solve_actions(CORRIDOR):
        _, reward, *_ = env.step(action_text(action, "keyword"))
    assert reward == 1.0
    assert "<action>" in env.prompt()


def test_prompt_describes_colours_actions_and_success():
    text = MazeEnv(size=9).prompt().lower()
    for word in ("gray", "white", "blue", "red", "('move', d)", "('stop', 'stop')", "stop"):
        assert word in text, f"the prompt should mention {word!r}"


@pytest.mark.parametrize("size", [7, 9, 11])
def test_generator_is_deterministic_and_connected(size):
    a, b = Layout.generate(123, size), Layout.generate(123, size)
    assert a == b and a.to_dict() == b.to_dict()
    assert Layout.generate(124, size) != a or Layout.generate(125, size) != a
    # Every open cell is reachable from the agent: flood fill.
    open_cells = {tuple(map(int, rc)) for rc in np.argwhere(a.walls == 0)}
    seen, stack = {a.agent}, [a.agent]
    while stack:
        r, c = stack.pop()
        for nxt in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if nxt in open_cells and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    assert seen == open_cells, "all path cells must be connected"
    # A perfect maze: a tree, so #edges = #cells - 1 among the open cells.
    edges = sum((r + 1, c) in open_cells for r, c in open_cells) + sum((r, c + 1) in open_cells for r, c in open_cells)
    assert edges == len(open_cells) - 1
    # Border is wall; agent and target on opposite interior corners.
    assert a.walls[0].all() and a.walls[-1].all() and a.walls[:, 0].all() and a.walls[:, -1].all()
    corners = {(1, 1), (1, size - 2), (size - 2, 1), (size - 2, size - 2)}
    assert a.agent in corners and a.target in corners
    assert a.agent[0] + a.target[0] == size - 1 and a.agent[1] + a.target[1] == size - 1


@pytest.mark.parametrize("bad", [8, 4, 3, 0, -9])
def test_bad_sizes_are_rejected_with_a_fix(bad):
    with pytest.raises(ValueError, match="odd integer"):
        Layout.generate(0, bad)
    with pytest.raises(ValueError, match="size"):
        MazeEnv(size=bad)


def test_bad_env_arguments_are_rejected():
    with pytest.raises(ValueError, match="max_moves"):
        MazeEnv(max_moves=0)
    with pytest.raises(ValueError, match="action_format"):
        MazeEnv(action_format="json")


def test_same_seed_envs_step_side_by_side_identically():
    a, b = MazeEnv(size=9), MazeEnv(size=9)
    frame_a, _ = a.reset(seed=7)
    frame_b, _ = b.reset(seed=7)
    assert np.array_equal(frame_a, frame_b)
    for text in ["('move', 0)", "('move', 3)", "bad", "('move', 1)"]:
        out_a, out_b = a.step(text), b.step(text)
        assert np.array_equal(out_a[0], out_b[0]) and out_a[1:] == out_b[1:]


def test_a_reset_without_seed_or_layout_draws_from_the_env_seed():
    # given envs built alike, when reset with neither seed nor layout, then they play the same mazes
    a, b, other = MazeEnv(size=7, seed=3), MazeEnv(size=7, seed=3), MazeEnv(size=7, seed=4)
    played_a = [(a.reset(), a.layout)[1] for _ in range(4)]
    played_b = [(b.reset(), b.layout)[1] for _ in range(4)]
    played_other = [(other.reset(), other.layout)[1] for _ in range(4)]
    assert played_a == played_b, "the same env seed must give the same mazes"
    assert played_a != played_other, "another env seed must give other mazes"
    assert len(set(played_a)) > 1, "each reset draws the next maze of the stream"


def test_action_ids_are_those_of_visgym():
    assert [int(a) for a in (Action.RIGHT, Action.UP, Action.LEFT, Action.DOWN, Action.STOP)] == [0, 1, 2, 3, 4]
    assert [action_text(a) for a in Action] == [f"('move', {d})" for d in range(4)] + ["('stop', 'stop')"]


def test_layout_json_round_trip_and_text_rendering():
    layout = Layout.generate(5, 9)
    assert Layout.from_dict(layout.to_dict()) == layout
    text = layout.to_text().splitlines()
    assert len(text) == 9 and all(len(row) == 9 for row in text)
    assert text[layout.agent[0]][layout.agent[1]] == "A"
    assert text[layout.target[0]][layout.target[1]] == "T"
    assert text[0] == "#" * 9


def test_solver_replays_to_reward_on_every_eval_maze():
    for name in ("maze64-easy-v1", "maze256-small-v1"):
        evalset = load(name)
        for layout in evalset.layouts:
            actions = solve(layout)
            assert actions[-1] == "('stop', 'stop')"
            env = MazeEnv(size=layout.size, max_moves=100)
            env.reset(layout=layout)
            for text in actions:
                _, reward, *_ = env.step(text)
            assert reward == 1.0, f"solver failed on a maze of {name}"
            assert optimal_moves(layout) == len(actions) - 1
