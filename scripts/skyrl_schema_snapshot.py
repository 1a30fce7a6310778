"""Write the field tree of the real ``SkyRLTrainConfig`` into ``mazerl/training/skyrl_schema.json``.

CI runs on Python 3.11 without SkyRL, so it cannot import the config our SkyRL backend
targets. This one-off, run where the pinned SkyRL is installed (Python >= 3.12), records
every dotted field path with its declared type, the value kinds that type accepts, and
its default, plus the SkyRL version. ``tests/test_skyrl_backend.py`` then checks every
override :func:`mazerl.training.skyrl_backend.build_overrides` emits against the snapshot,
and the snapshot's version against the pin in ``pyproject.toml``.

``scripts/skyrl_cpu_checks.py`` goes further and runs our overrides, tickets and metric
names through SkyRL's own functions.

Usage (a Python 3.12 venv outside the repo, e.g. /work/venv312, with ``skyrl==0.4.0``)::

    /work/venv312/bin/python scripts/skyrl_schema_snapshot.py
    /work/venv312/bin/python scripts/skyrl_schema_snapshot.py --check      # exit 1 if the file differs
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib.metadata
import json
import os
import sys
import types
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "mazerl" / "training" / "skyrl_schema.json"


def type_name(annotation: typing.Any) -> str:
    """A stable, readable spelling of an annotation (``Optional[int]``, ``List[str]``, ``Dict[str, Any]``)."""
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = type_name(rest[0]) if len(rest) == 1 else f"Union[{', '.join(type_name(a) for a in rest)}]"
        return f"Optional[{inner}]" if len(rest) < len(args) else inner
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is not None:
        name = {list: "List", dict: "Dict", tuple: "Tuple", set: "Set"}.get(
            origin, getattr(origin, "__name__", str(origin))
        )
        return f"{name}[{', '.join(type_name(a) for a in args)}]" if args else name
    return str(annotation).replace("typing.", "")


def accepted_kinds(annotation: typing.Any) -> list[str]:
    """The value kinds (as ``skyrl_schema.value_kind`` names them) an annotation admits."""
    if annotation is typing.Any:
        return ["any"]
    if annotation is type(None):
        return ["null"]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return sorted({kind for arg in args for kind in accepted_kinds(arg)})
    if origin is typing.Annotated:
        return accepted_kinds(args[0])
    if origin is typing.Literal:
        return sorted({type(a).__name__.replace("str", "string") for a in args})
    base = origin or annotation
    if isinstance(base, type) and issubclass(base, enum.Enum):
        return ["string"]
    table = {bool: ["bool"], int: ["int"], float: ["float", "int"], str: ["string"], list: ["array"], tuple: ["array"]}
    table[dict] = ["object"]
    if base in table:
        return table[base]
    if dataclasses.is_dataclass(base):
        return ["object"]
    return ["any"]


def json_default(value: typing.Any) -> typing.Any:
    """A JSON value for a default; the home directory is written as ``~`` so the file is machine-independent."""
    home = os.path.expanduser("~")
    if isinstance(value, str) and value.startswith(home + os.sep):
        return "~" + value[len(home) :]
    if isinstance(value, list):
        return [json_default(item) for item in value]
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return None  # recorded as its own section
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def dataclass_of(annotation: typing.Any) -> type | None:
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if (found := dataclass_of(arg)) is not None:
                return found
    return None


def walk(cls: type, instance: typing.Any, prefix: str, out: dict[str, dict]) -> None:
    """Record every field of ``cls``; defaults come from ``instance`` (None for a required-field class)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        annotation = hints.get(f.name, f.type)
        value = getattr(instance, f.name) if instance is not None else dataclasses.MISSING
        nested = dataclass_of(annotation)
        entry = {"type": type_name(annotation), "accepts": accepted_kinds(annotation)}
        if nested is not None:
            entry["node"] = "dataclass"
            if not dataclasses.is_dataclass(value):
                try:
                    value = nested()
                except TypeError:  # a section with required fields (e.g. DeltaWeightSyncConfig)
                    value = None
            out[path] = entry
            walk(nested, value, path + ".", out)
            continue
        if value is dataclasses.MISSING:
            entry["required"] = True
        else:
            entry["default"] = json_default(value)
        out[path] = entry


def fsdp_pins() -> dict[str, str]:
    """Exact pins of ``skyrl[fsdp]`` on Linux (torch, vllm, ray, peft, ...): the cluster image must honour them.

    ``fsdp`` pulls in ``skyrl[skyrl-train]``; self-referencing extras are followed.
    """
    from packaging.requirements import Requirement

    requirements = [Requirement(text) for text in importlib.metadata.requires("skyrl") or []]
    extras, pins = {"fsdp"}, {}
    changed = True
    while changed:  # close over skyrl[...] self-references
        changed = False
        for requirement in requirements:
            if requirement.name == "skyrl" and any(_applies(requirement, extra) for extra in extras):
                changed |= not requirement.extras <= extras
                extras |= requirement.extras
    for requirement in requirements:
        if requirement.name == "skyrl" or not any(_applies(requirement, extra) for extra in extras):
            continue
        if any(spec.operator == "==" for spec in requirement.specifier):
            pins[requirement.name.lower()] = str(requirement.specifier)
    return dict(sorted(pins.items()))


def _applies(requirement: typing.Any, extra: str) -> bool:
    environment = {"extra": extra, "sys_platform": "linux", "platform_machine": "x86_64"}
    return requirement.marker is None or requirement.marker.evaluate(environment)


def snapshot() -> dict[str, typing.Any]:
    from skyrl.train.config import SkyRLTrainConfig

    fields: dict[str, dict] = {}
    walk(SkyRLTrainConfig, SkyRLTrainConfig(), "", fields)
    return {
        "skyrl_version": importlib.metadata.version("skyrl"),
        "fsdp_pins": fsdp_pins(),
        "python": ".".join(map(str, sys.version_info[:3])),
        "generated_by": "scripts/skyrl_schema_snapshot.py",
        "root": "skyrl.train.config.SkyRLTrainConfig",
        "fields": dict(sorted(fields.items())),
    }


def render(content: dict) -> str:
    return json.dumps(content, indent=1, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the stored snapshot differs")
    parser.add_argument("--output", default=str(OUTPUT))
    args = parser.parse_args(argv)
    text = render(snapshot())
    output = Path(args.output)
    if args.check:
        same = output.exists() and output.read_text() == text
        print(f"{output}: {'up to date' if same else 'DIFFERS'}")
        return 0 if same else 1
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, output)
    print(f"wrote {output} ({len(json.loads(text)['fields'])} fields, skyrl {json.loads(text)['skyrl_version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
