"""Warm-start of the starter: supervised imitation of the shortest-path solver.

Data (:mod:`mazerl.starter.states`). One state per (maze, agent cell): the context of an
episode walking there from the start, rendered through the real processor and chat
template, and the solver's next action from that cell as the answer.

Why auxiliary losses. Plain imitation of a from-scratch 2 M-parameter Qwen3-VL stalls at
"pick any open direction" (per-action accuracy ~0.42, no maze solved). Two linear heads on
the text model's hidden states at the image positions after layer ``aux_layer`` break the
plateau: one predicts for every cell the solver's next action from that cell (or "wall"),
one predicts which cell the agent is on. Each is weighted ``aux_weight`` beside the answer
loss; the heads are discarded afterwards, so the saved model is a plain Qwen3-VL.

The noisy demonstrator (``answer_noise``). The reference SFT checkpoint learnt from imperfect
demonstrations; a starter that imitates the solver alone is, where it fails, confidently wrong
(the solver's move gets 0.2 at its first wrong state), which GRPO can barely move. With chance
``answer_noise`` an answer is instead the move of a demonstrator that heads for the red square
(:func:`~mazerl.starter.states.demonstrator_action`); where the maze's way leads round, the
starter then learns a mix of the two, so its mistakes are near-ties there. The auxiliary per-cell targets stay the
solver's, so what the model sees of the maze is learnt cleanly.

Loop: AdamW, linear warm-up then cosine decay, batches of ``batch_size`` states drawn
from one seeded permutation per epoch (length-sorted within windows, to pad less),
gradient clipping at 1.0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from envs.evalset import load as load_eval_set
from mazerl.policy.chat import image_token_id, model_inputs
from mazerl.progress import ProgressMeter
from mazerl.starter.states import WALL_CLASS, State, build_states, training_mazes

PROGRESS_EVERY_S = 30.0  # at most this long between progress lines, however slow the steps


class AuxHeads(torch.nn.Module):
    """Per-cell heads on image-token hidden states (discarded after the warm-start)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.cell_action = torch.nn.Linear(hidden, WALL_CLASS + 1)
        self.agent = torch.nn.Linear(hidden, 1)


def epoch_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int, window: int = 16) -> list[np.ndarray]:
    """One epoch's batches: a seeded permutation, sorted by length within windows of ``window``
    batches (less padding: contexts range from ~90 to ~220 tokens), batch order shuffled."""
    rng = np.random.default_rng([seed, 2, epoch])
    order = rng.permutation(len(lengths))
    batches = []
    for start in range(0, len(order), batch_size * window):
        chunk = order[start : start + batch_size * window]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def schedule_steps(config: Any, states: int) -> tuple[int, int]:
    """(optimizer steps the warm-start takes, steps of its learning-rate schedule) for a ``StarterConfig``: the two differ
    when ``schedule_epochs`` is longer than ``epochs`` and the warm-start stops mid-schedule."""
    steps = max(1, math.ceil(config.epochs * states / config.batch_size))
    schedule = math.ceil((config.schedule_epochs or config.epochs) * states / config.batch_size)
    return steps, max(steps, schedule)


