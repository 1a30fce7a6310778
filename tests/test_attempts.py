"""What a killed flow-run attempt leaves open is closed by the attempt that takes over, and only that.

Real Prefect (the module's temporary API server) and MLflow (SQLite): the killed attempt is made
by hand through Prefect's API, as a SIGKILLed process leaves it (its task run RUNNING, its flow
run Crashed), and the next attempt is a real run of the same flow run (``run_flow``, as
``prefect flow-run retry`` and ``mazerl run`` again run it).
"""

from __future__ import annotations

import time

from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.flow_engine import run_flow
from prefect.runtime import flow_run
from prefect.states import Crashed, Running, Scheduled

from mazerl.params import PipelineParams
from mazerl.tracking.lineage import set_run_status, stage_run_id, start_pipeline_run
from tasks.attempts import close_killed_attempts, end_mlflow_runs


@task(name="evaluate_inner")
def inner() -> str:
    return "evaluated"


@task(name="stage_outer")
def outer() -> str:
    """A stage that calls a task of its own (as baseline_eval calls evaluate_baseline): RUNNING meanwhile."""
    return inner()


@flow(name="attempts-test", on_running=[close_killed_attempts])
def two_stages() -> str:
    return outer()


def state_history(client, task_run_id) -> list[str]:
    return [state.type.value for state in client.read_task_run_states(task_run_id)]


