"""The job submitter against a real local Ray head, with real jobs written by the tests.

Each job is a tiny Python script in a temp dir: one that succeeds with log lines, one that
exits 2 (config error), one that exits 1, one that hangs silently, one killed mid-run. Every
test uses its own pipeline run id, so they share the session's head without interfering.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from mazerl.cluster.errors import ConfigError, JobConfigError, RetryableJobError
from mazerl.cluster.jobs.spec import JobSpec, local_runtime_env, module_entrypoint, runtime_env_for, submission_id_for
from mazerl.cluster.jobs.submitter import RayJob
from mazerl.training.progress import TrainingProgress

# Ray's job client against a Ray head, on the Ray the image ships too (`make test-image-stack`).
pytestmark = pytest.mark.image_stack

SCRIPTS = {
    "ok.py": """
        import time
        for step in range(3):
            print(f"step {step} reward 0.5", flush=True)
            time.sleep(0.1)
        print("training complete", flush=True)
    """,
    "bad_config.py": """
        import sys
        print("config error: learning_rate (-1.0) must be > 0", file=sys.stderr, flush=True)
        sys.exit(2)
    """,
    "crash.py": """
        import sys
        print("step 1", flush=True)
        raise RuntimeError("CUDA error: device-side assert (simulated)")
    """,
    "hang.py": """
        import time
        print("step 1/5: reward 0.0", flush=True)
        time.sleep(600)
    """,
    # Prints its pid, then waits to be killed (or for the release file, never written).
    "victim.py": """
        import os, sys, time
        print(f"pid={os.getpid()}", flush=True)
        print("step 0", flush=True)
        time.sleep(600)
    """,
    # Runs until the file named by argv[1] exists: lets a test re-attach while it runs.
    "gated.py": """
        import os, sys, time
        print("step 1", flush=True)
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.1)
        print("released", flush=True)
    """,
    # Three lines, then waits for the file named by argv[1], then one more: a job followed across attempts.
    "three_then_gated.py": """
        import os, sys, time
        for n in (1, 2, 3):
            print(f"early line {n}", flush=True)
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.1)
        print("late line", flush=True)
    """,
    # Fails on its first run (no marker yet), succeeds on the next: a retry that resumes.
    "flaky.py": """
        import os, sys
        marker = sys.argv[1]
        if not os.path.exists(marker):
            open(marker, "w").close()
            print("first try fails", flush=True)
            sys.exit(1)
        print("second try succeeds", flush=True)
    """,
}


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("jobs")
    for name, body in SCRIPTS.items():
        (folder / name).write_text(textwrap.dedent(body))
    return folder


def run_id() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def job(head, script: Path, *args: str, run: str, attempt: int = 1, lines: list[str] | None = None, **kwargs) -> RayJob:
    entrypoint = " ".join([sys.executable, str(script), *args])
    sink = lines.append if lines is not None else (lambda _line: None)
    return RayJob(
        head.address,
        JobSpec(entrypoint, pipeline_run_id=run, attempt=attempt),
        headers=head.auth_headers(),
        log=sink,
        **kwargs,
    )


def client_for(head):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(head.address, headers=head.auth_headers())


def jobs_of(head, run: str) -> list:
    return [j for j in client_for(head).list_jobs() if (j.metadata or {}).get("mazerl_pipeline_run") == run]


# --- pure: ids and entrypoints -------------------------------------------------------------


def test_submission_id_is_deterministic_per_run_and_attempt():
    assert submission_id_for("f1a2", 1) == submission_id_for("f1a2", 1) == "mazerl-f1a2-train-a1"
    assert submission_id_for("f1a2", 2) != submission_id_for("f1a2", 1), "each attempt gets its own id"
    assert submission_id_for("f1a2", 1, stage="eval") == "mazerl-f1a2-eval-a1"


@pytest.mark.parametrize(
    ("run", "attempt", "stage", "names"),
    [
        ("", 1, "train", "pipeline_run_id"),
        ("has space", 1, "train", "pipeline_run_id"),
        ("semi;colon", 1, "train", "pipeline_run_id"),
        ("x" * 101, 1, "train", "pipeline_run_id"),
        ("ok", 0, "train", "attempt"),
        ("ok", True, "train", "attempt"),
        ("ok", "1", "train", "attempt"),
        ("ok", 1, "a b", "stage"),
    ],
)
def test_submission_id_rejects_bad_input_naming_the_parameter(run, attempt, stage, names):
    with pytest.raises(ConfigError, match=names):
        submission_id_for(run, attempt, stage)


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"entrypoint": " "}, "entrypoint is empty"),
        ({"pipeline_run_id": "a b"}, "pipeline_run_id"),
        ({"attempt": 0}, "attempt"),
    ],
)
def test_a_job_spec_that_makes_no_sense_is_refused_when_built(fields, names):
    with pytest.raises(ConfigError, match=names):
        JobSpec(**({"entrypoint": "python -m m", "pipeline_run_id": "ok", "attempt": 1} | fields))


@pytest.mark.parametrize(
    ("module", "config", "expected"),
    [
        (
            "mazerl.training.local_entry",
            "/shared/runs/r1/config.json",
            "exec python -m mazerl.training.local_entry --config /shared/runs/r1/config.json",
        ),
        ("m", "/tmp/a b.json", "exec python -m m --config '/tmp/a b.json'"),
    ],
)
def test_module_entrypoint_quotes_the_config_path(module, config, expected):
    assert module_entrypoint(module, config) == expected


@pytest.mark.parametrize("module", ["", "mazerl/training", "x; rm -rf /", "1abc", "a..b"])
def test_module_entrypoint_rejects_non_module_names(module):
    with pytest.raises(ConfigError, match="entrypoint_module"):
        module_entrypoint(module, "/tmp/c.json")


# --- real jobs on the local head -------------------------------------------------------------


def test_successful_job_streams_its_log_lines_in_order(local_ray_head, scripts):
    lines: list[str] = []
    run = run_id()
    with job(local_ray_head, scripts / "ok.py", run=run, lines=lines) as running:
        outcome = running.wait()
    assert outcome.status == "SUCCEEDED"
    assert outcome.submission_id == f"mazerl-{run}-train-a1", "deterministic id for (run, attempt 1)"
    assert outcome.reattached is False
    own = [line for line in lines if line.startswith(("step", "training"))]
    assert own == ["step 0 reward 0.5", "step 1 reward 0.5", "step 2 reward 0.5", "training complete"], lines
    assert outcome.log_lines >= 4


def test_succeeded_attempt_is_returned_not_run_again(local_ray_head, scripts):
    run = run_id()
    first = job(local_ray_head, scripts / "ok.py", run=run)
    with first:
        first.wait()
    lines: list[str] = []
    again = job(local_ray_head, scripts / "ok.py", run=run, lines=lines)
    with again:
        outcome = again.wait()
    assert outcome.reattached and outcome.submission_id == f"mazerl-{run}-train-a1"
    assert len(jobs_of(local_ray_head, run)) == 1, "the same (run, attempt) must not start a second job"


def test_before_submit_runs_once_before_a_new_submission_and_never_for_a_job_that_needs_none(local_ray_head, scripts):
    run = run_id()
    calls: list[int] = []
    # given a retry's wait before submitting (here it only counts), when the attempt's job is submitted,
    first = job(local_ray_head, scripts / "ok.py", run=run, attempt=2, before_submit=lambda: calls.append(1))
    with first:
        first.wait()
    assert calls == [1] and len(jobs_of(local_ray_head, run)) == 1, "waited once, then submitted once"
    # and when the same attempt is looked at again (it already SUCCEEDED), nothing is waited for.
    again = job(local_ray_head, scripts / "ok.py", run=run, attempt=2, before_submit=lambda: calls.append(2))
    with again:
        assert again.wait().reattached
    assert calls == [1]
    # A wait that gives up leaves nothing submitted.
    with pytest.raises(RuntimeError, match="gave up"):
        job(local_ray_head, scripts / "ok.py", run=run, attempt=3, before_submit=gave_up).start()
    assert len(jobs_of(local_ray_head, run)) == 1


def gave_up() -> None:
    raise RuntimeError("gave up after 45 min waiting for 6 GPUs: 4 free")


def test_exit_code_2_is_a_config_error_with_the_jobs_message(local_ray_head, scripts):
    with (
        pytest.raises(JobConfigError) as caught,
        job(local_ray_head, scripts / "bad_config.py", run=run_id()) as running,
    ):
        running.wait()
    message = str(caught.value)
    assert "learning_rate (-1.0) must be > 0" in message, "the entrypoint's own error reaches the caller"
    assert local_ray_head.address in message and "exit code 2" in message
    assert isinstance(caught.value, ConfigError) and not isinstance(caught.value, RetryableJobError)


def test_exit_code_1_is_retryable_and_the_retry_gets_a_fresh_id(local_ray_head, scripts, tmp_path):
    run = run_id()
    marker = tmp_path / "tried-once"
    with (
        pytest.raises(RetryableJobError) as caught,
        job(local_ray_head, scripts / "flaky.py", str(marker), run=run) as running,
    ):
        running.wait()
    assert local_ray_head.address in str(caught.value) and "exit code 1" in str(caught.value)
    # The same attempt submitted again (e.g. the flow run re-run) must not collide with the failed id.
    with job(local_ray_head, scripts / "flaky.py", str(marker), run=run) as running:
        outcome = running.wait()
    assert outcome.submission_id == f"mazerl-{run}-train-a1-r1", "a failed id is never reused"
    assert outcome.status == "SUCCEEDED"


def test_crash_is_retryable_and_names_address(local_ray_head, scripts):
    with pytest.raises(RetryableJobError) as caught, job(local_ray_head, scripts / "crash.py", run=run_id()) as running:
        running.wait()
    assert "device-side assert" in str(caught.value), "the job's last lines are in the error"
    assert caught.value.address == local_ray_head.address


def test_reattaches_to_the_running_job_of_the_same_run_instead_of_a_second(local_ray_head, scripts, tmp_path):
    run = run_id()
    release = tmp_path / "release"
    first = job(local_ray_head, scripts / "gated.py", str(release), run=run, attempt=1)
    first_id = first.start()  # the orchestrator submits, then dies without waiting
    lines: list[str] = []
    second = job(local_ray_head, scripts / "gated.py", str(release), run=run, attempt=2, lines=lines)
    assert second.start() == first_id, "attempt 2 must follow attempt 1's still-running job"
    threading.Timer(2.0, release.touch).start()
    outcome = second.wait()
    assert outcome.reattached and outcome.status == "SUCCEEDED" and outcome.submission_id == first_id
    assert "released" in lines, "logs of the re-attached job are streamed too"
    assert [j.submission_id for j in jobs_of(local_ray_head, run)] == [first_id], "exactly one job for the run"


# An orchestrator attempt in its own process, so that the test can SIGKILL it mid-job.
FOLLOWER = """
import json, sys
from mazerl.cluster.jobs.spec import JobSpec
from mazerl.cluster.jobs.submitter import RayJob

