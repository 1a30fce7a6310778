"""Greedy eval of every maze of maze256-small-v1: the generate-based engine against the prefix-caching one.

    python bench/engine_equality.py [--model DIR] [--mazes 256]

Plays the whole embedded eval set greedily in the eval's chunks of 32 mazes, once as eval
ran before (``HFEngine``: transformers' ``generate``, no vision cache) and once as it runs
now (``PrefixCachingEngine`` with the vision cache), and compares every reply of every
maze token for token. Default model: the shipped starter. Writes its section of
docs/performance.md (the ``tests/test_prefix_engine.py`` cases do the same on the reduced
starter in every context mode).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

import torch  # noqa: E402

from bench.report import write_section  # noqa: E402
from envs.evalset import load as load_eval_set  # noqa: E402
from mazerl.policy.engines import GenerationSettings, HFEngine  # noqa: E402
from mazerl.policy.episodes import run_episodes  # noqa: E402
from mazerl.policy.loader import load_policy  # noqa: E402
from mazerl.policy.prefix_engine import PrefixCachingEngine  # noqa: E402
from mazerl.policy.vision_cache import VisionCache  # noqa: E402
from mazerl.starter.record import recorded_context_mode  # noqa: E402


def play(engine, processor, layouts, mode, chunk: int = 32) -> tuple[list, float]:
    started = time.perf_counter()
    episodes = []
    for start in range(0, len(layouts), chunk):
        episodes += run_episodes(
            engine,
            processor,
            layouts[start : start + chunk],
            GenerationSettings(greedy=True, max_new_tokens=24),
            history_images=mode[0],
            history_text=mode[1],
        )
    return episodes, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: the shipped starter)")
    parser.add_argument("--mazes", type=int, default=256)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as one eval worker
    if args.model is None:
        from mazerl.starter.build import ensure_starter

        args.model = str(ensure_starter())
    mode = recorded_context_mode(args.model)
    eval_set = load_eval_set("maze256-small-v1")
    layouts = list(eval_set.layouts[: args.mazes])
    before_load = os.getloadavg()[0]
    reference = load_policy(args.model, device="cpu")
    old, old_s = play(HFEngine(reference.model, reference.processor), reference.processor, layouts, mode)
    policy = load_policy(args.model, device="cpu")
    VisionCache().attach(policy.model)
    engine = PrefixCachingEngine.from_policy(policy)
    new, new_s = play(engine, policy.processor, layouts, mode)
    differ = [i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a.actions != b.actions]
    stats = engine.stats
    body = "\n".join(
        [
            "## Greedy eval: `generate` against the prefix-caching engine (`bench/engine_equality.py`)",
            "",
            f"Model `{Path(args.model).name}` (context mode history_images={mode[0]}, history_text={mode[1]}), "
            f"{len(layouts)} mazes of `maze256-small-v1` in chunks of 32, one torch thread.",
            "",
            "| engine | seconds | solved |",
            "| --- | ---: | ---: |",
            f"| HFEngine (`generate`, as eval ran before) | {old_s:.1f} | {sum(e.solved for e in old)} |",
            f"| PrefixCachingEngine + vision cache (eval now) | {new_s:.1f} | {sum(e.solved for e in new)} |",
            "",
            f"Replies identical maze by maze, token for token: **{'yes' if not differ else 'no'}** "
            f"({len(layouts) - len(differ)} of {len(layouts)} mazes{'; differ: ' + str(differ[:10]) if differ else ''}). "
            f"Speed-up {old_s / new_s:.1f}x; the new engine prefilled {stats.prefill_tokens / 1e3:.0f}k of "
            f"{stats.context_tokens / 1e3:.0f}k context tokens in {stats.forward_calls} forward calls. "
            f"Load average {before_load:.1f}-{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.",
        ]
    )
    print(body)
    if not args.no_write:
        write_section("engine_equality", body)
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
