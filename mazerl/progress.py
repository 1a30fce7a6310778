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
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tqdm import tqdm

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
