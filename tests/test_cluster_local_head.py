"""The embedded local Ray head: loopback only, token auth, reuse, stop, and a head that goes away."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest

from mazerl.cluster.client import job_client
from mazerl.cluster.errors import RetryableJobError
from mazerl.cluster.head.local import (
    LocalRayError,
    ensure_local_head,
    find_local_head,
    local_ray_head,
    start_local_head,
)
from mazerl.cluster.head.temp_dir import REGISTRY_NAME
from mazerl.cluster.jobs.spec import JobSpec
from mazerl.cluster.jobs.submitter import RayJob

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


def head_processes(head) -> list[psutil.Process]:
    """The head's `ray start` process, everything it started, and its process group."""
    root = psutil.Process(head.pid)
    found = {p.pid: p for p in [root, *root.children(recursive=True)]}
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == head.pid:
                found.setdefault(process.pid, process)
        except (ProcessLookupError, psutil.Error):
            continue
    return list(found.values())


def script_job(head, script, run: str | None = None, **options) -> RayJob:
    """A Ray job on ``head`` that runs ``script`` with this Python, its log discarded."""
    return RayJob(
        head.address,
        JobSpec(f"{sys.executable} {script}", pipeline_run_id=run or f"t{uuid.uuid4().hex[:8]}", attempt=1),
        headers=head.auth_headers(),
        log=lambda _line: None,
        **options,
    )


def test_every_listening_socket_of_the_head_is_loopback(local_ray_head, tmp_path):
    # A running job makes the head start its job supervisor and a worker: they listen too.
    script = tmp_path / "wait.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(30)\n")
    running = script_job(local_ray_head, script)
    with running:
        client = job_client(local_ray_head.address, local_ray_head.auth_headers())
        deadline = time.monotonic() + 30
        while str(client.get_job_status(running.submission_id)) != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = {p.pid for p in head_processes(local_ray_head)}
        listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in pids]
        running.stop()
    ports = {c.laddr.port for c in listening}
    dashboard_port = int(local_ray_head.address.rsplit(":", 1)[1])
    assert dashboard_port in ports, "the head's own sockets were examined (the dashboard is among them)"
    assert len(listening) >= 5, f"GCS, raylet, agents and the dashboard all listen ({len(listening)} found)"
    exposed = [
        (c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name()) for c in listening if c.laddr.ip not in LOOPBACK
    ]
    assert exposed == [], f"every Ray server of the embedded head must bind 127.0.0.1 only: {exposed}"


def test_the_job_api_requires_the_token(local_ray_head):
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(local_ray_head.address + "/api/version", timeout=5)
    assert caught.value.code == 401, "no token, no answer"
    request = urllib.request.Request(local_ray_head.address + "/api/version", headers=local_ray_head.auth_headers())
    with urllib.request.urlopen(request, timeout=5) as response:
        assert json.loads(response.read())["ray_version"] == local_ray_head.ray_version


def test_the_token_is_private_and_never_written_elsewhere(local_ray_head):
    token = local_ray_head.token_path.read_text().strip()
    assert len(token) >= 32, "a long random token"
    assert stat.S_IMODE(local_ray_head.token_path.stat().st_mode) == 0o600, "only the owner may read the token"
    assert token not in (local_ray_head.temp_dir / REGISTRY_NAME).read_text()
    assert token not in (local_ray_head.temp_dir / "mazerl_head.log").read_text()
    assert token not in repr(local_ray_head) and token not in json.dumps(local_ray_head.client_env())
    leaks = [
        str(path)
        for path in local_ray_head.temp_dir.rglob("*")
        if path.is_file()
        and path != local_ray_head.token_path
        and not path.is_symlink()
        and token.encode() in path.read_bytes()
    ]
    assert leaks == [], f"no Ray log or session file may contain the token: {leaks}"


def test_temp_dir_too_long_for_ray_sockets_is_refused():
    with pytest.raises(ValueError, match="temp_dir"):
        start_local_head("/tmp/" + "x" * 60)


def test_reuse_stop_and_a_vanished_head_is_a_retryable_error_naming_its_address(tmp_path):
    temp = tempfile.mkdtemp(prefix="mzr-l", dir="/tmp")
    try:
        head = start_local_head(temp, num_cpus=1, object_store_mb=100, dashboard_port=0)
        assert head.started_here and head.is_alive()
        again = ensure_local_head(temp)
        assert (again.address, again.pid, again.started_here) == (head.address, head.pid, False), (
            "reused, not restarted"
        )
        with local_ray_head(temp) as reused:
            assert not reused.started_here
        assert head.is_alive(), "leaving the block must not stop a head this call did not start"
        with pytest.raises(LocalRayError, match="already running"):
            start_local_head(temp)

        script = tmp_path / "long.py"
        script.write_text("import time\nprint('step 0', flush=True)\ntime.sleep(600)\n")
        running = script_job(head, script, "gone", unreachable_grace_s=1.0)
        running.start()
        head.stop()
        leftovers = [p.pid for p in psutil.process_iter(["cmdline"]) if temp in " ".join(p.info["cmdline"] or [])]
        assert leftovers == [], f"stopping the head ends all its processes ({leftovers})"
        assert find_local_head(temp) is None

        with pytest.raises(RetryableJobError) as caught:
            running.wait()
        assert head.address in str(caught.value), "the error names the address that stopped answering"
        with pytest.raises(RetryableJobError) as caught:
            job_client(head.address, {"Authorization": "Bearer x"})
        assert head.address in str(caught.value)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


