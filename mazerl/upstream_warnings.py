"""Warnings of our dependencies about each other that a user can do nothing about, silenced by exact text.

Each filter names the one message, the library that triggers it and when it can go; nothing
broader is silenced, so real warnings (ours, or a library's about how we call it) still show.
Imported by ``mazerl/__init__.py``, so every process that runs our code (the flow, Ray jobs
and their workers) has them.
"""

from __future__ import annotations

import warnings

# peft (0.21) asks every model it wraps for ``is_gradient_checkpointing``, which transformers 5
# deprecated in favour of ``is_activation_checkpointing``: two FutureWarnings per training job.
# Remove when peft reads the new property.
GRADIENT_CHECKPOINTING_MESSAGE = r"`is_gradient_checkpointing` is deprecated"


def install() -> None:
    warnings.filterwarnings(
        "ignore", message=GRADIENT_CHECKPOINTING_MESSAGE, category=FutureWarning, module=r"transformers\."
    )
