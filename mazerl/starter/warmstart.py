"""Warm-start of the starter: supervised imitation of the shortest-path solver.

Data. One state per (maze, agent cell): the agent stands on any open cell, the context is
the conversation an episode would have had walking there from the start (the task
prompt, the replies and the env's feedback kept by ``history_text``, the frames kept by
``history_images``), and the
answer is the solver's next action from that cell (``('stop', 'stop')`` on the target).
The walk arrives on the cell from a random open neighbour, with random wall bumps and
excursions mixed in (``history_noise``; see :func:`noisy_walk` for why). Contexts are rendered by
``chat.render`` through the real processor and chat template, so the starter learns on
exactly what the runner shows it. States whose walk already spends the budget are left out.

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
(:func:`demonstrator_action`); where the maze's way leads round, the starter then learns a mix
of the two, so its mistakes are near-ties there. The auxiliary per-cell targets stay the
solver's, so what the model sees of the maze is learnt cleanly.

Loop: AdamW, linear warm-up then cosine decay, batches of ``batch_size`` states drawn
from one seeded permutation per epoch (length-sorted within windows, to pad less),
gradient clipping at 1.0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from envs.evalset import EvalSet
from envs.evalset import load as load_eval_set
from envs.maze import DIRECTIONS, Action, Layout, MazeEnv, action_text, solve_actions
from envs.pool import training_pool, world_capacity
from mazerl.policy.chat import Conversation, end_of_turn_id, image_token_id, model_inputs, render
from mazerl.progress import ProgressMeter

PROGRESS_EVERY_S = 30.0  # at most this long between progress lines, however slow the steps
WALL_CLASS = 5  # per-cell classes: 0-3 move, 4 stop (the target), 5 wall


@dataclass(frozen=True)
class State:
    """One supervised example: a rendered context and the answer to learn."""

    input_ids: list[int]
    images: list[np.ndarray]
    answer_ids: list[int]  # the solver's action
    demo_ids: list[int]  # the noisy demonstrator's (heads for the target): see demonstrator_action
    cell_classes: np.ndarray  # (cells,) per-cell solver action or WALL_CLASS, row-major over the frame's grid
    agent_cell: int  # row-major index of the agent's cell


def training_mazes(eval_set: EvalSet, which: str) -> list[Layout]:
    """The warm-start's mazes: the GRPO training pool (every maze outside the eval set), plus the eval set for 'all'."""
    if eval_set.size != 7:
        raise ValueError(
            f"the warm-start enumerates the 7x7 world, but eval set {eval_set.name} is {eval_set.size}x{eval_set.size}; "
            "build the starter for maze256-small-v1"
        )
    pool = [layout for _, layout in training_pool(eval_set, world_capacity(eval_set))]  # all 512 outside the set
    return pool + list(eval_set.layouts) if which == "all" else pool


def cell_classes(layout: Layout) -> np.ndarray:
    """(H*W,) the solver's action from every open cell (STOP on the target), WALL_CLASS elsewhere."""
    classes = np.full(layout.walls.shape, WALL_CLASS, dtype=np.int64)
    for row, col in zip(*np.nonzero(layout.walls == 0), strict=True):
        classes[row, col] = solve_actions(layout, start=(int(row), int(col)))[0]
    return classes.reshape(-1)


def _reply_ids(processor: Any, action: int, action_format: str) -> list[int]:
    ids = processor.tokenizer(action_text(action, action_format), add_special_tokens=False)["input_ids"]
    return list(ids) + [end_of_turn_id(processor)]


REVERSE = {0: 2, 1: 3, 2: 0, 3: 1}


def demonstrator_action(layout: Layout, cell: tuple[int, int]) -> int:
    """What a demonstrator who heads for the red square does at ``cell``: the open move that brings
    the agent nearest the target as the crow flies (Manhattan distance; ties: the lower action id),
    and stop on the target.

    Where the maze's way leads round, away from the target, this is not the solver's move: the
    warm-start's ``answer_noise`` mixes it into the answers there, so the starter's mistakes are
    near-ties between the two (what GRPO can sharpen) rather than confident errors.
    """
    if cell == layout.target:
        return int(Action.STOP)
    open_moves = [
        (abs(cell[0] + dr - layout.target[0]) + abs(cell[1] + dc - layout.target[1]), action)
        for action, (dr, dc) in DIRECTIONS.items()
        if not layout.walls[cell[0] + dr, cell[1] + dc]
    ]
    return min(open_moves)[1]


