"""The starter's build record, ``starter.json``: what built a starter directory, read without torch.

The build (:mod:`mazerl.starter.build`) writes it last, so a directory without it is not a
complete build; the merge carries it into the merged directory with the new weights' digest,
and eval and training read from it the context mode the starter was warm-started with.
Nothing here imports torch: ``mazerl eval`` reads the record before anything heavy loads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RECORD_FILE = "starter.json"


class StarterError(ValueError):
    """A starter directory or build request that cannot be used as asked."""


def read_record(model_dir: str | os.PathLike) -> dict[str, Any]:
    """The build record of a starter directory."""
    path = Path(model_dir) / RECORD_FILE
    if not path.is_file():
        raise StarterError(
            f"{model_dir} has no {RECORD_FILE}: it is not a complete starter build; delete it and rebuild"
        )
    return json.loads(path.read_text())


def recorded_context_mode(model_dir: str | os.PathLike) -> tuple[int | str, int | str]:
    """(history_images, history_text) the model was last trained in: a merged model's training
    (``context_mode``, written by the merge), else the starter's warm-start; ("all", "all") for
    other models.

    Records written before ``history_text`` existed kept the whole text history.
    """
    path = Path(model_dir) / RECORD_FILE
    if not path.is_file():
        return "all", "all"
    record = json.loads(path.read_text())
    mode = record.get("context_mode") or record["config"]
    return mode.get("history_images", "all"), mode.get("history_text", "all")
