"""Progress of long work as plain lines: done/total, time elapsed and time left from the measured rate.

Every long stage writes where its output becomes a log, not a terminal: a Ray job's stdout
streamed into Prefect's run log, or Prefect's logger itself. A redrawn progress bar (carriage
returns) turns into hundreds of lines there, so progress is one plain line per update. tqdm
formats it (``tqdm.format_meter``: the same numbers and time format its terminal bar shows),
so the ETA arithmetic is not ours to get wrong::

    meter = ProgressMeter(total=431, unit="step")
    log(f"warm-start: {meter.text(21)}")   # warm-start: 21/431 steps, 00:43 elapsed, 14:03 left

The rate is measured from this meter's start, so work resumed at ``done`` counts only what
this process did (a resumed training's ETA is not flattered by the steps it skipped).

A training step's line, ``step N/M: ...`` (:func:`step_line`, read back by :func:`parse_step_line`),
is written by both training backends and read by the submitter's hang watchdog and the train
stage, so its format lives here, below training and the cluster alike.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from tqdm import tqdm

from mazerl.run_clock import STAGE_LEFT, parse_seconds

BAR_FORMAT = "{n_fmt}/{total_fmt} {unit}s, {elapsed} elapsed, {remaining} left"
TIMES_FORMAT = "{elapsed} elapsed, {remaining} left"  # for lines that say done/total themselves


class ProgressMeter:
    """done/total of one long piece of work and its time left, as text for a log line."""

    def __init__(self, total: int, unit: str, done: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        if total < 0 or done < 0:
            raise ValueError(f"total ({total}) and done ({done}) must be >= 0")
        self.total, self.unit, self.initial = total, unit, done
        self._clock = clock
        self._started = clock()

    def text(self, done: int) -> str:
        """``21/431 steps, 00:43 elapsed, 14:03 left`` ("? left" until something was done here)."""
        return self._format(done, BAR_FORMAT)

    def times(self, done: int) -> str:
        """``00:43 elapsed, 14:03 left``: for a line that already says ``done/total``."""
        return self._format(done, TIMES_FORMAT)

    def _format(self, done: int, bar_format: str) -> str:
        elapsed = self._clock() - self._started
        return tqdm.format_meter(done, self.total, elapsed, unit=self.unit, initial=self.initial, bar_format=bar_format)


# "step 3/160:" at a word boundary ("global_step 3" and "Resuming from global_step: 3" do not match).
STEP_LINE = re.compile(r"\bstep (\d+)/(\d+):")
GREEDY_EVAL = "greedy eval"  # the step line's label of a periodic eval's success rate
GREEDY_EVAL_KEY = "eval/success_rate"
GREEDY_EVAL_VALUE = re.compile(rf"\b{GREEDY_EVAL} \d+(?:\.\d+)?%")


def step_line(step: int, total: int, metrics: Mapping[str, Any], times: str | None = None) -> str:
    """``step 3/160: reward 0.512 success 0.438 (52.1s); 02:36 elapsed, 2:15:24 left``, from the metric
    names of docs/mlflow.md; ``times`` (:meth:`ProgressMeter.times`) ends it.

    The one writer of the line (both backends call it). Where the step's rollout and update
    seconds are known they go inside the brackets: ``(52.1s: rollout 40.0s, update 12.1s)``. A
    step that ran a periodic greedy eval says its result: ``greedy eval 41.4%`` (:data:`GREEDY_EVAL`).
    """
    parts = [f"step {step}/{total}:"]
    for label, key, spec in (
        ("reward", "train/reward_mean", ".3f"),
        ("success", "train/success_rate", ".3f"),
        ("loss", "train/policy_loss", "+.4f"),
        (GREEDY_EVAL, GREEDY_EVAL_KEY, ".1%"),
    ):
        if isinstance(metrics.get(key), int | float):
            parts.append(f"{label} {metrics[key]:{spec}}")
    if isinstance(metrics.get("train/step_seconds"), int | float):
        split = ("rollout", "train/rollout_seconds"), ("update", "train/update_seconds")
        detail = [f"{label} {metrics[key]:.1f}s" for label, key in split if isinstance(metrics.get(key), int | float)]
        parts.append(f"({metrics['train/step_seconds']:.1f}s{': ' + ', '.join(detail) if detail else ''})")
    return " ".join(parts) + (f"; {times}" if times else "")


def annotate_step_line(
    line: str, *, baseline: float | None = None, total_left: Callable[[float | None], str] | None = None
) -> str:
    """A job's step line as the pipeline shows it: a greedy eval's result next to the baseline's
    (``greedy eval 18.8% (baseline 27.0%)``) and, after the training's own time left, the whole
    run's (``total_left(seconds the training has left, or None)`` writes it). Other lines pass as they are."""
    if parse_step_line(line) is None:
        return line
    if baseline is not None:
        line = GREEDY_EVAL_VALUE.sub(lambda match: f"{match.group(0)} (baseline {baseline:.1%})", line, count=1)
    if total_left is not None:
        left = STAGE_LEFT.search(line)
        line += f"; {total_left(parse_seconds(left.group(1)) if left else None)}"
    return line


def parse_step_line(line: str) -> tuple[int, int] | None:
    """(step, total) of a step line anywhere in ``line``, else None."""
    match = STEP_LINE.search(line)
    return (int(match.group(1)), int(match.group(2))) if match else None
