"""``mazerl run`` again: the unfinished run with the same parameters resumes from its last checkpoint.

A ``mazerl run`` killed outright (SIGKILL, an OOM kill, a closed laptop lid or terminal, the
machine going down) leaves its flow run Running, one stopped (Ctrl-C, SIGTERM) leaves it
Crashed, one that failed mid-way (a full disk, a lost cluster) leaves it Failed; its MLflow runs
may still say RUNNING and its checkpoints are on disk. Running the same command again finds it
(:func:`find_interrupted_run`): the most recent flow run of the pipeline with exactly these
parameters (the data root included) that ran without a deployment, if it is Crashed, Failed, or
Running/Pending with no ``mazerl run`` alive to run it. Then (:func:`close_dead_attempt`) a
Running flow run is marked Crashed, and its task runs and MLflow runs still open are closed
(Crashed, KILLED), so the record says what happened, and

- by default the same flow run runs again (:func:`resume`), as ``prefect flow-run retry`` runs
  it: finished stages come from Prefect's result cache, the train stage re-attaches to its Ray
  job if that still runs or resumes from the newest intact checkpoint, and the MLflow runs and
  run directory are the same ones, so every step's metrics land once and one model is registered;
- with ``--fresh`` a new run starts; the interrupted one is left as it ended and its Ray jobs
  still running are stopped (a new run of the same training would otherwise re-attach to them).

Only a completed run (or one cancelled on purpose) makes the next command a new run. A command
with *other* parameters starts a new run, but first names the unfinished runs it passes by whose
``mazerl run`` is gone (:func:`abandoned_runs`), closes what they left open, and prints the
command that resumes each (:meth:`InterruptedRun.resume_command`).

One ``mazerl run`` per set of parameters and data root at a time: each holds a lock for as long
as it runs (:func:`hold_run_lock`, ``<data root>/locks/run-<digest>.lock``); that is also how a
Running flow run is known to be dead. A second one is refused, naming the first one's pid.
Deployments do not go through here: their runs are retried with ``prefect flow-run retry``.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mazerl import atomic, paths
from mazerl.params import PipelineParams
from mazerl.process_lock import LockHeld, ProcessLock
from mazerl.starter.build import starter_dir
from mazerl.training import checkpoints
from mazerl.training.config import load_config
from mazerl.training.run_config import check_unedited

# Prefect state types of a run that did not finish: killed or stopped (Crashed; Running or Pending
# with its process gone), or failed mid-way (a full disk, a lost cluster). Only a Completed run, or
# one a user cancelled, makes the next `mazerl run` of the same parameters a new run.
RESUMABLE = ("CRASHED", "RUNNING", "PENDING", "FAILED")
PARAMS_FILE = "pipeline_params.json"  # an unfinished run's parameters, for the command that resumes it
RECENT_RUNS = 200  # flow runs looked at, newest first


class RunInProgress(ValueError):
    """Another ``mazerl run`` with the same parameters runs on this data root."""


def run_identity(params: PipelineParams) -> str:
    """A digest of the parameters as they resolve (the data root made absolute): what "the same run" means."""
    values = params.model_dump(mode="json") | {"data_root": str(params.root())}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def run_lock_path(params: PipelineParams) -> Path:
    """The lock file the ``mazerl run`` of these parameters holds while it runs."""
    return params.root() / "locks" / f"run-{run_identity(params)[:16]}.lock"


def hold_run_lock(params: PipelineParams) -> ProcessLock:
    """This process's lock on the run these parameters describe (held until it exits); RunInProgress if taken."""
    lock = ProcessLock(run_lock_path(params), "mazerl run")
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
    """A flow run that ended without finishing, its parameters, and where its files are."""

    flow_run_id: str
    name: str
    state: str  # its Prefect state type when found: one of RESUMABLE
    run_dir: Path
    params: PipelineParams

    def progress(self) -> str:
        """How far it got, in the words ``mazerl run`` prints after "resuming <name>"."""
        extra = checkpoints.LOCAL_POLICY_FILES if self.params.backend == "local" else ()
        try:
            point = checkpoints.find_resume_point(self.run_dir / "checkpoints", extra)
        except checkpoints.CheckpointError as exc:
            return f"(its training cannot resume: {exc})"
        damaged = "".join(f" ({note}; the trainer falls back past it)" for note in point.notes)
        if point.checkpoint is None:
            return "(it stopped before its first training checkpoint; its finished stages are reused)" + damaged
        step = point.checkpoint.step
        try:
            steps = load_config(self.run_dir / "train_config.json").steps
        except (OSError, ValueError):
            steps = None
        if steps is not None and step >= steps:
            return f"after its training (step {step} of {steps})" + damaged
        return f"from step {step}" + (f" of {steps}" if steps else "") + damaged

    def resume_command(self) -> str:
        """The command that resumes this run, pasteable: its parameters written beside its files."""
        path = self.run_dir / PARAMS_FILE
        atomic.write_json(path, self.params.model_dump(mode="json") | {"data_root": str(self.params.root())})
        return shlex.join([paths.venv_command("mazerl"), "run", "--params", str(path)])


