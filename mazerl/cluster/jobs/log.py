"""A Ray job's output as complete, plain lines: followed live, with a fallback to polling.

:class:`LogFollower` reads the job's log into a queue of ``(line, offset)`` pairs for
:class:`~mazerl.cluster.jobs.submitter.RayJob`, which hands the lines to its caller and records the
offsets (:class:`LogOffsets`), so a later attempt re-attached to the same job continues where
this one stopped instead of replaying the lines its flow run already shows.
:func:`plain_text` strips what a terminal would not show (colours, redrawn progress bars).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import queue
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from mazerl.atomic import write_json
from mazerl.cluster.jobs.spec import TERMINAL, job_status

logger = logging.getLogger(__name__)

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


class LogOffsets:
    """How far each job's log was handed out, one record per job in ``directory``: ``{"submission_id",
    "chars", "lines"}``, written under a temporary name, then renamed. No directory: nothing is recorded."""

    def __init__(self, directory: str | Path | None):
        self.directory = Path(directory) if directory is not None else None

    def path(self, submission_id: str | None) -> Path | None:
        if self.directory is None or submission_id is None:
            return None
        return self.directory / f"{submission_id}.json"

    def read(self, submission_id: str | None) -> tuple[int, int] | None:
        """(characters, lines) of the job's log an earlier attempt handed out, or None if none is recorded."""
        path = self.path(submission_id)
        try:
            record = json.loads(path.read_text()) if path is not None else None
        except (OSError, ValueError):
            record = None
        if not isinstance(record, dict) or record.get("submission_id") != submission_id:
            return None
        return int(record.get("chars", 0)), int(record.get("lines", 0))

    def write(self, submission_id: str | None, chars: int, lines: int) -> None:
        """Record the offset; a failure (a full disk) only turns recording off: a retry then replays more."""
        path = self.path(submission_id)
        if path is None:
            return
        try:
            write_json(path, {"submission_id": submission_id, "chars": chars, "lines": lines}, indent=None)
        except OSError as exc:  # a full disk must not stop the job being followed
            logger.warning("could not record the log offset of job %s in %s: %s", submission_id, path, exc)
            self.directory = None


class JobLogFeed:
    """One job's log handed to the caller line by line, from the caller's thread (:meth:`drain`).

    A :class:`LogFollower` reads it; each non-blank line goes to ``feed`` (the progress probe's,
    if it has one) and to ``log``, so a Prefect run logger can be used directly; the last lines
    are kept for error messages (:meth:`tail`). How far the log was handed out is recorded in
    ``offsets``: a later attempt that re-attaches to the same job continues after that point
    instead of replaying the lines its flow run already shows, and says so.
    """

    def __init__(
        self, offsets: LogOffsets, log: Callable[[str], None], feed: Callable[[str], None] | None, poll_s: float
    ):
        self.offsets = offsets
        self.log = log
        self.feed = feed
        self.poll_s = poll_s
        self.recent: collections.deque[str] = collections.deque(maxlen=40)
        self.lines = 0  # lines this attempt handed out
        self.submission_id: str | None = None
        self._follower: LogFollower | None = None
        self._offset = self._recorded_offset = 0  # log characters handed to ``log`` / recorded as such
        self._lines_before = 0  # lines an earlier attempt handed out (from its record)

    def follow(self, client, submission_id: str, resume: bool) -> None:
        """Start following the job's log; ``resume``: a re-attached job, which an earlier attempt may have shown."""
        self.submission_id = submission_id
        self._start(client, self._already_logged() if resume else 0)

    def switch_client(self, client) -> None:
        """Go on following with a new client (a renewed session), right after the last line handed out."""
        self.drain()
        skip = self._follower.abandon() if self._follower is not None else 0
        self._start(client, skip)

    def finish(self) -> None:
        """After the job ended: take the rest of its log and hand it out."""
        if self._follower is not None:
            self._follower.finish()
        self.drain()

    def drain(self) -> None:
        """Hand out the lines read so far."""
        if self._follower is None:
            return
        while True:
            try:
                line, self._offset = self._follower.lines.get_nowait()
            except queue.Empty:
                self._record_offset()
                return
            if not line.strip():  # a blank line would be an empty "Task run '...' -" record
                continue
            self.lines += 1
            self.recent.append(line)
            if self.feed is not None:
                self.feed(line)
            self.log(line)

    def tail(self, lines: int = 20) -> str:
        """The last lines handed out, for an error message."""
        return "\n".join(list(self.recent)[-lines:])

    def _start(self, client, skip_chars: int) -> None:
        self._follower = LogFollower(client, self.submission_id, self.poll_s, skip_chars=skip_chars)
        self._follower.start()

    def _already_logged(self) -> int:
        """Characters of the re-attached job's log that an earlier attempt already handed to its ``log``."""
        recorded = self.offsets.read(self.submission_id)
        if recorded is None:
            if self.offsets.path(self.submission_id) is not None:
                self.log(f"job {self.submission_id}: following its log from the start (no earlier attempt showed it)")
            return 0
        chars, self._lines_before = recorded
        self._offset = self._recorded_offset = chars
        self.log(
            f"job {self.submission_id}: its log continues after the {self._lines_before} lines an earlier attempt "
            "already showed"
        )
        return chars

    def _record_offset(self) -> None:
        """Say how far the log was handed out: a retry continues from there."""
        if self._offset == self._recorded_offset:
            return
        self.offsets.write(self.submission_id, self._offset, self._lines_before + self.lines)
        self._recorded_offset = self._offset
