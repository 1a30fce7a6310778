"""The merged directory: what it takes from the base besides the weights, and its record, ``merge_record.json``.

:func:`mazerl.merge.lora.merge_adapter` builds it in a temporary sibling (:func:`build_dir`):
:func:`save_merged` copies the base's tokenizer, processor, chat template and generation config
verbatim, saves the merged weights, and carries the starter's ``starter.json`` over with the
merged weights' digest; ``merge_record.json`` (:class:`MergeReport`: what was merged and how well
each proof held) is written last, so a directory without it is not a finished merge. The merge
stage reads it back (:meth:`MergeReport.read`), and a retried merge of the same base and adapter
reuses the directory it finds (:func:`reusable_report`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mazerl.atomic import temporary_sibling
from mazerl.merge.memory import SAVE_SHARD
from mazerl.merge.proofs import MergeError
from mazerl.starter.build import weights_digest
from mazerl.starter.record import RECORD_FILE

MERGE_RECORD = "merge_record.json"
# Files of the base directory that the merged one must not inherit verbatim: weights
# (rewritten) and the starter's build record (rewritten by _carry_starter_record).
_NOT_COPIED_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
_NOT_COPIED_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json", RECORD_FILE, MERGE_RECORD)


@dataclass(frozen=True)
class MergeReport:
    """What was merged and how well each proof held (plain values; written as ``merge_record.json``)."""

    merged_dir: str
    base_model_dir: str
    adapter_dir: str
    checkpoint_step: int | None
    base_fingerprint: str
    adapter_sha256: str
    lora_modules: int  # modules carrying a LoRA adapter
    changed_tensors: int  # tensors whose values the merge changed (adapted modules with a non-zero delta)
    unchanged_tensors: int
    noop_adapter: bool  # every LoRA delta is zero (e.g. no update was ever applied): merged == base
    weight_delta_max_error: float  # max |W_merged v - (W_base v + delta v)| over adapted modules
    logits_max_abs_diff: float  # merged vs base+adapter on the probe batch
    reload_max_abs_diff: float  # saved directory reloaded vs merged
    adapter_effect: float  # base+adapter vs base: how much the adapter changes the logits
    logits_tolerance: float
    reload_tolerance: float
    probe_tokens: int
    proof_dtype: str
    save_dtype: str
    size_mb: float
    seconds: float
    reused: bool = False

    @staticmethod
    def read(merged_dir: str | os.PathLike) -> MergeReport:
        """The report a finished merge wrote into its directory (``merge_record.json``)."""
        path = Path(merged_dir) / MERGE_RECORD
        try:
            return MergeReport(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise MergeError(
                f"{path} is missing or unreadable ({exc}); the merge did not finish: run it again"
            ) from exc

    def summary(self) -> str:
        step = f" (checkpoint step {self.checkpoint_step})" if self.checkpoint_step is not None else ""
        return (
            f"merged {self.lora_modules} LoRA modules{step} into {self.merged_dir}: {self.changed_tensors} tensors "
            f"changed, logits |merged - base+adapter| {self.logits_max_abs_diff:.2e} <= {self.logits_tolerance:.2e}, "
            f"reload {self.reload_max_abs_diff:.2e}, adapter effect {self.adapter_effect:.3f}, {self.size_mb:.1f} MB"
            + (" (reused)" if self.reused else "")
        )


def reusable_report(out_dir: Path, base_fingerprint: str, adapter_sha: str) -> MergeReport | None:
    """The report of a finished merge of this base and adapter already in ``out_dir`` (a retry reuses it), else None."""
    record = out_dir / MERGE_RECORD
    if not record.is_file():
        return None
    try:
        data = json.loads(record.read_text())
        report = MergeReport(**data)
    except (json.JSONDecodeError, TypeError):
        return None
    if report.base_fingerprint != base_fingerprint or report.adapter_sha256 != adapter_sha:
        return None
    return MergeReport(**{**data, "merged_dir": str(out_dir), "reused": True})


def build_dir(out_dir: Path) -> Path:
    """An empty temporary sibling of ``out_dir`` to build the merged directory in (a leftover one is removed)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def save_merged(
    merged: torch.nn.Module,
    dtype: torch.dtype,
    base_dir: Path,
    tmp: Path,
    merge_info: dict[str, Any],
    context_mode: dict[str, Any] | None,
) -> None:
    """The merged directory in ``tmp``: the base's other files, the merged weights in ``dtype``, the starter record."""
    _copy_base_files(base_dir, tmp)
    merged = merged.to(dtype)
    merged.save_pretrained(tmp, safe_serialization=True, max_shard_size=SAVE_SHARD)
    _carry_starter_record(base_dir, tmp, merged, merge_info, context_mode)


def _copy_base_files(base_dir: Path, target: Path) -> None:
    """Tokenizer, processor, chat template, generation config: everything but weights, verbatim."""
    for path in base_dir.iterdir():
        name = path.name
        if path.is_file() and not name.startswith(".") and name not in _NOT_COPIED_NAMES:
            if name.endswith(_NOT_COPIED_SUFFIXES):
                continue
            shutil.copy2(path, target / name)


def _carry_starter_record(
    base_dir: Path,
    target: Path,
    merged: torch.nn.Module,
    merge_info: dict[str, Any],
    context_mode: dict[str, Any] | None,
) -> None:
    """Keep the starter's record (the eval reads its context mode from it) with the merged weights' digest.

    The base's digest moves to ``base_weights_sha256`` and ``merged`` says where the
    weights came from, so the record stays true of the directory it is in; ``context_mode``
    (the mode the adapter was trained in) becomes the merged model's own, which an eval
    without a mode of its own then uses.
    """
    source = base_dir / RECORD_FILE
    if not source.is_file():
        return
    record = json.loads(source.read_text())
    record["base_weights_sha256"] = record.get("weights_sha256")
    record["weights_sha256"] = weights_digest(merged)
    record["merged"] = merge_info
    if context_mode is not None:
        record["context_mode"] = context_mode
    (target / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
