"""The learning-rate schedule over a run's steps: a function of the step alone, so a resumed run
continues the schedule where the killed one was without any scheduler state in the checkpoint.

The schedules are transformers' (``get_scheduler``'s names, what SkyRL's
``optimizer_config.scheduler`` takes), so the local backend and SkyRL decay the same way.
"""

from __future__ import annotations

from typing import Literal

import torch
from transformers.optimization import (
    get_constant_schedule,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

LrSchedule = Literal["constant", "linear", "cosine"]


def step_scheduler(
    optimizer: torch.optim.Optimizer, schedule: LrSchedule, base_lr: float, steps: int, done: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """A scheduler that gives training step ``done + 1`` its rate now; ``.step()`` once after each
    training step (not after each optimizer step: all the step's updates share one rate).

    Step ``s`` of ``steps`` gets ``base_lr x f((s - 1) / steps)``: f is 1 (constant), ``1 - x``
    (linear) or ``(1 + cos(pi x)) / 2`` (cosine), so the last step still moves a little.
    """
    for group in optimizer.param_groups:
        # the schedule's base, whatever rate a resumed optimizer state last held (the scheduler sets "lr" from it)
        group["initial_lr"] = base_lr
    last = done - 1
    if schedule == "constant":
        return get_constant_schedule(optimizer, last_epoch=last)
    build = {"linear": get_linear_schedule_with_warmup, "cosine": get_cosine_schedule_with_warmup}[schedule]
    return build(optimizer, num_warmup_steps=0, num_training_steps=steps, last_epoch=last)
