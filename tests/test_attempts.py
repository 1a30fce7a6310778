"""A killed flow-run attempt's task run is closed (Crashed) by the retry that takes its stage over."""

from __future__ import annotations

from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run, task_run
from prefect.states import Completed, Running

from tasks.attempts import close_crashed_attempts


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
