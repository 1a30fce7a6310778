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
already in place is reused (a retried task does no work). What the directory takes from the base
besides the weights, and its record (``merge_record.json``, :class:`~mazerl.merge.output.MergeReport`),
are :mod:`mazerl.merge.output`'s; the checks before loading are :mod:`mazerl.merge.inputs`'.
"""

from __future__ import annotations

import gc
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
from mazerl.atomic import install_dir
from mazerl.merge.inputs import adapter_digest, check_inputs, resolve_adapter
from mazerl.merge.memory import check_merge_memory, merge_memory, weights_bytes
from mazerl.merge.output import MERGE_RECORD, MergeReport, build_dir, reusable_report, save_merged
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
from mazerl.policy.loader import ModelLoadError, Policy, check_adapter_fits, load_policy
from mazerl.training import checkpoints

# Default logits tolerance (atol, rtol of max |logits|) by the dtype the comparison runs in.
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (5e-2, 2e-2), torch.float16: (2e-2, 1e-2)}


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


@dataclass(frozen=True)
class Precision:
    """The dtypes a merge runs and saves in, and the logits tolerances its proofs allow."""

    proof: torch.dtype
    save: torch.dtype
    atol: float
    rtol: float

    def tolerance(self, logits: torch.Tensor) -> float:
        return self.atol + self.rtol * float(logits.abs().max())


@dataclass(frozen=True)
class MergePlan:
    """One merge, checked and resolved before anything loads: what goes in, where it goes, how it is proven."""

    base_dir: Path
    adapter_dir: Path
    out_dir: Path
    origin: str  # " (checkpoint step N)", for messages
    checkpoint_step: int | None
    base_fingerprint: str
    adapter_sha: str
    context_mode: dict[str, Any] | None  # recorded as the merged model's context mode
    probe_eval_set: str
    device: str | None
    precision: Precision


def _precision(
    base_dir: Path,
    proof_dtype: str | None,
    save_dtype: str | None,
    atol: float | None,
    rtol: float | None,
    available_memory: tuple[int, str] | None,
) -> Precision:
    """The precision from the options; a merge that would not fit is refused before loading."""
    stored = stored_dtype(base_dir)
    proof = _dtype(proof_dtype) if proof_dtype else stored
    default_atol, default_rtol = TOLERANCES.get(proof, TOLERANCES[torch.bfloat16])
    save = _dtype(save_dtype) if save_dtype else stored
    # before anything is loaded: the weights at the merge dtype, a save shard, the overhead
    weights = int(weights_bytes(base_dir) * _itemsize(proof) / _itemsize(stored))
    check_merge_memory(merge_memory(weights), available_memory)
    return Precision(
        proof=proof,
        save=save,
        atol=default_atol if atol is None else atol,
        rtol=default_rtol if rtol is None else rtol,
    )


def _load_base(
    plan: MergePlan, log: Callable[[str], None]
) -> tuple[Policy, dict[str, torch.Tensor], torch.Tensor, dict[str, str]]:
    """Step 1: the base model, the probe batch, and what the merge is checked against (base logits, tensor digests)."""
    try:
        policy = load_policy(plan.base_dir, device=plan.device, dtype=plan.precision.proof)
        check_adapter_fits(policy.model, plan.adapter_dir)
    except ModelLoadError as exc:
        raise MergeError(f"cannot merge adapter {plan.adapter_dir}{plan.origin} into {plan.base_dir}: {exc}") from exc
    ids, images = probe_contexts(policy.processor, plan.probe_eval_set)
    inputs = model_inputs(policy.processor, ids, images)
    base_logits = probe_logits(policy.model, inputs)
    before = tensor_digests(policy.model)
    log(
        f"merge: base {plan.base_dir.name} loaded ({len(before)} tensors), probe batch of {base_logits.shape[0]} tokens"
    )
    return policy, inputs, base_logits, before


def _load_adapter(
    policy: Policy, plan: MergePlan, inputs: dict[str, torch.Tensor], base_logits: torch.Tensor
) -> tuple[torch.nn.Module, list[Any], torch.Tensor, float]:
    """Step 2: base + adapter, unmerged: the logits the merge must reproduce, and how far the adapter moves them."""
    from peft import PeftModel  # loads transformers: only when a merge runs, not when this module is imported

    try:
        peft_model = PeftModel.from_pretrained(policy.model, str(plan.adapter_dir), is_trainable=False).eval()
    except (RuntimeError, ValueError, KeyError) as exc:
        raise MergeError(f"adapter {plan.adapter_dir}{plan.origin} does not load onto {plan.base_dir}: {exc}") from exc
    probes = lora_probes(peft_model)
    adapter_logits = probe_logits(peft_model, inputs)
    return peft_model, probes, adapter_logits, max_abs(adapter_logits, base_logits)


def _merge_and_prove(
    peft_model: torch.nn.Module,
    before: dict[str, str],
    probes: list[Any],
    inputs: dict[str, torch.Tensor],
    adapter_logits: torch.Tensor,
    plan: MergePlan,
    log: Callable[[str], None],
) -> tuple[torch.nn.Module, torch.Tensor, dict[str, Any]]:
    """Step 3: merge and prove weights + logits; (merged model, its logits, the report fields the proofs measured)."""
    precision = plan.precision
    merged = peft_model.merge_and_unload()
    changed, unchanged, delta_error = check_weights(merged, before, probes, precision.atol, precision.rtol)
    merged_logits = probe_logits(merged, inputs)
    logits_diff = max_abs(merged_logits, adapter_logits)
    logits_tol = precision.tolerance(adapter_logits)
    if logits_diff > logits_tol:
        raise MergeError(
            f"merged logits differ from base+adapter logits by {logits_diff:.3e} (tolerance {logits_tol:.3e}) on the "
            f"probe batch; the merge of {plan.adapter_dir}{plan.origin} is wrong"
        )
    noop = not any(probe.nonzero for probe in probes)
    if noop:
        log(
            "merge: warning: every LoRA delta is zero (no update reached the adapter); the merged model equals the base"
        )
    log(
        f"merge: {len(probes)} LoRA modules, {changed} tensors changed, logits diff {logits_diff:.2e} <= {logits_tol:.2e}"
    )
    proven = {
        "lora_modules": len(probes),
        "changed_tensors": changed,
        "unchanged_tensors": unchanged,
        "noop_adapter": noop,
        "weight_delta_max_error": delta_error,
        "logits_max_abs_diff": logits_diff,
        "logits_tolerance": logits_tol,
    }
    return merged, merged_logits, proven


def _prove_reload(
    tmp: Path, plan: MergePlan, inputs: dict[str, torch.Tensor], merged_logits: torch.Tensor
) -> dict[str, float]:
    """Step 4, the reload proof (once the merged copy is freed): the saved directory gives the merged logits."""
    precision, save = plan.precision, plan.precision.save
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    reloaded = load_policy(tmp, device=plan.device, dtype=precision.proof)
    reload_logits = probe_logits(reloaded.model, inputs)
    del reloaded
    gc.collect()
    reload_diff = max_abs(reload_logits, merged_logits)
    if save == precision.proof:
        reload_tol = precision.tolerance(merged_logits)
    else:  # rounding the merged weights to the save dtype is allowed for
        save_atol, save_rtol = TOLERANCES.get(save, TOLERANCES[torch.bfloat16])
        reload_tol = save_atol + save_rtol * float(merged_logits.abs().max())
    if reload_diff > reload_tol:
        raise MergeError(
            f"the saved directory reloads with logits {reload_diff:.3e} away from the merged model's "
            f"(tolerance {reload_tol:.3e}, saved as {save}); the save is lossy or incomplete"
        )
    return {"reload_max_abs_diff": reload_diff, "reload_tolerance": reload_tol}


def _merge_and_install(plan: MergePlan, started: float, log: Callable[[str], None]) -> MergeReport:
    """Steps 1-4 in the one frame that holds the models, so that deleting them frees their memory before the reload."""
    policy, inputs, base_logits, before = _load_base(plan, log)
    peft_model, probes, adapter_logits, adapter_effect = _load_adapter(policy, plan, inputs, base_logits)
    merged, merged_logits, proven = _merge_and_prove(peft_model, before, probes, inputs, adapter_logits, plan, log)
    # 4. save to a temporary sibling, reload with the standard loader, compare, install
    tmp = build_dir(plan.out_dir)
    try:
        merge_info = {
            "adapter_dir": str(plan.adapter_dir),
            "adapter_sha256": plan.adapter_sha,
            "checkpoint_step": plan.checkpoint_step,
        }
        save_merged(merged, plan.precision.save, plan.base_dir, tmp, merge_info, plan.context_mode)
        del merged, peft_model, policy
        proven |= _prove_reload(tmp, plan, inputs, merged_logits)
        report = MergeReport(
            merged_dir=str(plan.out_dir),
            base_model_dir=str(plan.base_dir),
            adapter_dir=str(plan.adapter_dir),
            checkpoint_step=plan.checkpoint_step,
            base_fingerprint=plan.base_fingerprint,
            adapter_sha256=plan.adapter_sha,
            **proven,
            adapter_effect=adapter_effect,
            probe_tokens=int(base_logits.shape[0]),
            proof_dtype=str(plan.precision.proof).removeprefix("torch."),
            save_dtype=str(plan.precision.save).removeprefix("torch."),
            size_mb=round(dir_size_mb(tmp), 3),
            seconds=round(time.perf_counter() - started, 2),
        )
        (tmp / MERGE_RECORD).write_text(json.dumps(asdict(report), indent=2) + "\n")
        install_dir(tmp, plan.out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


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
    started = time.perf_counter()
    base_dir, adapter_dir, out_dir = (Path(path).resolve() for path in (base_model_dir, adapter_dir, out_dir))
    origin = f" (checkpoint step {checkpoint_step})" if checkpoint_step is not None else ""
    base_fingerprint = check_inputs(base_dir, adapter_dir, expected_base_fingerprint, origin)
    adapter_sha = adapter_digest(adapter_dir)
    reused = reusable_report(out_dir, base_fingerprint, adapter_sha)
    if reused is not None:
        log(f"merge: {out_dir} already holds this base + adapter merge; reusing it")
        return reused
    plan = MergePlan(
        base_dir=base_dir,
        adapter_dir=adapter_dir,
        out_dir=out_dir,
        origin=origin,
        checkpoint_step=checkpoint_step,
        base_fingerprint=base_fingerprint,
        adapter_sha=adapter_sha,
        context_mode=trained_context_mode,
        probe_eval_set=probe_eval_set,
        device=device,
        precision=_precision(base_dir, proof_dtype, save_dtype, atol, rtol, available_memory),
    )
    report = _merge_and_install(plan, started, log)
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
