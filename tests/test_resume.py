"""``mazerl run`` again after a kill: the interrupted run is found, closed and resumed; one run per lock.

The end-to-end test runs the real command (``.venv/bin/mazerl run``) with embedded Prefect
(its temporary server under the data root) against the session's Ray head, kills it outright
(SIGKILL, as an OOM kill or a closed laptop lid does) during training, merge_lora, final_eval and
promote, one after the other, and runs the same command again each time. The others check the parts on their
own: the run lock, the orphaned Prefect server, finding and closing the interrupted run
(Prefect's temporary API server of the module, MLflow on SQLite), and what a stopped stage does
with its Ray job.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from cli import prefect_server
from cli.resume import RunInProgress, close_dead_attempt, find_interrupted_run, hold_run_lock, run_identity
from mazerl.params import PipelineParams
from mazerl.training import checkpoints
from mazerl.training.recipes import MINIATURE_TRAINING

PROJECT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------
# One mazerl run per run: the lock
# --------------------------------------------------------------------------------------

HOLD_LOCK = textwrap.dedent(
    """
    import sys, time
    from cli.resume import hold_run_lock
    from mazerl.params import PipelineParams
    lock = hold_run_lock(PipelineParams(data_root=sys.argv[1]))
    print("held", flush=True)
    time.sleep(120)
    """
)


def test_a_second_mazerl_run_of_the_same_run_is_refused_naming_the_first_and_free_once_it_is_killed(tmp_path):
    params = PipelineParams(data_root=str(tmp_path))
    # Given a mazerl run process holding the lock of these parameters on this data root,
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=PROJECT
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        # when a second one starts, it is refused, naming the first one's pid and what to do,
        with pytest.raises(
            RunInProgress, match=rf"pid {holder.pid} on .*kill {holder.pid}\) and run this command again"
        ):
            hold_run_lock(params)
        # while a run of other parameters on the same data root is not,
        hold_run_lock(params.model_copy(update={"gif_count": 1})).release()
    finally:
        holder.kill()  # SIGKILL: the kernel releases the lock
        holder.wait()
    # and once the first one is killed, the lock is free: nothing stale is left behind.
    hold_run_lock(params).release()


def test_the_run_identity_is_the_resolved_parameters(tmp_path, monkeypatch):
    monkeypatch.setenv("MAZERL_HOME", str(tmp_path))
    here = run_identity(PipelineParams())
    assert here == run_identity(PipelineParams(data_root=str(tmp_path))), "the same data root, named or not"
    assert here != run_identity(PipelineParams(training={"steps": 3})), "other parameters"
    monkeypatch.setenv("MAZERL_HOME", str(tmp_path / "other"))
    assert here != run_identity(PipelineParams()), "the same flags on another data root"


# --------------------------------------------------------------------------------------
# The temporary Prefect server a killed mazerl run left behind
# --------------------------------------------------------------------------------------


def fake_server(prefect_home: Path, owner: str) -> subprocess.Popen:
    """A process that looks like Prefect's temporary server (its command line names the app) and sleeps."""
    env = os.environ | {"PREFECT_HOME": str(prefect_home), prefect_server.OWNER_ENV: owner}
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", prefect_server.SERVER_APP], env=env, cwd=PROJECT
    )


def test_only_a_temporary_prefect_server_whose_mazerl_run_is_gone_is_stopped(tmp_path):
    home = tmp_path / "prefect"
    alive_owner = prefect_server.process_tag(os.getpid())
    dead_owner = "999999999-1.00"  # no such process
    orphan = fake_server(home, dead_owner)
    owned = fake_server(home, alive_owner)  # its mazerl run still runs
    elsewhere = fake_server(tmp_path / "other-prefect", dead_owner)  # another data root's
    try:
        time.sleep(0.5)
        lines: list[str] = []
        stopped = prefect_server.stop_orphaned_servers(str(home), log=lines.append)
        assert stopped == [orphan.pid] and orphan.wait(timeout=10) is not None
        assert f"temporary Prefect server (pid {orphan.pid})" in lines[0], lines
        assert owned.poll() is None and elsewhere.poll() is None, "servers of live runs and other roots are kept"
    finally:
        for process in (orphan, owned, elsewhere):
            process.kill()
            process.wait()


