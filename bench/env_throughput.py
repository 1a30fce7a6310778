"""Environment throughput: step+render per second on one core, and PNG data-URI encode time.

Side by side with a straightforward implementation that redraws the whole frame on every
step (same pixels, checked), so the ratio shows what incremental rendering buys.

    python bench/env_throughput.py            # writes its section of docs/performance.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench.report import write_section  # noqa: E402
from envs.maze import DIRECTIONS, MazeEnv, action_text  # noqa: E402
from envs.render import AGENT_RGB, agent_disc_mask, draw_static, png_data_uri  # noqa: E402


class RedrawEveryFrameEnv(MazeEnv):
    """The baseline: identical dynamics, but render() paints the full frame from scratch."""

    def render(self) -> np.ndarray:
        frame = draw_static(self.layout.walls, self.layout.target, self.cell_px)
        p = self.cell_px
        r, c = self.agent
        frame[r * p : (r + 1) * p, c * p : (c + 1) * p][agent_disc_mask(p)] = AGENT_RGB
        return frame


def steps_per_second(env: MazeEnv, steps: int, seed: int = 0) -> float:
    """Random moves (with bumps), each followed by the frame, as an episode loop does."""
    rng = np.random.default_rng(seed)
    texts = [action_text(int(a)) for a in rng.integers(len(DIRECTIONS), size=steps)]
    env.reset(seed=seed)
    start = time.perf_counter()
    for text in texts:
        env.step(text)  # step returns the rendered frame
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core

    # Same pixels first: the comparison is only fair if both draw the same frames.
    fast, slow = MazeEnv(size=9, max_moves=10**9), RedrawEveryFrameEnv(size=9, max_moves=10**9)
    fast.reset(seed=3)
    slow.reset(seed=3)
    for a in [0, 3, 3, 2, 1, 0]:
        assert np.array_equal(fast.step(action_text(a))[0], slow.step(action_text(a))[0])

    rows = []
    for size, cell_px in [(9, 25), (7, 16)]:
        incremental = steps_per_second(MazeEnv(size=size, max_moves=10**9, cell_px=cell_px), args.steps)
        redraw = steps_per_second(RedrawEveryFrameEnv(size=size, max_moves=10**9, cell_px=cell_px), args.steps // 5)
        rows.append((size, cell_px, incremental, redraw))

    frame = MazeEnv(size=9).reset(seed=0)[0]
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        png_data_uri(frame)
    encode_ms = (time.perf_counter() - start) / n * 1000

    lines = [
        "## Environment throughput (`bench/env_throughput.py`)",
        "",
        "Step + render per second on one core (random moves with wall bumps), incremental renderer vs. a",
        "redraw-every-frame baseline with identical pixels. Target: >= 20,000 /s; PNG data URI < 1 ms.",
        "",
        "| world | incremental step+render /s | redraw-every-frame /s | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for size, cell_px, inc, red in rows:
        lines.append(f"| {size}x{size} @ {cell_px} px | {inc:,.0f} | {red:,.0f} | {inc / red:.1f}x |")
    lines += ["", f"PNG data-URI encode of a 225x225 frame: **{encode_ms:.3f} ms** per frame."]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section("env_throughput", body)


if __name__ == "__main__":
    main()
