"""Write one benchmark's results into its own section of docs/performance.md.

Each benchmark owns the text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``;
re-running it replaces only that section, so benchmarks can run in any order.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
from datetime import date
from pathlib import Path

from mazerl.atomic import write_text

PERFORMANCE_MD = Path(__file__).parents[1] / "docs" / "performance.md"


def machine_line() -> str:
    """The machine and interpreter a number was measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
        cpu = model
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return (
        f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, "
        f"commit {commit}, {date.today().isoformat()}"
    )


def write_section(name: str, body: str, path: Path = PERFORMANCE_MD) -> None:
    """Replace (or append) the section ``name`` with ``body`` plus the machine and command."""
    command = "python " + shlex.join([Path(sys.argv[0]).as_posix().split("/work/main/")[-1], *sys.argv[1:]])
    section = (
        f"<!-- bench:{name} -->\n{body.rstrip()}\n\n"
        f"*Measured on {machine_line()}; reproduce with `{command}`.*\n<!-- /bench:{name} -->"
    )
    text = path.read_text() if path.exists() else "# Performance\n"
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.DOTALL)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section + "\n"
    write_text(path, text)