def lr_factor(step: int, total: int, warmup: int) -> float:
    """The schedule's multiplier of the peak learning rate at ``step``: linear warm-up, then cosine to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def batch_loss(
    model: torch.nn.Module,
    heads: AuxHeads,
    processor: Any,
    batch: list[State],
    aux_weight: float,
    captured: dict[str, torch.Tensor],
    answers: list[list[int]] | None = None,
    answer_weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Answer cross-entropy (+ the auxiliary losses); also exact-match answer accuracy.

    ``answers``: the reply ids to learn per state (default: the solver's); the auxiliary
    per-cell targets are always the solver's."""
    answers = answers if answers is not None else [s.answer_ids for s in batch]
    sequences = [s.input_ids + answer for s, answer in zip(batch, answers, strict=True)]
    inputs = model_inputs(processor, sequences, [s.images for s in batch], padding_side="left")
    longest = max(len(answer) for answer in answers)
    logits = model(**inputs, logits_to_keep=longest + 1).logits[:, :-1]  # (B, R, V)
    targets = inputs["input_ids"][:, -longest:]  # (B, R)
    lengths = torch.tensor([len(answer) for answer in answers])
    mask = torch.arange(longest).unsqueeze(0) >= (longest - lengths).unsqueeze(1)  # (B, R)
    token_loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, R)
    answer_loss = (token_loss * mask).sum() / mask.sum()
    correct = ((logits.argmax(-1) == targets) | ~mask).all(-1).float().mean()
    metrics = {"answer_loss": answer_loss.item(), "answer_accuracy": correct.item()}
    loss = answer_weight * answer_loss
    if aux_weight > 0:
        hidden = captured["hidden"]  # (B, T, H)
        image_mask = inputs["input_ids"] == image_token_id(processor)  # (B, T), one frame per context
        cells = batch[0].cell_classes.shape[0]
        # The last frame of each context is the current one; its pads are the last `cells` image positions.
        positions = [torch.nonzero(row).squeeze(-1)[-cells:] for row in image_mask]
        image_hidden = torch.stack([hidden[b, p] for b, p in enumerate(positions)])  # (B, cells, H)
        cell_targets = torch.from_numpy(np.stack([s.cell_classes for s in batch]))  # (B, cells)
        cell_loss = F.cross_entropy(heads.cell_action(image_hidden).transpose(1, 2), cell_targets)
        agent_targets = torch.tensor([s.agent_cell for s in batch])
        agent_loss = F.cross_entropy(heads.agent(image_hidden).squeeze(-1), agent_targets)
        loss = loss + aux_weight * (cell_loss + agent_loss)
        metrics |= {"cell_loss": cell_loss.item(), "agent_loss": agent_loss.item()}
    metrics["loss"] = loss.item()
    return loss, metrics


