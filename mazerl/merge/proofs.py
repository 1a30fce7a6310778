"""The merge's proofs: a probe batch of real maze contexts, its logits, and the weight check.

:mod:`mazerl.merge.lora` runs them (see its docstring for what each proves): the logits of
the merged model against base + adapter on :func:`probe_contexts`, and every tensor of the
merged model against the base (:func:`check_weights`, over :func:`lora_probes` taken before
the merge).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from envs import evalset
from envs.evalset import EMBEDDED_EVAL_SET
from envs.maze import MazeEnv, action_text
from mazerl.policy.chat import Conversation, end_of_turn_id, render


class MergeError(RuntimeError):
    """The adapter cannot be merged, or the merged model failed one of its proofs."""


# --------------------------------------------------------------------------------------
# Probe batch and logits
# --------------------------------------------------------------------------------------


def probe_contexts(processor: Any, eval_set: str = EMBEDDED_EVAL_SET) -> tuple[list[list[int]], list[list[np.ndarray]]]:
    """Two real maze contexts: maze 0's first turn, and maze 1's second turn after one move."""
    loaded = evalset.load(eval_set)
    env = MazeEnv(size=loaded.size, max_moves=loaded.max_moves, cell_px=loaded.cell_px)
    frame, _ = env.reset(layout=loaded.layouts[0])
    first = Conversation.start(env.prompt(), frame)
    frame, _ = env.reset(layout=loaded.layouts[1 % len(loaded)])
    second = Conversation.start(env.prompt(), frame)
    reply = action_text(3)
    reply_ids = processor.tokenizer(reply, add_special_tokens=False)["input_ids"] + [end_of_turn_id(processor)]
    second.add_reply(reply_ids, reply)
    frame, _, _, _, info = env.step(reply)
    second.add_observation(info["feedback"], frame)
    contexts = [render(processor, conversation, history_images="all") for conversation in (first, second)]
    return [ids for ids, _ in contexts], [images for _, images in contexts]


@torch.no_grad()
def probe_logits(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Float32 logits at the attended positions of the probe batch, flattened to (tokens, vocab) on CPU."""
    device = next(model.parameters()).device
    batch = {key: value.to(device) for key, value in inputs.items()}
    logits = model(**batch).logits  # (B, T, V)
    return logits[batch["attention_mask"].bool()].float().cpu()


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


# --------------------------------------------------------------------------------------
# Weight proof
# --------------------------------------------------------------------------------------


def tensor_digests(model: torch.nn.Module) -> dict[str, str]:
    """Per-tensor digest of the state dict, so "unchanged" means bit-identical without keeping a copy."""
    digests = {}
    for name, tensor in model.state_dict().items():
        data = tensor.detach().contiguous().cpu()
        digests[name] = hashlib.blake2b(data.view(torch.uint8).numpy().tobytes(), digest_size=16).hexdigest()
    return digests


@dataclass
class _LoraProbe:
    weight_key: str  # the merged model's state-dict key of the adapted weight
    vector: torch.Tensor  # (in,)
    base_proj: torch.Tensor  # W_base @ v, (out,)
    delta_proj: torch.Tensor  # delta @ v, (out,)
    nonzero: bool  # the merge changes the weight (a non-zero delta that survives the dtype's rounding)


def lora_probes(peft_model: torch.nn.Module, seed: int = 0) -> list[_LoraProbe]:
    """For every LoRA-adapted linear layer: W_base v and delta v on a seeded random v."""
    # peft (and transformers under it) loads when a merge runs, not when the flow imports MergeReport
    from peft.tuners.lora import LoraLayer

    generator = torch.Generator().manual_seed(seed)
    probes = []
    for name, module in peft_model.named_modules():
        if not isinstance(module, LoraLayer) or not module.active_adapters:
            continue
        adapter = module.active_adapters[0]
        base = module.get_base_layer()
        if adapter not in getattr(module, "lora_A", {}) or not hasattr(base, "weight"):
            raise MergeError(f"module {name} carries an adapter type the merge proof does not know ({type(base)})")
        weight = base.weight  # (out, in)
        delta = module.get_delta_weight(adapter).to(weight.dtype)  # (out, in), scale * B @ A
        vector = torch.randn(weight.shape[1], generator=generator).to(weight.device, weight.dtype)
        key = name.removeprefix("base_model.model.") + ".weight"
        # Does the merge change this weight at all? PEFT adds the delta in the weight's dtype, so in
        # bfloat16 a delta below the weight's rounding leaves it bit-identical, as it should.
        moves = bool((weight + delta != weight).any())
        probes.append(_LoraProbe(key, vector, (weight @ vector).cpu(), (delta @ vector).cpu(), moves))
    if not probes:
        raise MergeError("the adapter attached to no module of the base model; it was trained for another model")
    return probes


def check_weights(
    merged: torch.nn.Module, before: dict[str, str], probes: list[_LoraProbe], atol: float, rtol: float
) -> tuple[int, int, float]:
    """(changed tensors, unchanged tensors, max delta error); MergeError when any tensor changed wrongly."""
    after = tensor_digests(merged)
    if set(after) != set(before):
        extra, missing = sorted(set(after) - set(before)), sorted(set(before) - set(after))
        raise MergeError(
            f"the merged model's tensors differ from the base's by name (new {extra[:5]}, missing {missing[:5]}); "
            "merge_and_unload left adapter modules behind or dropped weights"
        )
    changed = {name for name in after if after[name] != before[name]}
    expected = {probe.weight_key for probe in probes if probe.nonzero}
    unexpected, unchanged = sorted(changed - expected), sorted(expected - changed)
    if unexpected:
        raise MergeError(f"the merge changed tensors that LoRA does not adapt: {unexpected[:10]}")
    if unchanged:
        raise MergeError(
            f"the merge left adapted weights unchanged although their LoRA delta is non-zero: {unchanged[:10]} "
            "(a delta too small for the weight's dtype, or the adapter was not applied)"
        )
    state = merged.state_dict()
    worst = 0.0
    for probe in probes:
        weight = state[probe.weight_key]
        merged_proj = (weight @ probe.vector.to(weight.device, weight.dtype)).cpu()
        expected_proj = probe.base_proj + probe.delta_proj
        error = max_abs(merged_proj, expected_proj)
        limit = atol + rtol * float(expected_proj.abs().max())
        if error > limit:
            raise MergeError(
                f"{probe.weight_key}: W_merged v differs from W_base v + delta v by {error:.3e} (> {limit:.3e}); "
                "the merged weight is not base + scale * B @ A"
            )
        worst = max(worst, error)
    return len(changed), len(after) - len(changed), worst