address, entrypoint, run, offsets, token = sys.argv[1:6]
job = RayJob(address, JobSpec(entrypoint, pipeline_run_id=run, attempt=1), log=lambda line: print(line, flush=True),
             headers={"Authorization": f"Bearer {token}"}, log_offsets_dir=offsets)
with job:
    job.wait()
"""


def follow_as_attempt_2(head, scripts, release: Path, run: str, offsets: Path) -> tuple:
    """A retry (attempt 2) that re-attaches to the run's gated job, releases it and follows it to its end."""
    lines: list[str] = []
    retry = job(
        head, scripts / "three_then_gated.py", str(release), run=run, attempt=2, lines=lines, log_offsets_dir=offsets
    )
    with retry:
        threading.Timer(1.0, release.touch).start()
        return retry.wait(), lines


def test_a_retry_that_reattaches_continues_the_log_where_the_killed_attempt_stopped(local_ray_head, scripts, tmp_path):
    run, release, offsets = run_id(), tmp_path / "release", tmp_path / "job_logs"
    follower = tmp_path / "follower.py"
    follower.write_text(FOLLOWER)
    entrypoint = f"{sys.executable} {scripts / 'three_then_gated.py'} {release}"
    token = local_ray_head.token_path.read_text().strip()
    command = [sys.executable, str(follower), local_ray_head.address, entrypoint, run, str(offsets), token]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        # Given a first attempt that logged the job's first three lines and was then killed outright,
        shown = []
        while "early line 3" not in shown:
            line = first.stdout.readline()
            assert line, f"the first attempt ended early after {shown}"
            shown.append(line.rstrip("\n"))
        deadline = time.monotonic() + 30
        while not list(offsets.glob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.1)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    # when the retry re-attaches to the still-running job and follows it to its end,
    outcome, lines = follow_as_attempt_2(local_ray_head, scripts, release, run, offsets)
    # then it shows only what came after, and says that the earlier lines were shown before.
    assert outcome.reattached and outcome.status == "SUCCEEDED"
    assert "late line" in lines and not [line for line in lines if line.startswith("early line")], lines
    assert any("its log continues after the" in line and "an earlier attempt already showed" in line for line in lines)


