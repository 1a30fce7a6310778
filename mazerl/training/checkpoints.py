"""Checkpoint layout, the step marker, atomic saves and verified resume (docs/training.md, "Checkpoints and resume").

::

    checkpoints/
      latest_ckpt_global_step.txt      "N", written last (by rename)
      base_model.json                  the base model the adapters belong to (SkyRL backend; its
                                       trainer_state.pt has no room for it)
      global_step_<N>/
        trainer_state.pt               global step, config, data order, base-model fingerprint
        metrics.json                   the step's metrics row (local backend), replayed on resume if missing
        policy/lora_adapter/           PEFT adapter (adapter_config.json + adapter_model.safetensors)
        policy/optimizer.pt, rng_state.pt   (local backend; older checkpoints also hold an unused scheduler.pt)

The local backend builds a checkpoint in a temporary directory and renames it into place,
then rewrites the marker by rename; SkyRL writes in place and the marker last. Either way a
reader trusts the step the marker names, and verifies that directory before use.

A resume loads every file of that step first (:func:`find_resume_point`): a file damaged after
it was written (truncated by a copy, a disk error, a marker edited or emptied by hand) must
not end the run with a library's traceback, nor be retried as if the cluster had failed. The
trainer then falls back to the newest older step that loads, says which and why, moves the
damaged directory aside (``global_step_<N>.damaged``) and points the marker at the intact step
(:func:`use_resume_point`). Scanning ``global_step_*`` directories happens only there and in pruning.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mazerl.atomic import install_dir, temporary_sibling, write_text
from mazerl.fingerprint import mismatch, model_fingerprint
from mazerl.training.disk_room import StorageFullError, check_room, dir_bytes, full_message, has_room, is_no_space
from mazerl.training.metrics_sink import MetricsSink

MARKER = "latest_ckpt_global_step.txt"
BASE_MODEL_RECORD = "base_model.json"
TRAINER_STATE = "trainer_state.pt"
METRICS = "metrics.json"
ADAPTER_SUBDIR = Path("policy") / "lora_adapter"
REQUIRED_FILES = (
    TRAINER_STATE,
    str(ADAPTER_SUBDIR / "adapter_config.json"),
    str(ADAPTER_SUBDIR / "adapter_model.safetensors"),
)
# what the local backend's resume loads beside the adapter and the trainer state
LOCAL_POLICY_FILES = ("policy/optimizer.pt", "policy/rng_state.pt")
DAMAGED_SUFFIX = ".damaged"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete, or belongs to another run or model."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, read-only file system, I/O error).

    Not a :class:`CheckpointError`: the configuration is fine, and a retry once the file
    system has room again resumes from the marker, which still names the previous checkpoint.
    """


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path

    @property
    def adapter_dir(self) -> Path:
        return self.path / ADAPTER_SUBDIR


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def read_marker(root: Path) -> int | None:
    """The step named by the marker, or None when no checkpoint was ever completed."""
    marker = Path(root) / MARKER
    if not marker.exists():
        return None
    text = marker.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(
            f"checkpoint marker {marker} holds {text!r}, not a step number; run the same command again: the "
            "trainer resumes from the newest intact checkpoint and rewrites the marker"
        )
    return int(text)


