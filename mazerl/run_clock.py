"""How far a pipeline run is and how long the rest will take: ``stage k/7`` lines and a total time left.

The seven stages (:data:`STAGES`) each announce themselves when they start::

    stage 4/7 train: 10:12 elapsed, about 14:30 left in total
    stage 2/7 verify_cluster: 00:08 elapsed, time left not known yet (not timed here before: train, merge_lora)

The time left is the sum of the remaining stages' estimates. A stage's estimate comes, first
found, from

1. the same work already timed in this run: the final eval plays the baseline's mazes with the
   baseline's settings on a model of the same size, so it takes about as long;
2. the last run in this data root whose stage did the same work (``<root>/stage_times.json``,
   one entry per stage and :func:`work key <work_keys>`; the train stage's entry is seconds per
   step, so a run with more steps of the same settings scales);
3. nowhere: the line names the stages it could not estimate instead of guessing.

While training runs, its own step line knows best how long it has left (``..., 14:03 left``):
:meth:`RunClock.total_left` takes that in place of the train stage's estimate.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mazerl.atomic import write_json

STAGES = ("prepare", "verify_cluster", "baseline_eval", "train", "merge_lora", "final_eval", "promote")
TIMES_FILE = "stage_times.json"
PER_STEP = "train"  # the stage whose recorded time is per step (its work key leaves the step count out)
SAME_WORK = {"final_eval": "baseline_eval"}  # a stage this run may already have timed the same work for
STAGE_LEFT = re.compile(r"(\S+) left$")  # the end of a ProgressMeter line: its own time left


def digest(value: Any) -> str:
    """A short digest of a JSON-able value (a work key)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def work_keys(
    *, eval_settings: Mapping[str, Any], training: Mapping[str, Any], base_model: str | os.PathLike
) -> dict[str, str]:
    """What decides each stage's duration, as a digest per stage.

    Both evals share a key (the eval settings and the model); training's key is its settings
    without the step count and the run's names; the merge's is the base model. ``prepare``,
    ``verify_cluster`` and ``promote`` take about the same time for any run of a data root.
    """
    train = {key: value for key, value in training.items() if key not in ("run_id", "mlflow", "steps")}
    evals = digest({"settings": dict(eval_settings), "model": str(base_model)})
    return {
        "prepare": "any",
        "verify_cluster": "any",
        "baseline_eval": evals,
        "train": digest(train),
        "merge_lora": digest(str(base_model)),
        "final_eval": evals,
        "promote": "any",
    }


def format_seconds(seconds: float) -> str:
    """``04:05`` or ``1:02:03``, as tqdm and the step lines write times."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def parse_seconds(text: str) -> float | None:
    """``14:03`` / ``2:15:24`` (a step line's "left") in seconds; None for ``?`` or anything else."""
    parts = text.strip().split(":")
    if not 2 <= len(parts) <= 3 or not all(part.isdigit() for part in parts):
        return None
    total = 0
    for part in parts:
        total = total * 60 + int(part)
    return float(total)


@dataclass
class RunClock:
    """The stage times of one pipeline run, read from and written to the data root.

    ``started_at`` is the run's start (epoch seconds, set once by its first stage), so every task
    of the run, whichever process it is in, reports the same elapsed time.
    """

    root: Path
    run_id: str
    keys: dict[str, str]
    steps: int
    started_at: float

    @property
    def path(self) -> Path:
        return self.root / TIMES_FILE

    def _recorded(self) -> dict[str, dict[str, float]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _this_run(self, recorded: Mapping[str, Any]) -> Mapping[str, float]:
        run = recorded.get("runs", {}).get(self.run_id, {})
        return run if isinstance(run, dict) else {}

    def estimate(self, stage: str) -> float | None:
        """Seconds ``stage`` will take, or None where nothing like it was timed (see the module docstring)."""
        recorded = self._recorded()
        this_run = self._this_run(recorded)
        twin = SAME_WORK.get(stage)
        if twin is not None and twin in this_run and self.keys.get(twin) == self.keys.get(stage):
            return float(this_run[twin])
        seconds = recorded.get("stages", {}).get(stage, {}).get(self.keys.get(stage, ""))
        if not isinstance(seconds, int | float):
            return None
        return float(seconds) * self.steps if stage == PER_STEP else float(seconds)

    def record(self, stage: str, seconds: float, *, same_work: bool = True) -> None:
        """Keep ``stage``'s duration for later estimates (``same_work=False``: it did not do its usual
        work, e.g. a baseline taken from the cache, and only this run's record of it is kept)."""
        recorded = self._recorded()
        this_run = self._this_run(recorded)
        stages = recorded.setdefault("stages", {})
        if same_work:
            per = seconds / max(self.steps, 1) if stage == PER_STEP else seconds
            stages.setdefault(stage, {})[self.keys.get(stage, "")] = round(per, 3)
        runs = recorded.setdefault("runs", {})
        runs.pop(self.run_id, None)
        runs[self.run_id] = {**this_run, stage: round(seconds, 3)} if same_work else dict(this_run)
        for old in list(runs)[:-8]:  # oldest first: the few latest runs are enough for their own estimates
            del runs[old]
        write_json(self.path, recorded)

    def elapsed(self) -> float:
        return max(0.0, time.time() - self.started_at)

    def total_left(self, stage: str, stage_left: float | None = None) -> tuple[float, list[str]]:
        """(seconds left, stages not estimated) from the start of ``stage`` on, or from within it
        when ``stage_left`` (its own time left) is given."""
        index = STAGES.index(stage)
        seconds, unknown = 0.0, []
        for later in STAGES[index:]:
            estimate = stage_left if later == stage and stage_left is not None else self.estimate(later)
            if estimate is None:
                if later != "promote":  # seconds; not worth a "not known yet"
                    unknown.append(later)
            else:
                seconds += estimate
        return seconds, unknown

    def left_text(self, stage: str, stage_left: float | None = None) -> str:
        """``about 14:30 left in total`` (``, not counting merge_lora``), or why it is not known yet."""
        seconds, unknown = self.total_left(stage, stage_left)
        if unknown and not seconds:
            if len(unknown) > 2:
                return "time left not known yet (the first run of this work here; the stages will say)"
            return f"time left not known yet (not timed here before: {', '.join(unknown)})"
        return f"about {format_seconds(seconds)} left in total" + (
            f" (+ {', '.join(unknown)}: not timed here before)" if unknown else ""
        )

    def with_total_left(self, line: str, stage: str) -> str:
        """A progress line of ``stage`` that ends in its own time left (``..., 01:10 left``), with the
        whole run's after it (``; about 04:30 left in total``); any other line as it is."""
        left = STAGE_LEFT.search(line)
        if left is None or "in total" in line:
            return line
        return f"{line}; {self.left_text(stage, parse_seconds(left.group(1)))}"

    def stage_line(self, stage: str) -> str:
        """``stage 4/7 train: 10:12 elapsed, about 14:30 left in total``."""
        number = STAGES.index(stage) + 1
        return (
            f"stage {number}/{len(STAGES)} {stage}: {format_seconds(self.elapsed())} elapsed, {self.left_text(stage)}"
        )
