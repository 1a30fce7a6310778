"""The run's two evals side by side, maze by maze: which mazes training fixed and which it broke.

The baseline (base model) and final (merged model) evals play the same mazes greedily, so a
maze's two rows say what training changed there. This module pairs them
(:func:`paired_mazes`) and puts the comparison on the parent MLflow run
(:func:`log_per_maze`):

- ``per_maze/comparison.json``: an MLflow table (``log_table``), one row per maze: index,
  seed, solved and moves before and after, the optimum, and the change (``fixed``,
  ``broken``, ``still failing``, ``both solved``);
- ``per_maze/gifs/maze<index>-<fixed|broken>.gif``: a few fixed mazes and a broken one, the
  baseline's episode beside the final one's. The world is deterministic, so both are redrawn
  from the evals' recorded replies (:func:`envs.maze.replay`): no model is loaded here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from envs.evalset import load as load_eval_set
from envs.maze import replay
from envs.render import comparison_gif_bytes, episode_caption
from mazerl.atomic import write_bytes
from mazerl.eval_files import read_result_rows
from mazerl.evaluation.evaluate import EvalReport
from mazerl.tracking.store import client_for

TABLE_FILE = "per_maze/comparison.json"
GIF_FOLDER = "per_maze/gifs"
FIXED_GIFS, BROKEN_GIFS = 3, 1
CHANGES = ("fixed", "broken", "still failing", "both solved")


@dataclass(frozen=True)
class PairedMaze:
    """One maze as both evals played it."""

    index: int
    seed: int | None
    baseline_solved: bool
    final_solved: bool
    baseline_moves: int
    final_moves: int
    optimal_moves: int

    @property
    def change(self) -> str:
        """``fixed``, ``broken``, ``still failing`` or ``both solved``."""
        if self.baseline_solved != self.final_solved:
            return "fixed" if self.final_solved else "broken"
        return "both solved" if self.final_solved else "still failing"


def paired_mazes(baseline: EvalReport, final: EvalReport) -> list[PairedMaze]:
    """The mazes both evals played, by index (a maze only one of them played is left out)."""
    before = {row["index"]: row for row in read_result_rows(baseline.results_path)}
    after = {row["index"]: row for row in read_result_rows(final.results_path)}
    return [
        PairedMaze(
            index=index,
            seed=after[index].get("seed"),
            baseline_solved=bool(before[index]["solved"]),
            final_solved=bool(after[index]["solved"]),
            baseline_moves=int(before[index]["moves"]),
            final_moves=int(after[index]["moves"]),
            optimal_moves=int(after[index].get("optimal_moves", before[index].get("optimal_moves", 0))),
        )
        for index in sorted(set(before) & set(after))
    ]


def counts(pairs: list[PairedMaze]) -> dict[str, int]:
    """How many mazes fall under each change."""
    return {change: sum(pair.change == change for pair in pairs) for change in CHANGES}


def changed_mazes(pairs: list[PairedMaze]) -> list[PairedMaze]:
    """The fixed mazes, then the broken ones (each by index)."""
    return [pair for change in ("fixed", "broken") for pair in pairs if pair.change == change]


def table_columns(pairs: list[PairedMaze]) -> dict[str, list]:
    """The comparison as columns for ``MlflowClient.log_table`` (the mazes that changed first)."""
    order = changed_mazes(pairs) + [pair for pair in pairs if pair.change in ("still failing", "both solved")]
    return {
        "maze": [pair.index for pair in order],
        "change": [pair.change for pair in order],
        "baseline_solved": [pair.baseline_solved for pair in order],
        "final_solved": [pair.final_solved for pair in order],
        "baseline_moves": [pair.baseline_moves for pair in order],
        "final_moves": [pair.final_moves for pair in order],
        "optimal_moves": [pair.optimal_moves for pair in order],
        "seed": [pair.seed for pair in order],
    }


def _episode_settings(report: EvalReport) -> dict:
    summary = json.loads(report.summary_path.read_text())
    return {"action_format": summary.get("settings", {}).get("action_format", "tuple")}


def comparison_gifs(baseline: EvalReport, final: EvalReport, pairs: list[PairedMaze], out_dir: Path) -> list[Path]:
    """GIFs of the first :data:`FIXED_GIFS` fixed mazes and :data:`BROKEN_GIFS` broken ones, the
    baseline's episode beside the final one's, written into ``out_dir``.

    A maze whose replay does not end as its eval recorded (an eval written by other code than
    this world's) gets no GIF rather than a wrong one.
    """
    eval_set = load_eval_set(final.eval_set)
    rows = {
        "baseline": {row["index"]: row for row in read_result_rows(baseline.results_path)},
        "final": {row["index"]: row for row in read_result_rows(final.results_path)},
    }
    settings = {"baseline": _episode_settings(baseline), "final": _episode_settings(final)}
    chosen = [p for p in pairs if p.change == "fixed"][:FIXED_GIFS]
    chosen += [p for p in pairs if p.change == "broken"][:BROKEN_GIFS]
    written = []
    for pair in chosen:
        episodes = {}
        for side in ("baseline", "final"):
            row = rows[side][pair.index]
            episodes[side] = replay(
                eval_set.layouts[pair.index],
                list(row.get("actions") or []),
                max_moves=eval_set.max_moves,
                cell_px=eval_set.cell_px,
                **settings[side],
            )
        if any(
            (episodes[side].solved, episodes[side].moves)
            != (bool(rows[side][pair.index]["solved"]), rows[side][pair.index]["moves"])
            for side in episodes
        ):
            continue
        data = comparison_gif_bytes(
            episodes["baseline"].frames,
            episodes["final"].frames,
            f"baseline: {episode_caption(episodes['baseline'].solved, episodes['baseline'].moves)}",
            f"final: {episode_caption(episodes['final'].solved, episodes['final'].moves)}",
        )
        written.append(write_bytes(out_dir / f"maze{pair.index}-{pair.change}.gif", data))
    return written


def log_per_maze(
    tracking_uri: str, run_id: str, baseline: EvalReport, final: EvalReport, out_dir: Path
) -> tuple[list[PairedMaze], list[Path]]:
    """The paired table and the comparison GIFs on run ``run_id`` (the parent); returns both."""
    pairs = paired_mazes(baseline, final)
    client = client_for(tracking_uri)
    if pairs:
        client.log_table(run_id, data=table_columns(pairs), artifact_file=TABLE_FILE)
    gifs = comparison_gifs(baseline, final, pairs, out_dir)
    for gif in gifs:
        client.log_artifact(run_id, str(gif), GIF_FOLDER)
    return pairs, gifs