def interrupted_runs(flow: Any, params: PipelineParams) -> dict[str, InterruptedRun]:
    """The unfinished runs of ``flow`` on this data root, by run identity: for each set of
    parameters, its most recent flow run if that one did not complete (nor was cancelled)."""
    from prefect.client.orchestration import get_client  # Prefect: seconds to import, only on this path
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterDeploymentId
    from prefect.client.schemas.sorting import FlowRunSort

    root = params.root()
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow.name])),
            flow_run_filter=FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(is_null_=True)),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC,
            limit=RECENT_RUNS,
        )
    found: dict[str, InterruptedRun | None] = {}
    for run in runs:
        try:
            theirs = PipelineParams.model_validate((run.parameters or {}).get("params") or {})
        except ValueError:  # parameters of another version of the pipeline
            continue
        identity = run_identity(theirs)
        if identity in found or theirs.root() != root:
            continue  # an older run of the same parameters, or another data root's
        state = run.state.type.value if run.state is not None else None
        found[identity] = (
            InterruptedRun(
                flow_run_id=str(run.id),
                name=run.name,
                state=state,
                run_dir=paths.run_dir(root, paths.run_id_for(run.name, str(run.id))),
                params=theirs,
            )
            if state in RESUMABLE
            else None  # the latest run of these parameters completed (or was cancelled): a new run starts
        )
    return {identity: run for identity, run in found.items() if run is not None}


def find_interrupted_run(flow: Any, params: PipelineParams) -> InterruptedRun | None:
    """The most recent run of ``flow`` with these parameters, if it did not finish (else None)."""
    return interrupted_runs(flow, params).get(run_identity(params))


def abandoned_runs(flow: Any, params: PipelineParams) -> list[InterruptedRun]:
    """Unfinished runs of *other* parameters on this data root whose ``mazerl run`` is gone (their
    lock is free): a rerun with changed flags must not pass them by without a word."""
    mine = run_identity(params)
    abandoned = []
    for identity, run in interrupted_runs(flow, params).items():
        if identity == mine:
            continue
        lock = ProcessLock(run_lock_path(run.params), "mazerl run (checking the run is not running)")
        try:
            lock.acquire()
        except LockHeld:  # its mazerl run is alive: not abandoned
            continue
        lock.release()
        abandoned.append(run)
    return abandoned


def differences(old: PipelineParams, new: PipelineParams, most: int = 3) -> str:
    """The parameters that differ between two runs, as ``name old -> new`` (at most ``most``)."""

    def flat(values: Any, prefix: str = "") -> dict[str, Any]:
        if not isinstance(values, dict):
            return {prefix: values}
        return {k: v for key, value in values.items() for k, v in flat(value, f"{prefix}{key}.").items()}

    before, after = flat(old.model_dump(mode="json")), flat(new.model_dump(mode="json"))
    changed = [key for key in sorted(before.keys() | after.keys()) if before.get(key) != after.get(key)]
    shown = [f"{key.rstrip('.')} {before.get(key)} -> {after.get(key)}" for key in changed[:most]]
    return ", ".join(shown) + (f" and {len(changed) - most} more" if len(changed) > most else "")


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
        if run.state in ("RUNNING", "PENDING"):  # a Crashed or Failed run said how it ended
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


def check_recorded_config(run: InterruptedRun, params: PipelineParams) -> None:
    """Before resuming: the run directory's ``train_config.json`` still says what the run trains
    (``TrainingConfigError`` naming the file and the edited settings if not)."""
    root = params.root()
    base_model = starter_dir(root) if params.base_model is None else Path(params.base_model).expanduser().resolve()
    check_unedited(params.train_config(run.run_dir.name, base_model))


def resume(flow: Any, run: InterruptedRun, params: PipelineParams) -> Any:
    """Run the interrupted flow run again (its next attempt), as ``prefect flow-run retry`` does; its final State."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow
    from prefect.states import Scheduled

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.flow_run_id, Scheduled(message="resumed by mazerl run"), force=True)
        flow_run = client.read_flow_run(run.flow_run_id)
    return run_flow(flow, flow_run=flow_run, parameters={"params": params}, return_type="state")