def test_a_reattached_job_without_a_record_is_followed_from_its_start_and_says_so(local_ray_head, scripts, tmp_path):
    run, release = run_id(), tmp_path / "release"
    job(local_ray_head, scripts / "three_then_gated.py", str(release), run=run).start()  # its follower died unrecorded
    _, lines = follow_as_attempt_2(local_ray_head, scripts, release, run, tmp_path / "job_logs")
    ours = [line for line in lines if line.startswith(("early line", "late line"))]
    assert ours == ["early line 1", "early line 2", "early line 3", "late line"], lines
    assert any("following its log from the start" in line for line in lines), lines


def test_hung_job_is_stopped_and_reported_retryable(local_ray_head, scripts):
    run = run_id()
    running = job(
        local_ray_head, scripts / "hang.py", run=run, hang_timeout_s=3.0, progress_probe=TrainingProgress(), poll_s=0.25
    )
    started = time.monotonic()
    with pytest.raises(RetryableJobError, match="hung") as caught, running:
        running.wait()
    assert time.monotonic() - started < 45, "the watchdog fires soon after the timeout"
    assert "last progress: 1" in str(caught.value), "the last step seen in the log is reported"
    status = client_for(local_ray_head).get_job_status(running.submission_id)
    assert str(status) == "STOPPED", f"the hung job must be stopped before the error is raised ({status})"


