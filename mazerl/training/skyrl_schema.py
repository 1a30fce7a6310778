"""The schema snapshot check: every SkyRL override names a real field of the pinned release.

``skyrl_schema.json`` beside this module is the field tree of the real ``SkyRLTrainConfig`` of
the pinned SkyRL release, written by ``scripts/skyrl_schema_snapshot.py`` where SkyRL is
installed (Python >= 3.12). CI checks :func:`mazerl.training.skyrl_backend.build_overrides`
against it with :func:`schema_problems`, so a field that SkyRL renames fails CI instead of a
GPU job. Plain Python, no SkyRL import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).with_name("skyrl_schema.json")

# Overrides whose value type differs from the annotation SkyRL declares, with the reason the
# real config accepts it. CI's schema check allows exactly these and nothing else.
TYPE_EXCEPTIONS: dict[str, tuple[str, str]] = {
    "trainer.policy.model.lora.target_modules": (
        "array",
        "annotated `str` but documented as 'all-linear' or a list of module names; the list reaches "
        "peft.LoraConfig(target_modules=...) unchanged (a comma-joined string would be read as a regex)",
    ),
}


def load_schema(path: Path = SCHEMA_PATH) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def value_kind(value: Any) -> str:
    """The JSON-ish kind of a value, as the snapshot's ``accepts`` lists use them."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def schema_problems(overrides: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Every override whose name is not a field of the snapshot, or whose value kind the field refuses.

    A name inside a free-form dict field (e.g. ``...engine_init_kwargs.max_model_len``) is
    accepted when its nearest parent is an ``object`` field.
    """
    fields: Mapping[str, Any] = schema["fields"]
    problems = []
    for name, value in overrides.items():
        kind = value_kind(value)
        field = fields.get(name)
        if field is None:
            parent = name.rpartition(".")[0]
            while parent and parent not in fields:
                parent = parent.rpartition(".")[0]
            if parent and fields[parent].get("node") != "dataclass" and "object" in fields[parent]["accepts"]:
                continue
            problems.append(f"{name}: no such field in SkyRL {schema['skyrl_version']}")
            continue
        if field.get("node") == "dataclass":
            problems.append(f"{name}: is a config section, not a value")
            continue
        accepts = set(field["accepts"])
        if "any" in accepts or kind in accepts or (kind == "int" and "float" in accepts):
            continue
        exception = TYPE_EXCEPTIONS.get(name)
        if exception and exception[0] == kind:
            continue
        problems.append(f"{name}: value {value!r} ({kind}) but SkyRL declares {field['type']}")
    return problems
