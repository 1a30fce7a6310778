"""What an ended flow-run attempt leaves open, closed: Prefect task runs and MLflow runs still RUNNING.

**Task runs.** A flow-run process killed outright (SIGKILL, an OOM kill, a lost pod) cannot
report the end of the task it was running: that task run stays RUNNING in Prefect's API, an
endless bar in the UI's timeline, while the next attempt of the flow run (``prefect flow-run
retry``, or ``mazerl run`` again) re-attaches to its Ray job or resumes from its checkpoint in
new task runs. Prefect records in every task run which attempt of its flow run created it
(``flow_run_run_count``). So when an attempt starts, the flow's ``on_running`` hook
:func:`close_killed_attempts` marks Crashed every task run of an *earlier* attempt still
RUNNING or PENDING. Task runs of the current attempt are never touched: a stage that calls a
task of its own (``baseline_eval`` -> ``evaluate_baseline``) has its enclosing task run
RUNNING, and that one is alive.

**MLflow runs.** A stage ends its own MLflow run, and the parent's on failure; a flow run that
fails or crashes outside any stage (between stages, in a task that records results) would
leave the parent RUNNING. The flow's ``on_failure``/``on_crashed`` hook
:func:`end_mlflow_runs` ends it (FAILED, or KILLED for a crash) with any stage run still open.
A crash hook touches only the attempt it belongs to: on a deployment, the worker runs it after
the process died, and a retry issued meanwhile already owns the flow run (and has re-opened the
same MLflow runs); the hook then finds the flow run in another state than the crash it was
called for and leaves everything alone.
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
from prefect.logging.loggers import flow_run_logger
from prefect.states import Crashed

from mazerl.params import PipelineParams
from mazerl.preflight.input_error import InputError
from mazerl.preflight.tracking_store import check_tracking_uri
from mazerl.tracking.lineage import end_pipeline_run

UNFINISHED = (StateType.RUNNING, StateType.PENDING)


def close_earlier_attempts(flow_run_id: UUID | str, attempt: int) -> list[str]:
    """Mark Crashed the task runs of ``flow_run_id`` that attempts before ``attempt`` left unfinished;
    returns their names. ``attempt`` is the flow run's run count (1 on its first attempt)."""
    closed = []
    with get_client(sync_client=True) as client:
        unfinished = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(str(flow_run_id))])),
            task_run_filter=TaskRunFilter(state=TaskRunFilterState(type=TaskRunFilterStateType(any_=list(UNFINISHED)))),
        )
        for stale in unfinished:
            if stale.flow_run_run_count >= attempt:  # this attempt's own (a stage, or a task inside one)
                continue
            message = (
                f"attempt {stale.flow_run_run_count or 1} of its flow run ended without reporting (its process was "
                f"killed); attempt {attempt} took over, re-attaching to its Ray job or resuming from the checkpoint"
            )
            client.set_task_run_state(stale.id, Crashed(message=message), force=True)
            closed.append(stale.name)
    return closed


def close_killed_attempts(flow: Any, flow_run: Any, state: Any) -> None:
    """Prefect flow hook (``on_running``): close what earlier attempts of this flow run left RUNNING."""
    with get_client(sync_client=True) as client:
        attempt = client.read_flow_run(flow_run.id).run_count  # the hook's copy predates this attempt's count
    if attempt <= 1:
        return
    closed = close_earlier_attempts(flow_run.id, attempt)
    if closed:
        flow_run_logger(flow_run, flow).info(
            f"attempt {attempt}: marked {', '.join(closed)} of a killed attempt Crashed (it could not say so itself)"
        )


def is_current_state(flow_run_id: UUID | str, state: Any) -> bool:
    """Whether ``state`` is still the flow run's state (no retry has taken the flow run over since)."""
    with get_client(sync_client=True) as client:
        current = client.read_flow_run(UUID(str(flow_run_id))).state
    if current is None or state is None:
        return current is state
    if getattr(state, "id", None) is not None and getattr(current, "id", None) is not None:
        return current.id == state.id
    return current.type == state.type and current.timestamp == state.timestamp


def end_mlflow_runs(flow: Any, flow_run: Any, state: Any) -> None:
    """Prefect flow hook (``on_failure``, ``on_crashed``): end the run's MLflow runs left RUNNING."""
    log = logging.getLogger("mazerl.attempts")
    try:  # parameters that did not validate never opened an MLflow run
        params = PipelineParams.model_validate((flow_run.parameters or {}).get("params") or {})
    except ValueError:
        return
    try:
        if not is_current_state(flow_run.id, state):  # a retry owns the flow run (and its MLflow runs) now
            log.info("flow run %s has moved on from %s (a retry?): its MLflow runs are left to it", flow_run.id, state)
            return
    except Exception as exc:  # noqa: BLE001 - the API is gone: the attempt is the only one there can be
        log.debug("could not read the state of flow run %s: %s", flow_run.id, exc)
    status = "KILLED" if state.is_crashed() else "FAILED"
    uri = params.resolved_tracking_uri()
    try:  # judged as the run judged it (the embedded store's directory is the run's own data root)
        check_tracking_uri(uri, params.experiment, embedded=params.tracking_uri is None)  # seconds, not minutes
        ended = end_pipeline_run(uri, params.experiment, str(flow_run.id), status)
    except InputError:  # the store does not answer: nothing can be ended there (the run's error says why)
        return
    except Exception as exc:  # noqa: BLE001 - a hook must not hide the flow run's own failure
        log.warning("could not end the MLflow runs of flow run %s: %s", flow_run.id, exc)
        return
    if ended:
        log.warning("flow run %s ended %s: marked its MLflow runs %s %s", flow_run.id, state.type.value, ended, status)
