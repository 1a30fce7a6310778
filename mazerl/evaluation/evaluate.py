"""The eval stage: every maze of an eval set played greedily, in parallel over Ray workers.

    settings = EvalSettings(eval_set="maze256-small-v1", eval_workers=2)
    report = evaluate("/path/to/model", settings, out_dir="eval/baseline")

Writes ``results.jsonl`` (one line per maze, in set order), ``summary.json`` and up to
``settings.gif_count`` episode GIFs (half solved, half failed where the set allows) into
``out_dir``, each atomically, and returns an :class:`EvalReport`: a small frozen value
(paths and numbers) that a Prefect task can return and cache.

Workers are Ray actors that load the policy once and play chunks of the set. By default the
chunks are sized from the worker count (:func:`eval_chunks`): every worker gets one, at most
:data:`MAX_CHUNK` mazes each, so 64 mazes on 6 GPU workers keep all 6 busy instead of two
chunks of 32. A given chunking gives the same results maze by maze whatever the number of
workers; ``chunk_size`` fixes it explicitly. Without a running Ray
(and no ``ray_address``) the call runs on the embedded loopback-only head
(:mod:`mazerl.cluster.head.local`), started if none runs, never on a bare ``ray.init()``, which
listens on every interface and writes an 0644 token into ``~/.ray``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from envs.evalset import EvalSet
from envs.evalset import load as load_eval_set
from envs.maze import optimal_moves
from mazerl.atomic import write_bytes, write_json, write_jsonl
from mazerl.cluster.head.driver import ray_driver
from mazerl.cluster.head.local import local_ray_head
from mazerl.eval_files import RESULTS_FILE, SUMMARY_FILE
from mazerl.evaluation.placement import reserve_workers
from mazerl.evaluation.settings import EvalSettings
from mazerl.evaluation.summary import summarize
from mazerl.evaluation.workers import EvalJob, EvalWorker, MazeCounter
from mazerl.fingerprint import model_fingerprint
from mazerl.policy.context_mode import check_context_mode
from mazerl.policy.loader import ModelLoadError, check_adapter_dir, check_image_text_to_text, check_model_files
from mazerl.starter.record import recorded_context_mode

GIF_DIR = "gifs"
PROGRESS_POLL_S = 2.0  # how often the driver asks the workers' maze counter while chunks run
# Mazes one worker batches per turn at most: the hf engine's batch on CPU, and what every eval used
# before chunks were sized from the workers (the embedded run's 256 mazes on 2 workers still get 32).
MAX_CHUNK = 32


@dataclass(frozen=True)
class EvalReport:
    """Where an eval wrote its files and its headline numbers."""

    out_dir: Path
    results_path: Path
    summary_path: Path
    gif_paths: tuple[Path, ...]
    eval_set: str
    n: int
    solved: int
    success_rate: float
    success_ci95: tuple[float, float]
    mean_moves_solved: float | None
    moves_over_optimal: float | None
    parse_failure_rate: float
    budget_ceiling: float
    wall_seconds: float
    episodes_per_second: float
    model_digest: str
    eval_set_digest: str
    avg_moves: float | None = None  # moves per maze, solved or not; None in summaries written before it

    @staticmethod
    def from_summary(summary_path: str | os.PathLike) -> EvalReport:
        """Re-read a finished eval (e.g. a cached baseline) from its ``summary.json``."""
        summary_path = Path(summary_path)
        summary = json.loads(summary_path.read_text())
        out_dir = summary_path.parent
        values = {f.name: summary[f.name] for f in fields(EvalReport) if f.name in summary}
        return EvalReport(
            **values
            | {
                "out_dir": out_dir,
                "results_path": out_dir / RESULTS_FILE,
                "summary_path": summary_path,
                "gif_paths": tuple(out_dir / p for p in summary["gifs"]),
                "success_ci95": tuple(summary["success_ci95"]),
            }
        )


def chunk_size_for(mazes: int, workers: int) -> int:
    """Mazes per chunk so that every worker gets one: ceil(mazes / workers), at most :data:`MAX_CHUNK`."""
    if mazes < 1 or workers < 1:
        raise ValueError(f"mazes ({mazes}) and workers ({workers}) must be >= 1")
    return min(MAX_CHUNK, math.ceil(mazes / workers))


def eval_chunks(mazes: int, workers: int, chunk_size: int | None = None) -> list[list[int]]:
    """The maze indices ``0..mazes-1`` in the chunks the workers play (``chunk_size`` None: :func:`chunk_size_for`)."""
    size = chunk_size_for(mazes, workers) if chunk_size is None else chunk_size
    return [list(range(start, min(start + size, mazes))) for start in range(0, mazes, size)]


def _check_arguments(model_dir: Path, settings: EvalSettings, chunk_size: int | None, threads: int) -> None:
    settings.check()
    for name, value in (("chunk_size", 1 if chunk_size is None else chunk_size), ("threads_per_worker", threads)):
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    if not model_dir.is_dir():
        raise ModelLoadError(f"model_dir={str(model_dir)!r} is not a directory; pass a Hugging Face model directory")
    check_model_files(model_dir)
    check_image_text_to_text(model_dir)


def evaluate(
    model_dir: str | os.PathLike,
    settings: EvalSettings,
    out_dir: str | os.PathLike = "eval",
    adapter: str | os.PathLike | None = None,
    *,
    ray_address: str | None = None,
    action_format: str = "tuple",
    chunk_size: int | None = None,
    threads_per_worker: int = 1,
    device: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    log: Callable[[str], None] = print,
) -> EvalReport:
    """Evaluate a model (optionally with a LoRA ``adapter``) greedily on every maze of ``settings.eval_set``.

    ``settings.history_images``, ``.history_text``: None uses the model's recorded setting (the starter's) or
    "all". ``settings.eval_gpus_per_worker``: None takes the engine's default
    (:func:`mazerl.evaluation.engines.gpus_per_worker`: one GPU per vllm worker, none for hf).
    ``chunk_size``: mazes a worker plays as one batch; None sizes them from the workers (:func:`eval_chunks`).
    ``progress(done, total)`` is called as mazes finish (polled every :data:`PROGRESS_POLL_S`). A
    mode other than the one the model was trained in is allowed (a run that trains in another mode
    evaluates its starter in that mode too) but said loudly through ``log`` and recorded in the summary.
    """
    started = time.perf_counter()
    model_dir = Path(model_dir).expanduser().resolve()
    _check_arguments(model_dir, settings, chunk_size, threads_per_worker)
    if adapter is not None:
        adapter = check_adapter_dir(adapter)
    mazes = load_eval_set(settings.eval_set)
    count = len(mazes) if settings.max_eval_mazes is None else min(settings.max_eval_mazes, len(mazes))
    history, text, recorded = _context_mode(model_dir, settings, log)
    out_dir = Path(out_dir).expanduser().resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    job = EvalJob(
        model_dir=str(model_dir),
        adapter_dir=str(adapter) if adapter is not None else None,
        settings=replace(settings, history_images=history, history_text=text),  # the modes resolved
        action_format=action_format,
        threads=threads_per_worker,
        device=device,
    )
    chunks = eval_chunks(count, settings.eval_workers, chunk_size)
    gpus = settings.gpus_per_worker()  # checked by settings.check()
    workers = min(settings.eval_workers, len(chunks))
    rows, gifs, rollout_seconds, placement = _run_on_ray(job, chunks, workers, gpus, ray_address, progress)
    rows.sort(key=lambda row: row["index"])
    gif_paths = _write_gifs(out_dir, rows, gifs, settings.gif_count)
    summary = _summary(model_dir, adapter, mazes, count, job, rows, gif_paths, out_dir, settings.eval_workers)
    summary["settings"]["chunk_size"] = len(chunks[0])  # mazes batched per turn: part of what decides the replies
    summary["worker_placement"] = placement  # node, GPUs and device of each worker
    summary["gpus_per_worker"] = gpus
    summary["trained_context_mode"] = {"history_images": recorded[0], "history_text": recorded[1]}
    summary["rollout_seconds"] = round(rollout_seconds, 3)
    summary["episodes_per_second"] = count / rollout_seconds if rollout_seconds > 0 else 0.0
    summary["wall_seconds"] = round(time.perf_counter() - started, 3)
    write_jsonl(out_dir / RESULTS_FILE, rows)
    write_json(out_dir / SUMMARY_FILE, summary)
    return EvalReport.from_summary(out_dir / SUMMARY_FILE)


def _context_mode(
    model_dir: Path, settings: EvalSettings, log: Callable[[str], None]
) -> tuple[int | str, int | str, tuple[int | str, int | str]]:
    """(history_images, history_text, the model's recorded mode): None settings take the recorded mode,
    and a mode other than the one the model was trained in is said loudly."""
    recorded = recorded_context_mode(model_dir)  # the starter's record; other models: every frame and line
    history = recorded[0] if settings.history_images is None else settings.history_images
    text = recorded[1] if settings.history_text is None else settings.history_text
    check_context_mode(history, text)
    if recorded != ("all", "all") and recorded != (history, text):
        log(
            f"warning: evaluating {model_dir.name} with history_images={history!r}, history_text={text!r}, but it was "
            f"trained with history_images={recorded[0]!r}, history_text={recorded[1]!r}: it sees contexts it was not "
            "trained on"
        )
    return history, text, recorded


def _run_on_ray(
    job: EvalJob,
    chunks: list[list[int]],
    workers: int,
    gpus: float,
    ray_address: str | None,
    progress: Callable[[int, int], None] | None,
) -> tuple[list[dict[str, Any]], dict[int, bytes], float, list[dict[str, Any]]]:
    import ray  # heavy: imported when an eval runs, not when the module is (tasks, CLIs)
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    stack = contextlib.ExitStack()
    started_here = _connect_driver(stack, workers, job.threads, ray_address)
    group = None
    try:
        group = reserve_workers(workers, job.threads, gpus)  # a bounded wait, naming what holds the cluster
        actor = ray.remote(num_cpus=job.threads, num_gpus=gpus)(EvalWorker)
        actors = [
            actor.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, index)).remote(job)
            for index in range(workers)
        ]
        counter = ray.remote(num_cpus=0)(MazeCounter).remote() if progress is not None else None
        # Actors load the policy in their constructor; waiting for it keeps the rollout clock honest.
        placement = ray.get([a.placement.remote() for a in actors])
        rollout_started = time.perf_counter()
        rows, gifs = _play_chunks(chunks, actors, counter, progress)
        return rows, gifs, time.perf_counter() - rollout_started, placement
    finally:
        if group is not None:
            with contextlib.suppress(Exception):  # the workers' resources go back at once, not when the driver ends
                remove_placement_group(group)
        if started_here:
            ray.shutdown()
        stack.close()


def _connect_driver(stack: contextlib.ExitStack, workers: int, threads: int, ray_address: str | None) -> bool:
    """Make this process a Ray driver unless it is one already: of ``ray_address`` (or ``RAY_ADDRESS``), else of
    the embedded loopback-only head, started if none runs (never a bare ``ray.init()``). True: connected here."""
    import ray  # heavy: imported when an eval runs, not when the module is (tasks, CLIs)

    started_here = not ray.is_initialized()
    if started_here:
        address = ray_address or os.environ.get("RAY_ADDRESS")
        if address is not None:
            ray.init(address=address, log_to_driver=False, logging_level="WARNING")  # no "Connecting to ..." lines
        else:
            head = stack.enter_context(local_ray_head(num_cpus=max(workers * threads, 2)))  # if it starts one
            stack.enter_context(ray_driver(head))
            cpus = int(ray.cluster_resources().get("CPU", 0))
            if workers * threads > cpus:  # the actors would wait for CPUs forever
                stack.close()
                raise ValueError(
                    f"workers={workers} x threads_per_worker={threads} need {workers * threads} CPUs but the "
                    f"embedded Ray head at {head.address} has {cpus}; lower workers to {max(cpus // threads, 1)}"
                )
    return started_here


def _play_chunks(
    chunks: list[list[int]], actors: list[Any], counter: Any, progress: Callable[[int, int], None] | None
) -> tuple[list[dict[str, Any]], dict[int, bytes]]:
    """Each worker takes the next chunk when it is free (ActorPool's schedule), while the driver reads the
    maze counter between results to call ``progress``."""
    import ray  # heavy: imported when an eval runs, not when the module is (tasks, CLIs)

    total = sum(len(chunk) for chunk in chunks)
    rows: list[dict[str, Any]] = []
    gifs: dict[int, bytes] = {}
    shown = -1

    def show(done: int) -> None:
        nonlocal shown
        if progress is not None and done > shown:
            progress(done, total)
            shown = done

    show(0)
    waiting, idle, running = list(chunks), list(actors), {}
    while waiting or running:
        while waiting and idle:
            worker = idle.pop()
            running[worker.run.remote(waiting.pop(0), counter)] = worker
        ready, _ = ray.wait(list(running), num_returns=1, timeout=PROGRESS_POLL_S)
        for ref in ready:
            result = ray.get(ref)
            idle.append(running.pop(ref))
            rows += result.rows
            gifs |= result.gifs
        if counter is not None and running:
            show(max(len(rows), min(ray.get(counter.value.remote()), total)))
        else:
            show(len(rows))
    return rows, gifs


def _write_gifs(out_dir: Path, rows: list[dict[str, Any]], gifs: dict[int, bytes], gif_count: int) -> list[Path]:
    """Half solved, half failed (the lowest maze indices of each), topped up from the other kind."""
    solved = [row["index"] for row in rows if row["solved"] and row["index"] in gifs]
    failed = [row["index"] for row in rows if not row["solved"] and row["index"] in gifs]
    take_solved = min(len(solved), max(gif_count - len(failed), (gif_count + 1) // 2))
    chosen = sorted(solved[:take_solved] + failed[: gif_count - take_solved])
    directory = out_dir / GIF_DIR
    directory.mkdir(exist_ok=True)
    paths = []
    by_index = {row["index"]: row for row in rows}
    for index in chosen:
        row = by_index[index]
        path = directory / f"maze{index:04d}-{'solved' if row['solved'] else 'failed'}.gif"
        write_bytes(path, gifs[index])
        row["gif"] = path.relative_to(out_dir).as_posix()
        paths.append(path)
    return paths


def _summary(
    model_dir: Path,
    adapter: Path | None,
    mazes: EvalSet,
    count: int,
    job: EvalJob,
    rows: list[dict[str, Any]],
    gif_paths: list[Path],
    out_dir: Path,
    workers: int,
) -> dict[str, Any]:
    # The ceiling of the mazes actually played (the whole set unless max_mazes cut it).
    ceiling = sum(optimal_moves(layout) + 1 <= mazes.max_moves for layout in mazes.layouts[:count]) / count
    return {
        "eval_set": mazes.name,
        "eval_set_digest": mazes.digest,
        "model_dir": str(model_dir),
        "model_digest": model_fingerprint(model_dir),
        "adapter": str(adapter) if adapter is not None else None,
        "adapter_digest": model_fingerprint(adapter) if adapter is not None else None,
        **summarize(rows, ceiling),
        "max_moves": mazes.max_moves,
        "settings": {  # the summary file's own names (read by tracking.evals.eval_params, as eval.* params)
            "engine": job.settings.eval_engine,
            "decoding": "greedy",
            "history_images": job.settings.history_images,
            "history_text": job.settings.history_text,
            "action_format": job.action_format,
            "max_new_tokens": job.settings.max_new_tokens,
            "max_mazes": count,
        },
        "workers": workers,
        "gifs": [path.relative_to(out_dir).as_posix() for path in gif_paths],
    }
