"""Versioned evaluation sets: fixed maze layouts stored as data with a SHA-256 digest.

A set is a JSON file in ``envs/data/<name>.json``. Its digest covers the canonical JSON
of everything but the digest itself. The digest of every shipped set is also pinned here
in code (``EvalSetSpec.sha256``), and loading checks the file against both: a file edited
by hand is refused, and so is one edited with its digest recomputed, so a silently changed
set can never produce comparable-looking numbers.

Regenerate and prove byte-identical regeneration::

    python -m envs.evalset --check          # exit 1 if any stored set differs
    python -m envs.evalset --write          # rewrite the files
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.maze import Layout, optimal_moves

DATA_DIR = Path(__file__).parent / "data"


@dataclass(frozen=True)
class EvalSetSpec:
    """How a set is generated: ``count`` mazes from seeds 0, 1, 2, ... of one world."""

    name: str
    size: int
    cell_px: int
    max_moves: int
    count: int
    distinct: bool  # skip seeds whose layout repeats an earlier one
    description: str
    sha256: str  # the content digest of the shipped file, pinned: an edited file is refused whatever it records


SPECS: dict[str, EvalSetSpec] = {
    spec.name: spec
    for spec in (
        EvalSetSpec(
            "maze64-easy-v1",
            9,
            25,
            15,
            64,
            False,
            "The reference set: seeds 0-63 of the 9x9 maze_2d/easy world at 25 px per cell.",
            "7113410e49bc9ab40f849dbc3f9be3a3d0870d5d1abac5420757619068ddd044",
        ),
        EvalSetSpec(
            "maze256-small-v1",
            7,
            16,
            15,
            256,
            True,
            "The embedded set: the first 256 distinct 7x7 mazes (seeds ascending) at 16 px per cell, "
            "one image token per cell for the tiny starter model.",
            "b632fcf33d8c44ff3262ddc3c1716478d3d20ba2621526bca762a60ac5f42631",
        ),
    )
}
DEFAULT_EVAL_SET = "maze64-easy-v1"
EMBEDDED_EVAL_SET = "maze256-small-v1"


class EvalSetError(ValueError):
    """An eval set that is unknown, unreadable or edited."""


@dataclass(frozen=True)
class EvalSet:
    """A loaded, digest-checked eval set."""

    name: str
    size: int
    cell_px: int
    max_moves: int
    seeds: tuple[int, ...]
    layouts: tuple[Layout, ...]
    digest: str
    description: str

    def __len__(self) -> int:
        return len(self.layouts)

    def budget_ceiling(self, max_moves: int | None = None) -> float:
        """Share of mazes the shortest-path solver finishes within the budget (stop included)."""
        budget = self.max_moves if max_moves is None else max_moves
        return sum(optimal_moves(layout) + 1 <= budget for layout in self.layouts) / len(self.layouts)


def canonical_json(content: dict[str, Any]) -> bytes:
    return json.dumps(content, sort_keys=True, separators=(",", ":")).encode()


def content_digest(content: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json({k: v for k, v in content.items() if k != "sha256"})).hexdigest()


def generate(spec: EvalSetSpec) -> dict[str, Any]:
    """The file content of a set, digest included."""
    seeds, layouts, seen = [], [], set()
    seed = 0
    while len(layouts) < spec.count:
        layout = Layout.generate(seed, spec.size)
        if not spec.distinct or layout not in seen:
            seen.add(layout)
            seeds.append(seed)
            layouts.append(layout.to_dict())
        seed += 1
        if seed > 100 * spec.count:
            raise EvalSetError(f"{spec.name}: could not find {spec.count} distinct {spec.size}x{spec.size} mazes")
    content = {
        "name": spec.name,
        "description": spec.description,
        "size": spec.size,
        "cell_px": spec.cell_px,
        "max_moves": spec.max_moves,
        "seeds": seeds,
        "layouts": layouts,
    }
    content["sha256"] = content_digest(content)
    return content


def render_file(content: dict[str, Any]) -> str:
    """Stable on-disk text: one layout per line keeps diffs readable."""
    head = {k: v for k, v in content.items() if k not in ("layouts", "sha256")}
    lines = ["{"]
    for key, value in head.items():
        lines.append(f"  {json.dumps(key)}: {json.dumps(value)},")
    lines.append('  "layouts": [')
    rows = [f"    {json.dumps(layout, separators=(',', ':'))}" for layout in content["layouts"]]
    lines.append(",\n".join(rows))
    lines.append("  ],")
    lines.append(f'  "sha256": {json.dumps(content["sha256"])}')
    lines.append("}")
    return "\n".join(lines) + "\n"


def path_for(name: str) -> Path:
    if name not in SPECS:
        raise EvalSetError(f"unknown eval set {name!r}: choose one of {sorted(SPECS)} (files in {DATA_DIR})")
    return DATA_DIR / f"{name}.json"


def load(name: str = DEFAULT_EVAL_SET) -> EvalSet:
    """Load a set by name and verify its digest."""
    path = path_for(name)
    return load_file(path)


def load_file(path: str | os.PathLike) -> EvalSet:
    """Load a set file from any path and verify its digest (and the pinned one, for a shipped set's name)."""
    path = Path(path)
    try:
        content = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise EvalSetError(f"eval set file {path} is missing; run `python -m envs.evalset --write`") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EvalSetError(f"eval set file {path} is not valid JSON ({exc})") from exc
    if not isinstance(content, dict):
        raise EvalSetError(f"eval set file {path} holds a {type(content).__name__}, not an eval set object")
    stored, actual = content.get("sha256"), content_digest(content)
    restore = f"restore it with `git checkout {path}` or `python -m envs.evalset --write`"
    if stored != actual:
        raise EvalSetError(
            f"eval set {path.name} was edited: its content hashes to {actual[:12]}... but the file records "
            f"{str(stored)[:12]}...; {restore}"
        )
    spec = SPECS.get(content.get("name"))
    if spec is not None and actual != spec.sha256:
        raise EvalSetError(
            f"eval set {path.name} was edited: it is named {spec.name!r} but its content hashes to {actual[:12]}..., "
            f"not the {spec.sha256[:12]}... this code pins for that set (the file's own digest was recomputed); "
            f"{restore}"
        )
    return EvalSet(
        name=content["name"],
        size=content["size"],
        cell_px=content["cell_px"],
        max_moves=content["max_moves"],
        seeds=tuple(content["seeds"]),
        layouts=tuple(Layout.from_dict(d) for d in content["layouts"]),
        digest=actual,
        description=content["description"],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the stored files")
    parser.add_argument("--check", action="store_true", help="fail if regeneration differs from the files")
    args = parser.parse_args(argv)
    status = 0
    for spec in SPECS.values():
        text = render_file(generate(spec))
        path = path_for(spec.name)
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
            print(f"wrote {path}")
        else:
            same = path.exists() and path.read_text() == text and content_digest(json.loads(text)) == spec.sha256
            print(f"{spec.name}: {'byte-identical' if same else 'DIFFERS'} ({path})")
            status |= not same
    return status


if __name__ == "__main__":
    sys.exit(main())
