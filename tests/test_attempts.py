"""A killed flow-run attempt's task run is closed (Crashed) by the retry that takes its stage over."""

from __future__ import annotations

from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run, task_run
from prefect.states import Completed, Running

from mazerl.params import PipelineParams
from mazerl.tracking.lineage import set_run_status, stage_run_id, start_pipeline_run
from tasks.attempts import close_crashed_attempts, end_mlflow_runs


@task(name="train")
def killed_train() -> None:
    """Stands for the train task of the attempt that was killed (never called: its run is made by hand)."""


@task(name="train")
def retried_train() -> list[str]:
    return close_crashed_attempts(flow_run.id, task_run.id, "train")


@flow(name="attempts-test")
def retried_flow_run() -> dict:
    with get_client(sync_client=True) as client:
        # Given what a SIGKILLed attempt leaves: its train task run RUNNING, and a stage it had finished,
        killed = client.create_task_run(killed_train, flow_run.id, dynamic_key="killed", state=Running())
        finished = client.create_task_run(killed_train, flow_run.id, dynamic_key="done", state=Completed())
    # when the retry's train stage starts,
    closed = retried_train()
    return {"killed": killed.id, "killed_name": killed.name, "finished": finished.id, "closed": closed}


def test_the_retry_marks_the_killed_attempts_running_task_run_crashed_and_nothing_else(prefect_api):
    outcome = retried_flow_run()
    with get_client(sync_client=True) as client:
        killed = client.read_task_run(outcome["killed"]).state
        finished = client.read_task_run(outcome["finished"]).state
        own = [
            run
            for run in client.read_task_runs()
            if run.flow_run_id == killed_flow_run_id(client, outcome["killed"]) and run.id != outcome["killed"]
        ]
    # then the killed attempt's task run is Crashed, saying which task run took over,
    assert outcome["closed"] == [outcome["killed_name"]]
    assert killed.is_crashed() and "taken over by task run" in killed.message, (killed.type, killed.message)
    # the finished stage keeps its state, and the retry's own task run completes.
    assert finished.is_completed()
    assert all(run.state.is_completed() for run in own), [(run.name, run.state.type) for run in own]


def killed_flow_run_id(client, task_run_id):
    return client.read_task_run(task_run_id).flow_run_id


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
    # and the pipeline flow carries the same hook for failures and crashes.
    assert end_mlflow_runs in pipeline.on_failure_hooks and end_mlflow_runs in pipeline.on_crashed_hooks
