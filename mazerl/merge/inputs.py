"""What a merge starts from, checked before anything loads: the adapter, its digest, and the base it goes into.

:func:`resolve_adapter` finds the adapter the checkpoint marker names (for
:func:`mazerl.merge.lora.merge_lora`), :func:`adapter_digest` identifies it (a finished merge of
the same base and adapter is reused), and :func:`check_inputs` refuses an unreadable adapter, a
missing base or a base other than the one the adapter was trained on.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from mazerl.fingerprint import mismatch, model_fingerprint
from mazerl.merge.proofs import MergeError
from mazerl.policy.loader import ModelLoadError, read_adapter_config
from mazerl.training import checkpoints


def resolve_adapter(checkpoints_dir: str | os.PathLike) -> tuple[Path, int, dict[str, Any]]:
    """(adapter dir, step, trainer state) of the checkpoint the marker names, or a MergeError saying why not."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        raise MergeError(
            f"checkpoints_dir={str(root)!r} does not exist: the train stage wrote no checkpoint there; "
            "run the train stage (or pass the run's checkpoints directory)"
        )
    marker = root / checkpoints.MARKER
    try:
        checkpoint = checkpoints.latest(root)
    except checkpoints.CheckpointError as exc:
        raise MergeError(f"the adapter named by the checkpoint marker {marker} is unusable: {exc}") from exc
    if checkpoint is None:
        raise MergeError(
            f"no checkpoint marker {marker}: training completed no checkpoint, so there is no adapter to merge; "
            "rerun the train stage"
        )
    try:
        state = checkpoints.load_trainer_state(checkpoint)
    except Exception as exc:  # a truncated or foreign trainer_state.pt
        raise MergeError(
            f"{checkpoint.path / checkpoints.TRAINER_STATE} (step {checkpoint.step}, named by {marker}) cannot be "
            f"read ({type(exc).__name__}: {exc})"
        ) from exc
    return checkpoint.adapter_dir, checkpoint.step, state


def _sha256_files(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:
            for block in iter(lambda h=handle: h.read(2**22), b""):
                digest.update(block)
    return digest.hexdigest()


def adapter_digest(adapter_dir: Path) -> str:
    return _sha256_files([adapter_dir / "adapter_config.json", adapter_dir / "adapter_model.safetensors"])


def check_inputs(base_dir: Path, adapter_dir: Path, expected_base_fingerprint: str | None, origin: str) -> str:
    """Refuse an unreadable adapter, a missing base or the wrong base before anything loads; the base's fingerprint."""
    try:
        read_adapter_config(adapter_dir)
    except ModelLoadError as exc:
        raise MergeError(str(exc)) from exc
    if not base_dir.is_dir():
        raise MergeError(f"base_model_dir={str(base_dir)!r} does not exist; pass the model the adapter was trained on")
    base_fingerprint = model_fingerprint(base_dir)
    if expected_base_fingerprint is not None and expected_base_fingerprint != base_fingerprint:
        trained_on = mismatch(expected_base_fingerprint, f"base_model_dir={str(base_dir)!r}", base_fingerprint)
        raise MergeError(f"the adapter{origin} was trained on {trained_on}; merge it into the base it was trained on")
    return base_fingerprint