def _train_step(
    model: torch.nn.Module,
    heads: AuxHeads,
    processor: Any,
    batch: list[State],
    step: int,
    config: Any,
    captured: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    parameters: list[torch.nn.Parameter],
) -> dict[str, float]:
    """One optimizer step on ``batch`` with the noisy demonstrator's answers mixed in; the step's metrics."""
    # The noisy demonstrator: each answer is its move instead of the solver's with chance answer_noise,
    # drawn anew every step, so a state where the two differ is learnt as a mix of both.
    noisy = np.random.default_rng([config.seed, 4, step]).random(len(batch)) < config.answer_noise
    answers = [s.demo_ids if swap else s.answer_ids for s, swap in zip(batch, noisy, strict=True)]
    loss, metrics = batch_loss(
        model, heads, processor, batch, config.aux_weight, captured, answers, config.answer_weight
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()
    scheduler.step()
    return metrics


def _curve_point(
    model: torch.nn.Module,
    window: list[dict[str, float]],
    done: int,
    states: int,
    config: Any,
    started: float,
    measure: Callable[[int, float], dict[str, float]] | None,
) -> tuple[dict[str, float], float]:
    """A learning-curve point: the window's mean metrics (+ ``measure``'s numbers); (point, seconds ``measure`` took)."""
    point = {
        "step": done,
        "epoch": round(done * config.batch_size / states, 3),
        "seconds": round(time.perf_counter() - started, 1),
        **{k: round(float(np.mean([m[k] for m in window])), 4) for k in window[0]},
    }
    if measure is None:
        return point, 0.0
    measure_started = time.perf_counter()
    model.eval()
    point |= measure(done, point["epoch"])
    model.train()
    return point, time.perf_counter() - measure_started


def _train(
    model: torch.nn.Module,
    processor: Any,
    config: Any,
    states: list[State],
    steps: int,
    schedule: int,
    started: float,
    log: Callable[[str], None],
    on_checkpoint: Callable[[int, float], dict[str, float]] | None,
    checkpoints: int,
) -> tuple[list[dict[str, float]], float]:
    """The training loop, with the auxiliary heads and the hook that feeds them; (learning curve, checkpoint seconds)."""
    heads = AuxHeads(model.config.text_config.hidden_size)
    parameters = list(model.parameters()) + list(heads.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=config.learning_rate, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, schedule, config.warmup_steps))
    captured: dict[str, torch.Tensor] = {}
    layer = model.model.language_model.layers[config.aux_layer - 1]
    hook = layer.register_forward_hook(lambda _m, _i, output: captured.__setitem__("hidden", output))
    per_epoch = math.ceil(len(states) / config.batch_size)
    lengths = np.array([len(s.input_ids) for s in states])
    log_every = max(1, steps // 20)
    checkpoint_steps = {round(steps * (k + 1) / (checkpoints + 1)) for k in range(checkpoints)} | {steps}
    curve: list[dict[str, float]] = []
    window: list[dict[str, float]] = []
    checkpoint_seconds = 0.0  # time spent in on_checkpoint, not training
    meter = ProgressMeter(steps, "step")
    last_line = time.perf_counter()
    model.train()
    try:
        for step in range(steps):
            epoch, offset = divmod(step, per_epoch)
            if offset == 0:
                batches = epoch_batches(lengths, config.batch_size, config.seed, epoch)
            batch = [states[i] for i in batches[offset]]
            window.append(
                _train_step(model, heads, processor, batch, step, config, captured, optimizer, scheduler, parameters)
            )
            done = step + 1
            if done % log_every == 0 or done in checkpoint_steps:
                measure = on_checkpoint if done in checkpoint_steps else None
                point, measured = _curve_point(model, window, done, len(states), config, started, measure)
                window = []
                checkpoint_seconds += measured
                curve.append(point)
                details = ", ".join(f"{k} {v}" for k, v in point.items() if k != "step")
                log(f"warm-start: {meter.text(done)}; {details}")
                last_line = time.perf_counter()
            elif time.perf_counter() - last_line > PROGRESS_EVERY_S:  # a slow machine: say it is alive
                log(f"warm-start: {meter.text(done)}")
                last_line = time.perf_counter()
    finally:
        hook.remove()
        model.eval()
    return curve, checkpoint_seconds


def warm_start(
    model: torch.nn.Module,
    processor: Any,
    config: Any,
    log: Callable[[str], None] = print,
    on_checkpoint: Callable[[int, float], dict[str, float]] | None = None,
    checkpoints: int = 0,
) -> dict[str, Any]:
    """Train ``model`` in place on solver imitation; returns the record for ``starter.json``.

    ``on_checkpoint(step, epoch)``, called ``checkpoints`` times during training and once
    at the end, may measure the model (e.g. greedy success); its numbers join the curve.
    """
    started = time.perf_counter()
    eval_set = load_eval_set(config.eval_set)
    layouts = training_mazes(eval_set, config.train_mazes)
    states = build_states(
        processor,
        layouts,
        eval_set.cell_px,
        eval_set.max_moves,
        config.action_format,
        config.history_images,
        config.max_states,
        config.seed,
        config.history_noise,
        config.history_text,
    )
    prepared = time.perf_counter() - started
    steps, schedule = schedule_steps(config, len(states))
    log(
        f"warm-start: {len(layouts)} mazes, {len(states)} states ({prepared:.1f} s to render), "
        f"{steps} steps of {config.batch_size} ({config.epochs} epochs"
        + (f" of a {schedule}-step schedule" if schedule > steps else "")
        + ")"
    )
    curve, checkpoint_seconds = _train(
        model, processor, config, states, steps, schedule, started, log, on_checkpoint, checkpoints
    )
    return {
        "warm_start": {
            "mazes": len(layouts),
            "states": len(states),
            "steps": steps,
            "seconds": round(time.perf_counter() - started - checkpoint_seconds, 1),
            "checkpoint_seconds": round(checkpoint_seconds, 1),
            "final_answer_accuracy": curve[-1]["answer_accuracy"],
            "curve": curve,
        }
    }
