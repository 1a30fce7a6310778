"""Fail when an installed package differs from its ``name==version`` pin in a constraints file.

pip honours constraints only for what it installs in that command; a package already present
(a base image's Ray, a torch installed earlier) keeps its version silently. This check runs
after the install, in the cluster image build (deployments/docker/Dockerfile) and for CI's
image-stack venv (``make test-image-stack``), so the stack tested and shipped is the pinned one.
``--exact-pins-only`` reads a requirement list whose other lines are ranges (vLLM's, for ``make test-vllm``)
and checks its exact pins only.

    python scripts/check_constraints.py deployments/docker/constraints.txt
    python scripts/check_constraints.py --exact-pins-only deployments/vllm-cpu/requirements.txt
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version


def mismatches(constraints: Path, exact_pins_only: bool = False) -> list[str]:
    """``name: installed X, pinned Y`` for every exact pin (whose marker applies) that the environment breaks;
    a line that is not one exact pin is a problem too, unless ``exact_pins_only``."""
    problems = []
    for line in constraints.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        pins = [spec for spec in requirement.specifier if spec.operator == "=="]
        if len(pins) != 1:
            if exact_pins_only:
                continue
            problems.append(f"{requirement.name}: {requirement.specifier} is not one exact pin (name==version)")
            continue
        pin = pins[0]
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{requirement.name}: not installed, pinned {pin.version}")
            continue
        if Version(installed).public != Version(pin.version).public:  # 2.13.0+cpu is 2.13.0
            problems.append(f"{requirement.name}: installed {installed}, pinned {pin.version}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("constraints", type=Path)
    parser.add_argument("--exact-pins-only", action="store_true", help="skip lines that are not name==version")
    args = parser.parse_args(argv)
    problems = mismatches(args.constraints, args.exact_pins_only)
    for problem in problems:
        print(f"error: {problem} ({args.constraints})", file=sys.stderr)
    if not problems:
        print(f"{args.constraints}: every pin is installed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
