"""How much of the earlier turns a policy's context keeps: ``history_images`` and ``history_text``.

The one home of the two settings' types and of their check: the episode runner and the chat
renderer (:mod:`mazerl.policy.chat`), the eval stage and the trainer's config all call
:func:`check_context_mode`. It imports nothing heavy (no torch), so ``TrainConfig`` and the
command line's flag checks can use it without loading a model runtime.
"""

from __future__ import annotations

from typing import Literal

HistoryImages = int | Literal["all"]  # frames shown: the last N (1: the current frame only), or all
# Earlier turns' text kept: N turns, all, the last feedback line, or that line and what was answered before on this frame
HistoryText = int | Literal["all", "feedback", "tried"]

# The Markov modes: the current frame only, so each needs history_images 1.
CURRENT_FRAME_MODES = ("feedback", "tried")


class ContextModeError(ValueError):
    """A ``history_images`` / ``history_text`` setting that no context can be rendered with."""


def check_history_images(history_images: HistoryImages) -> HistoryImages:
    """``"all"`` or an integer >= 1; anything else is refused with the fix."""
    if history_images == "all" or (isinstance(history_images, int) and history_images >= 1):
        return history_images
    raise ContextModeError(
        f"history_images={history_images!r} must be 'all' or an integer >= 1 (e.g. 1: current frame only)"
    )


def check_history_text(history_text: HistoryText) -> HistoryText:
    """``"all"``, ``"feedback"``, ``"tried"`` or an integer >= 0; anything else is refused with the fix."""
    if history_text in ("all", *CURRENT_FRAME_MODES) or (
        isinstance(history_text, int) and not isinstance(history_text, bool) and history_text >= 0
    ):
        return history_text
    raise ContextModeError(
        f"history_text={history_text!r} must be 'all', 'feedback', 'tried' or an integer >= 0 (0: the task prompt and "
        "the current frame only; 'feedback': also the last feedback line; 'tried': also what was answered before on "
        "this frame; 1: also the last reply and its feedback)"
    )


def check_context_mode(history_images: HistoryImages, history_text: HistoryText) -> None:
    """Both settings valid, and consistent: ``"feedback"`` and ``"tried"`` show the current frame only."""
    check_history_images(history_images)
    check_history_text(history_text)
    if history_text in CURRENT_FRAME_MODES and history_images != 1:
        raise ContextModeError(
            f"history_text={history_text!r} shows the current frame only, but history_images={history_images!r}; "
            "set history_images: 1"
        )