# --------------------------------------------------------------------------------------
# Finding the interrupted run, and closing what its dead attempt left open
# --------------------------------------------------------------------------------------


def test_the_latest_interrupted_run_of_the_same_parameters_is_found_and_its_dead_attempt_closed(
    prefect_api, mlflow_root
):
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Crashed, Running

    from flows.pipeline import pipeline
    from mazerl.tracking.lineage import set_run_status, stage_run_id, start_pipeline_run
    from tasks.training import train

    params = PipelineParams(data_root=str(mlflow_root), training={"steps": 6})
    other = params.model_copy(update={"training": {"steps": 7}})

    def flow_run(values: PipelineParams, state):
        with get_client(sync_client=True) as client:
            return client.create_flow_run(pipeline, parameters={"params": values.model_dump(mode="json")}, state=state)

    # Given an older crashed run, then a run killed outright (still Running, its train task run too, its MLflow
    # runs RUNNING), and a newer run of other parameters,
    flow_run(params, Crashed())
    killed = flow_run(params, Running())
    with get_client(sync_client=True) as client:
        task_run = client.create_task_run(train, killed.id, dynamic_key="train", state=Running())
    flow_run(other, Completed())
    runs = start_pipeline_run(params.resolved_tracking_uri(), params.experiment, "r", flow_run_id=str(killed.id))
    set_run_status(runs.tracking_uri, stage_run_id(runs.tracking_uri, runs.parent_run_id, "train"), "RUNNING")
    # when the same parameters run again, the killed run is the one found, with its run directory and progress,
    found = find_interrupted_run(pipeline, params)
    assert (found.flow_run_id, found.state) == (str(killed.id), "RUNNING"), found
    assert found.run_dir == mlflow_root / "runs" / f"{killed.name}-{str(killed.id)[:8]}"
    assert found.progress().startswith("(it stopped before its first training checkpoint")
    from test_checkpoints import write_fake

    checkpoints.save(found.run_dir / "checkpoints", 4, write_fake(4), keep=2)
    assert found.progress() == "from step 4"
    (found.run_dir / "checkpoints" / checkpoints.MARKER).write_text("")  # half-written by hand: said, not fatal
    assert (
        found.progress()
        == "from step 4 (the marker latest_ckpt_global_step.txt holds '', not a step number; the trainer falls back past it)"
    )
    # and closing its dead attempt marks its flow run and task run Crashed and its MLflow runs KILLED.
    closed = close_dead_attempt(found, params)
    assert [line.split(" ", 2)[:2] for line in closed] == [["flow", "run"], ["task", "runs"], ["MLflow", "runs"]]
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(killed.id).state.is_crashed()
        assert client.read_task_run(task_run.id).state.is_crashed()
    mlflow = MlflowClient(runs.tracking_uri)
    assert mlflow.get_run(runs.parent_run_id).info.status == "KILLED"
    # A run whose latest flow run completed is not resumed: its next `mazerl run` is a new run.
    flow_run(params, Completed())
    assert find_interrupted_run(pipeline, params) is None


def test_a_failed_run_stays_resumable_and_only_a_completed_or_cancelled_one_makes_the_next_command_new(
    prefect_api, mlflow_root
):
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Completed, Failed

    from flows.pipeline import pipeline

    params = PipelineParams(data_root=str(mlflow_root), training={"steps": 5})

    def latest(state) -> str | None:
        with get_client(sync_client=True) as client:
            client.create_flow_run(pipeline, parameters={"params": params.model_dump(mode="json")}, state=state)
        found = find_interrupted_run(pipeline, params)
        return found.state if found else None

    # A run that failed mid-way (a full disk, a lost cluster) is resumed by the same command,
    assert latest(Failed()) == "FAILED"
    # a completed one or one cancelled on purpose is not: the next command starts a new run.
    assert latest(Completed()) is None
    assert latest(Cancelled()) is None


