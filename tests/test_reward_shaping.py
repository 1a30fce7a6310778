"""The training-only shaping terms, on a maze small enough to check by hand."""

import pytest
from scripted_engines import FixedReplyEngine
from small_mazes import ROUND_THE_CORNER

from envs.maze import Layout, MazeEnv, action_text, solve_actions, target_distances
from envs.reward import Shaping, turn_shaping
from mazerl.policy.engines import GenerationSettings
from mazerl.policy.episodes import run_episodes
from mazerl.policy.loader import load_processor

LAYOUT = ROUND_THE_CORNER  # the way leads round: right, right, down, down
WALLS = LAYOUT.walls


def test_target_distances_count_moves_along_the_maze():
    distances = target_distances(LAYOUT)
    assert distances[3, 3] == 0 and distances[1, 3] == 2 and distances[1, 1] == 4
    assert distances[3, 1] == 6, "the dead end lies two moves past the start, away from the target"
    assert (distances[WALLS == 1] == -1).all()
    # and the solver's path lowers the distance by one per move
    cell, path = LAYOUT.agent, []
    for action in solve_actions(LAYOUT)[:-1]:
        env = MazeEnv(size=5, cell_px=8)
        env.reset(layout=Layout(WALLS, cell, LAYOUT.target))
        env.step(action_text(action))
        path.append(int(distances[env.agent]))
        cell = env.agent
    assert path == [3, 2, 1, 0]


@pytest.mark.parametrize(
    ("before", "after", "ended", "expected"),
    [
        (4, 3, False, 0.5),  # the solver's move: +progress
        (4, 5, False, -0.5),  # a step away: -progress
        (4, 4, False, -0.25),  # a wall bump or an unreadable reply: -bump_cost
        (0, 0, True, 0.5),  # a stop on the target: the solver's action, +progress
        (3, 3, True, -0.5),  # a stop anywhere else: -progress_reward
    ],
)
def test_turn_shaping_table(before, after, ended, expected):
    assert turn_shaping(Shaping(progress_reward=0.5, bump_cost=0.25), before, after, ended) == expected


@pytest.mark.parametrize("bad", [{"progress_reward": -0.1}, {"bump_cost": float("nan")}, {"progress_reward": "1"}])
def test_bad_shaping_terms_are_refused(bad):
    with pytest.raises(ValueError, match="finite number >= 0"):
        Shaping(**bad)


class _Scripted(FixedReplyEngine):
    """Replies from a fixed list, one per turn."""

    def __init__(self, processor, texts):
        super().__init__(processor, "")
        self.texts = list(texts)

    def reply(self, request):
        return self.texts.pop(0)


def test_the_runner_records_each_turns_shaping_and_never_pays_it(starter_model_dir):
    # Given a hand-written episode: a bump (up), into the dead end (down), back (up), then the way.
    processor = load_processor(starter_model_dir)
    moves = [1, 3, 1, 0, 0, 3, 3, 4]
    engine = _Scripted(processor, [action_text(m) for m in moves])
    shaping = Shaping(progress_reward=0.5, bump_cost=0.25)
    settings = GenerationSettings(greedy=True, max_new_tokens=16)
    # When the runner plays it with shaping,
    (episode,) = run_episodes(engine, processor, [LAYOUT], settings, cell_px=8, history_text=0, shaping=shaping)
    # then every turn carries its own term, by hand: bump -0.25; down into the dead end -0.5
    # (distance 4 -> 5); up back +0.5; right, right, down, down +0.5 each; the stop on the target +0.5.
    assert [t.shaping for t in episode.turns] == [-0.25, -0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    assert episode.shaping == pytest.approx(2.25)
    assert episode.solved and episode.reward == 1.0, "shaping never enters the reward or success"
