"""The wall-reading probe's states, labels and classifier (bench/wall_probe.py)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from small_mazes import ROUND_THE_CORNER

from envs.maze import Layout

_SPEC = importlib.util.spec_from_file_location("wall_probe", Path(__file__).parents[1] / "bench" / "wall_probe.py")
wall_probe = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(wall_probe)


def test_labels_name_the_walls_on_each_side_of_the_cell():
    # (1, 1): right open, up wall, left wall, down open; (1, 3): right wall, up wall, left open, down open
    assert wall_probe.wall_labels(ROUND_THE_CORNER, (1, 1)) == [0, 1, 1, 0]
    assert wall_probe.wall_labels(ROUND_THE_CORNER, (1, 3)) == [1, 1, 0, 0]
    assert wall_probe.wall_labels(ROUND_THE_CORNER, (3, 1)) == [1, 0, 1, 1]


def test_states_are_distinct_room_cells_never_the_target():
    layouts = [Layout.generate(seed, 7) for seed in range(6)]
    states = wall_probe.room_states(layouts, 40, seed=3)
    keys = [(id(layout), cell) for layout, cell in states]
    assert len(set(keys)) == 40
    for layout, (row, col) in states:
        assert row % 2 == 1 and col % 2 == 1 and (row, col) != layout.target and not layout.walls[row, col]
    assert wall_probe.room_states(layouts, 40, seed=3) == states  # the same seed, the same states
    with pytest.raises(ValueError, match="48 room states"):  # 9 room cells in a 7x7 maze, less its target
        wall_probe.room_states(layouts, 6 * 8 + 1, seed=0)


def test_the_probe_reads_a_feature_that_carries_the_label_and_not_one_that_does_not():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 400)
    carried = np.column_stack([labels + 0.1 * rng.standard_normal(400), rng.standard_normal((400, 3))])
    noise = rng.standard_normal((400, 4))
    assert wall_probe.probe_accuracy(carried[:300], labels[:300], carried[300:], labels[300:]) > 0.95
    assert wall_probe.probe_accuracy(noise[:300], labels[:300], noise[300:], labels[300:]) < 0.7
