"""The eval stage: greedy play of a fixed eval set over Ray workers, results and summary files, GIFs.

``evaluate`` and ``EvalReport`` are imported on first use, so that ``mazerl eval`` can check its
flags and refuse a bad one before torch is imported (seconds on a laptop).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mazerl.evaluation.evaluate import EvalReport, evaluate

__all__ = ["EvalReport", "evaluate"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module("mazerl.evaluation.evaluate")
    # importing the submodule bound the name ``evaluate`` to it; bind the public names to what they were
    globals().update({public: getattr(module, public) for public in __all__})
    return globals()[name]
