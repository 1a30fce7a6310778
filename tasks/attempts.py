"""What an ended flow-run attempt leaves open, closed: Prefect task runs and MLflow runs still RUNNING.

**Task runs.** A flow-run process killed outright (SIGKILL, a lost pod) cannot report the end of the task
it was running: that task run stays RUNNING in Prefect's API, an endless bar in the UI's
timeline, while the retry re-attaches to its Ray job or resumes from its checkpoint in a
new task run. The stages of one flow run run one after another, so when a stage starts, any
other task run of the same flow run still RUNNING belongs to an attempt that is gone: it is
marked Crashed, saying which task run took over (:func:`close_crashed_attempts`).

**MLflow runs.** A stage ends its own MLflow run, and the parent's on failure; a flow run that
fails or crashes outside any stage (between stages, in a task that records results) would
leave the parent RUNNING. The flow's ``on_failure``/``on_crashed`` hook
:func:`end_mlflow_runs` ends it (FAILED, or KILLED for a crash) with any stage run still open.
"""

from __future__ import annotations

import logging
from typing import Any
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

from mazerl.params import PipelineParams
from mazerl.preflight import InputError, check_tracking_uri
from mazerl.tracking.lineage import end_pipeline_run


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


def end_mlflow_runs(flow: Any, flow_run: Any, state: Any) -> None:
    """Prefect flow hook (``on_failure``, ``on_crashed``): end the run's MLflow runs left RUNNING."""
    log = logging.getLogger("mazerl.attempts")
    try:  # parameters that did not validate never opened an MLflow run
        params = PipelineParams.model_validate((flow_run.parameters or {}).get("params") or {})
    except ValueError:
        return
    status = "KILLED" if state.is_crashed() else "FAILED"
    try:
        check_tracking_uri(params.resolved_tracking_uri())  # seconds, not MLflow's minutes of retries
        ended = end_pipeline_run(params.resolved_tracking_uri(), params.experiment, str(flow_run.id), status)
    except InputError:  # the store does not answer: nothing can be ended there (the run's error says why)
        return
    except Exception as exc:  # noqa: BLE001 - a hook must not hide the flow run's own failure
        log.warning("could not end the MLflow runs of flow run %s: %s", flow_run.id, exc)
        return
    if ended:
        log.warning("flow run %s ended %s: marked its MLflow runs %s %s", flow_run.id, state.type.value, ended, status)
