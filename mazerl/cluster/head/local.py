"""The embedded local Ray head: one machine, dashboard and job server on 127.0.0.1 only.

The embedded pipeline submits its jobs through the same ``JobSubmissionClient`` path as a
real cluster, so it needs a Ray head with a job server. This module starts one with
``ray start --head --block`` (this venv's Ray) in its own process group, so it outlives a
crashed caller (a re-run re-attaches to its still-running job) and can be stopped by its
process id without touching any other Ray on the machine.

Security: every Ray process of this head binds to 127.0.0.1 and token authentication is on
(``RAY_AUTH_MODE=token``) with a fresh random token per head, kept in a 0600 file in the head's
temp dir and never logged; clients send it as an ``Authorization: Bearer`` header
(:meth:`LocalRayHead.auth_headers`), which Ray's standard ``JobSubmissionClient(address,
headers=...)`` accepts. Why the loopback-only mode and the job environment's allow-list:
:mod:`mazerl.cluster.head.env`; why the temp dir must be private: :mod:`mazerl.cluster.head.temp_dir`.

One head serves every run of this user (and ``TMPDIR``) at once. Each process that uses it
holds a lease (:mod:`mazerl.cluster.head.leases`; ``ensure_local_head`` takes one; it ends with
the process). A head started by :func:`local_ray_head` is stopped when the last lease is given
up, not when the run that started it ends, so two ``mazerl run`` side by side both finish.

Usage::

    with local_ray_head() as head:          # starts one, or reuses the running one
        client = JobSubmissionClient(head.address, headers=head.auth_headers())

A process that wants to connect as a Ray *driver* uses
:func:`~mazerl.cluster.head.driver.ray_driver` (``ray.init`` with the head's address and token).
"""

from __future__ import annotations

import contextlib
import fcntl
import inspect
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from mazerl.atomic import write_json
from mazerl.cluster.head.env import head_env
from mazerl.cluster.head.leases import live_leases, release_lease, take_lease
from mazerl.cluster.head.loopback import LOOPBACK, free_ports, is_loopback_ip, port_free
from mazerl.cluster.head.process import is_our_head_process, kill_group, log_tail, process_group_alive
from mazerl.cluster.head.temp_dir import (
    HEAD_LOG_NAME,
    LOCK_NAME,
    RAY_SUBDIR,
    REGISTRY_NAME,
    TOKEN_NAME,
    check_temp_dir,
    remove,
    write_secret,
)

log = logging.getLogger(__name__)

DEFAULT_DASHBOARD_PORT = 8265


class LocalRayError(RuntimeError):
    """The local head could not be started or stopped."""


