"""The temporary Prefect server of ``mazerl run``: started in a session of its own, stopped last.

Without a Prefect API configured (``PREFECT_API_URL``), the flow needs an API server over
``$PREFECT_HOME/prefect.db``. Prefect would start one itself, as a child in the caller's
process group; a Ctrl-C in a terminal reaches the whole foreground group, so that server died
with the keypress while ``mazerl run`` still had to record the interruption in it, and it hung
in the client's retries. So ``mazerl run`` starts the same server (uvicorn over Prefect's app
factory, on 127.0.0.1 only) in a new session, out of the terminal's reach, points
``PREFECT_API_URL`` at it, and stops it itself once the flow run's records are closed and the
Ray head is released (:func:`temporary_server`): the order borg uses for the helpers it depends
on (borgbackup/borg#6949).

A ``mazerl run`` killed outright (SIGKILL, an OOM kill, a closed laptop lid) cannot stop it, so
the server carries its owner in its environment (:data:`OWNER_ENV`: ``<pid>-<start time>``, a
recycled pid never passes for it), and the next ``mazerl run`` stops every temporary server of
the same ``PREFECT_HOME`` whose owner is gone (:func:`stop_orphaned_servers`). A server it did
not start (no owner recorded, another ``PREFECT_HOME``, a live owner) is never touched.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from mazerl.cluster.head.loopback import LOOPBACK, free_ports
from mazerl.cluster.head.process import log_tail

OWNER_ENV = "MAZERL_PREFECT_OWNER"
SERVER_APP = "prefect.server.api.server:create_app"  # in the command line of the temporary server
LOG_NAME = "server.log"  # under PREFECT_HOME: the server's own output, kept off the terminal
PORT_TAKEN_EXIT_CODE = 3  # uvicorn's exit code when its port was taken meanwhile
STOP_TIMEOUT_S = 10.0
# Prefect's own settings for the temporary server it would start: no UI, no background services
SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}


class PrefectServerError(RuntimeError):
    """The temporary Prefect server did not start."""


def process_tag(pid: int) -> str | None:
    """``<pid>-<start time>`` of a live process, or None."""
    import psutil  # a Ray dependency; imported here to keep `mazerl --help` fast

    try:
        return f"{pid}-{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return None


@contextlib.contextmanager
def temporary_server(prefect_home: Path, timeout_s: float) -> Iterator[str]:
    """Prefect's API server for this process's flow runs, in its own session; yields its API URL.

    Sets ``PREFECT_API_URL`` for this process (before Prefect is imported, which reads it once)
    and stops the server when the block ends, however it ends.
    """
    process, url = _start(prefect_home, timeout_s)
    os.environ["PREFECT_API_URL"] = url
    try:
        yield url
    finally:
        drain_prefect_clients()
        stop(process)


def drain_prefect_clients(timeout_s: float = 10.0) -> None:
    """Send what Prefect's background workers still hold (log lines, events) while the server
    still answers: they would otherwise try at interpreter exit, against a stopped server."""
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        with contextlib.suppress(Exception):  # noqa: BLE001 - a record that cannot be sent now never will be
            worker.drain_all(timeout=timeout_s)


def _start(prefect_home: Path, timeout_s: float) -> tuple[subprocess.Popen, str]:
    prefect_home.mkdir(parents=True, exist_ok=True)
    env = os.environ | SERVER_ENV | {OWNER_ENV: process_tag(os.getpid()) or str(os.getpid())}
    env["PREFECT_HOME"] = str(prefect_home)
    log_path = prefect_home / LOG_NAME
    for _ in range(3):  # a port picked free may be taken before uvicorn binds it
        (port,) = free_ports(1)
        command = [sys.executable, "-m", "uvicorn", "--factory", SERVER_APP, "--host", LOOPBACK, "--port", str(port)]
        command += ["--log-level", "error", "--lifespan", "on"]
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        url = f"http://{LOOPBACK}:{port}/api"
        if _wait_until_healthy(process, url, timeout_s):
            return process, url
        if process.returncode != PORT_TAKEN_EXIT_CODE:
            stop(process)
            raise PrefectServerError(
                f"Prefect's server for this run did not answer at {url} within {timeout_s:.0f} s "
                f"(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS); its log: {log_path}\n{log_tail(log_path)}"
            )
    raise PrefectServerError(f"Prefect's server found no free port on {LOOPBACK} in 3 tries; its log: {log_path}")


def _wait_until_healthy(process: subprocess.Popen, url: str, timeout_s: float) -> bool:
    """True once ``/health`` answers; False if the process exits first or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    return False


def stop(process: subprocess.Popen | object) -> None:
    """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S` (a ``subprocess.Popen`` or a ``psutil.Process``)."""
    import psutil

    with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except (subprocess.TimeoutExpired, psutil.TimeoutExpired):
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)


def orphaned_servers(prefect_home: str | None) -> list:
    """The temporary Prefect servers of ``prefect_home`` started by a ``mazerl run`` that is gone."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if SERVER_APP not in (process.info["cmdline"] or []):
            continue
        try:
            environ = process.environ()
        except psutil.Error:  # another user's, or gone meanwhile
            continue
        owner = environ.get(OWNER_ENV)
        if owner is None or environ.get("PREFECT_HOME") != prefect_home:
            continue
        pid = owner.split("-", 1)[0]
        if not pid.isdigit() or process_tag(int(pid)) != owner:
            found.append(process)
    return found


def stop_orphaned_servers(prefect_home: str | None, log: Callable[[str], None]) -> list[int]:
    """Stop the temporary Prefect servers a killed ``mazerl run`` left running here; returns their pids."""
    import psutil

    stopped = []
    for process in orphaned_servers(prefect_home):
        try:
            owner = process.environ().get(OWNER_ENV, "?").split("-", 1)[0]
        except psutil.Error:
            continue
        stop(process)
        log(f"stopped the temporary Prefect server (pid {process.pid}) that a killed mazerl run (pid {owner}) left")
        stopped.append(process.pid)
    return stopped
