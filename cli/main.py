"""Command line: ``mazerl <command>``. ``mazerl run`` is the README's main job."""

from __future__ import annotations

import argparse
import sys

from cli.build_starter import add_build_starter_command
from cli.eval import add_eval_command
from cli.ray import add_ray_command
from cli.run import add_run_command
from cli.ui import add_ui_command
from envs.maze import Layout, MazeEnv, solve
from mazerl.training.config import MAX_SEED

# The demo prints the maze one character per cell: a larger one wraps on a terminal, and its generation and
# solution take seconds to minutes (a size in the millions would never finish).
MAX_DEMO_SIZE = 99


def _demo(args: argparse.Namespace) -> int:
    if not 0 <= args.seed <= MAX_SEED:
        print(f"error: --seed {args.seed} must be between 0 and {MAX_SEED}", file=sys.stderr)
        return 2
    if args.size > MAX_DEMO_SIZE:
        print(
            f"error: --size {args.size} is larger than the demo prints (one character per cell, at most "
            f"{MAX_DEMO_SIZE} to a line); use an odd integer from 5 to {MAX_DEMO_SIZE}, e.g. 9",
            file=sys.stderr,
        )
        return 2
    try:
        layout = Layout.generate(args.seed, args.size)
    except ValueError as exc:  # the world's own rule: an odd size >= 5
        print(f"error: --size: {exc}", file=sys.stderr)
        return 2
    moves = solve(layout)
    env = MazeEnv(size=args.size, max_moves=len(moves))  # the solver's whole path: a large maze needs many moves
    env.reset(layout=layout)
    print(env.render_text(), "\n")
    for text in moves:
        _, reward, *_, info = env.step(text)
        print(f"{text:18s} -> {info['feedback']}")
    print("\n" + env.render_text())
    print(f"reward {reward}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mazerl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="play one maze with the shortest-path solver")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--size", type=int, default=9)
    demo.set_defaults(func=_demo)
    add_run_command(sub)
    add_build_starter_command(sub)
    add_eval_command(sub)
    add_ui_command(sub)
    add_ray_command(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
