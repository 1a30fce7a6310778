"""How a policy fails: greedy success on the 256 held-out mazes, and how close its mistakes are to ties.

    python bench/starter_probe.py --model DIR [--model DIR2 ...]

For each model: greedy episodes on all of ``maze256-small-v1`` in the model's recorded context
mode, then at the *first wrong state* of every failed episode (the first turn whose action is
not the solver's from that cell) the probability the policy gives the solver's action there
(each of the five replies scored in exactly the context the episode showed). A starter whose
mistakes are near-ties (the solver's action close behind the chosen one) is what GRPO can
sharpen; a confidently wrong one (the solver's action far behind) it can barely move.
:func:`probe` is also what ``bench/starter_search.py`` measures at each warm-start checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def reply_probabilities(model: Any, processor: Any, contexts: list[tuple[list[int], list]]) -> list[list[float]]:
    """For each (input_ids, images) context: the probability of each action's canonical reply (0-4)."""
    import torch

    from envs.maze import action_text
    from mazerl.policy.chat import end_of_turn_id, model_inputs

    replies = [
        [*processor.tokenizer(action_text(a), add_special_tokens=False)["input_ids"], end_of_turn_id(processor)]
        for a in range(5)
    ]
    out: list[list[float]] = []
    for start in range(0, len(contexts), 16):
        chunk = contexts[start : start + 16]
        sequences = [ids + reply for ids, _ in chunk for reply in replies]
        images = [imgs for _, imgs in chunk for _ in replies]
        inputs = model_inputs(processor, sequences, images, padding_side="left")
        longest = max(len(r) for r in replies)
        with torch.no_grad():
            logits = model(**inputs, logits_to_keep=longest + 1).logits[:, :-1].float()
        log_probs = torch.log_softmax(logits, -1)
        targets = inputs["input_ids"][:, -longest:]
        picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B*5, R)
        for i in range(len(chunk)):
            row = []
            for a, reply in enumerate(replies):
                k = i * len(replies) + a
                row.append(float(picked[k, longest - len(reply) :].sum().exp()))
            out.append(row)
    return out


def probe(
    model: Any, processor: Any, history_images: Any, history_text: Any, cache_vision: bool = True
) -> dict[str, float]:
    """Greedy success on the 256 held-out mazes and the solver's probability at first wrong states.

    ``cache_vision`` routes the vision tower through a cache for good (leave it off for a model
    that is still being trained)."""
    from envs.evalset import load as load_eval_set
    from envs.maze import DIRECTIONS, parse_tuple_action, solve_actions
    from mazerl.policy.engines import GenerationSettings
    from mazerl.policy.episodes import run_episodes
    from mazerl.policy.prefix_engine import PrefixCachingEngine
    from mazerl.policy.vision_cache import VisionCache

    eval_set = load_eval_set("maze256-small-v1")
    if cache_vision:
        VisionCache().attach(model)
    episodes = run_episodes(
        PrefixCachingEngine(model, processor, max_batch_size=256),
        processor,
        list(eval_set.layouts),
        GenerationSettings(greedy=True, max_new_tokens=12),
        max_moves=eval_set.max_moves,
        cell_px=eval_set.cell_px,
        history_images=history_images,
        history_text=history_text,
    )
    contexts, solver = [], []
    for episode in episodes:
        if episode.solved:
            continue
        cell = episode.layout.agent
        for turn in episode.turns:
            right = solve_actions(type(episode.layout)(episode.layout.walls, cell, episode.layout.target))[0]
            action, _ = parse_tuple_action(turn.response_text)
            if action != right:
                contexts.append((turn.input_ids, turn.images))
                solver.append(right)
                break
            if action in DIRECTIONS:
                dr, dc = DIRECTIONS[action]
                if not episode.layout.walls[cell[0] + dr, cell[1] + dc]:
                    cell = (cell[0] + dr, cell[1] + dc)
    probabilities = reply_probabilities(model, processor, contexts) if contexts else []
    at_solver = [row[a] for row, a in zip(probabilities, solver, strict=True)]
    success = sum(e.solved for e in episodes) / len(episodes)
    return {
        "greedy_success": round(success, 4),
        "first_wrong_states": len(at_solver),
        "solver_prob_mean": round(sum(at_solver) / max(len(at_solver), 1), 4),
        "solver_prob_over_0.3": round(sum(p > 0.3 for p in at_solver) / max(len(at_solver), 1), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, nargs="+", required=True)
    args = parser.parse_args()
    import torch

    from mazerl.policy.loader import load_policy
    from mazerl.starter.record import recorded_context_mode

    torch.set_num_threads(1)
    for directory in args.model:
        policy = load_policy(directory, device="cpu")
        images, text = recorded_context_mode(directory)
        print(json.dumps({"model": str(directory), **probe(policy.model, policy.processor, images, text)}), flush=True)


if __name__ == "__main__":
    main()