def test_a_command_with_other_parameters_names_the_unfinished_runs_it_passes_by_and_how_to_resume_each(
    prefect_api, mlflow_root
):
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    from cli.resume import abandoned_runs, differences, hold_run_lock
    from flows.pipeline import pipeline
    from mazerl.params import PipelineParams as Params

    killed = PipelineParams(data_root=str(mlflow_root), preset="smoke", training={"steps": 200})
    alive = PipelineParams(data_root=str(mlflow_root), preset="smoke", training={"steps": 300})
    now = PipelineParams(data_root=str(mlflow_root), preset="smoke", training={"steps": 50})
    with get_client(sync_client=True) as client:
        for values in (killed, alive):
            client.create_flow_run(pipeline, parameters={"params": values.model_dump(mode="json")}, state=Running())
    # Given a run killed outright and a run still running (its mazerl run holds its lock), both of other
    # parameters than this command's on the same data root,
    lock = hold_run_lock(alive)
    try:
        passed_by = abandoned_runs(pipeline, now)
    finally:
        lock.release()
    # then only the killed one is named, with what differs,
    assert [run.params for run in passed_by] == [killed], passed_by
    assert differences(killed, now) == "training.steps 200 -> 50"
    # and the command it prints resumes exactly that run: its parameters file holds the same identity.
    words = shlex.split(passed_by[0].resume_command())
    assert words[0].endswith("mazerl") and words[1:3] == ["run", "--params"] and len(words) == 4, words
    params_file = Path(words[3])
    assert run_identity(Params.model_validate(json.loads(params_file.read_text()))) == run_identity(killed)


def test_an_edited_train_config_is_refused_on_resume_naming_the_file_the_settings_and_the_fix(tmp_path):
    from mazerl.training.config import TrainingConfigError
    from mazerl.training.run_config import check_unedited, record_config

    params = PipelineParams(data_root=str(tmp_path), preset="smoke")
    config = params.train_config("r-1", tmp_path / "model")
    check_unedited(config)  # nothing recorded yet: nothing to compare
    path = record_config(config)
    check_unedited(config.model_copy(update={"mlflow": config.mlflow.model_copy(update={"run_id": "x"})}))
    recorded = json.loads(path.read_text())
    path.write_text(json.dumps(recorded | {"learning_rate": 0.5}))
    with pytest.raises(TrainingConfigError, match=r"train_config.json was edited .*learning_rate differ.*--fresh"):
        check_unedited(config)
    path.write_text("{")
    with pytest.raises(TrainingConfigError, match="cannot be read as a training config"):
        check_unedited(config)


# --------------------------------------------------------------------------------------
# What a stage does with its Ray job when its flow process is stopped (ray_jobs_on_stop)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "deployment", "error", "keeps"),
    [
        ("auto", None, "TerminationSignal", False),  # the laptop: mazerl run again resumes from the checkpoint
        ("auto", "d-1", "TerminationSignal", True),  # a deployment: the retry re-attaches
        ("auto", "d-1", "KeyboardInterrupt", True),
        ("auto", "d-1", "RuntimeError", False),  # an error in the stage itself stops its job
        ("keep", None, "TerminationSignal", True),
        ("stop", "d-1", "TerminationSignal", False),
    ],
)
def test_a_stopped_flow_process_keeps_its_ray_job_only_where_a_retry_re_attaches(
    monkeypatch, policy, deployment, error, keeps
):
    from prefect.exceptions import TerminationSignal

    import tasks.jobs

    errors = {
        "TerminationSignal": TerminationSignal(signal.SIGTERM),
        "KeyboardInterrupt": KeyboardInterrupt(),
        "RuntimeError": RuntimeError("a bug"),
    }
    monkeypatch.setattr(tasks.jobs, "deployment", SimpleNamespace(id=deployment))
    reason = tasks.jobs.keep_job_when_stopped(policy)(errors[error])
    assert bool(reason) is keeps, reason
    if keeps:
        assert "re-attaches" in reason and policy in reason