@dataclass(frozen=True)
class LocalRayHead:
    """A running local head. ``address`` is what ``JobSubmissionClient`` takes."""

    address: str  # http://127.0.0.1:<dashboard port>
    gcs_address: str  # 127.0.0.1:<gcs port>, for drivers (ray.init)
    temp_dir: Path
    pid: int  # the `ray start --block` process; its process group is the whole head
    metrics_export_port: int  # Prometheus endpoint of this node: http://127.0.0.1:<port>/metrics
    ray_version: str
    started_here: bool = False
    managed: bool = False  # started by local_ray_head(): stopped when its last lease is given up

    @property
    def token_path(self) -> Path:
        return self.temp_dir / TOKEN_NAME

    @property
    def ray_temp_dir(self) -> Path:
        """Ray's own temp dir (sessions, logs, sockets), inside the private one."""
        return self.temp_dir / RAY_SUBDIR

    def auth_headers(self) -> dict[str, str]:
        """The bearer header for Ray's HTTP API. Read fresh from the 0600 file; never log it."""
        return {"Authorization": f"Bearer {self.token_path.read_text().strip()}"}

    def client_env(self) -> dict[str, str]:
        """Environment for a subprocess that talks to this head with Ray's standard client
        or connects as a driver: Ray reads the token from ``RAY_AUTH_TOKEN_PATH``."""
        return {
            "RAY_ADDRESS": self.gcs_address,
            "RAY_API_SERVER_ADDRESS": self.address,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        }

    @property
    def node_ip(self) -> str:
        """The loopback address the head's node runs on (127.0.0.1 unless started with another)."""
        return self.gcs_address.rsplit(":", 1)[0]

    @property
    def metrics_url(self) -> str:
        return f"http://{self.node_ip}:{self.metrics_export_port}/metrics"

    def is_alive(self) -> bool:
        """The head process is ours and its job server answers."""
        return is_our_head_process(self.pid, self.temp_dir) and _answers(self.address, self.auth_headers())

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the head: SIGTERM to ``ray start --block`` (it stops its children), then SIGKILL
        to whatever is left of its process group. Safe to call twice."""
        if not is_our_head_process(self.pid, self.temp_dir):
            remove(self.temp_dir / REGISTRY_NAME)
            return
        log.info("stopping local Ray head at %s (pid %d)", self.address, self.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and process_group_alive(self.pid):
            time.sleep(0.2)
        if process_group_alive(self.pid):
            log.warning(
                "local Ray head (pid %d) did not stop in %.0f s; killing its process group", self.pid, timeout_s
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        remove(self.temp_dir / REGISTRY_NAME)


def start_local_head(
    temp_dir: str | os.PathLike | None = None,
    *,
    num_cpus: int = 2,
    num_gpus: int | None = None,
    object_store_mb: int = 150,
    memory_mb: int | None = None,
    dashboard_port: int | None = None,
    extra_env: dict[str, str] | None = None,
    timeout_s: float = 90.0,
    node_ip: str = LOOPBACK,
) -> LocalRayHead:
    """Start a new head (fails if one registered in ``temp_dir`` is still running).

    ``num_cpus`` bounds how many tasks run at once (2 suits a 2-core laptop); ``memory_mb``
    is the memory Ray schedules tasks against (default: half of this machine's RAM); the object
    store is small because stages exchange paths, not tensors. ``dashboard_port`` None means 8265
    when free, else any free port; 0 means any free port. ``node_ip`` is another loopback address
    (127.0.0.2, ...) for a head that other nodes on this machine join: Ray's multi-node mode
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1``) swaps 127.0.0.1 itself for the machine's external
    address, but keeps any other address of 127.0.0.0/8.
    """
    if not is_loopback_ip(node_ip):
        raise ValueError(f"node_ip ({node_ip}) must be a loopback address (127.x.y.z): the embedded head is local")
    temp = check_temp_dir(temp_dir)
    with _registry_lock(temp):
        running = _read_registry(temp)
        if running is not None and running.is_alive():
            raise LocalRayError(f"a local Ray head is already running at {running.address} (temp dir {temp})")
        if running is not None:
            running.stop()
        return _start(
            temp, num_cpus, num_gpus, object_store_mb, memory_mb, dashboard_port, extra_env, timeout_s, node_ip=node_ip
        )


def find_local_head(temp_dir: str | os.PathLike | None = None) -> LocalRayHead | None:
    """The head registered in ``temp_dir`` if it is still running and answering, else None."""
    temp = check_temp_dir(temp_dir)
    with _registry_lock(temp):
        head = _read_registry(temp)
    if head is None or not head.is_alive():
        return None
    return head


def ensure_local_head(temp_dir: str | os.PathLike | None = None, **start_kwargs) -> LocalRayHead:
    """Reuse the running head in ``temp_dir`` or start one (``started_here`` tells which).

    This process takes a lease on it (given up by :func:`local_ray_head`'s exit, or when the
    process ends), so a :func:`local_ray_head` elsewhere does not stop it under this process.
    """
    temp = check_temp_dir(temp_dir)
    with _registry_lock(temp):
        return _ensure(temp, start_kwargs, managed=False)


@contextlib.contextmanager
def local_ray_head(temp_dir: str | os.PathLike | None = None, **start_kwargs) -> Iterator[LocalRayHead]:
    """A head for the ``with`` block: reused, or started; stopped at the end of the last block using it.

    A head this call starts is stopped when no process holds a lease on it any more, whichever
    run ends last; a head started otherwise (``start_local_head``, a deployment's flow run) is
    left running.
    """
    temp = check_temp_dir(temp_dir)
    with _registry_lock(temp):
        head = _ensure(temp, start_kwargs, managed=True)
    try:
        yield head
    finally:
        with _registry_lock(temp):
            release_lease(temp)
            current = _read_registry(temp)
            if current is not None and current.pid == head.pid and current.managed and not live_leases(temp):
                current.stop()


def lease_holders(temp_dir: str | os.PathLike | None = None) -> list[str]:
    """Process ids of the live processes that hold a lease on the head in ``temp_dir``."""
    temp = check_temp_dir(temp_dir)
    with _registry_lock(temp):
        return [lease.split("-", 1)[0] for lease in live_leases(temp)]


def stop_idle_head(temp_dir: str | os.PathLike | None = None, *, force: bool = False) -> LocalRayHead | None:
    """Stop the embedded head of this user (and ``TMPDIR``) unless a live process still leases it.

    What ``mazerl ray stop`` does: a deployment's flow run starts the head and leaves it up for
    the next run (and for a retry to re-attach to its job). Only this project's own head in
    ``temp_dir`` is touched, never another Ray on the machine. Returns the stopped head, or None
    if none runs; raises :class:`LocalRayError` naming the lease holders unless ``force``.
    """
    temp = check_temp_dir(temp_dir)
    with _registry_lock(temp):
        head = _read_registry(temp)
        if head is None or not is_our_head_process(head.pid, temp):
            if head is not None:
                head.stop()  # clears the stale registry
            return None
        holders = [lease.split("-", 1)[0] for lease in live_leases(temp)]
        holders = [pid for pid in holders if pid != str(os.getpid())]
        if holders and not force:
            pids = ", ".join(holders)
            raise LocalRayError(
                f"the local Ray head at {head.address} is in use by running process(es) {pids} (a pipeline run or "
                "an eval); let them finish, or stop it anyway with --force (their Ray jobs fail and are retried)"
            )
        head.stop()
        return head


# --- internals ---------------------------------------------------------------------------


def _start_defaults(kwargs: dict) -> dict:
    """``start_local_head``'s keyword defaults, overridden by ``kwargs`` (one source of defaults)."""
    defaults = {
        name: param.default
        for name, param in inspect.signature(start_local_head).parameters.items()
        if param.kind is param.KEYWORD_ONLY
    }
    unknown = set(kwargs) - set(defaults)
    if unknown:
        raise TypeError(f"unknown local head options {sorted(unknown)}; allowed: {sorted(defaults)}")
    return {**defaults, **kwargs}


def _ensure(temp: Path, start_kwargs: dict, managed: bool) -> LocalRayHead:
    """Reuse the running head or start one (under the registry lock), and lease it to this process."""
    head = _read_registry(temp)
    if head is not None and head.is_alive():
        log.info("reusing the local Ray head at %s", head.address)
    else:
        if head is not None:
            head.stop()  # a half-dead head (e.g. its dashboard crashed): clear what is left of it
        head = _start(temp, **_start_defaults(start_kwargs), managed=managed)
    take_lease(temp)
    return head


@contextlib.contextmanager
def _registry_lock(temp: Path) -> Iterator[None]:
    """Two callers starting the embedded pipeline at once must not start two heads."""
    with open(temp / LOCK_NAME, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _start(
    temp: Path,
    num_cpus: int,
    num_gpus: int | None,
    object_store_mb: int,
    memory_mb: int | None,
    dashboard_port: int | None,
    extra_env: dict[str, str] | None,
    timeout_s: float,
    managed: bool = False,
    node_ip: str = LOOPBACK,
) -> LocalRayHead:
    from importlib.metadata import version

    if num_cpus < 1:
        raise ValueError(f"num_cpus ({num_cpus}) must be >= 1 so the head can run the job drivers and tasks")
    if object_store_mb < 80:
        raise ValueError(f"object_store_mb ({object_store_mb}) must be >= 80 (Ray's minimum is 75 MiB)")
    token_path = temp / TOKEN_NAME
    write_secret(token_path, secrets.token_hex(32))
    spare, gcs_port, client_port, metrics_port, agent_port = free_ports(5)
    if dashboard_port is None:
        dashboard_port = DEFAULT_DASHBOARD_PORT if port_free(DEFAULT_DASHBOARD_PORT) else spare
    elif dashboard_port == 0:
        dashboard_port = spare
    ports = (gcs_port, dashboard_port, client_port, metrics_port, agent_port)
    command = _head_command(temp, node_ip, ports, num_cpus, num_gpus, object_store_mb, memory_mb)
    env = head_env(token_path, extra_env)
    log_path = temp / HEAD_LOG_NAME
    address = f"http://{node_ip}:{dashboard_port}"
    log.info("starting a local Ray head at %s (temp dir %s, %d CPUs)", address, temp, num_cpus)
    with open(log_path, "w") as log_file:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    headers = {"Authorization": f"Bearer {token_path.read_text().strip()}"}
    _wait_until_answering(process, address, headers, timeout_s, log_path)
    head = LocalRayHead(
        address=address,
        gcs_address=f"{node_ip}:{gcs_port}",
        temp_dir=temp,
        pid=process.pid,
        metrics_export_port=metrics_port,
        ray_version=version("ray"),  # not ray.__version__: importing ray would fix its settings too early
        started_here=True,
        managed=managed,
    )
    _write_registry(head)
    return head


def _head_command(
    temp: Path,
    node_ip: str,
    ports: tuple[int, int, int, int, int],
    num_cpus: int,
    num_gpus: int | None,
    object_store_mb: int,
    memory_mb: int | None,
) -> list[str]:
    """``ray start --head --block`` with every address, port and resource set: nothing left to Ray's defaults."""
    gcs_port, dashboard_port, client_port, metrics_port, agent_port = ports
    command = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        "--block",
        "--disable-usage-stats",
        f"--node-ip-address={node_ip}",
        f"--port={gcs_port}",
        "--include-dashboard=true",
        f"--dashboard-host={node_ip}",
        f"--dashboard-port={dashboard_port}",
        f"--ray-client-server-port={client_port}",
        f"--metrics-export-port={metrics_port}",
        f"--dashboard-agent-listen-port={agent_port}",
        f"--num-cpus={num_cpus}",
        f"--object-store-memory={object_store_mb * 1024 * 1024}",
        f"--temp-dir={temp / RAY_SUBDIR}",
    ]
    if num_gpus is not None:
        command.append(f"--num-gpus={num_gpus}")
    if memory_mb is None:  # Ray would offer ~70% of RAM to tasks; leave the laptop half of it
        memory_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 / 2)
    command.append(f"--memory={memory_mb * 1024 * 1024}")
    return command


