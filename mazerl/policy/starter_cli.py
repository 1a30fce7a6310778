"""``mazerl build-starter``: build the tiny Qwen3-VL starter model, with progress output."""

from __future__ import annotations

import argparse


def add_build_starter_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("build-starter", help="build the tiny Qwen3-VL starter model (about 5-10 min)")
    parser.add_argument("--reduced", action="store_true", help="the seconds-long CI build (barely trained)")
    parser.add_argument(
        "--out", default=None, help="model directory to create; default <data root>/models/maze-starter-v1"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of initialisation and data order (default 0)")
    parser.add_argument("--data-root", default=None, help="data root (default $MAZERL_HOME or ./.mazerl)")
    parser.set_defaults(func=run_build_starter_command)


def run_build_starter_command(args: argparse.Namespace) -> int:
    from mazerl.policy.starter import StarterConfig, build_starter, starter_dir

    config = StarterConfig.reduced_build(args.seed) if args.reduced else StarterConfig(seed=args.seed)
    out = args.out or starter_dir(args.data_root)
    build_starter(out, config, log=lambda line: print(line, flush=True))
    return 0