def noisy_walk(layout: Layout, cell: tuple[int, int], noise: float, rng: np.random.Generator) -> list[int]:
    """Actions from the start to ``cell``, arriving from a random open neighbour, with noise mixed in.

    Why not the maze's path: on path histories the last action gives the answer away (on
    the way to the target "continue" is right, in a dead-end branch "go back" always is),
    so a model learns to read the history instead of the frame and, once it strays, swings
    back and forth. Here the walk goes to a random open neighbour of ``cell`` first (through
    ``cell`` when that neighbour lies beyond it) and then steps onto ``cell``, so the last
    move says nothing about the answer; before each step, with probability ``noise / 2``
    each, it also bumps into a wall or steps into a side cell and back.
    """
    neighbours = [
        (cell[0] + d[0], cell[1] + d[1])
        for d in DIRECTIONS.values()
        if not layout.walls[cell[0] + d[0], cell[1] + d[1]]
    ]
    if cell == layout.agent and rng.random() < 0.5:
        path: list[int] = []  # the episode's very first turn
    else:
        before = neighbours[int(rng.integers(len(neighbours)))]
        to_before = [] if before == layout.agent else solve_actions(Layout(layout.walls, layout.agent, before))[:-1]
        back = next(a for a, d in DIRECTIONS.items() if (before[0] + d[0], before[1] + d[1]) == cell)
        path = [*to_before, back]
    walk: list[int] = []
    position = layout.agent
    for step in [*path, None]:
        draw = rng.random()
        around = {a: (position[0] + d[0], position[1] + d[1]) for a, d in DIRECTIONS.items()}
        blocked = [a for a, n in around.items() if layout.walls[n]]
        sides = [a for a, n in around.items() if not layout.walls[n] and a != step]
        if draw < noise / 2 and blocked:
            walk.append(int(rng.choice(blocked)))
        elif draw < noise and sides:
            side = int(rng.choice(sides))
            walk += [side, REVERSE[side]]
        if step is not None:
            walk.append(step)
            position = around[step]
    return walk


def state_cells(
    layouts: list[Layout], max_moves: int, noise: float, seed: int
) -> list[tuple[int, tuple[int, int], list[int]]]:
    """(maze index, agent cell, walk from the start) of every state whose walk leaves a move to spare."""
    cells = []
    for maze, layout in enumerate(layouts):
        for row, col in zip(*np.nonzero(layout.walls == 0), strict=True):
            cell = (int(row), int(col))
            rng = np.random.default_rng([seed, 3, maze, int(row), int(col)])
            walk = noisy_walk(layout, cell, noise, rng)
            if len(walk) + 1 > max_moves:
                walk = noisy_walk(layout, cell, 0.0, rng)  # without the noise, if that fits
            if len(walk) + 1 <= max_moves:
                cells.append((maze, cell, walk))
    return cells


def build_states(
    processor: Any,
    layouts: list[Layout],
    cell_px: int,
    max_moves: int,
    action_format: str,
    history_images: int | str,
    max_states: int | None = None,
    seed: int = 0,
    noise: float = 0.0,
    history_text: int | str = "all",
) -> list[State]:
    """The states of ``layouts`` (a seeded subset of ``max_states`` if given), rendered through the chat template.

    Walks are replayed through :class:`MazeEnv`, so feedback texts and frames are the env's own.
    """
    cells = state_cells(layouts, max_moves, noise, seed)
    if max_states is not None and max_states < len(cells):
        chosen = np.random.default_rng([seed, 1]).permutation(len(cells))[:max_states]
        cells = [cells[i] for i in sorted(chosen.tolist())]
    replies = {action: _reply_ids(processor, action, action_format) for action in range(5)}
    env = MazeEnv(size=layouts[0].size, max_moves=max_moves + 1, action_format=action_format, cell_px=cell_px)
    classes = {maze: cell_classes(layouts[maze]) for maze in sorted({maze for maze, _, _ in cells})}
    states = []
    for maze, cell, walk in cells:
        layout = layouts[maze]
        frame, _ = env.reset(layout=layout)
        conversation = Conversation.start(env.prompt(), frame)
        for action in walk:
            text = action_text(action, action_format)
            frame, _, _, _, info = env.step(text)
            conversation.add_reply(replies[action], text)
            conversation.add_observation(info["feedback"], frame)
        assert env.agent == cell, f"walk to {cell} ended at {env.agent}"
        input_ids, images = render(processor, conversation, history_images, history_text)
        index = cell[0] * layout.walls.shape[1] + cell[1]
        answer = int(classes[maze][index])
        demo = demonstrator_action(layout, cell)
        states.append(State(input_ids, images, replies[answer], replies[demo], classes[maze], index))
    return states


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
            window.append(metrics)
            done = step + 1
            if done % log_every == 0 or done in checkpoint_steps:
                point = {
                    "step": done,
                    "epoch": round(done * config.batch_size / len(states), 3),
                    "seconds": round(time.perf_counter() - started, 1),
                    **{k: round(float(np.mean([m[k] for m in window])), 4) for k in window[0]},
                }
                window = []
                if done in checkpoint_steps and on_checkpoint is not None:
                    measure_started = time.perf_counter()
                    model.eval()
                    point |= on_checkpoint(done, point["epoch"])
                    model.train()
                    checkpoint_seconds += time.perf_counter() - measure_started
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
