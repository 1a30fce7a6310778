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


def cpu_kind(cpuinfo: str) -> str:
    """The CPU as a kind whose runs replay each other: the model name, family and model, and whether
    it has AVX-512. Two 2-core "AMD EPYC" hosts, one with AVX-512 and one without, round the same
    seed's kernels differently and take different times, so a number names all three."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" not in fields:
        return name
    avx512 = "AVX-512" if "avx512f" in fields.get("flags", "").split() else "no AVX-512"
    return f"{name}, family {fields['cpu family']} model {fields.get('model', '?')}, {avx512}"


def this_cpu() -> str:
    """:func:`cpu_kind` of this machine (the platform's name where there is no /proc/cpuinfo)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    return cpu_kind(cpuinfo)


def machine_line() -> str:
    """The machine and interpreter a number was measured on."""
    cpu = this_cpu()
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
