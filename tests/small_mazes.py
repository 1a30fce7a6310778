"""Mazes small enough to check by hand, shared by the tests of the reward and of the warm-start's data."""

import numpy as np

from envs.maze import Layout

# A 5x5 maze (3x3 interior) whose way leads round: from the start (1, 1) the target (3, 3) is
# straight down-right, but the only way is right along the top and down the right-hand side
# (right, right, down, down). The cell (3, 1) is a dead end below the start.
ROUND_THE_CORNER = Layout(
    walls=np.array(
        [
            [1, 1, 1, 1, 1],
            [1, 0, 0, 0, 1],
            [1, 0, 1, 0, 1],
            [1, 0, 1, 0, 1],
            [1, 1, 1, 1, 1],
        ],
        dtype=np.uint8,
    ),
    agent=(1, 1),
    target=(3, 3),
)
