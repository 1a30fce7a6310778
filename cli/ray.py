"""``mazerl ray status`` and ``mazerl ray stop``: the project's own embedded Ray head.

``mazerl run`` stops the head it started when it ends; a deployment's flow run (or ``mazerl
eval`` beside another run) leaves it up, about 20 processes and 2 GB, for the next run and
for a retry that re-attaches to its job. ``mazerl ray stop`` stops it, and only it: the head
registered under this user's ``TMPDIR``, never another Ray on the machine, and not while a
live process still holds a lease on it (``--force`` overrides). Exit codes: 0 done (also when
none runs), 1 the head is in use or would not stop, 2 a bad temp dir.
"""

from __future__ import annotations

import argparse
import sys

from mazerl.cluster.head.local import LocalRayError, find_local_head, lease_holders, stop_idle_head
from mazerl.cluster.head.temp_dir import UnsafeTempDirError, default_temp_dir

EXIT_OK, EXIT_IN_USE, EXIT_BAD_INPUT = 0, 1, 2


def add_ray_command(subparsers: argparse._SubParsersAction) -> None:
    ray = subparsers.add_parser("ray", help="status or stop of the project's embedded Ray head")
    actions = ray.add_subparsers(dest="ray_command", required=True)
    status = actions.add_parser("status", help="say whether the embedded head runs, where, and who uses it")
    status.set_defaults(func=status_command)
    stop = actions.add_parser("stop", help="stop the embedded head (only this project's, only when unused)")
    stop.add_argument("--force", action="store_true", help="stop it even while a run still holds a lease on it")
    stop.set_defaults(func=stop_command)


def status_command(args: argparse.Namespace) -> int:
    try:
        head = find_local_head()
    except UnsafeTempDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if head is None:
        print(f"no embedded Ray head runs (temp dir {default_temp_dir()})")
        return EXIT_OK
    holders = lease_holders(head.temp_dir)
    users = f"in use by process(es) {', '.join(holders)}" if holders else "unused: stop it with `mazerl ray stop`"
    print(
        f"embedded Ray head at {head.address} (pid {head.pid}, Ray {head.ray_version}, temp dir {head.temp_dir}); {users}"
    )
    return EXIT_OK


def stop_command(args: argparse.Namespace) -> int:
    try:
        head = stop_idle_head(force=args.force)
    except UnsafeTempDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except LocalRayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_IN_USE
    if head is None:
        print(f"no embedded Ray head runs (temp dir {default_temp_dir()}); nothing to stop")
    else:
        print(f"stopped the embedded Ray head at {head.address} (pid {head.pid})")
    return EXIT_OK
