"""The ``stage k/7`` line every pipeline stage starts with, and its time kept for later estimates.

``with timed_stage(run, "train") as timer:`` logs ``stage 4/7 train: 10:12 elapsed, about 14:30
left in total`` (:mod:`mazerl.run_clock`) and, when the body succeeds, records how long the stage
took in the data root, so the next run of the same work knows. A body that did not do its usual
work (a baseline taken from the cache, a training resumed half-way) sets ``timer.same_work = False``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

from prefect import get_run_logger

from mazerl.run_clock import RunClock
from tasks.context import RunContext


@dataclass
class StageTimer:
    clock: RunClock
    same_work: bool = True


@contextlib.contextmanager
def timed_stage(run: RunContext, stage: str) -> Iterator[StageTimer]:
    timer = StageTimer(run.clock())
    if run.stage_keys:  # the eval-only flow has no stages to count
        get_run_logger().info(timer.clock.stage_line(stage))
    started = time.monotonic()
    yield timer
    if run.stage_keys:
        try:
            timer.clock.record(stage, time.monotonic() - started, same_work=timer.same_work)
        except OSError as exc:  # an estimate is a nicety: never fail a stage for it
            get_run_logger().warning(f"{stage}: could not keep its time in {timer.clock.path}: {exc}")
