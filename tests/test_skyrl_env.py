"""The skyrl-gym adapter, driven through the real skyrl-gym registry."""

import skyrl_gym
from image_uris import image_from_data_uri

from envs.evalset import load
from envs.maze import Layout, solve
from envs.skyrl_env import ENV_ID, register_maze_env


def make_env(**extras):
    register_maze_env()
    register_maze_env()  # idempotent
    return skyrl_gym.make(ENV_ID, env_config={}, extras=extras)


def test_solver_episode_through_skyrl_gym_earns_reward_one():
    layout = load("maze64-easy-v1").layouts[1]
    env = make_env(layout=layout.to_dict(), max_turns=30)
    conversation, _ = env.init([{"role": "user", "content": "placeholder"}])
    assert len(conversation) == 1 and conversation[0]["role"] == "user"
    parts = conversation[0]["content"]
    assert parts[0]["type"] == "text" and "maze" in parts[0]["text"]
    assert parts[1]["type"] == "image_url"
    assert image_from_data_uri(parts[1]["image_url"]["url"]).size == (225, 225)
    for text in solve(layout):
        out = env.step(text)
    assert out["done"] and out["reward"] == 1.0 and out["observations"] == []
    metrics = env.get_metrics()
    assert metrics["solved"] == 1.0 and metrics["parse_failures"] == 0
    assert metrics["moves"] == len(solve(layout))


def test_seed_extras_play_the_generated_maze():
    env = make_env(seed=5, size=9, max_turns=40)
    env.init([])
    for text in solve(Layout.generate(5, 9)):
        out = env.step(text)
    assert out["reward"] == 1.0


def test_malformed_reply_gives_feedback_with_an_image_and_no_crash():
    env = make_env(seed=0, size=7, cell_px=16, max_turns=3)
    env.init([])
    out = env.step("I think I should go somewhere")
    assert not out["done"] and out["reward"] == 0.0
    feedback = out["observations"][0]["content"]
    assert "('move', 0)" in feedback[0]["text"]
    assert image_from_data_uri(feedback[1]["image_url"]["url"]).size == (112, 112)
    assert env.get_metrics()["parse_failures"] == 1


def test_format_bonus_is_paid_but_never_counts_as_solved():
    env = make_env(seed=0, size=7, max_turns=2, format_bonus=0.2)
    env.init([])
    env.step("('move', 1)")
    out = env.step("('stop', 'stop')")
    assert out["done"]
    assert abs(out["reward"] - 0.2) < 1e-9, "both replies parsed: full bonus, no task reward"
    assert env.get_metrics()["solved"] == 0.0
