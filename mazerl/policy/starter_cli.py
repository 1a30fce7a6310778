"""``mazerl build-starter``: build the tiny Qwen3-VL starter model, with progress output."""

from __future__ import annotations

import argparse


def add_build_starter_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("build-starter", help="build the tiny Qwen3-VL starter model (about 5-10 min)")
    parser.add_argument("--reduced", action="store_true", help="the seconds-long CI build (barely trained)")
    parser.add_argument(
        "--out", default=None, help="model directory to create; default <data root>/models/maze-starter-v2"
    )
    parser.add_argument(
        "--ship",
        action="store_true",
        help="replace the starter shipped with the package (mazerl/policy/starter_data) and print its digest to pin",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of initialisation and data order (default 0)")
    parser.add_argument("--data-root", default=None, help="data root (default $MAZERL_HOME or ./.mazerl)")
    parser.set_defaults(func=run_build_starter_command)


def run_build_starter_command(args: argparse.Namespace) -> int:
    from mazerl.policy.starter import StarterConfig, build_starter, starter_dir

    config = StarterConfig.reduced_build(args.seed) if args.reduced else StarterConfig(seed=args.seed)
    if args.ship:
        return ship(config)
    out = args.out or starter_dir(args.data_root)
    build_starter(out, config, log=lambda line: print(line, flush=True))
    return 0


def ship(config) -> int:
    """Build into a temporary directory, then swap it in for the shipped copy and print the digest to pin."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from mazerl.policy.shipped_starter import SHIPPED_DIR, directory_digest
    from mazerl.policy.starter import StarterConfig, build_starter

    if config != StarterConfig():
        print("error: --ship ships the default config only (no --reduced, --seed 0)")
        return 2
    with tempfile.TemporaryDirectory(dir=SHIPPED_DIR.parent.parent) as tmp:
        built = build_starter(Path(tmp) / SHIPPED_DIR.name, config, log=lambda line: print(line, flush=True))
        old = SHIPPED_DIR.with_name(SHIPPED_DIR.name + ".old")
        SHIPPED_DIR.parent.mkdir(parents=True, exist_ok=True)
        if SHIPPED_DIR.exists():
            os.replace(SHIPPED_DIR, old)
        os.replace(built, SHIPPED_DIR)
        shutil.rmtree(old, ignore_errors=True)
    print(
        f'shipped {SHIPPED_DIR}; pin it in mazerl/policy/shipped_starter.py: SHIPPED_DIGEST = "{directory_digest(SHIPPED_DIR)}"'
    )
    return 0
