"""Does the policy see the walls around the agent? A linear probe per layer, at the reply position.

    python bench/wall_probe.py --model DIR [--adapter NAME=DIR ...]

For the starter (and each trained adapter laid over it): fresh contexts (the task prompt and
one frame, no feedback line) with the agent placed on a room cell of a maze, the text model's
hidden state at the last context position (where the reply's first token is chosen) at every
layer, and one logistic regression per (layer, side) that reads from it whether the cell on
that side of the agent is a wall. Fitted on states of training-pool mazes, scored on states of
held-out mazes (``maze256-small-v1``); "always the majority" is the floor to beat.

Why: success can rise because GRPO sharpened a direction prior ("head for the red square")
while what the policy reads of the frame got worse. An arm that raises success while the
probe falls is sharpening a prior, not learning to see (issue 19). Room cells only: on a
passage cell between two rooms the walls follow from the position alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.maze import DIRECTIONS, Layout  # noqa: E402

SIDES = ("right", "up", "left", "down")  # DIRECTIONS' order: the move ids 0-3


def room_states(layouts: list[Layout], count: int, seed: int) -> list[tuple[Layout, tuple[int, int]]]:
    """``count`` (layout, room cell) pairs drawn without repeats: the agent on a room cell that is not the target."""
    candidates = [
        (index, (row, col))
        for index, layout in enumerate(layouts)
        for row in range(1, layout.size - 1, 2)
        for col in range(1, layout.size - 1, 2)
        if (row, col) != layout.target
    ]
    if count > len(candidates):
        raise ValueError(f"count ({count}) is more than the {len(candidates)} room states these mazes have")
    picked = np.random.default_rng(seed).choice(len(candidates), size=count, replace=False)
    return [(layouts[candidates[i][0]], candidates[i][1]) for i in picked]


def wall_labels(layout: Layout, cell: tuple[int, int]) -> list[int]:
    """1 where the cell on that side (right, up, left, down) of ``cell`` is a wall."""
    return [int(layout.walls[cell[0] + dr, cell[1] + dc]) for dr, dc in DIRECTIONS.values()]


def reply_position_states(model: Any, processor: Any, states: list, cell_px: int, batch: int = 64) -> np.ndarray:
    """(layers + 1, N, hidden): the text model's hidden state at the last context position, per layer."""
    import torch

    from envs.maze import MazeEnv
    from mazerl.policy.chat import Conversation, model_inputs, render

    contexts = []
    for layout, cell in states:
        env = MazeEnv(size=layout.size, cell_px=cell_px)
        frame, _ = env.reset(layout=Layout(layout.walls, cell, layout.target))
        contexts.append(render(processor, Conversation.start(env.prompt(), frame), 1, "feedback"))
    chunks = []
    for start in range(0, len(contexts), batch):
        part = contexts[start : start + batch]
        inputs = model_inputs(processor, [ids for ids, _ in part], [images for _, images in part], "left")
        with torch.no_grad():
            hidden = model(**inputs, output_hidden_states=True, logits_to_keep=1).hidden_states
        chunks.append(torch.stack([layer[:, -1, :] for layer in hidden]).float().numpy())
    return np.concatenate(chunks, axis=1)


def probe_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray) -> float:
    """Held-out accuracy of a logistic regression on standardised features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if len(set(train_y.tolist())) < 2:
        return float(np.mean(test_y == train_y[0]))
    classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=1.0))
    return float(classifier.fit(train_x, train_y).score(test_x, test_y))


def probe(model: Any, processor: Any, fit_states: list, test_states: list, cell_px: int) -> dict[str, Any]:
    """Per layer and side: the probe's held-out accuracy; and the majority floor per side."""
    fit_x = reply_position_states(model, processor, fit_states, cell_px)
    test_x = reply_position_states(model, processor, test_states, cell_px)
    fit_y = np.array([wall_labels(layout, cell) for layout, cell in fit_states])
    test_y = np.array([wall_labels(layout, cell) for layout, cell in test_states])
    layers = [
        {side: round(probe_accuracy(fit_x[k], fit_y[:, s], test_x[k], test_y[:, s]), 3) for s, side in enumerate(SIDES)}
        for k in range(fit_x.shape[0])
    ]
    majority = {
        side: round(float(max(test_y[:, s].mean(), 1 - test_y[:, s].mean())), 3) for s, side in enumerate(SIDES)
    }
    return {"layers": layers, "majority": majority}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="the starter (base model) directory")
    parser.add_argument("--adapter", nargs="*", default=[], help="NAME=DIR: a trained LoRA adapter over --model")
    parser.add_argument("--fit-states", type=int, default=1500, help="room states of pool mazes to fit on")
    parser.add_argument("--test-states", type=int, default=600, help="room states of held-out mazes to score")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch

    from envs.evalset import load as load_eval_set
    from envs.pool import training_pool
    from mazerl.policy.loader import load_policy

    torch.set_num_threads(2)
    eval_set = load_eval_set("maze256-small-v1")
    fit = room_states([layout for _, layout in training_pool(eval_set, 512)], args.fit_states, args.seed)
    test = room_states(list(eval_set.layouts), args.test_states, args.seed + 1)
    arms = [("starter", None)] + [tuple(item.split("=", 1)) for item in args.adapter]
    for name, adapter in arms:
        policy = load_policy(args.model, adapter_dir=adapter, device="cpu", merge_adapter=adapter is not None)
        result = probe(policy.model, policy.processor, fit, test, eval_set.cell_px)
        print(json.dumps({"arm": name, **result}), flush=True)


if __name__ == "__main__":
    main()
