"""``mazerl build-starter``: build the tiny Qwen3-VL starter model, with progress output.

The flags are checked before anything is built or written (exit code 2 with the flag and the
fix); the build itself writes to a temporary directory and renames it into place.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from mazerl.atomic import install_dir
from mazerl.preflight.data_root import check_data_root, check_root_env
from mazerl.preflight.input_error import InputError
from mazerl.starter.shipped import SHIPPED_DIR, directory_digest
from mazerl.training.config import MAX_SEED

EXIT_OK, EXIT_BAD_INPUT = 0, 2


def add_build_starter_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("build-starter", help="build the tiny Qwen3-VL starter model (about 5-10 min)")
    parser.add_argument("--reduced", action="store_true", help="the seconds-long CI build (barely trained)")
    parser.add_argument(
        "--out", default=None, help="model directory to create; default <data root>/models/maze-starter-v6"
    )
    parser.add_argument(
        "--ship",
        action="store_true",
        help="replace the starter shipped with the package (mazerl/starter/data) and print its digest to pin",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of initialisation and data order (default 0)")
    parser.add_argument("--data-root", default=None, help="data root (default $MAZERL_HOME or ./.mazerl)")
    parser.set_defaults(func=run_build_starter_command)


def check_build_flags(args: argparse.Namespace) -> Path:
    """The directory to build into, once the flags are known to work; raises InputError naming the flag."""
    if not 0 <= args.seed <= MAX_SEED:
        raise InputError("--seed", f"--seed {args.seed} must be between 0 and {MAX_SEED}")
    if args.out is not None:
        out = Path(args.out).expanduser().resolve()
    else:
        check_root_env(args.data_root)  # an empty --data-root (or MAZERL_HOME) is refused, not read as ./.mazerl
        from mazerl.starter.build import starter_dir  # imports torch: only when it is needed

        out = starter_dir(args.data_root)
    if out.exists():
        raise InputError("--out", f"--out {out} already exists; delete it or choose another --out")
    check_data_root(out, field="--out" if args.out else "--data-root")
    return out


def run_build_starter_command(args: argparse.Namespace) -> int:
    try:
        out = None if args.ship else check_build_flags(args)  # --ship builds into the package, not --out
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from mazerl.starter.build import build_starter  # torch: once the flags are known to work
    from mazerl.starter.config import StarterConfig

    config = StarterConfig.reduced_build(args.seed) if args.reduced else StarterConfig(seed=args.seed)
    if args.ship:
        return ship(config)
    build_starter(out, config, log=lambda line: print(line, flush=True))
    return EXIT_OK


def ship(config) -> int:
    """Build into a temporary directory, then swap it in for the shipped copy and print the digest to pin."""
    from mazerl.starter.build import build_starter  # torch: only for a build
    from mazerl.starter.config import StarterConfig

    if config != StarterConfig():
        print("error: --ship ships the default config only (no --reduced, --seed 0)", file=sys.stderr)
        return EXIT_BAD_INPUT
    with tempfile.TemporaryDirectory(dir=SHIPPED_DIR.parent.parent) as tmp:
        built = build_starter(Path(tmp) / SHIPPED_DIR.name, config, log=lambda line: print(line, flush=True))
        SHIPPED_DIR.parent.mkdir(parents=True, exist_ok=True)
        install_dir(built, SHIPPED_DIR)
    print(
        f'shipped {SHIPPED_DIR}; pin it in mazerl/starter/shipped.py: SHIPPED_DIGEST = "{directory_digest(SHIPPED_DIR)}"'
    )
    return EXIT_OK
