"""Training progress as both backends report it: one ``step N/M:`` line per finished step.

Who writes it: the local engine prints it after every step (``local_trainer``); the SkyRL entry
prints it from its tracker hook whenever SkyRL logs a finished step's metrics
(:func:`tracker_hook`). SkyRL itself prints no step line with ``trainer.logger=mlflow``: its
``Step N:`` comes only from its console logger, and its one-time ``Resuming from global_step: N``
says nothing about steps that follow. Inside a Ray job the line reaches the job's log either
way (a task's output is forwarded to the driver, e.g. ``(train_in_ray_task pid=7) step 3/160: ...``).

The line's format (:func:`mazerl.progress.step_line`, :func:`mazerl.progress.parse_step_line`)
lives below both training and the cluster; this module holds what only training knows: SkyRL's
hook and the progress reader that also trusts the checkpoint marker.

Who reads it: the submitter's hang watchdog and the train stage's Prefect progress artifact, both
through one :class:`TrainingProgress` that the train stage hands to its job. It also reads the checkpoint marker when the caller can see
the checkpoint directory (the embedded run, or a flow-run pod with the shared mount), so progress
that reaches the disk counts even if log lines are lost on the way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from mazerl import paths
from mazerl.progress import ProgressMeter, parse_step_line, step_line
from mazerl.training import checkpoints

# The metric that marks SkyRL's end-of-step payload: trainer.py adds it just before the one
# tracker.log(..., commit=True) call of each finished step (skyrl 0.4.0, RayPPOTrainer.train).
SKYRL_STEP_KEY = "trainer/global_step"


def _print_now(line: str) -> None:
    print(line, flush=True)  # a Ray worker's stdout is a pipe: unflushed lines reach the job log late


def tracker_hook(
    log: Callable[..., None], total_steps: int, emit: Callable[[str], None] = _print_now
) -> Callable[..., None]:
    """Wrap a SkyRL ``Tracking.log`` so that each finished step also prints its step line.

    The wrapped call keeps SkyRL's signature ``log(data, step, commit=False)``; the line is
    printed after the metrics were handed to SkyRL's logger, and only for the end-of-step payload
    (eval-only payloads carry no ``trainer/global_step``).
    """

    meters: list[ProgressMeter] = []  # started at the first finished step: resumed steps do not count

    def log_and_report(data: dict, step: int, commit: bool = False) -> None:
        log(data, step, commit=commit)
        if SKYRL_STEP_KEY in data:
            if not meters:
                meters.append(ProgressMeter(total_steps, "step", done=int(step)))
            emit(step_line(int(step), total_steps, data, meters[0].times(int(step))))

    return log_and_report


class TrainingProgress:
    """The furthest finished step: from step lines fed to it and, if given, the checkpoint marker.

    The submitter feeds it every log line of the job (:class:`~mazerl.cluster.jobs.hang_watchdog.JobProgress`),
    tells it which job it follows (:meth:`follow`) and calls it for the watchdog's value; the
    train stage reads :attr:`fraction` for its progress artifact.
    """

    def __init__(self, checkpoint_dir: str | Path | None = None, total_steps: int | None = None):
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.total = total_steps
        self._logged: int | None = None

    def follow(self, metadata: Mapping[str, str]) -> None:
        """The job being followed, by its submitter metadata: a job re-attached from another
        pipeline run writes its checkpoints into that run's directory, so read the marker there."""
        run_id, data_root = metadata.get("mazerl_id_run_id"), metadata.get("mazerl_id_data_root")
        if self.checkpoint_dir is not None and run_id and data_root:
            self.checkpoint_dir = paths.checkpoints_dir(Path(data_root), run_id)

    def feed(self, line: str) -> None:
        parsed = parse_step_line(line)
        if parsed is None:
            return
        step, total = parsed
        self.total = total
        if self._logged is None or step > self._logged:
            self._logged = step

    def marker_step(self) -> int | None:
        if self.checkpoint_dir is None:
            return None
        try:
            return checkpoints.read_marker(self.checkpoint_dir)
        except (OSError, checkpoints.CheckpointError):
            return None  # unreadable now (shared mount hiccup, torn write): no news, not a crash

    def __call__(self) -> int | None:
        steps = [s for s in (self._logged, self.marker_step()) if s is not None]
        return max(steps) if steps else None

    @property
    def fraction(self) -> float | None:
        """Share of the run's steps finished (the total comes from the caller or the step lines)."""
        step = self()
        if step is None or not self.total:
            return None
        return min(1.0, step / self.total)
