"""Command line: ``mazerl <command>``. ``mazerl run`` is the README's main job."""

from __future__ import annotations

import argparse
import sys

from cli.build_starter import add_build_starter_command
from cli.eval import add_eval_command
from cli.ray import add_ray_command
from cli.run import add_run_command
from cli.ui import add_ui_command
from envs.maze import MazeEnv, solve

MAX_SEED = 2**32 - 1  # numpy's seeding takes 0 .. 2**32 - 1


def _demo(args: argparse.Namespace) -> int:
    if not 0 <= args.seed <= MAX_SEED:
        print(f"error: --seed {args.seed} must be between 0 and {MAX_SEED}", file=sys.stderr)
        return 2
    try:
        env = MazeEnv(size=args.size, max_moves=50)
    except ValueError as exc:  # the world's own rule: an odd size >= 5
        print(f"error: --size: {exc}", file=sys.stderr)
        return 2
    env.reset(seed=args.seed)
    print(env.render_text(), "\n")
    for text in solve(env.layout):
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