def _wait_until_answering(
    process: subprocess.Popen, address: str, headers: dict[str, str], timeout_s: float, log_path: Path
) -> None:
    """Block until the head's job API answers; a head that exits or stays silent is an error naming its log."""
    deadline = time.monotonic() + timeout_s
    while not _answers(address, headers, path="/api/jobs/"):
        if process.poll() is not None:
            raise LocalRayError(
                f"the local Ray head exited with code {process.returncode} while starting; "
                f"last lines of {log_path}:\n{log_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            kill_group(process.pid)
            raise LocalRayError(
                f"the local Ray head did not answer at {address} within {timeout_s:.0f} s; "
                f"last lines of {log_path}:\n{log_tail(log_path)}"
            )
        time.sleep(0.25)


def _write_registry(head: LocalRayHead) -> None:
    record = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(head).items() if k != "started_here"}
    write_json(head.temp_dir / REGISTRY_NAME, record)


def _read_registry(temp: Path) -> LocalRayHead | None:
    path = temp / REGISTRY_NAME
    try:
        record = json.loads(path.read_text())
        return LocalRayHead(**{**record, "temp_dir": Path(record["temp_dir"]), "started_here": False})
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError):
        return None


def _answers(address: str, headers: dict[str, str], path: str = "/api/version") -> bool:
    request = urllib.request.Request(address + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
