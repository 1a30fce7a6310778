"""The eval worker: loads the policy once, then plays chunks of eval mazes greedily.

It runs as a Ray actor (one per worker), but is a plain class, so it can be tested and
profiled in-process. A chunk is a fixed list of maze indices; chunks are the same whatever
the number of workers, so every maze is played in exactly the same batch (same padding,
same thread count) and greedy results do not depend on how many workers there are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from envs.evalset import load as load_eval_set
from envs.render import episode_caption, episode_gif_bytes
from mazerl.evaluation.settings import EvalSettings
from mazerl.evaluation.summary import result_row
from mazerl.policy.engines import GenerationSettings
from mazerl.policy.episodes import run_episodes
from mazerl.policy.loader import load_policy, load_processor
from mazerl.policy.prefix_engine import PrefixCachingEngine
from mazerl.policy.vision_cache import VisionCache
from mazerl.policy.vllm_engine import VLLMEngine  # vllm itself is imported only when an engine is built


@dataclass(frozen=True)
class EvalJob:
    """Everything a worker needs, as plain values (it crosses process boundaries)."""

    model_dir: str
    adapter_dir: str | None
    settings: EvalSettings  # its context mode resolved (never None); gif_count: per chunk, GIFs of up to
    # this many solved and this many failed episodes are returned
    action_format: str
    threads: int  # torch CPU threads per worker
    device: str | None  # None: GPU if the worker has one, else CPU


@dataclass(frozen=True)
class ChunkResult:
    rows: list[dict[str, Any]]
    gifs: dict[int, bytes]  # maze index -> GIF bytes, for candidate episodes only


def make_engine(job: EvalJob) -> tuple[Any, Any]:
    """(engine, processor) for the job; vLLM is imported only when asked for."""
    if job.settings.eval_engine == "hf":
        policy = load_policy(job.model_dir, adapter_dir=job.adapter_dir, device=job.device)
        VisionCache().attach(policy.model)  # eval never changes the weights: encode each frame once
        return PrefixCachingEngine.from_policy(policy), policy.processor
    if job.settings.eval_engine == "vllm":
        processor = load_processor(job.model_dir)
        return VLLMEngine(job.model_dir, processor, adapter_dir=job.adapter_dir), processor
    raise ValueError(f"eval_engine={job.settings.eval_engine!r} must be 'hf' or 'vllm'")


class EvalWorker:
    """Holds one loaded policy and plays chunks of the eval set."""

    def __init__(self, job: EvalJob) -> None:
        torch.set_num_threads(job.threads)
        self.job = job
        self.eval_set = load_eval_set(job.settings.eval_set)
        self.engine, self.processor = make_engine(job)

    def placement(self) -> dict[str, Any]:
        """Where this worker runs (returns once the policy is loaded): the Ray node, the GPUs Ray
        gave it, and the device the engine uses, so a report can show that GPU workers got GPUs."""
        import ray  # only inside a Ray actor, where ray is already loaded

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "device": str(getattr(self.engine, "device", "n/a")),
        }

    def run(self, indices: list[int], counter: Any = None) -> ChunkResult:
        """Play the mazes ``indices`` in one batch. ``counter`` (a :class:`MazeCounter` actor) hears of
        every maze as its episode ends, so progress moves by the maze, not by the chunk."""
        eval_set, job = self.eval_set, self.job
        reported = [0]

        def report(finished: int) -> None:
            if counter is not None and finished > reported[0]:
                counter.add.remote(finished - reported[0])  # fire and forget: progress never waits
                reported[0] = finished

        episodes = run_episodes(
            self.engine,
            self.processor,
            [eval_set.layouts[i] for i in indices],
            GenerationSettings(greedy=True, max_new_tokens=job.settings.max_new_tokens),
            maze_ids=[f"{eval_set.name}/{i}" for i in indices],
            max_moves=eval_set.max_moves,
            action_format=job.action_format,
            cell_px=eval_set.cell_px,
            history_images=job.settings.history_images,
            history_text=job.settings.history_text,
            keep_frames=job.settings.gif_count > 0,
            on_turn=lambda _turn, active: report(len(indices) - active),
        )
        report(len(indices))
        rows = [result_row(i, eval_set.seeds[i], e) for i, e in zip(indices, episodes, strict=True)]
        gifs: dict[int, bytes] = {}
        for solved in (True, False):
            chosen = [(i, e) for i, e in zip(indices, episodes, strict=True) if e.solved == solved]
            for index, episode in chosen[: job.settings.gif_count]:
                gifs[index] = episode_gif_bytes(episode.frames, caption=episode_caption(episode.solved, episode.moves))
        return ChunkResult(rows=rows, gifs=gifs)


class MazeCounter:
    """How many mazes the workers have finished (a Ray actor the eval's driver reads)."""

    def __init__(self) -> None:
        self.done = 0

    def add(self, count: int) -> None:
        self.done += count

    def value(self) -> int:
        return self.done
