"""The episode runner: scripted policies pin down its bookkeeping; the starter runs it for real."""

import numpy as np
import pytest
import skyrl_gym
import torch
from scripted_engines import FixedReplyEngine, SolverEngine, layout_from_frame

from envs.evalset import load as load_eval_set
from envs.maze import Layout, MazeEnv
from envs.reward import Shaping
from envs.skyrl_env import ENV_ID, register_maze_env
from mazerl.policy.engines import GenerationSettings, HFEngine
from mazerl.policy.episodes import run_episodes
from mazerl.policy.loader import load_policy, load_processor

GREEDY = GenerationSettings(greedy=True, max_new_tokens=16)


@pytest.fixture(scope="module")
def processor(starter_model_dir):
    return load_processor(starter_model_dir)


@pytest.fixture(scope="module")
def eval_set():
    return load_eval_set("maze256-small-v1")


def test_frames_are_read_back_into_the_layout_they_show():
    for seed in range(20):
        layout = Layout.generate(seed, 7)
        frame, _ = MazeEnv(size=7, cell_px=16).reset(layout=layout)
        assert layout_from_frame(frame, 16) == layout


def test_solver_policy_reaches_exactly_the_budget_ceiling(processor, eval_set):
    # given the solver as policy on the whole embedded eval set with its budget
    engine = SolverEngine(processor, cell_px=eval_set.cell_px)
    episodes = run_episodes(engine, processor, eval_set.layouts, GREEDY, max_moves=eval_set.max_moves)
    # then exactly the mazes the solver can finish within the budget are solved, in optimal moves
    solved = [episode.solved for episode in episodes]
    assert np.mean(solved) == pytest.approx(eval_set.budget_ceiling())
    for episode in episodes:
        assert episode.solved == (episode.optimal_moves + 1 <= eval_set.max_moves)
        assert episode.parse_failures == 0
        if episode.solved:
            assert episode.moves == episode.optimal_moves + 1 and episode.reward == 1.0


def test_solver_policy_solves_everything_with_a_large_budget(processor, eval_set):
    engine = SolverEngine(processor, cell_px=eval_set.cell_px)
    episodes = run_episodes(engine, processor, eval_set.layouts[:64], GREEDY, max_moves=60)
    assert all(episode.solved for episode in episodes)


def test_garbage_policy_solves_nothing_and_never_parses(processor, eval_set):
    engine = FixedReplyEngine(processor, "I think I will go somewhere nice")
    episodes = run_episodes(engine, processor, eval_set.layouts[:16], GREEDY, max_moves=15, format_bonus=0.5)
    assert not any(episode.solved for episode in episodes)
    assert all(episode.parse_failures == episode.moves == 15 for episode in episodes)
    assert all(episode.reward == 0.0 for episode in episodes), "no format bonus for replies that never parse"


def test_format_bonus_enters_the_reward_never_success(processor, eval_set):
    # given a policy that always parses but stops at once (away from the target)
    engine = FixedReplyEngine(processor, "('stop', 'stop')")
    episodes = run_episodes(engine, processor, eval_set.layouts[:4], GREEDY, format_bonus=0.25)
    assert all(not e.solved and e.moves == 1 and e.reward == pytest.approx(0.25) for e in episodes)


def test_turns_record_the_contexts_and_frames_are_kept_on_request(processor, eval_set):
    # given the solver with every frame in the history and frames kept for GIFs
    engine = SolverEngine(processor, cell_px=eval_set.cell_px)
    episode = run_episodes(
        engine, processor, eval_set.layouts[:1], GREEDY, history_images="all", keep_frames=True, maze_ids=["set/0"]
    )[0]
    # then each turn's context extends the previous context plus its reply, with one more frame
    assert episode.maze_id == "set/0"
    assert len(episode.turns) == episode.moves == len(episode.actions)
    for before, after in zip(episode.turns, episode.turns[1:], strict=False):
        prefix = before.input_ids + before.response_ids
        assert after.input_ids[: len(prefix)] == prefix
        assert len(after.images) == len(before.images) + 1
    assert len(episode.frames) == episode.moves + 1
    assert np.array_equal(episode.turns[-1].images[-1], episode.frames[-2])
    assert episode.response_tokens == sum(len(t.response_ids) for t in episode.turns)


