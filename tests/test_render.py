"""Frames: size, colours at cell centres, the agent disc, data URIs and GIFs."""

import numpy as np
from image_uris import image_from_data_uri
from PIL import Image

from envs.maze import Layout, MazeEnv, solve
from envs.render import (
    AGENT_RGB,
    CAPTION_PX,
    PATH_RGB,
    TARGET_RGB,
    WALL_RGB,
    episode_caption,
    episode_gif,
    png_data_uri,
)


def centre(frame, cell, cell_px):
    return tuple(int(v) for v in frame[cell[0] * cell_px + cell_px // 2, cell[1] * cell_px + cell_px // 2])


def corner(frame, cell, cell_px):
    return tuple(int(v) for v in frame[cell[0] * cell_px + 1, cell[1] * cell_px + 1])


def test_frame_size_and_cell_colours_at_default_25px():
    layout = Layout.generate(3, 9)
    env = MazeEnv(size=9)
    frame, _ = env.reset(layout=layout)
    assert frame.shape == (225, 225, 3) and frame.dtype == np.uint8
    wall = tuple(map(int, np.argwhere(layout.walls == 1)[0]))
    path = next(
        tuple(map(int, rc)) for rc in np.argwhere(layout.walls == 0) if tuple(rc) not in (layout.agent, layout.target)
    )
    assert centre(frame, wall, 25) == WALL_RGB
    assert centre(frame, path, 25) == PATH_RGB
    assert centre(frame, layout.target, 25) == TARGET_RGB
    assert centre(frame, layout.agent, 25) == AGENT_RGB
    assert corner(frame, layout.agent, 25) == PATH_RGB, "the agent is a disc, not a square"


def test_agent_disc_radius_is_a_quarter_cell():
    env = MazeEnv(size=9, cell_px=25)
    frame, info = env.reset(seed=0)
    r, c = info["agent"]
    patch = frame[r * 25 : (r + 1) * 25, c * 25 : (c + 1) * 25]
    blue = np.all(patch == AGENT_RGB, axis=-1).sum()
    assert abs(blue - np.pi * 6.25**2) < 15, f"disc area {blue} px should be near pi*(25/4)^2"


def test_cell_px_parameter_and_embedded_world():
    frame, _ = MazeEnv(size=7, cell_px=16).reset(seed=0)
    assert frame.shape == (112, 112, 3)


def test_agent_is_drawn_over_the_target_and_old_cell_is_restored():
    layout = Layout.generate(11, 7)
    env = MazeEnv(size=7, cell_px=16, max_moves=50)
    frame, _ = env.reset(layout=layout)
    start = layout.agent
    for text in solve(layout)[:-1]:
        frame, *_ = env.step(text)
    assert centre(frame, layout.target, 16) == AGENT_RGB
    assert corner(frame, layout.target, 16) == TARGET_RGB
    assert centre(frame, start, 16) == PATH_RGB
    assert np.all(
        np.all(frame == AGENT_RGB, axis=-1).sum()
        == np.all(MazeEnv(size=7, cell_px=16).reset(layout=layout)[0] == AGENT_RGB, axis=-1).sum()
    ), "exactly one disc"


def test_incremental_frames_equal_a_full_redraw():
    layout = Layout.generate(2, 9)
    env = MazeEnv(size=9, max_moves=50)
    env.reset(layout=layout)
    for text in ["('move', 0)", "('move', 3)", "('move', 2)", "('move', 1)", *solve(layout)]:
        if env.done:
            break
        frame, *_ = env.step(text)
        fresh = MazeEnv(size=9)
        fresh.reset(layout=Layout(walls=layout.walls, agent=env.agent, target=layout.target))
        assert np.array_equal(frame, fresh.render())


def test_render_returns_a_copy():
    env = MazeEnv(size=7, cell_px=16)
    frame, _ = env.reset(seed=1)
    frame[:] = 0
    assert env.render().max() == 255


def test_png_data_uri_round_trips():
    frame, _ = MazeEnv(size=9).reset(seed=4)
    uri = png_data_uri(frame)
    assert uri.startswith("data:image/png;base64,")
    assert np.array_equal(np.asarray(image_from_data_uri(uri)), frame)


def solved_episode_frames() -> list[np.ndarray]:
    """The frames of maze 0 (7x7, 16 px) played along its shortest path."""
    layout = Layout.generate(0, 7)
    env = MazeEnv(size=7, cell_px=16, max_moves=50)
    return [env.reset(layout=layout)[0]] + [env.step(text)[0] for text in solve(layout)]


def test_episode_gif_has_one_frame_per_step(tmp_path):
    frames = solved_episode_frames()
    path = episode_gif(frames, tmp_path / "ep" / "episode.gif")
    with Image.open(path) as gif:
        # GIF writers merge identical consecutive frames (the final stop changes nothing).
        changes = 1 + sum(not np.array_equal(a, b) for a, b in zip(frames, frames[1:], strict=False))
        assert gif.n_frames == changes
        gif.seek(0)
        assert np.array_equal(np.asarray(gif.convert("RGB"))[::3, ::3], frames[0]), "frame 0, scaled up by 3"
    assert not list(tmp_path.rglob("*.tmp"))


def test_episode_gif_is_scaled_up_with_its_caption_under_the_maze(tmp_path):
    # given a 7x7 maze at 16 px (112 px frames) and a solved episode
    frames = solved_episode_frames()
    caption = episode_caption(True, len(frames) - 1)
    assert caption == f"solved in {len(frames) - 1} moves" and episode_caption(False, 1) == "failed after 1 move"
    # when it is written with its caption
    path = episode_gif(frames, tmp_path / "episode.gif", caption=caption)
    with Image.open(path) as gif:
        gif.seek(0)
        image = np.asarray(gif.convert("RGB"))
    # then each cell is scaled up by a whole factor (nearest neighbour: still flat colours)
    assert image.shape == (112 * 3 + CAPTION_PX, 112 * 3, 3), image.shape
    assert np.array_equal(image[: 112 * 3 : 3, ::3], frames[0]), "scaled by 3 with nearest-neighbour sampling"
    # and the caption band under the maze holds dark text on white
    band = image[112 * 3 :]
    assert (band < 100).all(axis=-1).sum() > 50, "the caption is drawn"
    assert (band == 255).all(axis=-1).mean() > 0.5, "on a white band"
