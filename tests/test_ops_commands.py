"""``mazerl ray status|stop`` and ``mazerl ui``: the commands the run's closing lines tell a user to paste."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from mazerl.cluster.head.local import find_local_head
from mazerl.cluster.head.temp_dir import default_temp_dir

MAZERL = [sys.executable, "-m", "cli.main"]

# A deployment's flow run: takes the embedded head with ensure_local_head (started if none runs),
# does its work, and ends without stopping it.
FLOW_RUN = """
import sys, time
from pathlib import Path
from mazerl.cluster.head.local import ensure_local_head

head = ensure_local_head(num_cpus=1, object_store_mb=80, dashboard_port=0)
print(f"UP {head.address}", flush=True)
while not Path(sys.argv[1]).exists():
    time.sleep(0.1)
"""


def mazerl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*MAZERL, *args], env=env, capture_output=True, text=True, timeout=120)


def test_ray_stop_stops_the_head_a_deployment_run_left_up_and_never_one_in_use(tmp_path):
    short = Path(tempfile.mkdtemp(prefix="mzs", dir="/tmp"))  # Ray's socket paths need a short TMPDIR
    env = os.environ | {"TMPDIR": str(short), "RAY_TMPDIR": str(short)}
    script, may_end = tmp_path / "flow_run.py", tmp_path / "may_end"
    script.write_text(FLOW_RUN)
    flow_run = subprocess.Popen([sys.executable, str(script), str(may_end)], env=env, stdout=subprocess.PIPE, text=True)
    temp = short / default_temp_dir().name
    try:
        # Given a flow run that started the embedded head and still runs,
        assert flow_run.stdout.readline().startswith("UP "), "the flow run did not get a head"
        # when the user asks to stop it, then it is refused, naming the run's process, and the head keeps running;
        refused = mazerl("ray", "stop", env=env)
        assert refused.returncode == 1, refused
        assert str(flow_run.pid) in refused.stderr and "--force" in refused.stderr, refused.stderr
        assert find_local_head(temp) is not None, "ray stop stopped a head a live run holds a lease on"
        # and once the flow run has ended (leaving its head up, ~20 processes), status says it is unused
        may_end.touch()
        flow_run.wait(timeout=60)
        head = find_local_head(temp)
        assert head is not None, "the flow run's end stopped the head: nothing left to test"
        status = mazerl("ray", "status", env=env)
        assert status.returncode == 0 and head.address in status.stdout and "unused" in status.stdout, status
        # and `mazerl ray stop` stops it and every process of it,
        stopped = mazerl("ray", "stop", env=env)
        assert stopped.returncode == 0 and f"stopped the embedded Ray head at {head.address}" in stopped.stdout
        assert find_local_head(temp) is None
        leftovers = [p.pid for p in psutil.process_iter(["cmdline"]) if str(temp) in " ".join(p.info["cmdline"] or [])]
        assert leftovers == [], f"processes of the stopped head are left: {leftovers}"
        # and a second stop has nothing to do.
        again = mazerl("ray", "stop", env=env)
        assert again.returncode == 0 and "nothing to stop" in again.stdout, again
    finally:
        may_end.touch()
        flow_run.wait(timeout=60)
        left = find_local_head(temp)
        if left is not None:
            left.stop()
        shutil.rmtree(short, ignore_errors=True)


@pytest.mark.slow
def test_mazerl_ui_serves_the_embedded_store_and_prints_the_runs_table_link(mlflow_root):
    from mazerl.paths import mlflow_db_uri
    from mazerl.tracking.store import ensure_experiment

    # Given an embedded store with the pipeline's experiment,
    experiment_id = ensure_experiment(mlflow_db_uri(mlflow_root), "vlm-maze-grpo")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # when the user runs the closing hint's command,
    ui = subprocess.Popen(
        [*MAZERL, "ui", "--data-root", str(mlflow_root), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        # then it prints the runs table's link and the UI answers there.
        first = ui.stdout.readline()
        assert f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs?" in first, first
        deadline = time.time() + 180
        while True:
            assert ui.poll() is None, f"mazerl ui exited: {ui.stdout.read()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert time.time() < deadline, "mazerl ui did not answer within 180 s"
                time.sleep(1)
        # sized for a laptop: one server process (no worker processes, no background job runners)
        processes = [ui.pid] + [child.pid for child in psutil.Process(ui.pid).children(recursive=True)]
        assert len(processes) <= 2, [psutil.Process(pid).cmdline()[:4] for pid in processes]
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=60)
    # and no line per HTTP request.
    assert "GET /health" not in ui.stdout.read()


def test_mazerl_ui_refuses_a_port_in_use_and_takes_a_free_one_when_none_was_asked_for(mlflow_root, monkeypatch):
    from cli import ui as ui_cli

    with socket.socket() as busy:  # another program on the port
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # when the user asks for that port, the UI refuses before starting, naming it and the fix,
        result = mazerl("ui", "--data-root", str(mlflow_root), "--port", str(port), env=dict(os.environ))
        assert result.returncode == 2, result
        assert f"port {port} on 127.0.0.1 is already in use" in result.stderr and "--port" in result.stderr
        # and when the default port is the one taken, it takes a free port and says which.
        monkeypatch.setattr(ui_cli, "DEFAULT_PORT", port)
        chosen, note = ui_cli.choose_port("127.0.0.1", None)
        assert chosen != port and ui_cli.port_is_free("127.0.0.1", chosen)
        assert f"port {port} is in use, so this UI listens on port {chosen}" in note


def test_mazerl_ui_without_a_store_says_where_it_looked(tmp_path):
    result = mazerl("ui", "--data-root", str(tmp_path), env=dict(os.environ))
    assert result.returncode == 2 and f"no MLflow store under the data root {tmp_path}" in result.stderr, result


def test_the_closing_hint_names_commands_of_this_environment_that_work_pasted(tmp_path, monkeypatch):
    from cli.run import closing_hints
    from mazerl import paths

    # Given a run on the embedded store, seen from the project directory (where .venv lies),
    monkeypatch.chdir(Path(sys.executable).parents[2])
    hints = closing_hints(paths.mlflow_db_uri(tmp_path), tmp_path, embedded_head=False)
    # then the hint calls the venv's own scripts (a bare `mlflow` is not on the PATH outside it),
    command = hints.splitlines()[0].removeprefix("Look at it: ").split()
    assert command[:2] == [str(Path(sys.executable).parent.relative_to(Path.cwd()) / "mazerl"), "ui"], hints
    assert Path(command[0]).is_file() and command[2:] == ["--data-root", str(tmp_path)], hints
    assert f"{Path(sys.executable).parent.relative_to(Path.cwd()) / 'mlflow'} ui --backend-store-uri" in hints
    # and a tracking server's hint is its address.
    assert closing_hints("http://mlflow:5000", tmp_path, embedded_head=False) == "Look at it: http://mlflow:5000"


def test_the_printed_commands_work_pasted_for_a_data_root_with_spaces(tmp_path, monkeypatch):
    import shlex

    from cli.run import closing_hints, resume_hint
    from mazerl import paths

    # Given a data root whose path holds spaces (and a quote),
    root = tmp_path / "my runs" / "Bob's root"
    hints = closing_hints(paths.mlflow_db_uri(root), root, embedded_head=False).splitlines()
    # then the shell reads each printed command back into the very arguments it names:
    ui = shlex.split(hints[0].removeprefix("Look at it: "))
    assert ui[1:] == ["ui", "--data-root", str(root)], hints
    same = shlex.split(hints[1].strip().removeprefix("(the same as ").removesuffix(")"))
    artifacts = str(paths.mlflow_artifacts_dir(root))
    assert same[1:] == ["ui", "--backend-store-uri", paths.mlflow_db_uri(root), "--default-artifact-root", artifacts]
    # and so does the command that resumes an interrupted run.
    monkeypatch.setattr(sys, "argv", ["mazerl", "run", "--data-root", str(root), "--training", '{"steps": 4}'])
    again = resume_hint(None).split("run the same command again (", 1)[1].split(") to resume", 1)[0]
    assert shlex.split(again)[1:] == sys.argv[1:], again
