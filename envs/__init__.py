"""The maze world, compatible with VisGym's ``maze_2d``; numpy and Pillow only, no ``mazerl`` import.

- ``maze``: ``Layout``, ``MazeEnv``, ``Action``, the reply parsers, ``solve``, ``optimal_moves``;
- ``reward``: ``episode_reward`` (task reward + format bonus, the one rule both training runners pay)
  and the training-only per-turn ``Shaping``;
- ``render``: frames, and episodes as GIFs;
- ``evalset``: the versioned eval sets with their digests (``python -m envs.evalset --check``);
- ``pool``: the training pool, the world's mazes outside an eval set (GRPO and the starter's warm-start);
- ``skyrl_env``: the skyrl-gym adapter, id ``maze2d``.
"""
