"""The temporary Prefect server of ``mazerl run``: one whose run was killed is stopped by the next run.

Without a Prefect API configured (``PREFECT_API_URL``), Prefect starts a temporary API server
for the flow: a child process (uvicorn on 127.0.0.1, over ``$PREFECT_HOME/prefect.db``) that
the flow's process stops when it exits. A ``mazerl run`` killed outright (SIGKILL, an OOM kill,
a closed terminal) cannot stop it, and the server runs on, orphaned, holding the database.

So ``mazerl run`` names itself in the environment that server inherits
(:data:`OWNER_ENV`: ``<pid>-<start time>``, a recycled pid never passes for it), and the next
``mazerl run`` stops every temporary server of the same ``PREFECT_HOME`` whose owner is gone
(:func:`stop_orphaned_servers`). A server it did not start (no owner recorded, another
``PREFECT_HOME``, a live owner) is never touched.
"""

from __future__ import annotations

import os
from collections.abc import Callable

OWNER_ENV = "MAZERL_PREFECT_OWNER"
SERVER_APP = "prefect.server.api.server:create_app"  # in the command line of Prefect's temporary server


def process_tag(pid: int) -> str | None:
    """``<pid>-<start time>`` of a live process, or None."""
    import psutil  # a Ray dependency; imported here to keep `mazerl --help` fast

    try:
        return f"{pid}-{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return None


def claim_temporary_server() -> None:
    """Name this process as the owner of the temporary server Prefect will start from it."""
    os.environ[OWNER_ENV] = process_tag(os.getpid()) or str(os.getpid())


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
            process.terminate()
            try:
                process.wait(timeout=10)
            except psutil.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        except psutil.NoSuchProcess:
            continue
        log(f"stopped the temporary Prefect server (pid {process.pid}) that a killed mazerl run (pid {owner}) left")
        stopped.append(process.pid)
    return stopped
