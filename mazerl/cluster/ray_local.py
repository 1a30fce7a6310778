"""The embedded local Ray head: one machine, dashboard and job server on 127.0.0.1 only.

The embedded pipeline submits its jobs through the same ``JobSubmissionClient`` path as a
real cluster, so it needs a Ray head with a job server. This module starts one with
``ray start --head --block`` (this venv's Ray) in its own process group, so it outlives a
crashed caller (a re-run re-attaches to its still-running job) and can be stopped by its
process id without touching any other Ray on the machine.

Security: every Ray process of this head binds to 127.0.0.1. ``--dashboard-host`` covers the
dashboard only; the GCS, raylet and agents bind to the node IP, which Ray on Linux resolves
to the machine's external address even when ``--node-ip-address 127.0.0.1`` is given. Ray's
own local-only mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, the default on macOS and
Windows) keeps the loopback address, so the head is started with it (tests check the
listening sockets). Token authentication is on (``RAY_AUTH_MODE=token``) with a fresh random
token per head, kept in a 0600 file in the head's temp dir and never logged; clients send
it as an ``Authorization: Bearer`` header (:meth:`LocalRayHead.auth_headers`), which Ray's
standard ``JobSubmissionClient(address, headers=...)`` accepts.

Usage::

    with local_ray_head() as head:          # starts one, or reuses the running one
        client = JobSubmissionClient(head.address, headers=head.auth_headers())

A process that wants to connect as a Ray *driver* (``ray.init(address=head.gcs_address)``)
needs ``head.client_env()`` in its environment before it imports ray.
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
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
DEFAULT_DASHBOARD_PORT = 8265
REGISTRY_NAME = "mazerl_head.json"
TOKEN_NAME = "mazerl_auth_token"
HEAD_LOG_NAME = "mazerl_head.log"
LOCK_NAME = "mazerl_head.lock"
# Ray's Unix socket paths (<temp>/session_<date>_<pid>/sockets/plasma_store) must stay under
# 107 bytes, so the temp dir has to be short.
MAX_TEMP_DIR_CHARS = 40


def default_temp_dir() -> Path:
    """A short per-user directory (Ray's socket paths have a length limit)."""
    return Path(tempfile.gettempdir()) / f"mazerl-ray-{os.getuid()}"


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

    @property
    def token_path(self) -> Path:
        return self.temp_dir / TOKEN_NAME

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
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.metrics_export_port}/metrics"

    def is_alive(self) -> bool:
        """The head process is ours and its job server answers."""
        return _is_our_head_process(self.pid, self.temp_dir) and _answers(self.address, self.auth_headers())

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the head: SIGTERM to ``ray start --block`` (it stops its children), then SIGKILL
        to whatever is left of its process group. Safe to call twice."""
        if not _is_our_head_process(self.pid, self.temp_dir):
            _remove(self.temp_dir / REGISTRY_NAME)
            return
        log.info("stopping local Ray head at %s (pid %d)", self.address, self.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _process_group_alive(self.pid):
            time.sleep(0.2)
        if _process_group_alive(self.pid):
            log.warning(
                "local Ray head (pid %d) did not stop in %.0f s; killing its process group", self.pid, timeout_s
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        _remove(self.temp_dir / REGISTRY_NAME)


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
) -> LocalRayHead:
    """Start a new head (fails if one registered in ``temp_dir`` is still running).

    ``num_cpus`` bounds how many tasks run at once (2 suits a 2-core laptop); ``memory_mb``
    is the memory Ray schedules tasks against (default: half of this machine's RAM); the object
    store is small because stages exchange paths, not tensors. ``dashboard_port`` None means 8265
    when free, else any free port; 0 means any free port.
    """
    temp = _temp_dir(temp_dir)
    with _registry_lock(temp):
        running = _read_registry(temp)
        if running is not None and running.is_alive():
            raise LocalRayError(f"a local Ray head is already running at {running.address} (temp dir {temp})")
        if running is not None:
            running.stop()
        return _start(temp, num_cpus, num_gpus, object_store_mb, memory_mb, dashboard_port, extra_env, timeout_s)


def find_local_head(temp_dir: str | os.PathLike | None = None) -> LocalRayHead | None:
    """The head registered in ``temp_dir`` if it is still running and answering, else None."""
    temp = _temp_dir(temp_dir)
    head = _read_registry(temp)
    if head is None or not head.is_alive():
        return None
    return head


def ensure_local_head(temp_dir: str | os.PathLike | None = None, **start_kwargs) -> LocalRayHead:
    """Reuse the running head in ``temp_dir`` or start one (``started_here`` tells which)."""
    temp = _temp_dir(temp_dir)
    with _registry_lock(temp):
        head = _read_registry(temp)
        if head is not None and head.is_alive():
            log.info("reusing the local Ray head at %s", head.address)
            return head
        if head is not None:
            head.stop()  # a half-dead head (e.g. its dashboard crashed): clear what is left of it
        return _start(temp, **_start_defaults(start_kwargs))


@contextlib.contextmanager
def local_ray_head(temp_dir: str | os.PathLike | None = None, **start_kwargs) -> Iterator[LocalRayHead]:
    """Ensure a head for the ``with`` block; stop it afterwards only if this call started it."""
    head = ensure_local_head(temp_dir, **start_kwargs)
    try:
        yield head
    finally:
        if head.started_here:
            head.stop()


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


def _temp_dir(temp_dir: str | os.PathLike | None) -> Path:
    temp = Path(temp_dir) if temp_dir is not None else default_temp_dir()
    temp = temp.expanduser().absolute()
    if len(str(temp)) > MAX_TEMP_DIR_CHARS:
        raise ValueError(
            f"temp_dir ({temp}) is {len(str(temp))} characters; Ray's socket paths under it must stay below "
            f"107 bytes, so use a directory of at most {MAX_TEMP_DIR_CHARS} characters (e.g. {default_temp_dir()})"
        )
    temp.mkdir(mode=0o700, parents=True, exist_ok=True)
    return temp


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
) -> LocalRayHead:
    import ray  # lazily: importing ray costs a second

    if num_cpus < 1:
        raise ValueError(f"num_cpus ({num_cpus}) must be >= 1 so the head can run the job drivers and tasks")
    if object_store_mb < 80:
        raise ValueError(f"object_store_mb ({object_store_mb}) must be >= 80 (Ray's minimum is 75 MiB)")
    token_path = temp / TOKEN_NAME
    _write_secret(token_path, secrets.token_hex(32))
    spare, gcs_port, client_port, metrics_port, agent_port = _free_ports(5)
    if dashboard_port is None:
        dashboard_port = DEFAULT_DASHBOARD_PORT if _port_free(DEFAULT_DASHBOARD_PORT) else spare
    elif dashboard_port == 0:
        dashboard_port = spare
    command = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        "--block",
        "--disable-usage-stats",
        f"--node-ip-address={LOOPBACK}",
        f"--port={gcs_port}",
        "--include-dashboard=true",
        f"--dashboard-host={LOOPBACK}",
        f"--dashboard-port={dashboard_port}",
        f"--ray-client-server-port={client_port}",
        f"--metrics-export-port={metrics_port}",
        f"--dashboard-agent-listen-port={agent_port}",
        f"--num-cpus={num_cpus}",
        f"--object-store-memory={object_store_mb * 1024 * 1024}",
        f"--temp-dir={temp}",
    ]
    if num_gpus is not None:
        command.append(f"--num-gpus={num_gpus}")
    if memory_mb is None:  # Ray would offer ~70% of RAM to tasks; leave the laptop half of it
        memory_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 / 2)
    command.append(f"--memory={memory_mb * 1024 * 1024}")
    env = _head_env(token_path, extra_env)
    log_path = temp / HEAD_LOG_NAME
    address = f"http://{LOOPBACK}:{dashboard_port}"
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
    deadline = time.monotonic() + timeout_s
    while not _answers(address, headers, path="/api/jobs/"):
        if process.poll() is not None:
            raise LocalRayError(
                f"the local Ray head exited with code {process.returncode} while starting; "
                f"last lines of {log_path}:\n{_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            _kill_group(process.pid)
            raise LocalRayError(
                f"the local Ray head did not answer at {address} within {timeout_s:.0f} s; "
                f"last lines of {log_path}:\n{_tail(log_path)}"
            )
        time.sleep(0.25)
    head = LocalRayHead(
        address=address,
        gcs_address=f"{LOOPBACK}:{gcs_port}",
        temp_dir=temp,
        pid=process.pid,
        metrics_export_port=metrics_port,
        ray_version=ray.__version__,
        started_here=True,
    )
    _write_registry(head)
    return head


def _head_env(token_path: Path, extra_env: dict[str, str] | None) -> dict[str, str]:
    """The head's environment, inherited by every job's entrypoint: this venv's python first on
    PATH (entrypoints say ``python -m ...``), token auth on, loopback-only node address."""
    env = dict(os.environ)
    for inherited in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_API_SERVER_ADDRESS"):
        env.pop(inherited, None)  # an outer cluster's settings must not leak into this head
    env.update(
        {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token_path),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            # A SIGTERM'd head would first wait for its node to drain (meant for Serve on k8s);
            # a local head has nothing to drain, so stop at once.
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        }
    )
    env.update(extra_env or {})
    return env


def _write_secret(path: Path, value: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    _remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value)
    os.replace(tmp, path)


def _write_registry(head: LocalRayHead) -> None:
    record = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(head).items() if k != "started_here"}
    path = head.temp_dir / REGISTRY_NAME
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, path)


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


def _is_our_head_process(pid: int, temp: Path) -> bool:
    """Guards against a recycled pid: the process must be `ray start` with our temp dir."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return _pid_alive(pid)  # no /proc (macOS): fall back to liveness
    return f"--temp-dir={temp}".encode() in cmdline


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _process_group_alive(pgid: int) -> bool:
    """Any non-zombie process left in the head's process group (reaping our own child first:
    a zombie leader would otherwise look alive to ``killpg(pgid, 0)``)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)
    import psutil  # a Ray dependency

    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports. The probe sockets stay bound until all are
    picked: closing each before asking for the next let the kernel hand out the same port twice,
    and Ray refuses to start when two of its components share one."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for probe in probes:
            probe.bind((LOOPBACK, 0))
        return [probe.getsockname()[1] for probe in probes]


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
