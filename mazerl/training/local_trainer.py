"""The local GRPO engine: multi-turn GRPO with LoRA on one machine (CPU or one GPU).

Launch (inside a Ray job, or directly)::

    python -m mazerl.training.local_entry --config run/train_config.json

One step, in the order the loop runs:
  1. rollout   ``mazes_per_step`` training mazes x ``samples_per_maze`` sampled episodes,
               batched per turn through the shared episode runner (the same code as eval);
  2. advantage each episode's reward relative to its group (same maze), SkyRL's GRPO;
  3. old logp  log-probs of every reply under the rollout policy (from the first update
               epoch's forward pass, before any optimizer step);
  4. update    ``update_epochs`` passes of the clipped surrogate over every turn with an
               advantage (every turn, with a KL term); loss only on reply tokens, each turn
               scored in exactly the context, images included, that the rollout showed the
               policy; grad clip; AdamW step;
  5. eval      optional greedy eval every ``eval_interval`` steps;
  6. checkpoint every ``checkpoint_interval`` steps and at the end, atomically, the step's
               metrics row included (a crash before the row is logged loses nothing);
  7. log       step metrics to MLflow (and metrics.jsonl) and the ``step N/M:`` line.

Simplifications of GRPO as SkyRL runs it, said plainly: mini-batches (``mini_batch_mazes``,
SkyRL's policy_mini_batch_size) count only mazes whose group has an advantage; no KL term
unless ``grpo.kl_coef > 0`` (then the reference policy is the base model with the adapter
disabled); the rollout log-probs are recomputed by the trainer instead of being taken from
the sampler, so ``ratio == 1`` exactly on the first pass; the rate follows ``lr_schedule`` per step.

Determinism: every source of randomness of step N is seeded from ``(seed, N)``, so a run
resumed from the checkpoint of step N reproduces an uninterrupted run bit for bit on CPU
with a fixed thread count. RNG states are saved with each checkpoint as well.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envs.evalset import load as load_eval_set
from envs.pool import training_pool
from envs.reward import Shaping
from mazerl.atomic import write_jsonl, write_text
from mazerl.eval_files import EVAL_METRICS
from mazerl.evaluation.summary import result_row
from mazerl.fingerprint import model_fingerprint
from mazerl.policy.engines import GenerationSettings, InferenceEngine, stop_ids
from mazerl.policy.episodes import Episode, rollout_metrics, run_episodes
from mazerl.policy.loader import ModelLoadError, load_policy, read_adapter_config
from mazerl.policy.prefix_engine import PrefixCachingEngine
from mazerl.policy.vision_cache import VisionCache
from mazerl.progress import ProgressMeter, step_line
from mazerl.starter.record import recorded_context_mode
from mazerl.training import checkpoints
from mazerl.training.config import TrainConfig, TrainingConfigError
from mazerl.training.credit import turn_credit
from mazerl.training.data import epoch_of_step, order_state, record_success, recorded_success, step_mazes
from mazerl.training.disk_room import check_room, checkpoint_need
from mazerl.training.grpo import LOSS_REDUCTIONS, micro_batch_loss, mini_batches
from mazerl.training.lora_adapter import attach_lora
from mazerl.training.lr_schedule import step_scheduler
from mazerl.training.metrics_sink import MetricsSink
from mazerl.training.run_config import record_config
from mazerl.training.scoring import PackedScorer, TurnSample, decision_mask, log_probs_before_update, reply_mask
from mazerl.training.seeding import rng_state, seed_everything, step_seed


@dataclass(frozen=True)
class TrainResult:
    """What a run did; ``steps_run == 0`` only when it was already complete."""

    run_id: str
    start_step: int
    final_step: int
    steps_run: int
    already_complete: bool
    checkpoint: str | None
    wall_seconds: float

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2)


# --------------------------------------------------------------------------------------
# The trainer
# --------------------------------------------------------------------------------------


class LocalGRPOTrainer:
    """Owns the model, optimizer and run directory of one local training run.

    ``engine_class`` (rollouts and periodic evals) and ``scorer_class`` (the update) are the
    prefix-caching engine and the packed scorer; tests and ``bench/train_step.py`` swap in the
    ``generate``-based engine and the per-turn oracle to compare the paths.
    """

    engine_class: Callable[..., InferenceEngine] = PrefixCachingEngine
    scorer_class: type = PackedScorer

    def __init__(self, config: TrainConfig, log: Callable[[str], None] = print) -> None:
        self.config = config
        self.log = log
        self.eval_set = load_eval_set(config.eval_set)
        if config.max_turns != self.eval_set.max_moves:
            log(f"note: max_turns={config.max_turns} differs from the eval set's budget {self.eval_set.max_moves}")
        recorded = recorded_context_mode(config.base_model)
        if recorded != ("all", "all") and recorded != (config.history_images, config.history_text):
            log(
                f"note: the base model was warm-started with history_images={recorded[0]!r}, "
                f"history_text={recorded[1]!r} but this run trains with {config.history_images!r}, "
                f"{config.history_text!r}; the run's baseline and final evals use the run's mode"
            )
        self.pool = training_pool(self.eval_set, config.train_pool_size)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        self.base_fingerprint = model_fingerprint(config.base_model)
        # Built by _build once a run knows where it resumes from (the model is the expensive part).
        self.processor: Any = None
        self.model: Any = None  # the PEFT-wrapped policy
        self.vision_cache: VisionCache | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        # The last rollout's engine and update's scorer, for tests and bench/train_step.py to inspect.
        self.last_engine: Any = None
        self.last_scorer: Any = None
        # Each pool maze's last group success rate (data.step_mazes draws retries from it); saved
        # with every checkpoint so a resumed run draws what an uninterrupted one would.
        self.last_success: dict[int, float] = {}
        self.last_retries = 0  # how many of the last rollout's mazes were retries

    # ---- set-up and resume -----------------------------------------------------------

    def _resume_point(self) -> checkpoints.Checkpoint | None:
        latest = checkpoints.use_resume_point(self.config.checkpoint_dir, checkpoints.LOCAL_POLICY_FILES, self.log)
        if latest is None:
            if self.config.resume == "required":
                raise TrainingConfigError(
                    f"resume='required' but {self.config.checkpoint_dir} holds no checkpoint (no {checkpoints.MARKER}); "
                    "set resume='latest' to start from scratch, or point data_root/run_id at the run to continue"
                )
            return None
        if self.config.resume == "none":
            raise TrainingConfigError(
                f"{self.config.checkpoint_dir} already holds a checkpoint (step {latest.step}) but resume='none'; "
                "set resume='latest' to continue it or choose a new run_id"
            )
        state = checkpoints.load_trainer_state(latest)
        if state.get("base_model_fingerprint") != self.base_fingerprint:
            raise TrainingConfigError(
                f"checkpoint step {latest.step} in {self.config.checkpoint_dir} was trained from another base model "
                f"({state.get('base_model')}); use the same base_model or a new run_id"
            )
        try:  # before the model is loaded: PEFT's own error would come after it, and be obscure
            read_adapter_config(latest.adapter_dir)
        except ModelLoadError as exc:
            raise TrainingConfigError(
                f"the adapter of checkpoint step {latest.step} cannot be resumed: {exc}; restore that checkpoint, "
                f"or delete {self.config.checkpoint_dir} to train from scratch"
            ) from exc
        self.last_success = recorded_success(state)  # the retries' record, from the state read above
        return latest

    def _build(self, resume_from: checkpoints.Checkpoint | None) -> None:
        config = self.config
        seed_everything(config.seed)
        policy = load_policy(self.config.base_model, device=self.device)
        self.processor = policy.processor
        model = policy.model
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        self.model = attach_lora(model, self.config, resume_from.adapter_dir if resume_from else None)
        self.stop_ids = stop_ids(model, self.processor)  # what ends a reply (the engines stop on these)
        # A frozen vision tower's output per frame never changes: encode each frame once for the
        # whole run. A trained one runs with gradients in the update, and its cache lives one rollout.
        self.vision_cache = VisionCache()
        if self.config.freeze_vision:
            self.vision_cache.attach(self.model)
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
        if resume_from is not None:
            policy_dir = resume_from.path / "policy"
            self.optimizer.load_state_dict(torch.load(policy_dir / "optimizer.pt", weights_only=True))
        # The rate is a function of the step (lr_schedule.py): no scheduler state to resume (an old scheduler.pt is ignored)
        done = resume_from.step if resume_from else 0
        self.scheduler = step_scheduler(self.optimizer, config.lr_schedule, config.learning_rate, config.steps, done)

    # ---- one step --------------------------------------------------------------------

    def _rollout(self, step: int) -> list[Episode]:
        config = self.config
        indices, self.last_retries = step_mazes(
            step, config.mazes_per_step, len(self.pool), config.seed, config.retry_share, self.last_success
        )
        settings = GenerationSettings(
            greedy=False,
            temperature=config.grpo.temperature,
            top_p=config.grpo.top_p,
            max_new_tokens=config.grpo.max_new_tokens,
            seed=step_seed(config.seed, step),
        )
        episodes = self._play(
            [self.pool[i][1] for i in indices for _ in range(config.group_size)],
            settings,
            config.max_turns,
            maze_ids=[f"train/{self.pool[i][0]}" for i in indices for _ in range(config.group_size)],
            format_bonus=config.grpo.format_bonus,
            shaping=Shaping(progress_reward=config.grpo.progress_reward, bump_cost=config.grpo.bump_cost),
        )
        record_success(self.last_success, indices, [episode.solved for episode in episodes], config.group_size)
        return episodes

    def _play(self, layouts: list[Any], settings: GenerationSettings, max_moves: int, **options: Any) -> list[Episode]:
        """Episodes of the current policy (adapter merged into a copy) on ``layouts``, batched per turn."""
        engine = self.engine_class(self._inference_model(), self.processor, max_batch_size=256)
        with torch.no_grad():
            episodes = run_episodes(
                engine,
                self.processor,
                layouts,
                settings,
                max_moves=max_moves,
                action_format=self.config.action_format,
                cell_px=self.eval_set.cell_px,
                history_images=self.config.history_images,
                history_text=self.config.history_text,
                **options,
            )
        self.last_engine = engine
        return episodes

    def _inference_model(self) -> torch.nn.Module:
        """A throw-away copy with the adapter folded into the weights, for generation.

        Decoding through PEFT's LoRA hooks costs about twice a plain forward on small models;
        merging a copy (milliseconds for the starter) keeps the trained model's weights exact,
        unlike merge/unmerge in place, whose float rounding would drift step after step.
        """
        cache = self.vision_cache if self.config.freeze_vision else VisionCache()
        return cache.attach(copy.deepcopy(self.model).merge_and_unload().eval())

    def _greedy_eval(self, step: int) -> dict[str, float]:
        """Greedy success on the (first ``eval_mazes`` of the) eval set with the current adapter.

        Per-maze rows (as the eval stage's results.jsonl) go to ``<run>/evals/step_<N>.jsonl``, so
        a run's curve can be compared maze by maze with its baseline.
        """
        config = self.config
        layouts = list(self.eval_set.layouts[: config.eval_mazes or len(self.eval_set)])
        settings = GenerationSettings(greedy=True, max_new_tokens=config.grpo.max_new_tokens)
        maze_ids = [f"{self.eval_set.name}/{i}" for i in range(len(layouts))]
        episodes = self._play(layouts, settings, self.eval_set.max_moves, maze_ids=maze_ids)
        rows = [result_row(i, self.eval_set.seeds[i], e) for i, e in enumerate(episodes)]
        write_jsonl(config.run_dir / "evals" / f"step_{step:05d}.jsonl", rows)
        solved = [e for e in episodes if e.solved]
        return {
            EVAL_METRICS["success_rate"]: len(solved) / len(episodes),
            EVAL_METRICS["avg_moves"]: float(np.mean([e.moves for e in episodes])),  # per maze, solved or not
            EVAL_METRICS["parse_failure_rate"]: sum(e.parse_failures for e in episodes)
            / max(sum(e.moves for e in episodes), 1),
        }

    def _samples(self, episodes: list[Episode]) -> list[TurnSample]:
        groups = [episode.maze_id for episode in episodes]
        per_turn = turn_credit(episodes, groups, self.config.grpo)
        return [
            TurnSample(turn.input_ids, turn.images, turn.response_ids, advantage, episode.maze_id, number)
            for number, (episode, advantages) in enumerate(zip(episodes, per_turn, strict=True))
            for turn, advantage in zip(episode.turns, advantages, strict=True)
            if turn.response_ids
        ]

    def _update(self, samples: list[TurnSample]) -> dict[str, float]:
        grpo = self.config.grpo
        _, normaliser = LOSS_REDUCTIONS[grpo.loss_reduction]
        # Mini-batches of whole GRPO groups (SkyRL's policy_mini_batch_size): one optimizer step
        # each. Without a KL term a reply of zero advantage carries no gradient and is not scored,
        # but its tokens count in the normaliser as SkyRL's token_mean counts every reply of the
        # mini-batch: skipping it saves the compute (most turns of a late step: docs/training.md),
        # nothing else. Nothing left to score: nothing to learn from, no update.
        batches = [
            (scored, normaliser([reply_mask(batch, self.device)]))
            for batch in mini_batches(samples, self.config.mini_batch_mazes)
            if (scored := [sample for sample in batch if sample.advantage != 0.0 or grpo.kl_coef > 0])
        ]
        if not batches:
            return {"train/policy_loss": 0.0, "train/grad_norm": 0.0}
        # The scorer lays a mini-batch out once (each distinct token computed once, see
        # mazerl/training/scoring.py) in chunks (micro-batches) that bound activation memory.
        scorer = self.scorer_class(self.model, self.processor, self.device, grpo.temperature)
        self.last_scorer = scorer
        minis = [(group, scorer.prepare(group), total) for group, total in batches]
        old, ref = log_probs_before_update(scorer, self.model, [chunks for _, chunks, _ in minis], grpo.kl_coef > 0)
        # 4. update epochs over the same batch
        losses, clip_fracs, grad_norms, kls = [], [], [], []
        token_count = max(sum(len(s.response_ids) for s in samples), 1)
        params = [p for p in self.model.parameters() if p.requires_grad]
        for _ in range(grpo.update_epochs):
            epoch_loss, clipped_tokens, kl_sum = 0.0, 0.0, 0.0
            for mini, (group, chunks, total) in enumerate(minis):
                self.optimizer.zero_grad(set_to_none=True)
                for index, chunk in enumerate(chunks):
                    log_probs, mask = scorer.log_probs(chunk)  # (B, R): shared tokens scored once
                    if not grpo.stop_token_loss:
                        mask = mask * decision_mask([group[i] for i in chunk.samples], self.stop_ids, self.device)
                    advantages = torch.tensor([group[i].advantage for i in chunk.samples], device=self.device)
                    if len(old[mini]) <= index:
                        old[mini].append(log_probs.detach())
                    reference = ref[mini][index] if grpo.kl_coef > 0 else None
                    loss, clipped, kl = micro_batch_loss(
                        log_probs, old[mini][index], reference, advantages, mask, grpo, total
                    )
                    loss.backward()
                    epoch_loss += loss.item() / len(minis)
                    clipped_tokens += clipped
                    kl_sum += kl
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)))
                self.optimizer.step()
            losses.append(epoch_loss)
            clip_fracs.append(clipped_tokens / token_count)
            kls.append(kl_sum / token_count)
        metrics = {
            "train/policy_loss": float(np.mean(losses)),
            "train/grad_norm": float(np.mean(grad_norms)),
            "train/optimizer_steps": float(len(grad_norms)),
        }
        if len(grad_norms) > 1:  # one optimizer step per batch: the ratio is 1 everywhere, nothing can clip
            metrics["train/clip_fraction"] = float(np.mean(clip_fracs))
        if grpo.kl_coef > 0:
            metrics["train/kl"] = float(np.mean(kls))
        return metrics

    # ---- checkpoint ------------------------------------------------------------------

    def _save(self, step: int, metrics: dict[str, float] | None = None) -> checkpoints.Checkpoint:
        config = self.config

        def write(path: Path) -> None:
            adapter = path / checkpoints.ADAPTER_SUBDIR
            self.model.save_pretrained(str(adapter), safe_serialization=True)
            policy_dir = path / "policy"
            torch.save(self.optimizer.state_dict(), policy_dir / "optimizer.pt")
            torch.save(rng_state(), policy_dir / "rng_state.pt")
            checkpoints.save_trainer_state(
                path,
                {
                    "global_step": step,
                    "backend": "local",
                    "config": json.loads(config.model_dump_json()),
                    "base_model": str(config.base_model),
                    "base_model_fingerprint": self.base_fingerprint,
                    **order_state(step, config.seed, config.mazes_per_step, len(self.pool), self.last_success),
                },
            )

        started = time.perf_counter()
        need = checkpoint_need(self.model, self.optimizer)
        keep = config.checkpoints_kept
        saved = checkpoints.save(config.checkpoint_dir, step, write, keep=keep, metrics=metrics, need_bytes=need)
        self.log(f"checkpoint step {step} -> {saved.path} ({time.perf_counter() - started:.1f}s)")
        return saved

    # ---- the run ---------------------------------------------------------------------

    def run(self, metrics_sink: MetricsSink | None = None) -> TrainResult:
        config = self.config
        started = time.perf_counter()
        config.run_dir.mkdir(parents=True, exist_ok=True)
        record_config(config)
        resume_from = self._resume_point()
        start_step = resume_from.step if resume_from else 0
        if resume_from is not None and metrics_sink is not None:  # killed after the marker, before the row?
            checkpoints.replay_metrics(resume_from, metrics_sink)
        if start_step >= config.steps:
            self.log(f"already complete at step {start_step} (steps={config.steps}); nothing to train")
            return self._finish(start_step, start_step, resume_from, started)
        self._build(resume_from)  # then room for a checkpoint, before the first step is spent
        check_room(
            config.checkpoint_dir,
            checkpoint_need(self.model, self.optimizer),
            "a checkpoint",
            checkpoints.resume_note(config.checkpoint_dir),
        )
        self.log(
            f"training {config.run_id}: steps {start_step + 1}..{config.steps}, "
            f"{config.mazes_per_step} mazes x {config.group_size} samples per step, device {self.device}"
            + (f", resumed from step {start_step}" if resume_from else "")
        )
        last_checkpoint = resume_from
        meter = ProgressMeter(config.steps, "step", done=start_step)  # time left from this attempt's steps
        for step in range(start_step + 1, config.steps + 1):
            seed_everything(step_seed(config.seed, step))
            step_started = time.perf_counter()
            episodes = self._rollout(step)  # 1. rollout
            rollout_seconds = time.perf_counter() - step_started
            samples = self._samples(episodes)  # 2. advantages
            update_started = time.perf_counter()
            learning_rate = self.optimizer.param_groups[0]["lr"]
            update_metrics = self._update(samples)  # 3. old log-probs, 4. update
            self.scheduler.step()
            update_seconds = time.perf_counter() - update_started
            metrics = rollout_metrics(episodes) | {
                "train/learning_rate": learning_rate,
                **update_metrics,
                "train/rollout_seconds": rollout_seconds,
                "train/update_seconds": update_seconds,
                "train/step_seconds": time.perf_counter() - step_started,
                "train/epoch": float(epoch_of_step(step, config.mazes_per_step, len(self.pool))),
            }
            if config.retry_share > 0:
                metrics["train/retry_mazes"] = float(self.last_retries)
            if config.eval_interval and step % config.eval_interval == 0:  # 5. eval
                metrics.update(self._greedy_eval(step))
            if step % config.checkpoint_interval == 0 or step == config.steps:  # 6. checkpoint
                ckpt_started = time.perf_counter()
                last_checkpoint = self._save(step, metrics)  # the row goes into the checkpoint too
                metrics["train/checkpoint_seconds"] = time.perf_counter() - ckpt_started
            if metrics_sink is not None:  # 7. log
                metrics_sink.log(step, metrics)
            self.log(step_line(step, config.steps, metrics, meter.times(step)))
        return self._finish(start_step, config.steps, last_checkpoint, started)

    def _finish(
        self, start_step: int, final_step: int, checkpoint: checkpoints.Checkpoint | None, started: float
    ) -> TrainResult:
        result = TrainResult(
            run_id=self.config.run_id,
            start_step=start_step,
            final_step=final_step,
            steps_run=final_step - start_step,
            already_complete=final_step == start_step,
            checkpoint=str(checkpoint.path) if checkpoint else None,
            wall_seconds=time.perf_counter() - started,
        )
        write_text(self.config.run_dir / "train_result.json", result.to_json())
        return result