def test_job_killed_mid_run_is_retryable(local_ray_head, scripts):
    def kill_on_pid(line: str) -> None:
        if line.startswith("pid="):
            os.kill(int(line.split("=")[1]), signal.SIGKILL)

    running = RayJob(
        local_ray_head.address,
        JobSpec(f"{sys.executable} {scripts / 'victim.py'}", pipeline_run_id=run_id(), attempt=1),
        headers=local_ray_head.auth_headers(),
        log=kill_on_pid,
    )
    with pytest.raises(RetryableJobError) as caught, running:
        running.wait()
    assert "FAILED" in str(caught.value) and local_ray_head.address in str(caught.value)


class Cancelled(BaseException):
    """Stands in for Prefect's cancellation / KeyboardInterrupt reaching the waiting task."""


def test_cancelling_the_caller_stops_the_ray_job(local_ray_head, scripts):
    def cancel_on_first_step(line: str) -> None:
        if line.startswith("step"):
            raise Cancelled

    running = RayJob(
        local_ray_head.address,
        JobSpec(f"{sys.executable} {scripts / 'hang.py'}", pipeline_run_id=run_id(), attempt=1),
        headers=local_ray_head.auth_headers(),
        log=cancel_on_first_step,
    )
    with pytest.raises(Cancelled), running:
        running.wait()
    client = client_for(local_ray_head)
    deadline = time.monotonic() + 20
    while (
        str(client.get_job_status(running.submission_id)) not in ("STOPPED", "FAILED") and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert str(client.get_job_status(running.submission_id)) == "STOPPED", (
        "a cancelled caller must not leave a job behind"
    )


def test_a_stopped_caller_keeps_its_job_for_a_retry_and_an_abandoned_run_loses_its_jobs(local_ray_head, scripts):
    """A caller stopped where a retry re-attaches keeps its job; an abandoned run has its jobs stopped."""
    from mazerl.cluster.jobs.pipeline_jobs import stop_pipeline_jobs

    lines: list[str] = []

    def stopped_on_first_step(line: str) -> None:
        lines.append(line)
        if line.startswith("step"):
            raise Cancelled  # as Prefect's TerminationSignal reaches a deployment's stage on SIGTERM

    # Given a stage whose policy keeps its job when the flow process is stopped (a deployment's),
    run = run_id()
    running = RayJob(
        local_ray_head.address,
        JobSpec(f"{sys.executable} {scripts / 'hang.py'}", pipeline_run_id=run, attempt=1),
        headers=local_ray_head.auth_headers(),
        log=stopped_on_first_step,
        keep_running_on=lambda exc: "its retry re-attaches" if isinstance(exc, Cancelled) else None,
    )
    # when the process is stopped while the job runs,
    with pytest.raises(Cancelled), running:
        running.wait()
    # then the job runs on, and the log says so (the retry of the flow run re-attaches to it),
    client = client_for(local_ray_head)
    assert str(client.get_job_status(running.submission_id)) == "RUNNING"
    assert any(f"left Ray job {running.submission_id} running" in line and "re-attaches" in line for line in lines)
    # and when that run is abandoned instead (mazerl run --fresh), its jobs are stopped.
    assert stop_pipeline_jobs(local_ray_head.address, run, local_ray_head.auth_headers()) == [running.submission_id]
    assert str(client.get_job_status(running.submission_id)) == "STOPPED"


def test_a_training_job_runs_a_module_entrypoint_with_the_config(local_ray_head, tmp_path):
    """The real entrypoint shape, ``exec python -m <module> --config <file>``: plain ``python`` must be
    this venv's interpreter on the head, the job must import this checkout's code, and no shell
    stays between Ray and the module (a wrapper killed alone would orphan the trainer)."""
    from mazerl.cluster.jobs.spec import project_root

    (tmp_path / "fake_entry.py").write_text(
        textwrap.dedent(
            """
            import argparse, json, os
            import mazerl.cluster  # the project is importable inside the job
            parser = argparse.ArgumentParser()
            parser.add_argument("--config", required=True)
            config = json.load(open(parser.parse_args().config))
            print(f"step 1 run_id={config['run_id']}", flush=True)
            parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\\0")[0].decode()
            print(f"parent={parent}", flush=True)
            """
        )
    )
    config = tmp_path / "train config.json"  # a space: the path must be quoted
    config.write_text('{"run_id": "r-42"}')
    lines: list[str] = []
    with RayJob(
        local_ray_head.address,
        JobSpec(
            module_entrypoint("fake_entry", config),
            pipeline_run_id=run_id(),
            attempt=1,
            runtime_env={"env_vars": {"PYTHONPATH": f"{project_root()}{os.pathsep}{tmp_path}"}},
        ),
        headers=local_ray_head.auth_headers(),
        log=lines.append,
    ) as job:
        outcome = job.wait()
    assert outcome.status == "SUCCEEDED"
    assert "step 1 run_id=r-42" in lines, lines
    (parent,) = [line.removeprefix("parent=") for line in lines if line.startswith("parent=")]
    assert not parent.endswith("sh"), f"the module runs under a shell wrapper ({parent}), not in its place"


def test_unreachable_address_is_retryable_and_names_it():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    address = f"http://127.0.0.1:{port}"
    with (
        pytest.raises(RetryableJobError) as caught,
        RayJob(
            address,
            JobSpec(
                module_entrypoint("mazerl.training.local_entry", "/tmp/c.json"), pipeline_run_id=run_id(), attempt=1
            ),
        ) as job,
    ):
        job.wait()
    assert address in str(caught.value) and caught.value.address == address


@pytest.mark.parametrize(
    "address, on_this_machine",
    [
        ("http://127.0.0.1:8265", True),
        ("http://localhost:8265", True),
        ("http://127.0.0.2:8265", True),  # a second local node's head (ray_local's node_ip)
        ("http://[::1]:8265", True),
        ("127.0.0.1:8265", True),
        ("http://10.0.0.5:8265", False),
        ("http://127.foo:8265", False),
        ("http://head.example.com:8265", False),
    ],
)
def test_the_auto_runtime_env_points_at_our_code_only_for_a_head_on_this_machine(address, on_this_machine):
    # given a cluster address, when the "auto" runtime env is chosen, then only a local head shares our files
    expected = local_runtime_env() if on_this_machine else None
    assert runtime_env_for(address) == expected, f"{address}: expected {expected}"