class _GarbleFirstTurn(SolverEngine):
    """Unreadable on the first turn, then the solver: a reward with a partial format bonus."""

    calls = 0

    def generate(self, requests, settings):
        self.calls += 1
        return super().generate(requests, settings)

    def reply(self, request):
        return "no idea yet" if self.calls == 1 else super().reply(request)


def test_both_runners_pay_the_same_reward(processor, eval_set):
    # given episodes of the local runner with one unreadable reply each, a format bonus and shaping
    layouts = eval_set.layouts[:6]
    engine = _GarbleFirstTurn(processor, cell_px=eval_set.cell_px)
    shaping = Shaping(progress_reward=0.5, bump_cost=0.25)
    episodes = run_episodes(
        engine, processor, layouts, GREEDY, max_moves=eval_set.max_moves, format_bonus=0.3, shaping=shaping
    )
    assert any(e.solved for e in episodes) and all(e.parse_failures == 1 for e in episodes)
    register_maze_env()
    for layout, episode in zip(layouts, episodes, strict=True):
        # when the skyrl-gym adapter (the skyrl backend's env) hears the same replies
        extras = {"layout": layout.to_dict(), "max_turns": eval_set.max_moves, "cell_px": eval_set.cell_px}
        env = skyrl_gym.make(
            ENV_ID, env_config={}, extras=extras | {"format_bonus": 0.3, "progress_reward": 0.5, "bump_cost": 0.25}
        )
        env.init([])
        steps = [env.step(text) for text in episode.actions]
        # then it pays exactly the local runner's reward: each step its shaping, the last one the task too
        assert steps[-1]["done"] and steps[-1]["reward"] == episode.reward + episode.turns[-1].shaping
        assert [out["reward"] for out in steps[:-1]] == [turn.shaping for turn in episode.turns[:-1]], episode.maze_id


def test_bad_runner_arguments_are_refused(processor, eval_set):
    engine = SolverEngine(processor, cell_px=16)
    with pytest.raises(ValueError, match="maze_ids"):
        run_episodes(engine, processor, eval_set.layouts[:2], GREEDY, maze_ids=["only-one"])
    with pytest.raises(ValueError, match="history_images"):
        run_episodes(engine, processor, eval_set.layouts[:2], GREEDY, history_images=0)
    with pytest.raises(ValueError, match="format_bonus"):
        run_episodes(engine, processor, eval_set.layouts[:2], GREEDY, format_bonus=-0.5)
    with pytest.raises(TypeError, match="HFEngine"):
        run_episodes(torch.nn.Linear(1, 1), processor, eval_set.layouts[:2], GREEDY)  # a bare model, not an engine


def test_starter_rollouts_are_reproducible_with_a_seed(starter_model_dir, eval_set):
    # given the starter sampling at temperature 1 with a seed, run twice (what the local trainer does)
    policy = load_policy(starter_model_dir, device="cpu")
    engine = HFEngine.from_policy(policy)
    settings = GenerationSettings(greedy=False, temperature=1.0, max_new_tokens=12, seed=7)
    layouts = [eval_set.layouts[0]] * 4 + [eval_set.layouts[1]] * 4
    first = run_episodes(engine, policy.processor, layouts, settings, max_moves=4)
    again = run_episodes(
        HFEngine.from_policy(policy), policy.processor, layouts, settings, max_moves=4
    )  # a fresh engine
    # then every reply is the same
    assert [e.actions for e in first] == [e.actions for e in again]
    assert all(len(e.turns) == e.moves for e in first)