def settled_task_runs(client, flow_run_id, count: int, timeout_s: float = 60.0) -> list:
    """The flow run's ``count`` task runs once all are final (Prefect records task states from events, a
    moment after the task reported them)."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = [t for t in client.read_task_runs() if t.flow_run_id == flow_run_id]
        if len(runs) >= count and all(t.state is not None and t.state.is_final() for t in runs):
            return runs
        assert time.monotonic() < deadline, [(t.name, t.state_type) for t in runs]
        time.sleep(0.5)


def test_the_next_attempt_crashes_the_killed_attempts_task_run_and_never_one_of_its_own(prefect_api):
    with get_client(sync_client=True) as client:
        # Given a flow run whose first attempt was killed in a stage (its task run left RUNNING), and which
        # Prefect or `mazerl run` marked Crashed afterwards,
        run = client.create_flow_run(two_stages, state=Running())
        killed = client.create_task_run(outer, run.id, dynamic_key="killed", state=Running())
        client.set_flow_run_state(run.id, Crashed(message="process killed"), force=True)
        # when the flow run runs again (its second attempt), with a stage that runs a task inside it,
        client.set_flow_run_state(run.id, Scheduled(), force=True)
        state = run_flow(two_stages, flow_run=client.read_flow_run(run.id), return_type="state")
        assert state.is_completed(), state
        stale = client.read_task_run(killed.id).state
        own = [t for t in settled_task_runs(client, run.id, 3) if t.id != killed.id]
        histories = {t.name: state_history(client, t.id) for t in own}
    # then the killed attempt's task run is Crashed, saying which attempt took over,
    assert stale.is_crashed() and "attempt 2 took over" in stale.message, (stale.type, stale.message)
    # and none of the second attempt's task runs, the enclosing stage included, was ever marked Crashed.
    assert len(own) == 2 and all(h[-1] == "COMPLETED" and "CRASHED" not in h for h in histories.values()), histories


def test_a_first_attempt_marks_nothing_crashed(prefect_api):
    # Given a fresh flow run whose stage runs a task inside it, when it runs,
    state = two_stages(return_state=True)
    with get_client(sync_client=True) as client:
        own = settled_task_runs(client, state.state_details.flow_run_id, 2)
        histories = {t.name: state_history(client, t.id) for t in own}
    # then no task run of it went through Crashed (the enclosing stage is alive, not a killed attempt's).
    assert len(own) == 2 and all("CRASHED" not in h for h in histories.values()), histories


def test_a_crash_hook_that_runs_after_a_retry_took_the_flow_run_over_leaves_its_mlflow_runs_alone(
    prefect_api, mlflow_root
):
    params = PipelineParams(data_root=str(mlflow_root), training={"steps": 2})
    uri = params.resolved_tracking_uri()
    with get_client(sync_client=True) as client:
        # Given a flow run whose killed attempt was reported Crashed, whose crash hook has not run yet,
        run = client.create_flow_run(two_stages, parameters={"params": params.model_dump(mode="json")})
        crash = client.set_flow_run_state(run.id, Crashed(message="process killed"), force=True).state
        # and a retry already running, which has re-opened the run's MLflow parent and a stage run,
        client.set_flow_run_state(run.id, Scheduled(), force=True)
        client.set_flow_run_state(run.id, Running(), force=True)
        runs = start_pipeline_run(uri, params.experiment, "r", flow_run_id=str(run.id))
        stage = stage_run_id(uri, runs.parent_run_id, "train")
        set_run_status(uri, stage, "RUNNING")
        # when the killed attempt's crash hook runs at last (on a deployment the worker runs it),
        end_mlflow_runs(two_stages, client.read_flow_run(run.id), crash)
    # then the retry's MLflow runs are left RUNNING: the hook belongs to the attempt that crashed.
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(uri)
    assert mlflow.get_run(runs.parent_run_id).info.status == "RUNNING"
    assert mlflow.get_run(stage).info.status == "RUNNING"
    # and the same hook run while the crash is still the flow run's state ends them (KILLED).
    with get_client(sync_client=True) as client:
        crash = client.set_flow_run_state(run.id, Crashed(message="the retry crashed too"), force=True).state
        end_mlflow_runs(two_stages, client.read_flow_run(run.id), crash)
    assert mlflow.get_run(runs.parent_run_id).info.status == "KILLED"
    assert mlflow.get_run(stage).info.status == "KILLED"


OPEN_RUNS: list[str] = []


@flow(name="fails-between-stages", on_failure=[end_mlflow_runs])
def fails_between_stages(params: PipelineParams) -> None:
    """Opens the parent and a stage run (the stage was running when the flow failed), then fails outside it."""
    runs = start_pipeline_run(params.resolved_tracking_uri(), params.experiment, "r", flow_run_id=str(flow_run.id))
    set_run_status(runs.tracking_uri, stage_run_id(runs.tracking_uri, runs.parent_run_id, "train"), "RUNNING")
    OPEN_RUNS.append(runs.parent_run_id)
    raise RuntimeError("a failure between stages")


def test_a_flow_run_failing_outside_any_stage_does_not_leave_its_mlflow_runs_running(prefect_api, mlflow_root):
    from mlflow.tracking import MlflowClient

    from flows.pipeline import pipeline

    params = PipelineParams(data_root=str(mlflow_root), training={"steps": 2})
    # Given a run whose parent and a stage run are open, when the flow fails in its own code, not in a stage,
    state = fails_between_stages(params, return_state=True)
    assert state.is_failed()
    # then the failure hook has ended the parent and the stage run.
    client = MlflowClient(params.resolved_tracking_uri())
    parent = client.get_run(OPEN_RUNS[-1])
    assert parent.info.status == "FAILED" and parent.info.end_time is not None
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{OPEN_RUNS[-1]}'")
    assert [run.info.status for run in children] == ["FAILED"]
    # and the pipeline flow carries the same hook for failures and crashes, and closes killed attempts.
    assert end_mlflow_runs in pipeline.on_failure_hooks and end_mlflow_runs in pipeline.on_crashed_hooks
    assert close_killed_attempts in pipeline.on_running_hooks


def test_the_crash_hook_judges_the_embedded_store_as_the_run_did_and_ends_its_runs(mlflow_root, monkeypatch):
    from types import SimpleNamespace
    from uuid import uuid4

    from mlflow.tracking import MlflowClient

    import tasks.attempts

    # Given an embedded run (no tracking_uri) that crashed with its parent run open (no retry since),
    params = PipelineParams(data_root=str(mlflow_root), training={"steps": 2})
    crashed = SimpleNamespace(id=uuid4(), parameters={"params": params.model_dump(mode="json")})
    runs = start_pipeline_run(params.resolved_tracking_uri(), params.experiment, "r", flow_run_id=str(crashed.id))
    monkeypatch.setattr(tasks.attempts, "is_current_state", lambda flow_run_id, state: True)
    checked = []
    real_check = tasks.attempts.check_tracking_uri
    monkeypatch.setattr(
        tasks.attempts, "check_tracking_uri", lambda *a, **kw: checked.append((a, kw)) or real_check(*a, **kw)
    )
    # when its crash hook runs,
    end_mlflow_runs(None, crashed, Crashed(message="killed"))
    # then the store is checked as the run's setup checks it (embedded: the data root is the run's own),
    assert checked == [((params.resolved_tracking_uri(), params.experiment), {"embedded": True})], checked
    # and the run is ended KILLED.
    assert MlflowClient(params.resolved_tracking_uri()).get_run(runs.parent_run_id).info.status == "KILLED"
