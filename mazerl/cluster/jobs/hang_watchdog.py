"""The hang watchdog: has a running job made progress within ``hang_timeout_s``?

Progress is whatever the caller's probe returns (the train stage gives
:class:`~mazerl.training.progress.TrainingProgress`, the last ``step N/M:`` line both training
backends print); the cluster package knows nothing of training. A job whose probe value does not
change for longer than the timeout is hung: :class:`~mazerl.cluster.jobs.submitter.RayJob` stops it
and reports it as retryable. Works on any Ray cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

logger = logging.getLogger(__name__)


class JobProgress(Protocol):
    """What :class:`~mazerl.cluster.jobs.submitter.RayJob` asks of a progress probe: its value for the
    watchdog (anything comparable; it changes when the job advances), every line of the job's log,
    and the metadata of the job it follows (a re-attached job may write into another run's directory)."""

    def __call__(self) -> object: ...

    def feed(self, line: str) -> None: ...

    def follow(self, metadata: Mapping[str, str]) -> None: ...


class HangWatchdog:
    """Asked on every poll of a RUNNING job: how long has ``probe`` returned the same value?"""

    def __init__(self, probe: Callable[[], object], timeout_s: float):
        self.probe = probe
        self.timeout_s = timeout_s
        self.value: object = None  # the last progress seen
        self._since: float | None = None

    def idle_s(self, now: float) -> float | None:
        """Seconds without progress, once they exceed ``timeout_s``; None while the job advances."""
        try:
            value = self.probe()
        except Exception as exc:  # noqa: BLE001 - a broken probe must not kill a healthy job
            logger.warning("progress probe failed: %s", exc)
            value = self.value
        if self._since is None or value != self.value:
            self.value, self._since = value, now
            return None
        idle_s = now - self._since
        return idle_s if idle_s > self.timeout_s else None
