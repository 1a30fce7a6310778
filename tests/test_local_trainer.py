"""The local GRPO engine on the reduced starter: updates, checkpoints, exact resume, completion."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from mazerl.training import checkpoints
from mazerl.training.config import TrainConfig, TrainingConfigError, save_config
from mazerl.training.local_trainer import LocalGRPOTrainer
from mazerl.training.recipes import MINIATURE_TRAINING


def tiny_config(root, model_dir, run_id="r", **overrides):
    """Seconds per step: 1 maze x 2 samples, 3-move episodes, sampling warm enough to vary rewards."""
    values = {
        "run_id": run_id,
        "data_root": str(root),
        "base_model": str(model_dir),
        "eval_set": "maze256-small-v1",
        **MINIATURE_TRAINING,
        "steps": 3,
        "checkpoints_kept": 5,
    }
    for key, value in overrides.items():
        values[key] = value if not isinstance(value, dict) else {**values.get(key, {}), **value}
    return TrainConfig.model_validate(values)


def adapter_tensors(config, step=None):
    latest = checkpoints.latest(config.checkpoint_dir)
    path = checkpoints.step_dir(config.checkpoint_dir, step) if step else latest.path
    return load_file(str(path / checkpoints.ADAPTER_SUBDIR / "adapter_model.safetensors"))


class MetricsSink:
    def __init__(self):
        self.rows = []
        self.by_step = {}

    def log(self, step, metrics):
        self.rows.append(metrics)
        self.by_step[step] = metrics


def test_training_changes_the_adapter_and_checkpoints_every_step(tmp_path, starter_model_dir):
    # 4 samples at temperature 1.2: a group whose rewards all tie has zero advantages and moves nothing
    config = tiny_config(
        tmp_path, starter_model_dir, steps=2, grpo={"update_epochs": 1, "samples_per_maze": 4, "temperature": 1.2}
    )
    sink = MetricsSink()
    result = LocalGRPOTrainer(config, log=lambda _: None).run(metrics_sink=sink)
    # one optimizer step per batch: the probability ratio is 1, nothing can clip, so no clip_fraction
    assert all("train/clip_fraction" not in row for row in sink.rows), [sorted(row) for row in sink.rows]
    assert (result.start_step, result.final_step, result.steps_run) == (0, 2, 2)
    assert checkpoints.read_marker(config.checkpoint_dir) == 2
    state = checkpoints.load_trainer_state(checkpoints.latest(config.checkpoint_dir))
    assert state["global_step"] == 2 and state["data_order"]["next_step"] == 3
    lora_b = {k: v for k, v in adapter_tensors(config).items() if "lora_B" in k}
    assert lora_b and any(v.abs().sum() > 0 for v in lora_b.values()), "LoRA B starts at zero; updates must move it"
    assert not any("visual" in k for k in adapter_tensors(config)), "the vision tower gets no adapter"


@pytest.mark.slow
def test_resumed_run_equals_uninterrupted_run_bitwise(tmp_path, starter_model_dir):
    # Given the same seed, when one run does 3 steps and another does 2 then resumes to 3,
    # then the final adapters are bit-identical (CPU, one thread).
    straight = tiny_config(tmp_path / "a", starter_model_dir)
    LocalGRPOTrainer(straight, log=lambda _: None).run()
    first = tiny_config(tmp_path / "b", starter_model_dir, steps=2)
    LocalGRPOTrainer(first, log=lambda _: None).run()
    resumed = tiny_config(tmp_path / "b", starter_model_dir)
    lines = []
    result = LocalGRPOTrainer(resumed, log=lines.append).run()
    assert result.start_step == 2 and result.steps_run == 1
    assert any("resumed from step 2" in line for line in lines)
    a, b = adapter_tensors(straight), adapter_tensors(resumed)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after resume"


def test_without_a_metrics_sink_the_trainer_writes_no_metrics_file(tmp_path, starter_model_dir):
    # The metrics file is the job's (local_entry passes a sink that writes it); the trainer alone
    # keeps only its checkpoints, so a library caller's run directory holds no stray metrics.
    config = tiny_config(tmp_path, starter_model_dir, steps=1)
    LocalGRPOTrainer(config, log=lambda _: None).run()
    assert checkpoints.read_marker(config.checkpoint_dir) == 1
    assert not (config.run_dir / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_run_with_retries_resumes_bitwise_and_retries_the_split_mazes(tmp_path):
    from mazerl.starter.shipped import shipped_starter

    # The shipped starter (it solves some samples and fails others), 2 mazes x 4 samples at
    # temperature 1.2, one slot a step for a retry: the record of each maze's last group goes into
    # every checkpoint, so a run stopped just before its first retry and resumed draws and trains
    # what 4 straight steps do (the stop follows the retry, wherever this starter's weights put it).
    starter_model_dir = shipped_starter()
    retry = {"mazes_per_step": 2, "retry_share": 0.5, "steps": 4, "max_turns": 10}
    grpo = {"update_epochs": 1, "samples_per_maze": 4, "temperature": 1.2}
    straight = tiny_config(tmp_path / "a", starter_model_dir, grpo=grpo, **retry)
    sink = MetricsSink()
    LocalGRPOTrainer(straight, log=lambda _: None).run(metrics_sink=sink)
    retried = [sink.by_step[step]["train/retry_mazes"] for step in (1, 2, 3, 4)]
    assert retried[0] == 0.0 and 1.0 in retried[1:], f"step 1 has no record yet; steps 2-4 should retry: {retried}"
    state = checkpoints.load_trainer_state(checkpoints.latest(straight.checkpoint_dir))
    assert state["maze_success"] and all(0.0 <= rate <= 1.0 for rate in state["maze_success"].values())
    stop = retried.index(1.0)  # the last step before the first retry: that retry's record is in its checkpoint
    first = tiny_config(tmp_path / "b", starter_model_dir, grpo=grpo, **(retry | {"steps": stop}))
    LocalGRPOTrainer(first, log=lambda _: None).run()
    resumed = tiny_config(tmp_path / "b", starter_model_dir, grpo=grpo, **retry)
    resumed_sink = MetricsSink()
    LocalGRPOTrainer(resumed, log=lambda _: None).run(metrics_sink=resumed_sink)
    for step in range(stop + 1, 5):
        for key in ("train/retry_mazes", "train/reward_mean", "train/policy_loss"):
            assert resumed_sink.by_step[step][key] == sink.by_step[step][key], (step, key)
    a, b = adapter_tensors(straight), adapter_tensors(resumed)
    assert all(torch.equal(a[key], b[key]) for key in a), "the resumed run drew other mazes or trained otherwise"


def test_complete_run_does_no_work_and_says_so(tmp_path, starter_model_dir):
    config = tiny_config(tmp_path, starter_model_dir, steps=1)
    LocalGRPOTrainer(config, log=lambda _: None).run()
    lines = []
    result = LocalGRPOTrainer(config, log=lines.append).run()
    assert result.already_complete and result.steps_run == 0 and result.final_step == 1
    assert "already complete at step 1 (steps=1); nothing to train" in lines
    assert not any(line.startswith("step ") for line in lines), "no step is trained again"


def test_resume_none_refuses_an_existing_checkpoint(tmp_path, starter_model_dir):
    LocalGRPOTrainer(tiny_config(tmp_path, starter_model_dir, steps=1), log=lambda _: None).run()
    with pytest.raises(TrainingConfigError, match="resume='latest'"):
        LocalGRPOTrainer(tiny_config(tmp_path, starter_model_dir, steps=2, resume="none")).run()


def test_checkpoint_from_another_base_model_is_refused(tmp_path, starter_model_dir):
    config = tiny_config(tmp_path, starter_model_dir, steps=1)
    LocalGRPOTrainer(config, log=lambda _: None).run()
    checkpoint = checkpoints.latest(config.checkpoint_dir)
    state = checkpoints.load_trainer_state(checkpoint)
    state["base_model_fingerprint"] = "0" * 64
    checkpoints.save_trainer_state(checkpoint.path, state)
    with pytest.raises(TrainingConfigError, match="another base model"):
        LocalGRPOTrainer(tiny_config(tmp_path, starter_model_dir, steps=2)).run()


@pytest.mark.parametrize(
    "schedule, factor",
    [
        ("constant", lambda x: 1.0),
        ("linear", lambda x: 1.0 - x),
        ("cosine", lambda x: (1.0 + math.cos(math.pi * x)) / 2.0),
    ],
)
def test_a_resumed_run_continues_the_learning_rate_schedule_where_the_killed_one_was(
    tmp_path, starter_model_dir, schedule, factor
):
    # Given a 4-step run that stops after step 2 and is resumed, each step's logged rate is
    # learning_rate x f((step - 1) / steps), written out by hand here: what a straight run logs.
    lr = 1e-3
    first = MetricsSink()
    LocalGRPOTrainer(
        tiny_config(tmp_path / "b", starter_model_dir, steps=2, learning_rate=lr, lr_schedule=schedule),
        log=lambda _: None,
    ).run(metrics_sink=first)
    resumed = tiny_config(tmp_path / "b", starter_model_dir, steps=4, learning_rate=lr, lr_schedule=schedule)
    second = MetricsSink()
    LocalGRPOTrainer(resumed, log=lambda _: None).run(metrics_sink=second)
    expected = [lr * factor(k / 4) for k in range(4)]
    # the first run was told steps=2: its schedule spans 2 steps; the resumed one spans 4 from step 3 on
    expected_first = [lr * factor(k / 2) for k in range(2)]

    def rates(sink, steps):  # a resume replays the checkpoint's own row first: read by step
        return [sink.by_step[step]["train/learning_rate"] for step in steps]

    assert rates(first, [1, 2]) == pytest.approx(expected_first, rel=1e-9)
    assert rates(second, [3, 4]) == pytest.approx(expected[2:], rel=1e-9)


@pytest.mark.slow
def test_killed_job_resumes_from_its_checkpoint_without_redoing_steps(tmp_path, starter_model_dir):
    # Given a training process killed hard after its first checkpoint, when it is started
    # again, then it continues at the next step and ends with the uninterrupted adapter.
    config = tiny_config(tmp_path / "killed", starter_model_dir, steps=4)
    path = save_config(config, tmp_path / "train.json")
    command = [sys.executable, "-m", "mazerl.training.local_entry", "--config", str(path)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while checkpoints.read_marker(config.checkpoint_dir) is None and time.time() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = checkpoints.read_marker(config.checkpoint_dir)
    assert killed_at is not None and killed_at < 4
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"resumed from step {killed_at}" in rerun.stdout
    started = [int(line.split()[1].split("/")[0]) for line in rerun.stdout.splitlines() if line.startswith("step ")]
    assert started == list(range(killed_at + 1, 5)), "no completed step is trained twice"
    straight = tiny_config(tmp_path / "straight", starter_model_dir, steps=4)
    LocalGRPOTrainer(straight, log=lambda _: None).run()
    a, b = adapter_tensors(straight), adapter_tensors(config)
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed adapter equals the uninterrupted one"


def test_config_errors_exit_with_code_2(tmp_path, starter_model_dir):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"run_id": "x", "base_model": str(starter_model_dir), "learning_rate": -1}))
    result = subprocess.run(
        [sys.executable, "-m", "mazerl.training.local_entry", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "learning_rate" in result.stdout


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"history_text": -1}, "history_text"),
        ({"history_text": "last"}, "history_text"),
        ({"history_images": 2, "history_text": "feedback"}, "history_images: 1"),
    ],
)
def test_bad_context_modes_are_refused_by_the_config_with_the_fix(tmp_path, starter_model_dir, overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(tmp_path, starter_model_dir, **overrides)
    assert tiny_config(tmp_path, starter_model_dir, history_text="feedback").history_text == "feedback"


def test_mini_batches_hold_whole_groups_in_rollout_order():
    from mazerl.training.grpo import mini_batches
    from mazerl.training.scoring import TurnSample

    samples = [TurnSample([1], [], [2], 0.5, f"train/{maze}") for maze in (7, 7, 3, 3, 3, 9, 5, 5)]
    batches = mini_batches(samples, 2)
    assert [[s.maze_id[6:] for s in batch] for batch in batches] == [["7", "7", "3", "3", "3"], ["9", "5", "5"]]
    assert mini_batches(samples, None) == [samples]


def test_mini_batches_take_one_optimizer_step_each_and_score_old_log_probs_first(
    tmp_path, starter_model_dir, monkeypatch
):
    from mazerl.training.scoring import PackedScorer

    # given 2 mazes per step split into mini-batches of 1 maze, 2 update epochs, rewards that vary,
    config = tiny_config(tmp_path, starter_model_dir, steps=3, mazes_per_step=2, mini_batch_mazes=1)
    scoring = PackedScorer.log_probs
    calls, steps = [], []  # calls: grad enabled?, per log-prob pass; steps: (metrics, that step's calls)

    def recorded(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return scoring(*args, **kwargs)

    class Sink:
        def log(self, step, metrics):
            steps.append((metrics, calls.copy()))
            calls.clear()

    monkeypatch.setattr(PackedScorer, "log_probs", recorded)
    LocalGRPOTrainer(config, log=lambda _: None).run(metrics_sink=Sink())
    # when a step has two mini-batches with samples,
    split = [(m, c) for m, c in steps if m.get("train/optimizer_steps") == 4.0]
    assert split, f"no step had both mazes with an advantage: {[m.get('train/optimizer_steps') for m, _ in steps]}"
    for metrics, step_calls in split:
        # then it takes one optimizer step per (mini-batch, epoch), and the old log-probs are all
        # scored without gradients before the first update (the second mini-batch would otherwise
        # see a policy the first one already moved).
        scored = step_calls.index(True)
        assert scored >= 2 and not any(step_calls[:scored]) and all(step_calls[scored:]), step_calls
        assert metrics["train/grad_norm"] > 0
        assert 0 <= metrics["train/clip_fraction"] <= 1, "several optimizer steps per batch: the clip can bite"


def test_a_reply_of_zero_advantage_is_not_scored_but_counts_in_the_loss_normaliser(
    tmp_path, starter_model_dir, monkeypatch
):
    import mazerl.training.local_trainer as local_trainer

    # Given one step of 2 mazes x 4 samples from the same seed, whose credit is set by hand: the
    # second maze's turns +-0.5, the first maze's 0 (a perfect group) or, as the oracle that
    # scores them, 1e-30 (what float rounding used to leave there),
    recorded = []

    def loss(log_probs, old, reference, advantages, mask, grpo, total):
        recorded.append((len(advantages), total))
        return micro_batch_loss(log_probs, old, reference, advantages, mask, grpo, total)

    micro_batch_loss = local_trainer.micro_batch_loss
    monkeypatch.setattr(local_trainer, "micro_batch_loss", loss)

    def one_step(run_id, fill):
        def credit(episodes, groups, grpo):
            first = groups[0]
            return [
                [fill if group == first else (-1.0) ** (number + turn) * 0.5 for turn in range(len(e.turns))]
                for number, (e, group) in enumerate(zip(episodes, groups, strict=True))
            ]

        monkeypatch.setattr(local_trainer, "turn_credit", credit)
        grpo = {"update_epochs": 1, "samples_per_maze": 4, "temperature": 1.2}
        config = tiny_config(tmp_path, starter_model_dir, run_id=run_id, steps=1, mazes_per_step=2, grpo=grpo)
        sink = MetricsSink()
        LocalGRPOTrainer(config, log=lambda _: None).run(metrics_sink=sink)
        calls = list(recorded)
        recorded.clear()
        return sink.rows[0], calls

    skipped, skipped_calls = one_step("zero", 0.0)
    oracle, oracle_calls = one_step("tiny", 1e-30)
    # when each is updated, then the zero-advantage replies were left out of the scoring,
    scored = sum(n for n, _ in skipped_calls)
    assert 0 < scored < sum(n for n, _ in oracle_calls), (skipped_calls, oracle_calls)
    # over the same normaliser (every reply token of the mini-batch, as SkyRL's token_mean), so the
    # loss and the gradient are the oracle's: a normaliser over the scored replies alone would scale both.
    assert {total for _, total in skipped_calls} == {total for _, total in oracle_calls}
    assert skipped["train/policy_loss"] == pytest.approx(oracle["train/policy_loss"], rel=1e-5)
    assert skipped["train/grad_norm"] == pytest.approx(oracle["train/grad_norm"], rel=1e-5)
    assert oracle["train/grad_norm"] > 0


def test_mini_batch_mazes_must_divide_mazes_per_step(tmp_path, starter_model_dir):
    with pytest.raises(ValueError, match=r"mini_batch_mazes \(3\) must divide mazes_per_step \(8\).*such as 2"):
        tiny_config(tmp_path, starter_model_dir, mazes_per_step=8, mini_batch_mazes=3)


@pytest.mark.parametrize(
    ("overrides", "adapted", "not_adapted"),
    [
        ({}, {"language_model"}, {"visual", "lm_head"}),
        ({"freeze_vision": False}, {"language_model", "visual.blocks", "visual.merger", "deepstack"}, {"lm_head"}),
        ({"lora": {"target_modules": ["q_proj", "lm_head"]}}, {"language_model", "lm_head"}, {"visual"}),
    ],
)
def test_adapters_go_where_the_config_says(tmp_path, starter_model_dir, overrides, adapted, not_adapted):
    # Given a config, when the trainer attaches its adapters to the starter,
    from mazerl.policy.loader import load_policy
    from mazerl.training.lora_adapter import attach_lora

    model = attach_lora(
        load_policy(starter_model_dir, device="cpu").model, tiny_config(tmp_path, starter_model_dir, **overrides)
    )
    names = [name for name, _ in model.named_parameters() if "lora_A" in name]
    # then every part asked for has adapters, and nothing else does
    for part in adapted:
        assert any(part in name for name in names), f"no adapter in {part}: {names[:6]}"
    for part in not_adapted:
        assert not any(part in name for name in names), f"an adapter in {part}"


def test_a_trained_vision_tower_moves_and_is_encoded_anew_each_rollout(tmp_path, starter_model_dir):
    # Given freeze_vision: false, when two steps train,
    config = tiny_config(
        tmp_path,
        starter_model_dir,
        steps=2,
        freeze_vision=False,
        grpo={"update_epochs": 1, "samples_per_maze": 4, "temperature": 1.2, "progress_reward": 0.5, "credit": "turn"},
    )
    trainer = LocalGRPOTrainer(config, log=lambda _: None)
    trainer.run()
    # then the vision tower's adapters moved (per-turn shaping gives every group a gradient),
    lora_b = {k: v for k, v in adapter_tensors(config).items() if "lora_B" in k and "visual" in k}
    assert lora_b and any(v.abs().sum() > 0 for v in lora_b.values()), "the vision tower's adapters must train"
    # and the training model's tower was never routed through the run-long frame cache
    tower = next(m for n, m in trainer.model.named_modules() if n.endswith("visual"))
    assert not hasattr(tower, "_uncached_forward"), "a trained tower must not be cached across steps"


def test_the_stop_token_left_out_of_the_loss_changes_the_update_not_the_rollout(tmp_path, monkeypatch):
    import mazerl.training.local_trainer as local_trainer
    from mazerl.starter.shipped import shipped_starter

    # Given one step of the shipped starter (its replies end: an action, then the stop token) from
    # the same seed, with the stop token trained (SkyRL's way) and left out, the loss masks recorded,
    masks = []

    def recording(log_probs, old, reference, advantages, mask, grpo, total):
        masks.append((grpo.stop_token_loss, mask.clone(), total))
        return micro_batch_loss(log_probs, old, reference, advantages, mask, grpo, total)

    micro_batch_loss = local_trainer.micro_batch_loss
    monkeypatch.setattr(local_trainer, "micro_batch_loss", recording)

    def one_step(run_id, stop_token_loss):
        grpo = {"update_epochs": 1, "samples_per_maze": 4, "temperature": 1.2, "stop_token_loss": stop_token_loss}
        config = tiny_config(
            tmp_path, shipped_starter(), run_id=run_id, steps=1, max_turns=10, mazes_per_step=4, grpo=grpo
        )
        sink = MetricsSink()
        trainer = LocalGRPOTrainer(config, log=lambda _: None)
        trainer.run(metrics_sink=sink)
        return sink.rows[0]

    trained = one_step("with-stop", True)
    left_out = one_step("without-stop", False)
    # then both played the same episodes (the rollout comes before the update), with replies that end,
    for key in ("train/reward_mean", "train/response_tokens", "train/moves_mean"):
        assert trained[key] == left_out[key], key
    assert trained["train/response_tokens"] < 8 * trained["train/moves_mean"], "the replies should end early"
    # and the loss saw every reply token but the stop tokens, over the same normaliser (so the
    # other tokens' gradients are what they were).
    (on, with_stop, total_on), (off, without_stop, total_off) = masks
    assert (on, off) == (True, False) and total_on == total_off
    assert with_stop.shape == without_stop.shape and torch.all(without_stop <= with_stop)
    # Generation stops at a stop token, so it can only be a reply's last token (right-aligned: the
    # last column); the replies the starter ended lose it, and nothing else changes.
    assert torch.equal(without_stop[:, :-1], with_stop[:, :-1])
    assert with_stop[:, -1].sum() == with_stop.shape[0] and without_stop[:, -1].sum() == 0, "every reply ended"


def test_anchor_credit_trains_without_a_solver_and_groups_turns_by_what_the_policy_saw(tmp_path, starter_model_dir):
    import numpy as np

    from mazerl.policy.episodes import Turn
    from mazerl.training.credit import turn_credit

    # Turns with the same tokens and frames share a key (the same state), a changed pixel does not.
    frame = np.zeros((8, 8, 3), dtype=np.uint8)
    moved = frame.copy()
    moved[3, 3] = 255
    turn = Turn([1, 2, 3], [frame], [4], "up", True)
    assert turn.context_key() == Turn([1, 2, 3], [frame.copy()], [5], "down", True).context_key()
    assert turn.context_key() != Turn([1, 2, 3], [moved], [4], "up", True).context_key()
    assert turn.context_key() != Turn([1, 2, 4], [frame], [4], "up", True).context_key()
    # Given credit: anchor with a bump cost (no progress term: no solver), when a step trains,
    config = tiny_config(
        tmp_path,
        starter_model_dir,
        steps=1,
        grpo={"update_epochs": 1, "samples_per_maze": 4, "temperature": 1.2, "bump_cost": 0.1, "credit": "anchor"},
    )
    trainer = LocalGRPOTrainer(config, log=lambda _: None)
    episodes = []
    rollout = trainer._rollout

    def recorded(step):
        episodes.extend(rollout(step))
        return episodes

    trainer._rollout = recorded
    trainer.run()
    # then its turns' advantages are the anchor credit of the rollout it played, and the adapter moved.
    groups = [episode.maze_id for episode in episodes]
    per_turn = turn_credit(episodes, groups, config.grpo)
    assert [len(a) for a in per_turn] == [len(e.turns) for e in episodes]
    assert any(v.abs().sum() > 0 for k, v in adapter_tensors(config).items() if "lora_B" in k)
