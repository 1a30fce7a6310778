"""``mazerl run`` again: the interrupted run with the same parameters resumes from its last checkpoint.

A ``mazerl run`` killed outright (SIGKILL, an OOM kill, a closed laptop lid or terminal) leaves
its flow run Running, one stopped (Ctrl-C, SIGTERM) leaves it Crashed; either way its MLflow runs
may still say RUNNING and its checkpoints are on disk. Running the same command again finds it
(:func:`find_interrupted_run`): the most recent flow run of the pipeline with exactly these
parameters (the data root included) that ran without a deployment, if it is Crashed, or
Running/Pending with no ``mazerl run`` alive to run it. Then (:func:`close_dead_attempt`) its flow
run is marked Crashed and its task runs and MLflow runs still open are closed (Crashed,
KILLED), so the record says what happened, and

- by default the same flow run runs again (:func:`resume`), as ``prefect flow-run retry`` runs
  it: finished stages come from Prefect's result cache, the train stage re-attaches to its Ray
  job if that still runs or resumes from the latest checkpoint, and the MLflow runs and run
  directory are the same ones, so every step's metrics land once and one model is registered;
- with ``--fresh`` a new run starts; the interrupted one stays Crashed and its Ray jobs still
  running are stopped (a new run of the same training would otherwise re-attach to them).

One ``mazerl run`` per set of parameters and data root at a time: each holds a lock for as long
as it runs (:func:`hold_run_lock`, ``<data root>/locks/run-<digest>.lock``); that is also how a
Running flow run is known to be dead. A second one is refused, naming the first one's pid.
Deployments do not go through here: their runs are retried with ``prefect flow-run retry``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mazerl import paths
from mazerl.params import PipelineParams
from mazerl.process_lock import LockHeld, ProcessLock
from mazerl.training import checkpoints
from mazerl.training.config import load_config

INTERRUPTED = ("CRASHED", "RUNNING", "PENDING")  # Prefect state types of a run killed or stopped
RECENT_RUNS = 200  # flow runs looked at, newest first


class RunInProgress(ValueError):
    """Another ``mazerl run`` with the same parameters runs on this data root."""


def run_identity(params: PipelineParams) -> str:
    """A digest of the parameters as they resolve (the data root made absolute): what "the same run" means."""
    values = params.model_dump(mode="json") | {"data_root": str(params.root())}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def hold_run_lock(params: PipelineParams) -> ProcessLock:
    """This process's lock on the run these parameters describe (held until it exits); RunInProgress if taken."""
    path = params.root() / "locks" / f"run-{run_identity(params)[:16]}.lock"
    lock = ProcessLock(path, "mazerl run")
    try:
        lock.acquire()
    except LockHeld as held:
        who = held.holder.describe() if held.holder is not None else "another process"
        stop = f" (kill {held.holder.pid})" if held.holder is not None else ""
        raise RunInProgress(
            f"another mazerl run with these parameters is running on {params.root()}: {who}; wait for it to "
            f"finish, or stop it{stop} and run this command again to resume it"
        ) from None
    return lock


@dataclass(frozen=True)
class InterruptedRun:
    """A flow run of these parameters that ended without finishing, and where its files are."""

    flow_run_id: str
    name: str
    state: str  # its Prefect state type when found: CRASHED, RUNNING or PENDING
    run_dir: Path

    def progress(self) -> str:
        """How far it got, in the words ``mazerl run`` prints after "resuming <name>"."""
        step = checkpoints.read_marker(self.run_dir / "checkpoints")
        if not step:
            return "(it stopped before its first training checkpoint; its finished stages are reused)"
        try:
            steps = load_config(self.run_dir / "train_config.json").steps
        except (OSError, ValueError):
            steps = None
        if steps is not None and step >= steps:
            return f"after its training (step {step} of {steps})"
        return f"from step {step}" + (f" of {steps}" if steps else "")


def find_interrupted_run(flow: Any, params: PipelineParams) -> InterruptedRun | None:
    """The most recent run of ``flow`` with these parameters, if it was interrupted (else None)."""
    from prefect.client.orchestration import get_client  # Prefect: seconds to import, only on this path
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterDeploymentId
    from prefect.client.schemas.sorting import FlowRunSort

    identity = run_identity(params)
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow.name])),
            flow_run_filter=FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(is_null_=True)),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC,
            limit=RECENT_RUNS,
        )
    for run in runs:
        try:
            theirs = PipelineParams.model_validate((run.parameters or {}).get("params") or {})
        except ValueError:  # parameters of another version of the pipeline
            continue
        if run_identity(theirs) != identity:
            continue
        if run.state is None or run.state.type.value not in INTERRUPTED:
            return None  # the latest run of these parameters finished (or failed, or was cancelled)
        return InterruptedRun(
            flow_run_id=str(run.id),
            name=run.name,
            state=run.state.type.value,
            run_dir=paths.run_dir(params.root(), paths.run_id_for(run.name, str(run.id))),
        )
    return None


def close_dead_attempt(run: InterruptedRun, params: PipelineParams) -> list[str]:
    """Mark the interrupted run's flow run Crashed, its unfinished task runs Crashed and its MLflow
    runs still RUNNING KILLED; returns what it closed, in words."""
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

    from mazerl.tracking.lineage import end_pipeline_run  # MLflow: seconds to import

    message = "its mazerl run process ended without reporting (killed); the next mazerl run found it"
    closed = []
    with get_client(sync_client=True) as client:
        if run.state != "CRASHED":
            client.set_flow_run_state(run.flow_run_id, Crashed(message=message), force=True)
            closed.append(f"flow run {run.name} Crashed")
        unfinished = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.flow_run_id])),
            task_run_filter=TaskRunFilter(
                state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING]))
            ),
        )
        for task_run in unfinished:
            client.set_task_run_state(task_run.id, Crashed(message=message), force=True)
        if unfinished:
            closed.append(f"task runs {', '.join(t.name for t in unfinished)} Crashed")
    ended = end_pipeline_run(params.resolved_tracking_uri(), params.experiment, run.flow_run_id, "KILLED")
    if ended:
        closed.append(f"MLflow runs {', '.join(ended)} KILLED")
    return closed


def resume(flow: Any, run: InterruptedRun, params: PipelineParams) -> Any:
    """Run the interrupted flow run again (its next attempt), as ``prefect flow-run retry`` does; its final State."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow
    from prefect.states import Scheduled

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.flow_run_id, Scheduled(message="resumed by mazerl run"), force=True)
        flow_run = client.read_flow_run(run.flow_run_id)
    return run_flow(flow, flow_run=flow_run, parameters={"params": params}, return_type="state")
