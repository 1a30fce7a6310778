"""A Ray job's output as complete, plain lines: followed live, with a fallback to polling.

:class:`LogFollower` reads the job's log into a queue of ``(line, offset)`` pairs for
:class:`~mazerl.cluster.submitter.RayJob`, which hands the lines to its caller and records the
offsets, so a later attempt re-attached to the same job continues where this one stopped.
:func:`plain_text` strips what a terminal would not show (colours, redrawn progress bars).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import re
import threading
import time

from mazerl.cluster.job_spec import TERMINAL, job_status

# Terminal control sequences (colours, cursor moves) that Ray and libraries write into job output;
# a log file or Prefect's UI shows them as raw "[36m" noise.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def plain_text(line: str) -> str:
    """``line`` as a terminal would leave it: no control sequences, and of a line redrawn with carriage
    returns (a library's progress bar, e.g. transformers' "Writing model shards") only its last state."""
    return _ANSI_ESCAPE.sub("", line).rsplit("\r", 1)[-1]


class _NormalWebsocketClose(logging.Filter):
    """Drops Ray's "WebSocket closed for job ... with close code 1000": the log stream's normal end,
    which Ray's job client logs at INFO for every job (other close codes still get through)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("WebSocket closed for job") and message.endswith("close code 1000"))


logging.getLogger("ray.dashboard.modules.job.sdk").addFilter(_NormalWebsocketClose())


class LogFollower(threading.Thread):
    """Follows a job's output into a queue of complete lines.

    ``tail_job_logs`` (a websocket) is the cheap path for long jobs; if it fails (a proxy
    without websockets, a head hiccup), poll ``get_job_logs`` and emit only what lies beyond
    the characters already seen. The websocket closes a few seconds after the job ends, so
    :meth:`finish` stops waiting for it and fetches the remainder itself.
    """

    def __init__(self, client, submission_id: str, poll_s: float, skip_chars: int = 0):
        super().__init__(name=f"ray-logs-{submission_id}", daemon=True)
        self.client = client
        self.submission_id = submission_id
        self.poll_s = poll_s
        self.lines: queue.Queue[tuple[str, int]] = queue.Queue()  # (line, log offset just after it)
        self.error: Exception | None = None
        self._lock = threading.Lock()
        self._abandoned = False
        self._seen_chars = 0
        self._skip = skip_chars  # characters an earlier follower of this job already handed out
        self._handed_out = skip_chars  # log offset just after the last line handed out
        self._partial = ""

    def run(self) -> None:
        try:
            asyncio.run(self._tail())
        except Exception as exc:  # noqa: BLE001 - fall back to polling below
            self.error = exc
            self._poll()

    def finish(self, grace_s: float = 0.5) -> None:
        """After the job ended: let the stream close by itself, else take the rest by one fetch."""
        self.join(timeout=grace_s)
        with self._lock:
            self._abandoned = True
            if self.is_alive():
                try:
                    text = self.client.get_job_logs(self.submission_id)
                except Exception:  # noqa: BLE001 - the log tail is best effort once the job ended
                    text = ""
                if len(text) > self._seen_chars:
                    self._take_locked(text[self._seen_chars :])
            if self._partial:
                self._handed_out += len(self._partial)
                self.lines.put((plain_text(self._partial.rstrip("\r")), self._handed_out))
                self._partial = ""

    def abandon(self) -> int:
        """Stop taking output (a new follower takes over); returns how many characters of the log
        were handed out as complete lines, so the successor starts right after them."""
        with self._lock:
            self._abandoned = True
            self._partial = ""
            return self._handed_out

    async def _tail(self) -> None:
        async for chunk in self.client.tail_job_logs(self.submission_id):
            if not self._take(chunk):
                return

    def _poll(self) -> None:
        while True:
            try:
                text = self.client.get_job_logs(self.submission_id)
                status = job_status(self.client.get_job_info(self.submission_id))
            except Exception:  # noqa: BLE001 - the main loop reports the outage
                return
            if len(text) > self._seen_chars and not self._take(text[self._seen_chars :]):
                return
            if status in TERMINAL:
                return
            time.sleep(self.poll_s)

    def _take(self, chunk: str) -> bool:
        with self._lock:
            if self._abandoned:
                return False
            self._take_locked(chunk)
            return True

    def _take_locked(self, chunk: str) -> None:
        self._seen_chars += len(chunk)
        if self._skip:
            dropped = min(self._skip, len(chunk))
            chunk, self._skip = chunk[dropped:], self._skip - dropped
        *complete, self._partial = (self._partial + chunk).split("\n")
        for line in complete:
            self._handed_out += len(line) + 1
            self.lines.put((plain_text(line.rstrip("\r")), self._handed_out))