def test_a_cancelled_flow_run_stops_its_ray_job_even_on_a_deployment(prefect_api, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import TerminationSignal
    from prefect.states import Cancelling

    import tasks.jobs
    from flows.pipeline import pipeline

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(pipeline, state=Cancelling())
    monkeypatch.setattr(tasks.jobs, "deployment", SimpleNamespace(id="d-1"))
    monkeypatch.setattr(tasks.jobs, "flow_run", SimpleNamespace(id=run.id))
    assert tasks.jobs.keep_job_when_stopped("auto")(TerminationSignal(signal.SIGTERM)) is None


# --------------------------------------------------------------------------------------
# End to end: mazerl run killed during training, merge_lora, final_eval and promote, run again each time
# --------------------------------------------------------------------------------------


def training_processes(root: Path) -> list:
    """The local trainer processes training under ``root``."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "mazerl.training.local_entry" in cmdline and str(root) in cmdline:
            found.append(process)
    return found


def registered_versions(root: Path) -> int:
    """How many model versions the data root's MLflow store holds (read while a run writes it).

    A run killed mid-commit leaves a hot journal that only a writer may roll back; until the next run's
    first write does, a read-only reader is refused, and that reads as none registered yet."""
    try:
        with sqlite3.connect(f"file:{root / 'mlflow.db'}?mode=ro", uri=True, timeout=30) as db:
            return db.execute("select count(*) from model_versions").fetchone()[0]
    except sqlite3.OperationalError as error:
        if error.sqlite_errorname == "SQLITE_READONLY_ROLLBACK":
            return 0
        raise


def prefect_db_states(root: Path) -> tuple[dict, list]:
    """(flow run states by id, [(task run name, state, flow-run attempt)]) from the embedded Prefect database."""
    with sqlite3.connect(root / "prefect" / "prefect.db") as db:
        flows = dict(db.execute("select id, state_type from flow_run").fetchall())
        tasks = db.execute("select name, state_type, flow_run_run_count from task_run").fetchall()
    return flows, tasks


@pytest.mark.slow  # five mazerl runs (each starts Prefect's temporary server)
def test_mazerl_run_killed_in_each_late_stage_resumes_each_time_and_finishes_once(
    local_ray_head, starter_model_dir, mlflow_root, tmp_path
):
    """`mazerl run` killed in training, merge_lora, final_eval and promote resumes each time and
    finishes once."""
    import psutil
    from mlflow.tracking import MlflowClient

    root = mlflow_root
    params_file = tmp_path / "params.json"
    params_file.write_text(json.dumps({"eval_workers": 1, "gif_count": 0}))
    training = MINIATURE_TRAINING | {"steps": 4}
    command = [
        str(Path(sys.executable).parent / "mazerl"),
        "run",
        *("--params", str(params_file), "--data-root", str(root), "--base-model", str(starter_model_dir)),
        *("--eval-set", "maze256-small-v1", "--max-eval-mazes", "2", "--ray-address", local_ray_head.address),
        *("--training", json.dumps(training)),
    ]
    # embedded Prefect and MLflow, as on a laptop (a slow machine may still give Prefect's server more time)
    keep = {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"}
    env = {k: v for k, v in os.environ.items() if k in keep or not k.startswith(("PREFECT_", "MLFLOW_"))}
    env |= {"RAY_AUTH_TOKEN_PATH": str(local_ray_head.token_path), "PREFECT_LOGGING_LEVEL": "INFO"}
    logs: list[Path] = []
    started: list[psutil.Process] = []  # the runs and the Prefect servers they start: none may outlive the test

    def start() -> subprocess.Popen:
        log = tmp_path / f"run-{len(logs) + 1}.log"
        logs.append(log)
        with open(log, "w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=PROJECT)
        started.append(psutil.Process(process.pid))
        return process

    def kill_when(process: subprocess.Popen, condition, what: str, and_trainer: bool = False) -> int | None:
        """SIGKILL ``process`` (only it: its Prefect server is orphaned) once ``condition`` holds, and with
        ``and_trainer`` the training job's process too (the machine went down with the run); returns the
        orphaned server's pid."""
        deadline = time.monotonic() + 1800
        while not condition():
            assert process.poll() is None, f"mazerl run ended before {what}:\n{logs[-1].read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)  # promote registers, then concludes within seconds
        servers = [c for c in psutil.Process(process.pid).children() if prefect_server.SERVER_APP in c.cmdline()]
        started.extend(servers)
        trainers = training_processes(root) if and_trainer else []
        process.kill()
        for trainer in trainers:
            trainer.kill()
        process.wait(timeout=30)
        return servers[0].pid if servers else None

    def run_dir() -> Path | None:
        found = list(root.glob("runs/*/train_config.json"))
        return found[0].parent if found else None

    def marker() -> int | None:
        return checkpoints.read_marker(run_dir() / "checkpoints") if run_dir() else None

    try:
        # Given `mazerl run` and its training job killed outright once the training wrote a checkpoint (steps left),
        first = start()
        orphans = [kill_when(first, lambda: (marker() or 0) >= 1, "the first checkpoint", and_trainer=True)]
        killed_at = marker()
        assert killed_at < 4 and orphans[0] is not None
        name = run_dir().name.rsplit("-", 1)[0]
        # when the same command runs again, it resumes that run from its checkpoint (saying so), and when that run
        # is killed in its turn during merge_lora, final_eval and promote (their jobs left as the kill leaves
        # them), every next run resumes it after its training and stops the Prefect server the last one left,
        later_kills = {
            "merge_lora": lambda: (run_dir() / "merge_request.json").is_file(),
            "final_eval": lambda: (run_dir() / "eval" / "final" / "request.json").is_file(),
            "promote": lambda: registered_versions(root) > 0,  # mid-promote: registered, not yet concluded
        }
        for stage, reached in later_kills.items():
            orphans.append(kill_when(start(), reached, stage))
            text = logs[-1].read_text()
            assert f"stopped the temporary Prefect server (pid {orphans[-2]})" in text, text[-4000:]
            if len(logs) == 2:
                assert f"resuming {name} from step {killed_at} of 4" in text, text[-4000:]
                assert f"resumed from step {killed_at}" in text, "the training job continued after the checkpoint"
            else:
                assert f"resuming {name} after its training (step 4 of 4)" in text, text[-4000:]
        # and the last one finishes the run.
        last = start()
        assert last.wait(timeout=1800) == 0, logs[-1].read_text()[-4000:]
        text = logs[-1].read_text()
        assert f"resuming {name} after its training (step 4 of 4)" in text, text[-4000:]
        assert f"stopped the temporary Prefect server (pid {orphans[-1]})" in text, text[-4000:]
        assert not [pid for pid in orphans if psutil.pid_exists(pid)], "no Prefect server is left behind"
    finally:
        for process in started:
            with contextlib.suppress(psutil.Error):
                process.kill()

    # Every step's metrics landed once, in metrics.jsonl and in MLflow, one run directory was used,
    assert len(list(root.glob("runs/*/train_config.json"))) == 1
    steps = [json.loads(line)["step"] for line in (run_dir() / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4], steps
    uri = f"sqlite:///{root / 'mlflow.db'}"
    mlflow = MlflowClient(uri)
    experiments = [e.experiment_id for e in mlflow.search_experiments()]
    everything = mlflow.search_runs(experiments)
    (train_run,) = [r for r in everything if r.info.run_name == "train"]
    history = mlflow.get_metric_history(train_run.info.run_id, "train/reward_mean")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]
    # one model version was registered, no MLflow run is left RUNNING,
    assert len(mlflow.search_model_versions("name = 'maze-vlm'")) == 1
    assert {r.info.run_name: r.info.status for r in everything if r.info.status != "FINISHED"} == {}
    # and in Prefect the one flow run completed, the killed attempts' task runs are Crashed (their train and
    # merge_lora), and nothing is left Running or Pending.
    flows, task_runs = prefect_db_states(root)
    assert list(flows.values()) == ["COMPLETED"], flows
    assert not [t for t in task_runs if t[1] in ("RUNNING", "PENDING")], task_runs
    crashed = {name.rsplit("-", 1)[0] for name, state, _ in task_runs if state == "CRASHED"}
    assert {"train", "merge_lora", "final_eval", "promote"} <= crashed, task_runs
    assert not [t for t in task_runs if t[1] == "CRASHED" and t[2] == 5], "the last attempt crashed nothing of its own"
