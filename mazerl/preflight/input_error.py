"""The one error of the preflight: a parameter that cannot work, named by the field the user gave it by."""

from __future__ import annotations


class InputError(ValueError):
    """A pipeline parameter that cannot work; ``field`` is its name (``training.resume`` for nested ones)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def short_message(exc: BaseException, limit: int = 160) -> str:
    """``exc``'s message on one line, cut to ``limit`` characters: a parser's error quoted in a refusal."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
