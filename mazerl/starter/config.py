"""The starter's build config: everything that determines its weights, recorded in ``starter.json``.

:func:`mazerl.starter.build.build_starter` builds from a :class:`StarterConfig`, and
:func:`~mazerl.starter.build.ensure_starter` refuses a cached directory whose recorded config
differs from the one asked for. The defaults are the shipped starter's; :meth:`StarterConfig.reduced_build`
is the seconds-long build the tests use. Nothing here imports torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class StarterConfig(BaseModel):
    """Everything that determines the starter's weights (recorded in ``starter.json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, description="Seeds initialisation, data order and the tokenizer corpus order.")
    reduced: bool = Field(False, description="A seconds-long build for tests: same architecture, few steps.")
    # The world the starter is made for (the embedded eval set's).
    eval_set: str = Field("maze256-small-v1", description="Eval set whose world (size, cell_px, budget) is used.")
    action_format: Literal["tuple", "keyword"] = Field("tuple", description="Action syntax taught.")
    history_images: int | Literal["all"] = Field(
        1, description="Frames in the context the starter is trained on (and should be run with)."
    )
    history_text: int | Literal["all", "feedback", "tried"] = Field(
        "tried",
        description="Past exchanges kept as text in its contexts (mazerl.policy.chat); feedback: the task prompt, the "
        "current frame and the last feedback line after a reply that got nowhere, so the context is a function of "
        "the state and a bump changes it (the embedded recipe trains with the same value). 0 (no feedback) left a "
        "greedy policy bumping the same wall forever; 1 (the last reply too) gave the way back away in every dead "
        "end: greedy 2-cycles. tried (maze-starter-v5, v6): feedback plus the replies given before on the same frame, "
        "warm-started on walks that back out of wrong branches (mazerl.starter.states.exploring_walk), so a policy "
        "back at a junction can take another branch (v4, feedback: 40.2% -> 71.5-73.0%; v5: 44.9% -> 76.6-78.9%; v6: "
        "44.5% -> 82.8-85.9%).",
    )
    # Architecture.
    vocab_size: int = Field(512, ge=64, description="BPE vocabulary size, special tokens included.")
    text_hidden: int = Field(128, description="Text model width.")
    text_layers: int = Field(4, description="Text decoder layers.")
    text_heads: int = Field(4, description="Attention heads (head_dim 32).")
    text_intermediate: int = Field(512, description="Text MLP width.")
    vision_hidden: int = Field(128, description="Vision tower width.")
    vision_layers: int = Field(
        4, description="Vision blocks (4, not 2: per-cell path directions need the depth; cheap at 49 tokens)."
    )
    vision_heads: int = Field(4, description="Vision attention heads.")
    vision_intermediate: int = Field(512, description="Vision MLP width.")
    patch_size: int = Field(16, description="Vision patch size in pixels (= the world's cell_px: one patch per cell).")
    # Warm-start.
    train_mazes: Literal["outside_eval", "all"] = Field(
        "outside_eval",
        description="outside_eval: only mazes not in the eval set (the baseline then measures generalisation); "
        "all: every maze of the world.",
    )
    history_noise: float = Field(
        0.3, ge=0, le=1, description="Per-step chance of a wall bump or dead-end excursion in warm-start histories."
    )
    answer_noise: float = Field(
        0.85,
        ge=0,
        le=1,
        description="Chance that a warm-start answer is the move of a demonstrator that heads for the red square "
        "instead of the solver's (mazerl.starter.states.demonstrator_action): where the maze leads round, the "
        "starter's mistakes become near-ties that GRPO can sharpen (v3, the solver only: 0, was confidently wrong "
        "where it failed; 0.6 (v4, v5) gave GRPO +20 points in 40 steps, docs/performance.md). 0.85 (v6): at the "
        "same epochs about the same greedy share (44.5% against v5's 44.9%), and the embedded recipe from it reached "
        "82.8-85.9% over 3 seeds against 76.6-78.9% from v5. 0: the solver only.",
    )
    epochs: float = Field(
        1.2,
        gt=0,
        description="Passes over the warm-start states (fractional allowed). 1.2 (v6, answer_noise 0.85): 44.5% "
        "greedy; 0.8: 31.6%, 1.6: 52.0% (v5, answer_noise 0.6: 44.9% at 1.2; v4, feedback, stopped at 0.8: 40.2%).",
    )
    schedule_epochs: float | None = Field(
        2.0,
        gt=0,
        description="Length of the learning-rate schedule in epochs (None: epochs). Longer than epochs stops the "
        "warm-start mid-schedule, its learning rate still high: a starter that has learnt to see the maze but whose "
        "answers are not yet sharpened, which GRPO moves further than a converged one.",
    )
    max_states: int | None = Field(None, ge=1, description="Use only the first N states (reduced builds).")
    batch_size: int = Field(16, ge=1, description="States per optimizer step (16 learns faster per second than 32).")
    learning_rate: float = Field(1e-3, gt=0, description="AdamW peak learning rate (cosine decay to 0).")
    warmup_steps: int = Field(20, ge=0, description="Linear warm-up steps.")
    aux_weight: float = Field(
        3.0,
        ge=0,
        description="Weight of each auxiliary per-cell loss (0 disables them). 3 (1 before v4) is the largest single "
        "lever on what the starter reads of the maze (docs/performance.md, the starter arms).",
    )
    answer_weight: float = Field(
        1.0,
        gt=0,
        description="Weight of the answer loss beside the auxiliary ones: below 1 the starter learns to see the "
        "maze (the per-cell heads) faster than to act on it, so it knows more than its answers show.",
    )
    aux_layer: int = Field(2, ge=1, description="Text layer whose output feeds the auxiliary heads.")
    torch_threads: int = Field(2, ge=1, description="torch threads of the build (fixed: results depend on it).")

    @model_validator(mode="after")
    def _schedule_covers_the_run(self) -> StarterConfig:
        if self.schedule_epochs is not None and self.schedule_epochs < self.epochs:
            raise ValueError(
                f"schedule_epochs={self.schedule_epochs} is shorter than epochs={self.epochs}: the schedule would end "
                "before the warm-start does; set schedule_epochs >= epochs, or leave it unset (= epochs)"
            )
        return self

    @staticmethod
    def reduced_build(seed: int = 0) -> StarterConfig:
        """The CI build: the real pipeline end to end in seconds (a few hundred states, one pass)."""
        return StarterConfig(
            seed=seed,
            reduced=True,
            epochs=1.0,
            schedule_epochs=None,
            max_states=320,
            batch_size=16,
            warmup_steps=2,
            aux_weight=1.0,
            answer_noise=0.0,
        )
