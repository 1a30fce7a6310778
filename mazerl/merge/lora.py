"""Fold a trained LoRA adapter into its base model, prove the result, and save a complete HF directory.

The merged directory is what final eval, vLLM and the model registry get, so a silent
mistake here (an adapter that did not load, a merge into the wrong modules, weights saved
in a form that reloads differently) would poison everything after it. The merge therefore
proves itself and raises :class:`MergeError` when any proof fails:

1. weights: every tensor of the merged model equals the base's bit for bit, except the
   ``<module>.weight`` of each LoRA-adapted module whose delta is non-zero; for those,
   ``W_merged @ v == W_base @ v + delta @ v`` on a random vector ``v`` (the change is the
   adapter's ``scale * B @ A``, no more, no less).
2. logits: on a probe batch (two real maze contexts through ``mazerl.policy.chat``: a
   first turn, and a second turn after one reply with its feedback and next frame, so
   two images, left padding and a spliced reply are exercised) the merged model's logits
   equal the unmerged base+adapter logits within ``atol + rtol * max|logits|``.
3. reload: the saved directory, loaded back with ``mazerl.policy.loader.load_policy``,
   reproduces the merged logits (bit-exact when saved in float32; within the rounding of
   the save dtype otherwise).

The merge and its proofs run in the checkpoint's own dtype (``proof_dtype`` None: the dtype
the base model's config names; bfloat16 for Qwen3-VL releases, float32 for the starter), with
that dtype's tolerances, and the directory is saved in it too (``save_dtype``): bf16 weights
stay bf16, and an 8B model needs one 16 GiB copy in memory rather than a 32 GiB float32 one.
Memory: that copy, one save shard of at most 5 GB, and the overhead of
:mod:`mazerl.merge.memory`, checked against what the machine has *before* loading;
the reload happens after the copy is freed. In the pipeline the merge runs as a Ray job
(:mod:`mazerl.merge.job_entry`) on a node with that memory, not in the flow-run pod.

The adapter is the one the checkpoint marker names (:func:`merge_lora`); an explicit
adapter directory can be merged with :func:`merge_adapter`. Output is built in a temporary
sibling directory and renamed into place; a merge of the same base and adapter that is
already in place is reused (a retried task does no work).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from envs.evalset import EMBEDDED_EVAL_SET
from mazerl.atomic import install_dir, temporary_sibling
from mazerl.fingerprint import mismatch, model_fingerprint
from mazerl.merge.memory import SAVE_SHARD, check_merge_memory, merge_memory, weights_bytes
from mazerl.merge.proofs import (
    MergeError,
    check_weights,
    lora_probes,
    max_abs,
    probe_contexts,
    probe_logits,
    tensor_digests,
)
from mazerl.paths import dir_size_mb
from mazerl.policy.chat import model_inputs
from mazerl.policy.loader import ModelLoadError, check_adapter_fits, load_policy, read_adapter_config
from mazerl.starter.build import weights_digest
from mazerl.starter.record import RECORD_FILE
from mazerl.training import checkpoints

MERGE_RECORD = "merge_record.json"
# Files of the base directory that the merged one must not inherit verbatim: weights
# (rewritten) and the starter's build record (rewritten by _carry_starter_record).
_NOT_COPIED_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
_NOT_COPIED_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json", RECORD_FILE, MERGE_RECORD)
# Default logits tolerance (atol, rtol of max |logits|) by the dtype the comparison runs in.
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (5e-2, 2e-2), torch.float16: (2e-2, 1e-2)}


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


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# The merge
# --------------------------------------------------------------------------------------


def _dtype(value: str | torch.dtype) -> torch.dtype:
    dtype = getattr(torch, value, None) if isinstance(value, str) else value
    if not isinstance(dtype, torch.dtype):
        raise MergeError(f"dtype {value!r} is not a torch dtype; use 'float32', 'bfloat16' or 'float16'")
    return dtype


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def stored_dtype(model_dir: Path) -> torch.dtype:
    """The dtype the base model's config says its weights are stored in (float32 if unstated)."""
    config = json.loads((model_dir / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or config.get("text_config", {}).get("dtype")
    return _dtype(name) if name else torch.float32


def _reusable(out_dir: Path, base_fingerprint: str, adapter_sha: str) -> MergeReport | None:
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


def merge_adapter(
    base_model_dir: str | os.PathLike,
    adapter_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    checkpoint_step: int | None = None,
    expected_base_fingerprint: str | None = None,
    trained_context_mode: dict[str, Any] | None = None,
    probe_eval_set: str = EMBEDDED_EVAL_SET,
    device: str | None = None,
    proof_dtype: str | None = None,
    save_dtype: str | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    available_memory: tuple[int, str] | None = None,
    log: Callable[[str], None] = print,
) -> MergeReport:
    """Merge ``adapter_dir`` into ``base_model_dir``, prove it, save to ``out_dir``; see the module docstring.

    ``expected_base_fingerprint`` (from the checkpoint's trainer state) refuses a base model
    other than the one the adapter was trained on; ``trained_context_mode`` (its ``history_images``
    and ``history_text``) is recorded as the merged model's context mode. ``proof_dtype``/``save_dtype`` None: the base
    model's stored dtype. ``atol``/``rtol`` default to :data:`TOLERANCES` for ``proof_dtype``.
    ``available_memory`` (bytes, source) None: measured here; a merge that would not fit is
    refused with :class:`~mazerl.merge.memory.MergeMemoryError` before loading.
    """
    from peft import PeftModel  # loads transformers: only when a merge runs, not when the flow imports MergeReport

    started = time.perf_counter()
    base_dir, adapter_dir, out_dir = (
        Path(base_model_dir).resolve(),
        Path(adapter_dir).resolve(),
        Path(out_dir).resolve(),
    )
    origin = f" (checkpoint step {checkpoint_step})" if checkpoint_step is not None else ""
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
    adapter_sha = adapter_digest(adapter_dir)
    reused = _reusable(out_dir, base_fingerprint, adapter_sha)
    if reused is not None:
        log(f"merge: {out_dir} already holds this base + adapter merge; reusing it")
        return reused
    stored = stored_dtype(base_dir)
    proof = _dtype(proof_dtype) if proof_dtype else stored
    default_atol, default_rtol = TOLERANCES.get(proof, TOLERANCES[torch.bfloat16])
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    target_dtype = _dtype(save_dtype) if save_dtype else stored
    # before anything is loaded: the weights at the merge dtype, a save shard, the overhead
    weights = int(weights_bytes(base_dir) * _itemsize(proof) / _itemsize(stored))
    check_merge_memory(merge_memory(weights), available_memory)

    # 1. base model, probe batch, base logits, per-tensor digests
    try:
        policy = load_policy(base_dir, device=device, dtype=proof)
        check_adapter_fits(policy.model, adapter_dir)
    except ModelLoadError as exc:
        raise MergeError(f"cannot merge adapter {adapter_dir}{origin} into {base_dir}: {exc}") from exc
    ids, images = probe_contexts(policy.processor, probe_eval_set)
    inputs = model_inputs(policy.processor, ids, images)
    base_logits = probe_logits(policy.model, inputs)
    before = tensor_digests(policy.model)
    log(f"merge: base {base_dir.name} loaded ({len(before)} tensors), probe batch of {base_logits.shape[0]} tokens")

    # 2. base + adapter (unmerged): the reference the merge must reproduce
    try:
        peft_model = PeftModel.from_pretrained(policy.model, str(adapter_dir), is_trainable=False).eval()
    except (RuntimeError, ValueError, KeyError) as exc:
        raise MergeError(f"adapter {adapter_dir}{origin} does not load onto {base_dir}: {exc}") from exc
    probes = lora_probes(peft_model)
    adapter_logits = probe_logits(peft_model, inputs)
    adapter_effect = max_abs(adapter_logits, base_logits)

    # 3. merge and prove weights + logits
    merged = peft_model.merge_and_unload()
    changed, unchanged, delta_error = check_weights(merged, before, probes, atol, rtol)
    merged_logits = probe_logits(merged, inputs)
    logits_diff = max_abs(merged_logits, adapter_logits)
    logits_tol = atol + rtol * float(adapter_logits.abs().max())
    if logits_diff > logits_tol:
        raise MergeError(
            f"merged logits differ from base+adapter logits by {logits_diff:.3e} (tolerance {logits_tol:.3e}) on the "
            f"probe batch; the merge of {adapter_dir}{origin} is wrong"
        )
    noop = not any(probe.nonzero for probe in probes)
    if noop:
        log(
            "merge: warning: every LoRA delta is zero (no update reached the adapter); the merged model equals the base"
        )
    log(
        f"merge: {len(probes)} LoRA modules, {changed} tensors changed, logits diff {logits_diff:.2e} <= {logits_tol:.2e}"
    )

    # 4. save to a temporary sibling, reload with the standard loader, compare, install
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _copy_base_files(base_dir, tmp)
        merged = merged.to(target_dtype)
        merged.save_pretrained(tmp, safe_serialization=True, max_shard_size=SAVE_SHARD)
        merge_info = {
            "adapter_dir": str(adapter_dir),
            "adapter_sha256": adapter_sha,
            "checkpoint_step": checkpoint_step,
        }
        _carry_starter_record(base_dir, tmp, merged, merge_info, trained_context_mode)
        del merged, peft_model, policy
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        reloaded = load_policy(tmp, device=device, dtype=proof)
        reload_logits = probe_logits(reloaded.model, inputs)
        del reloaded
        gc.collect()
        reload_diff = max_abs(reload_logits, merged_logits)
        if target_dtype == proof:
            reload_tol = atol + rtol * float(merged_logits.abs().max())
        else:  # rounding the merged weights to the save dtype is allowed for
            save_atol, save_rtol = TOLERANCES.get(target_dtype, TOLERANCES[torch.bfloat16])
            reload_tol = save_atol + save_rtol * float(merged_logits.abs().max())
        if reload_diff > reload_tol:
            raise MergeError(
                f"the saved directory reloads with logits {reload_diff:.3e} away from the merged model's "
                f"(tolerance {reload_tol:.3e}, saved as {target_dtype}); the save is lossy or incomplete"
            )
        report = MergeReport(
            merged_dir=str(out_dir),
            base_model_dir=str(base_dir),
            adapter_dir=str(adapter_dir),
            checkpoint_step=checkpoint_step,
            base_fingerprint=base_fingerprint,
            adapter_sha256=adapter_sha,
            lora_modules=len(probes),
            changed_tensors=changed,
            unchanged_tensors=unchanged,
            noop_adapter=noop,
            weight_delta_max_error=delta_error,
            logits_max_abs_diff=logits_diff,
            reload_max_abs_diff=reload_diff,
            adapter_effect=adapter_effect,
            logits_tolerance=logits_tol,
            reload_tolerance=reload_tol,
            probe_tokens=int(base_logits.shape[0]),
            proof_dtype=str(proof).removeprefix("torch."),
            save_dtype=str(target_dtype).removeprefix("torch."),
            size_mb=round(dir_size_mb(tmp), 3),
            seconds=round(time.perf_counter() - started, 2),
        )
        (tmp / MERGE_RECORD).write_text(json.dumps(asdict(report), indent=2) + "\n")
        install_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"merge: {report.summary()}")
    return report


def merge_lora(
    base_model_dir: str | os.PathLike,
    checkpoints_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    **options: Any,
) -> MergeReport:
    """Merge the adapter of the checkpoint the marker in ``checkpoints_dir`` names (options: see merge_adapter).

    The base-model fingerprint the checkpoint recorded (in its trainer state, or in
    ``base_model.json`` beside the checkpoints) must match ``base_model_dir``.
    """
    adapter_dir, step, state = resolve_adapter(checkpoints_dir)
    # local backend: in trainer_state.pt; SkyRL: the record its entry writes beside the checkpoints
    fingerprint = state.get("base_model_fingerprint") if isinstance(state, dict) else None
    try:
        fingerprint = fingerprint or checkpoints.recorded_base_fingerprint(Path(checkpoints_dir))
    except checkpoints.CheckpointError as exc:
        raise MergeError(str(exc)) from exc
    trained = state.get("config") if isinstance(state, dict) else None  # the local backend's TrainConfig
    mode = (
        {key: trained[key] for key in ("history_images", "history_text")}
        if isinstance(trained, dict) and {"history_images", "history_text"} <= trained.keys()
        else None
    )
    return merge_adapter(
        base_model_dir,
        adapter_dir,
        out_dir,
        checkpoint_step=step,
        expected_base_fingerprint=fingerprint,
        trained_context_mode=mode,
        **options,
    )