# --------------------------------------------------------------------------------------
# The head's temp dir is private; the head outlives the run that started it while others use it
# --------------------------------------------------------------------------------------


def short_temp(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # Ray's socket paths need a short one


def test_a_head_temp_dir_that_others_own_or_can_write_is_refused():
    from mazerl.cluster.head.temp_dir import UnsafeTempDirError, check_temp_dir

    opened, foreign = short_temp("mzr-o"), short_temp("mzr-f")
    try:
        # Given a directory anyone may write into (as Ray leaves its own temp dir, 0777 without sticky bit),
        opened.chmod(0o777)
        with pytest.raises(UnsafeTempDirError, match="mode 0777: other users can write into it"):
            check_temp_dir(opened)
        # and one that belongs to another user (made beforehand, e.g. under a shared /tmp),
        if os.getuid() == 0:
            os.chown(foreign, 65534, 65534)
        else:
            foreign = Path("/")  # root's
        with pytest.raises(UnsafeTempDirError, match="not to you"):
            check_temp_dir(foreign)
        # then neither is used, and a private one of this user is.
        private = short_temp("mzr-p")
        assert check_temp_dir(private) == private
        shutil.rmtree(private)
    finally:
        shutil.rmtree(opened, ignore_errors=True)
        if foreign != Path("/"):
            shutil.rmtree(foreign, ignore_errors=True)


def test_the_head_temp_dir_stays_private_while_jobs_run(local_ray_head, tmp_path):
    # Given the head, when a job has run on it (Ray opens its own temp dir to 0777 for every worker),
    script = tmp_path / "ok.py"
    script.write_text("print('ran', flush=True)\n")
    with script_job(local_ray_head, script) as job:
        assert job.wait().status == "SUCCEEDED"
    # then the directory that holds its registry and token is still this user's alone,
    mode = stat.S_IMODE(local_ray_head.temp_dir.stat().st_mode)
    assert mode == 0o700, f"the head's temp dir is {mode:04o}: others could replace its registry or token"
    assert local_ray_head.ray_temp_dir.parent == local_ray_head.temp_dir, "Ray's own dir lies inside it"
    # and the head is still found there (its directory passes the checks).
    found = find_local_head(local_ray_head.temp_dir)
    assert found is not None and (found.address, found.pid) == (local_ray_head.address, local_ray_head.pid)


LEASE_HOLDER = """
import sys, time
from pathlib import Path
from mazerl.cluster.head.local import local_ray_head

temp, may_end = sys.argv[1], Path(sys.argv[2])
with local_ray_head(temp, num_cpus=1, object_store_mb=80, dashboard_port=0) as head:
    print(f"UP {head.address} {'started' if head.started_here else 'reused'}", flush=True)
    while not may_end.exists():
        time.sleep(0.1)
print("LEFT", flush=True)
"""


def test_the_head_outlives_the_run_that_started_it_while_another_run_still_uses_it(tmp_path):
    temp = short_temp("mzr-r")
    holder = tmp_path / "holder.py"
    holder.write_text(LEASE_HOLDER)
    first_may_end, second_may_end, job_may_end = (tmp_path / name for name in ("first", "second", "job"))
    processes = []

    def hold(may_end: Path) -> tuple[subprocess.Popen, str]:
        process = subprocess.Popen(
            [sys.executable, str(holder), str(temp), str(may_end)], stdout=subprocess.PIPE, text=True
        )
        processes.append(process)
        return process, process.stdout.readline()

    try:
        # Given one run that started the embedded head and a second run that reuses it, with a job running,
        first, first_said = hold(first_may_end)
        second, second_said = hold(second_may_end)
        assert first_said.endswith("started\n") and second_said.endswith("reused\n"), (first_said, second_said)
        head = find_local_head(temp)
        script = tmp_path / "job.py"
        script.write_text(f"import os, time\nwhile not os.path.exists({str(job_may_end)!r}): time.sleep(0.1)\n")
        job = script_job(head, script, "second-run")
        job.start()
        # when the run that started the head ends first,
        first_may_end.touch()
        assert first.communicate(timeout=60)[0].strip() == "LEFT"
        # then the head keeps running for the other run, whose job completes,
        assert find_local_head(temp) is not None, "the head was stopped under a run still using it"
        job_may_end.touch()
        assert job.wait().status == "SUCCEEDED"
        # and when the last run using it ends, the head stops.
        second_may_end.touch()
        assert second.communicate(timeout=60)[0].strip() == "LEFT"
        assert find_local_head(temp) is None
        leftovers = [p.pid for p in psutil.process_iter(["cmdline"]) if str(temp) in " ".join(p.info["cmdline"] or [])]
        assert leftovers == [], f"the last run's end stops all the head's processes ({leftovers})"
    finally:
        for path in (first_may_end, second_may_end, job_may_end):
            path.touch()
        for process in processes:
            process.wait(timeout=60)
        left = find_local_head(temp)
        if left is not None:
            left.stop()
        shutil.rmtree(temp, ignore_errors=True)
