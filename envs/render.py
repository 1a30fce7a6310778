"""Drawing maze frames, encoding them for chat messages, and recording episodes as GIFs.

The renderer draws the static maze once per episode and afterwards only repaints the
two cells an agent move touches, which keeps step+render well above 20k per second.
"""

from __future__ import annotations

import base64
import io
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

WALL_RGB = (169, 169, 169)
PATH_RGB = (255, 255, 255)
TARGET_RGB = (255, 0, 0)
AGENT_RGB = (0, 0, 255)
GIF_MIN_PX = 336  # episode GIFs are scaled up to at least this width (a 7x7 maze at 16 px is 112 px)
CAPTION_PX = 28  # height of the caption band under each GIF frame


def agent_disc_mask(cell_px: int) -> np.ndarray:
    """(cell_px, cell_px) bool: pixels whose centres lie within cell_px/4 of the cell centre."""
    centres = np.arange(cell_px) + 0.5
    rows, cols = np.meshgrid(centres, centres, indexing="ij")
    radius = cell_px / 4
    return (rows - cell_px / 2) ** 2 + (cols - cell_px / 2) ** 2 <= radius**2


def draw_static(walls: np.ndarray, target: tuple[int, int], cell_px: int) -> np.ndarray:
    """The frame without the agent: walls, paths and the target square."""
    colours = np.array([PATH_RGB, WALL_RGB], dtype=np.uint8)[walls]  # (H, W, 3)
    colours[target] = TARGET_RGB
    return np.repeat(np.repeat(colours, cell_px, axis=0), cell_px, axis=1)


class FrameRenderer:
    """Keeps one canvas per episode and moves the agent disc on it incrementally."""

    def __init__(self, walls: np.ndarray, target: tuple[int, int], cell_px: int) -> None:
        self.cell_px = cell_px
        self._static = draw_static(walls, target, cell_px)
        self._canvas = self._static.copy()
        self._mask = agent_disc_mask(cell_px)
        self._agent: tuple[int, int] | None = None

    def _cell(self, image: np.ndarray, cell: tuple[int, int]) -> np.ndarray:
        r, c = cell[0] * self.cell_px, cell[1] * self.cell_px
        return image[r : r + self.cell_px, c : c + self.cell_px]

    def place_agent(self, cell: tuple[int, int]) -> None:
        if self._agent is not None:
            self._cell(self._canvas, self._agent)[...] = self._cell(self._static, self._agent)
        self._cell(self._canvas, cell)[self._mask] = AGENT_RGB
        self._agent = cell

    def frame(self) -> np.ndarray:
        return self._canvas.copy()


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def png_bytes(image: np.ndarray) -> bytes:
    """Lossless PNG of an RGB frame.

    Written directly (no row filters, zlib level 1) because maze frames are flat colour:
    this is about 4x faster than Pillow's adaptive-filter encoder at a similar size, which
    matters when every turn of every rollout sends a frame. Pillow decodes it (tested).
    """
    image = np.ascontiguousarray(image, dtype=np.uint8)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"png_bytes expects an (H, W, 3) uint8 frame, got shape {image.shape}")
    height, width, _ = image.shape
    rows = np.zeros((height, width * 3 + 1), dtype=np.uint8)  # leading 0 = filter "None"
    rows[:, 1:] = image.reshape(height, -1)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit truecolour
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(rows.tobytes(), 1))
        + _png_chunk(b"IEND", b"")
    )


def png_data_uri(image: np.ndarray) -> str:
    """``data:image/png;base64,...`` for OpenAI-style ``image_url`` message parts."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode("ascii")


def episode_caption(solved: bool, moves: int) -> str:
    """The line under an episode GIF: ``solved in 6 moves`` or ``failed after 15 moves``."""
    plural = "" if moves == 1 else "s"
    return f"solved in {moves} move{plural}" if solved else f"failed after {moves} move{plural}"


def _gif_frame(frame: np.ndarray, scale: int, caption: str | None) -> Image.Image:
    """One frame scaled up by ``scale`` (nearest neighbour: cells stay crisp), with the caption band below."""
    image = Image.fromarray(np.asarray(frame, dtype=np.uint8))
    image = image.resize((image.width * scale, image.height * scale), Image.Resampling.NEAREST)
    if caption is None:
        return image
    from PIL import ImageDraw, ImageFont

    framed = Image.new("RGB", (image.width, image.height + CAPTION_PX), PATH_RGB)
    framed.paste(image, (0, 0))
    font = ImageFont.load_default(size=CAPTION_PX * 2 // 3)
    ImageDraw.Draw(framed).text(
        (image.width // 2, image.height + CAPTION_PX // 2), caption, fill=(0, 0, 0), font=font, anchor="mm"
    )
    return framed


def _encode_gif(images: list[Image.Image], frame_ms: int) -> bytes:
    """The frames as one looping GIF, the last frame held three times longer so the end reads."""
    durations = [frame_ms] * (len(images) - 1) + [frame_ms * 3]
    buffer = io.BytesIO()
    images[0].save(
        buffer, format="GIF", save_all=True, append_images=images[1:], duration=durations, loop=0, optimize=False
    )
    return buffer.getvalue()


def episode_gif_bytes(
    frames: Sequence[np.ndarray], frame_ms: int = 400, caption: str | None = None, min_px: int = GIF_MIN_PX
) -> bytes:
    """The frames as an animated GIF (looping, last frame held longer).

    Frames are scaled up by a whole factor to at least ``min_px`` wide, and ``caption`` (e.g.
    :func:`episode_caption`) is written under every frame, so the GIF reads on its own in a UI.
    """
    if not frames:
        raise ValueError("episode_gif needs at least one frame")
    scale = max(1, -(-min_px // np.asarray(frames[0]).shape[1]))  # ceil(min_px / width)
    images = [_gif_frame(frame, scale, caption) for frame in frames]
    return _encode_gif(images, frame_ms)


def comparison_gif_bytes(
    left: Sequence[np.ndarray],
    right: Sequence[np.ndarray],
    left_caption: str,
    right_caption: str,
    frame_ms: int = 400,
    min_px: int = GIF_MIN_PX,
    gap_px: int = 12,
) -> bytes:
    """Two episodes of the same maze side by side, frame by frame, each with its caption.

    For a maze a run fixed or broke: the base model's episode beside the trained one's. The
    shorter episode holds its last frame until the longer one ends.
    """
    if not left or not right:
        raise ValueError("comparison_gif_bytes needs at least one frame on each side")
    scale = max(1, -(-min_px // np.asarray(left[0]).shape[1]))
    count = max(len(left), len(right))
    images = []
    for index in range(count):
        a = _gif_frame(left[min(index, len(left) - 1)], scale, left_caption)
        b = _gif_frame(right[min(index, len(right) - 1)], scale, right_caption)
        pair = Image.new("RGB", (a.width + gap_px + b.width, max(a.height, b.height)), WALL_RGB)
        pair.paste(a, (0, 0))
        pair.paste(b, (a.width + gap_px, 0))
        images.append(pair)
    return _encode_gif(images, frame_ms)


def episode_gif(
    frames: Sequence[np.ndarray],
    path: str | os.PathLike,
    frame_ms: int = 400,
    caption: str | None = None,
    min_px: int = GIF_MIN_PX,
) -> Path:
    """Write :func:`episode_gif_bytes` to ``path`` (temporary name, then rename); returns the path.

    ``envs`` imports nothing of ``mazerl``, so this is its own copy of ``mazerl.atomic.write_bytes``.
    """
    data = episode_gif_bytes(frames, frame_ms, caption, min_px)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path