def verify(path: Path) -> None:
    """Raise if a checkpoint directory lacks any required file."""
    missing = [name for name in REQUIRED_FILES if not (Path(path) / name).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {', '.join(missing)}")


def latest(root: Path) -> Checkpoint | None:
    """The verified checkpoint the marker names, or None if there is no marker."""
    step = read_marker(root)
    if step is None:
        return None
    checkpoint = Checkpoint(step, step_dir(root, step))
    verify(checkpoint.path)
    return checkpoint


@dataclass(frozen=True)
class ResumePoint:
    """Where a run resumes: the newest intact checkpoint (None: none was ever completed), the
    damaged steps passed over on the way to it, and why each (or the marker) was passed over."""

    checkpoint: Checkpoint | None
    damaged: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def fell_back(self) -> bool:
        return bool(self.notes)


def damage(path: Path, extra_files: tuple[str, ...] = ()) -> str | None:
    """Why the checkpoint directory ``path`` cannot be resumed from, or None when every file loads:
    the adapter's config and weights, the trainer state (whose step must be the directory's) and
    ``extra_files`` (the backend's optimizer and RNG state)."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_dir():
        return f"{path} does not exist"
    missing = [name for name in (*REQUIRED_FILES, *extra_files) if not (path / name).is_file()]
    if missing:
        return f"missing {', '.join(missing)}"
    loads: list[tuple[str, Callable[[Path], Any]]] = [
        (str(ADAPTER_SUBDIR / "adapter_config.json"), lambda file: dict(json.loads(file.read_text()))),
        (str(ADAPTER_SUBDIR / "adapter_model.safetensors"), lambda file: load_file(str(file))),
        *(
            (name, lambda file: torch.load(file, map_location="cpu", weights_only=True))
            for name in (TRAINER_STATE, *extra_files)
        ),
    ]
    for name, load in loads:
        try:
            value = load(path / name)
        except Exception as exc:  # noqa: BLE001 - whatever the library says, the file does not load
            return f"{name} does not load ({type(exc).__name__}: {str(exc)[:200]})"
        if name == TRAINER_STATE and isinstance(value, dict) and value.get("global_step") not in (None, _step_of(path)):
            return f"{name} is of step {value.get('global_step')}, not of this directory's"
    return None


def find_resume_point(root: Path, extra_files: tuple[str, ...] = ()) -> ResumePoint:
    """The newest checkpoint a run can resume from: the marker's step if it loads, else the newest
    older one that does (reads only; :func:`use_resume_point` acts on it). Raises
    :class:`CheckpointError` when the marker exists but no step loads."""
    root = Path(root)
    marker = root / MARKER
    if not marker.exists():
        return ResumePoint(None)
    text = marker.read_text(errors="replace").strip()
    named = int(text) if text.isdigit() else None
    damaged, notes = [], [] if named is not None else [f"the marker {marker.name} holds {text!r}, not a step number"]
    for step in sorted({*([named] if named is not None else []), *_steps(root)}, reverse=True):
        if named is not None and step > named:
            continue  # a step directory the marker never named (a crash before the marker moved)
        why = damage(step_dir(root, step), extra_files)
        if why is None:
            return ResumePoint(Checkpoint(step, step_dir(root, step)), tuple(damaged), tuple(notes))
        damaged.append(step)
        notes.append(f"checkpoint step {step} is damaged: {why}")
    raise CheckpointError(
        f"no checkpoint in {root} can be resumed from ({'; '.join(notes)}); restore a checkpoint, or start the "
        "run anew (mazerl run ... --fresh)"
    )


def use_resume_point(root: Path, extra_files: tuple[str, ...], log: Callable[[str], None]) -> Checkpoint | None:
    """The checkpoint to resume from (:func:`find_resume_point`), with a fallback acted on: each
    damaged step moved aside, the marker pointed at the intact step, and the reason logged.
    Call it where no other process writes the checkpoints (the trainer, under its lock)."""
    root = Path(root)
    point = find_resume_point(root, extra_files)
    if not point.fell_back or point.checkpoint is None:
        return point.checkpoint
    for step in point.damaged:
        if step_dir(root, step).is_dir():
            aside = root / f"global_step_{step}{DAMAGED_SUFFIX}"
            shutil.rmtree(aside, ignore_errors=True)
            step_dir(root, step).rename(aside)
    resumed = point.checkpoint
    write_text(root / MARKER, str(resumed.step), fsync=True)
    log(
        f"{'; '.join(point.notes)}: resuming from step {resumed.step}, the newest intact checkpoint (a damaged "
        f"step is kept aside as global_step_<N>{DAMAGED_SUFFIX}; the steps after {resumed.step} are trained again)"
    )
    return resumed


def _steps(root: Path) -> list[int]:
    """The steps of the ``global_step_<N>`` directories under ``root``."""
    return [int(m.group(1)) for entry in Path(root).iterdir() if (m := _STEP_DIR.match(entry.name))]


def _step_of(path: Path) -> int | None:
    match = _STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


def save(
    root: Path,
    step: int,
    write: Callable[[Path], None],
    keep: int,
    metrics: dict[str, float] | None = None,
    need_bytes: int = 0,
) -> Checkpoint:
    """Build a checkpoint with ``write(tmp_dir)``, rename it into place, move the marker, prune.

    A crash at any point leaves the marker on the previous complete checkpoint: the
    temporary directory is ignored (and cleared on the next save of that step). ``metrics``
    (the step's row) goes into the checkpoint too, so a crash after the marker moved but
    before the row reached ``metrics.jsonl`` loses nothing (:func:`replay_metrics`). Too little
    room for it (the previous checkpoint's size, else ``need_bytes``), or a write failing with
    ENOSPC, is a :class:`~mazerl.training.disk_room.StorageFullError` (:mod:`~mazerl.training.disk_room`).
    """
    root = Path(root)
    final = step_dir(root, step)
    tmp = temporary_sibling(final)
    check_room(root, checkpoint_bytes(root) or need_bytes, f"checkpoint step {step}", resume_note(root))
    try:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(f".{final.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
        write(tmp)
        verify(tmp)
        if metrics is not None:
            (tmp / METRICS).write_text(json.dumps(metrics))
        install_dir(tmp, final)  # a step dir left by a crash between rename and marker is never trusted: replaced
        write_text(root / MARKER, str(step), fsync=True)
    except CheckpointError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as exc:  # OSError, and torch's RuntimeError for a full disk ("unexpected pos ...")
        shutil.rmtree(tmp, ignore_errors=True)
        if is_no_space(exc) or not has_room(root, checkpoint_bytes(root) or need_bytes):  # torch's says no errno
            raise StorageFullError(full_message(root, f"checkpoint step {step}", resume_note(root))) from exc
        raise CheckpointWriteError(_write_failure(root, step, exc)) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(root, keep)
    return Checkpoint(step, final)


def _write_failure(root: Path, step: int, exc: Exception) -> str:
    """What went wrong, how much room there is, and that the previous checkpoint is still the one to use."""
    try:
        free = f"{shutil.disk_usage(root).free / 2**20:.0f} MiB free there"
    except OSError:
        free = "its free space cannot be read"
    writable = os.access(root, os.W_OK) if root.exists() else os.access(root.parent, os.W_OK)
    return (
        f"could not write checkpoint step {step} under {root} ({type(exc).__name__}: {exc}); {free}"
        + ("" if writable else ", and it is read-only or not writable by this user")
        + f". Free space or make {root} writable, then run again: {resume_note(root)}"
    )


def resume_note(root: Path) -> str:
    """Where the next attempt resumes: after the step the marker still names, or from the start."""
    try:
        previous = read_marker(root) if Path(root).is_dir() else None
    except (OSError, CheckpointError):
        previous = None
    if previous is None:
        return "no earlier checkpoint exists, so the run starts its training from step 0"
    return f"the marker still names step {previous}, which is intact, and the run resumes after it"


def checkpoint_bytes(root: Path) -> int:
    """The size of the checkpoint the marker names (0: none yet): what the next one will need."""
    try:
        step = read_marker(root) if Path(root).is_dir() else None
    except (OSError, CheckpointError):
        return 0
    return dir_bytes(step_dir(root, step)) if step is not None else 0


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest step directories, never the one the marker names."""
    current = read_marker(root)
    steps = sorted((int(m.group(1)), entry) for entry in Path(root).iterdir() if (m := _STEP_DIR.match(entry.name)))
    doomed = [path for step, path in steps[:-keep] if step != current] if keep > 0 else []
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def recorded_base_fingerprint(root: Path) -> str | None:
    """The base-model fingerprint written beside the checkpoints, or None if there is no record."""
    path = Path(root) / BASE_MODEL_RECORD
    try:
        return str(json.loads(path.read_text())["fingerprint"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} is unreadable ({exc}); restore it or delete it with the checkpoints") from exc


def record_base_model(root: Path, base_model: Path) -> str:
    """Write ``base_model.json`` beside the checkpoints, or check the one already there.

    For a backend whose own checkpoint files cannot carry the base model's fingerprint (SkyRL),
    so that a resume and the merge can refuse adapters trained from another base model.
    """
    root, base_model = Path(root), Path(base_model)
    fingerprint = model_fingerprint(base_model)
    recorded = recorded_base_fingerprint(root)
    if recorded is not None and recorded != fingerprint:
        raise CheckpointError(
            f"the checkpoints in {root} were trained from {mismatch(recorded, f'base_model {base_model}', fingerprint)}"
            "; resume with the original base model, or use a new run_id to start a new run"
        )
    if recorded is None:
        root.mkdir(parents=True, exist_ok=True)
        record = {"fingerprint": fingerprint, "base_model": str(base_model)}
        write_text(root / BASE_MODEL_RECORD, json.dumps(record, indent=2) + "\n", fsync=True)
    return fingerprint


def replay_metrics(checkpoint: Checkpoint, sink: MetricsSink) -> bool:
    """Hand the checkpoint's own metrics row to ``sink.log(step, row)`` (which records a step once).

    True when the checkpoint holds a row; a SkyRL checkpoint, or one written before rows were kept, holds none.
    """
    path = checkpoint.path / METRICS
    if not path.is_file():
        return False
    sink.log(checkpoint.step, json.loads(path.read_text()))
    return True


def save_trainer_state(path: Path, state: dict[str, Any]) -> None:
    torch.save(state, path / TRAINER_STATE)


def load_trainer_state(checkpoint: Checkpoint) -> dict[str, Any]:
    """Plain values only, loaded without unpickling arbitrary objects (``weights_only=True``)."""
    return torch.load(checkpoint.path / TRAINER_STATE, map_location="cpu", weights_only=True)
