"""Params on MLflow runs: nested configs flattened to ``a.b.c`` keys within MLflow's limits, redacted.

A run's params are written once: a retry that logs the same config again is a no-op, and one
that logs a different value is refused (:class:`LineageError`), because a run whose config
changed half-way cannot be compared with anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from mlflow.entities import Param
from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH

from mazerl.tracking.secrets import redact
from mazerl.tracking.store import client_for

TRUNCATED = "...[truncated]"  # the end of a value cut to MLflow's length limit
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9_./\- ]")


class LineageError(RuntimeError):
    """The MLflow store holds something that contradicts the run being recorded."""


def safe_name(key: str) -> str:
    """``key`` with every character MLflow refuses in a param or metric name replaced by ``_``."""
    return _UNSAFE_NAME_CHARS.sub("_", key)


def truncated(text: str, limit: int) -> str:
    """``text``, cut to ``limit`` characters ending in ``...[truncated]`` when longer."""
    return text if len(text) <= limit else text[: limit - len(TRUNCATED)] + TRUNCATED


def _plain(value: Any) -> Any:
    """Pydantic models and dataclasses -> dicts; everything else unchanged."""
    if hasattr(value, "model_dump") and callable(value.model_dump):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _param_key(key: str) -> str:
    return safe_name(key)[:MAX_ENTITY_KEY_LENGTH]


def _param_value(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool) or value is None or isinstance(value, int | float):
        text = str(value)
    elif isinstance(value, os.PathLike):
        text = os.fspath(value)
    else:
        text = json.dumps(value, default=str, sort_keys=True)
    return truncated(text, MAX_PARAM_VAL_LENGTH)


def flatten_params(values: Any, prefix: str = "") -> dict[str, str]:
    """Nested pydantic models, dataclasses and dicts -> ``{"a.b.c": "value"}`` within MLflow's limits.

    Lists of plain values stay one JSON-valued param; lists holding dicts are expanded by
    index (``a.0.b``). Keys keep letters, digits and ``_ . / - space`` (others become ``_``);
    values longer than MLflow's 6000 characters end in ``...[truncated]``. Not yet redacted:
    :func:`log_params` does that.
    """
    values = _plain(values)
    out: dict[str, str] = {}
    if isinstance(values, Mapping):
        items = values.items()
    elif isinstance(values, list | tuple) and any(isinstance(_plain(v), Mapping) for v in values):
        items = enumerate(values)
    else:
        if not prefix:
            raise TypeError(f"params must be a mapping, pydantic model or dataclass, not {type(values).__name__}")
        return {_param_key(prefix): _param_value(values)}
    for key, value in items:
        name = f"{prefix}.{key}" if prefix else str(key)
        value = _plain(value)
        if isinstance(value, Mapping) and value:
            out |= flatten_params(value, name)
        elif isinstance(value, list | tuple) and any(isinstance(_plain(v), Mapping) for v in value):
            out |= flatten_params(list(value), name)
        else:
            out[_param_key(name)] = _param_value(value)
    return out


def log_params(tracking_uri: str, run_id: str, params: Any, prefix: str = "") -> dict[str, str]:
    """Flatten, redact and log ``params`` on a run; returns what was logged.

    Params that the run already holds with the same value are skipped (a retried task
    logs the same config again); a different value is a :class:`LineageError`, because a
    run whose config changed half-way cannot be compared with anything.
    """
    flat = redact(flatten_params(params, prefix))
    client = client_for(tracking_uri)
    existing = client.get_run(run_id).data.params
    conflicts = {
        key: (existing[key], value) for key, value in flat.items() if key in existing and existing[key] != value
    }
    if conflicts:
        listed = "; ".join(f"{key}: logged {old!r}, now {new!r}" for key, (old, new) in list(conflicts.items())[:5])
        raise LineageError(
            f"run {run_id} already holds different values for {len(conflicts)} param(s) ({listed}); "
            "a retry must use the parameters of the first attempt, or start a new flow run"
        )
    new = [Param(key, value) for key, value in flat.items() if key not in existing]
    for start in range(0, len(new), 100):  # MLflow's per-request param limit
        client.log_batch(run_id, params=new[start : start + 100])
    return flat
