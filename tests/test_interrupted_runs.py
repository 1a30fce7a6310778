"""``mazerl run`` interrupted as a laptop interrupts it, then the same command again, end to end.

Each test runs the real command (``.venv/bin/mazerl run``) with embedded Prefect and MLflow:

- Ctrl-C in a terminal: SIGINT to the whole foreground process group, on the embedded Ray head
  the command starts itself (no ``--ray-address``). The run ends within seconds with exit 130.
- The machine going down: ``mazerl run``, its trainer and the embedded head all SIGKILLed.
- A full disk: the data root on a small tmpfs, filled while the run trains. The run pauses with
  one message and no traceback, its MLflow runs are not left RUNNING, and it resumes once space
  is freed.

In every case the same command, run at once, finishes the run: every step's metrics land in
MLflow once, there is one run directory and one registered model version, and nothing is left
RUNNING in MLflow or Prefect.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from test_resume import prefect_db_states, registered_versions, training_processes

from mazerl.training import checkpoints
from mazerl.training.recipes import MINIATURE_TRAINING

pytestmark = pytest.mark.slow  # two or three mazerl runs per test

PROJECT = Path(__file__).resolve().parents[1]
STEPS = 12


def mazerl_run(root: Path, model: Path, params_file: Path, *extra: str) -> list[str]:
    """The command a user types: the reduced starter, 2 eval mazes, the miniature recipe for STEPS steps."""
    params_file.write_text(json.dumps({"eval_workers": 1, "gif_count": 0}))
    return [
        str(Path(sys.executable).parent / "mazerl"),
        "run",
        *("--params", str(params_file), "--data-root", str(root), "--base-model", str(model)),
        *("--eval-set", "maze256-small-v1", "--max-eval-mazes", "2"),
        *("--training", json.dumps(MINIATURE_TRAINING | {"steps": STEPS})),
        *extra,
    ]


def laptop_env(temp: Path) -> dict[str, str]:
    """Embedded Prefect and MLflow as on a laptop, and a TMPDIR of the test's own (its own embedded head)."""
    keep = {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"}
    env = {k: v for k, v in os.environ.items() if k in keep or not k.startswith(("PREFECT_", "MLFLOW_", "RAY_"))}
    return env | {"TMPDIR": str(temp), "PREFECT_LOGGING_LEVEL": "INFO"}


def in_a_terminal() -> None:
    """A terminal's foreground job: SIGINT as the shell leaves it (a CI runner may start us with it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:  # its own process group, as a terminal's foreground job has
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=PROJECT, start_new_session=True,
            preexec_fn=in_a_terminal,
        )  # fmt: skip


def run_to_end(command: list[str], env: dict[str, str], log: Path) -> tuple[int, str]:
    """The command run to its end; (exit code, its output)."""
    with open(log, "w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=PROJECT).returncode
    return code, log.read_text()


def run_dir(root: Path) -> Path | None:
    found = list(root.glob("runs/*/train_config.json"))
    return found[0].parent if found else None


def marker(root: Path) -> int:
    directory = run_dir(root)
    try:
        return (checkpoints.read_marker(directory / "checkpoints") or 0) if directory else 0
    except checkpoints.CheckpointError:
        return 0


def wait_until(process: subprocess.Popen, condition, log: Path, what: str, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.poll() is None, f"mazerl run ended before {what}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def head_processes(temp: Path) -> list[psutil.Process]:
    """The embedded Ray head started under ``temp`` (its ``ray start --block`` and everything in its group)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(str(temp) in part for part in process.info["cmdline"] or []):
                found.append(process)
    return found


def assert_finished_once(root: Path) -> None:
    """Every step's metrics once (file and MLflow), one run directory, one model version, nothing left open."""
    from mlflow.tracking import MlflowClient

    assert len(list(root.glob("runs/*/train_config.json"))) == 1, "one run directory"
    steps = [json.loads(line)["step"] for line in (run_dir(root) / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1)), steps
    mlflow = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    everything = mlflow.search_runs([e.experiment_id for e in mlflow.search_experiments()])
    (train_run,) = [r for r in everything if r.info.run_name == "train"]
    history = mlflow.get_metric_history(train_run.info.run_id, "train/reward_mean")
    assert sorted(m.step for m in history) == list(range(1, STEPS + 1)), "each step in MLflow once"
    assert registered_versions(root) == 1
    assert {r.info.run_name: r.info.status for r in everything if r.info.status != "FINISHED"} == {}
    flows, task_runs = prefect_db_states(root)
    assert list(flows.values()) == ["COMPLETED"], flows
    assert not [t for t in task_runs if t[1] in ("RUNNING", "PENDING")], task_runs


@pytest.fixture
def laptop(starter_model_dir, mlflow_root, tmp_path):
    """A laptop's `mazerl run` on the embedded head: a TMPDIR of its own (its own head, stopped and removed
    afterwards, with any trainer left), the command, and a log for each of the two runs."""
    temp = Path(tempfile.mkdtemp(prefix="mzr-", dir="/tmp"))
    root = mlflow_root
    yield SimpleNamespace(
        temp=temp,
        root=root,
        env=laptop_env(temp),
        command=mazerl_run(root, starter_model_dir, tmp_path / "params.json"),
        first_log=tmp_path / "first.log",
        second_log=tmp_path / "second.log",
    )
    for process in head_processes(temp) + training_processes(root):
        with contextlib.suppress(psutil.Error):
            process.kill()
    shutil.rmtree(temp, ignore_errors=True)


def test_ctrl_c_in_a_terminal_exits_130_within_seconds_and_the_same_command_finishes_the_run(laptop):
    temp, root, env, command = laptop.temp, laptop.root, laptop.env, laptop.command
    first_log, second_log = laptop.first_log, laptop.second_log
    # Given `mazerl run` on the embedded head, in a terminal, training (a checkpoint written, steps left),
    first = start(command, env, first_log)
    wait_until(first, lambda: marker(root) >= 2, first_log, "the second checkpoint")
    server = [c for c in psutil.Process(first.pid).children() if "uvicorn" in " ".join(c.cmdline())]
    # when the user presses Ctrl-C (SIGINT to the terminal's whole foreground process group),
    os.killpg(first.pid, signal.SIGINT)
    pressed = time.monotonic()
    code = first.wait(timeout=60)
    # it ends within seconds with exit 130 and the hint to run the same command again,
    text = first_log.read_text()
    assert code == 130, text[-4000:]
    assert time.monotonic() - pressed < 30, "within 30 s of the keypress"
    assert "interrupted (KeyboardInterrupt): run the same command again" in text, text[-4000:]
    assert "Traceback" not in text, text[-6000:]
    # having closed its records (its MLflow runs KILLED, none RUNNING) and stopped what it started:
    # its trainer, its Prefect server and the embedded head.
    time.sleep(2)
    assert not training_processes(root), "the training job was stopped"
    assert server and not [s for s in server if s.is_running() and s.status() != psutil.STATUS_ZOMBIE]
    assert not head_processes(temp), "the embedded head was stopped"
    interrupted_at = marker(root)
    assert 2 <= interrupted_at < STEPS
    # When the same command runs again, it resumes that run from its checkpoint and finishes it.
    code, text = run_to_end(command, env, second_log)
    assert code == 0, text[-4000:]
    name = run_dir(root).name.rsplit("-", 1)[0]
    assert f"resuming {name} from step {interrupted_at} of {STEPS}" in text, text[-4000:]
    assert f"resumed from step {interrupted_at}" in text
    assert_finished_once(root)


def test_the_machine_going_down_then_the_same_command_at_once_finishes_the_run(laptop):
    temp, root, env, command = laptop.temp, laptop.root, laptop.env, laptop.command
    first_log, second_log = laptop.first_log, laptop.second_log
    # Given `mazerl run` on the embedded head, training,
    first = start(command, env, first_log)
    wait_until(first, lambda: marker(root) >= 2, first_log, "the second checkpoint")
    old_address = json.loads((temp / "mazerl-ray-0" / "mazerl_head.json").read_text())["address"]
    # when the machine goes down: mazerl run, its trainer and the whole embedded head killed at once,
    victims = [psutil.Process(first.pid), *training_processes(root), *head_processes(temp)]
    for process in victims:
        with contextlib.suppress(psutil.Error):
            process.kill()
    first.wait(timeout=30)
    psutil.wait_procs(victims, timeout=30)
    killed_at = marker(root)
    # and the same command runs at once (a new head; its port may be another one), it resumes the run
    # from its checkpoint and finishes it, having stopped the Prefect server the killed run left.
    code, text = run_to_end(command, env, second_log)
    assert code == 0, text[-4000:]
    assert "stopped the temporary Prefect server" in text, text[-4000:]
    name = run_dir(root).name.rsplit("-", 1)[0]
    assert f"resuming {name} from step {killed_at} of {STEPS}" in text, text[-4000:]
    assert "local Ray head at http://127.0.0.1:" in text and old_address.startswith("http://127.0.0.1:")
    assert_finished_once(root)


@pytest.fixture
def small_disk(tmp_path):
    """A 160 MiB tmpfs of the test's own (the data root's file system, filled by the test)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:  # not a skip: CI runs as root, as this machine does
        pytest.fail(f"this test mounts a tmpfs (root): {mounted.stderr.decode()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave_mib: int) -> Path:
    """A ballast file that leaves ``leave_mib`` free on ``disk``."""
    ballast = disk / "ballast"
    left = shutil.disk_usage(disk).free - leave_mib * 2**20
    with open(ballast, "wb") as out:
        for _ in range(max(left, 0) // 2**20):
            out.write(bytes(2**20))
    return ballast


def test_a_full_disk_pauses_the_run_with_one_message_and_it_resumes_once_space_is_freed(
    starter_model_dir, local_ray_head, small_disk, tmp_path, _mlflow_template_db
):
    root = small_disk / "root"
    root.mkdir()
    shutil.copy(_mlflow_template_db, root / "mlflow.db")
    env = laptop_env(Path("/tmp")) | {"RAY_AUTH_TOKEN_PATH": str(local_ray_head.token_path)}
    command = mazerl_run(root, starter_model_dir, tmp_path / "params.json", "--ray-address", local_ray_head.address)
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    # Given a run training on a data root whose disk fills up (less left than a checkpoint and the records need),
    first = start(command, env, first_log)
    wait_until(first, lambda: marker(root) >= 2, first_log, "the second checkpoint")
    ballast = fill(small_disk, leave_mib=40)
    code = first.wait(timeout=600)
    text = first_log.read_text()
    # then the run ends (exit 1) with one error naming the path, the room needed and the fix, and no traceback,
    assert code == 1, text[-4000:]
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the training paused: the disk under" in errors[0], text[-4000:]
    assert str(root) in errors[0] and "MiB free" in errors[0] and "run the same command again" in errors[0]
    assert "Traceback" not in text, text[-6000:]
    # its MLflow runs are marked failed (none left RUNNING), the marker names an intact step,
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiments = [e.experiment_id for e in mlflow.search_experiments()]
    statuses = {r.info.run_name: r.info.status for r in mlflow.search_runs(experiments)}
    assert "RUNNING" not in statuses.values() and "FAILED" in statuses.values(), statuses
    paused_at = marker(root)
    assert 2 <= paused_at < STEPS
    # and once space is freed, the same command resumes the run and finishes it.
    ballast.unlink()
    code, text = run_to_end(command, env, second_log)
    assert code == 0, text[-4000:]
    name = run_dir(root).name.rsplit("-", 1)[0]
    assert f"resuming {name} from step {paused_at} of {STEPS}" in text, text[-4000:]
    assert_finished_once(root)
