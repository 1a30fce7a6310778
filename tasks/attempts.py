"""What a crashed attempt of a flow run leaves in Prefect's records, closed when a retry takes over.

A flow-run process killed outright (SIGKILL, a lost pod) cannot report the end of the task
it was running: that task run stays RUNNING in Prefect's API, an endless bar in the UI's
timeline, while the retry re-attaches to its Ray job or resumes from its checkpoint in a
new task run. The stages of one flow run run one after another, so when a stage starts, any
other task run of the same flow run still RUNNING belongs to an attempt that is gone: it is
marked Crashed, saying which task run took over.
"""

from __future__ import annotations

from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    TaskRunFilter,
    TaskRunFilterState,
    TaskRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.states import Crashed


def close_crashed_attempts(flow_run_id: UUID | str, current_task_run_id: UUID | str, stage: str) -> list[str]:
    """Mark every other RUNNING task run of ``flow_run_id`` Crashed; returns their names."""
    closed = []
    with get_client(sync_client=True) as client:
        running = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(str(flow_run_id))])),
            task_run_filter=TaskRunFilter(
                state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.RUNNING]))
            ),
        )
        for stale in running:
            if str(stale.id) == str(current_task_run_id):
                continue
            message = (
                f"its flow-run attempt ended without reporting (process killed); {stage} was taken over by task run "
                f"{current_task_run_id}, which re-attaches to its Ray job or resumes from the checkpoint"
            )
            client.set_task_run_state(stale.id, Crashed(message=message), force=True)
            closed.append(stale.name)
    return closed
