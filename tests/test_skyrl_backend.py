"""The SkyRL backend's translations, checked on Python 3.11 without SkyRL.

SkyRL's names are checked against ``mazerl/training/skyrl_schema.json``, the field tree of the
real ``SkyRLTrainConfig`` of the pinned release (``scripts/skyrl_schema_snapshot.py`` writes it
where SkyRL is installed), so a renamed SkyRL field fails here, not on a GPU cluster.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import skyrl_gym
from packaging.requirements import Requirement
from packaging.version import Version

from envs.evalset import load as load_eval_set
from envs.maze import Layout, solve
from envs.skyrl_env import ENV_ID, register_maze_env
from mazerl.training import skyrl_schema
from mazerl.training.config import TrainConfig
from mazerl.training.skyrl_backend import (
    METRIC_ALIASES,
    PLACEHOLDER_PROMPT,
    SkyrlConfigError,
    add_metric_aliases,
    build_overrides,
    dataset_rows,
    write_datasets,
)
from mazerl.training.skyrl_schema import load_schema, schema_problems

REPO = Path(__file__).resolve().parents[1]
SCHEMA = load_schema()


def make_config(tmp_path: Path, **changes) -> TrainConfig:
    base = {
        "run_id": "sky-1",
        "data_root": str(tmp_path),
        "base_model": "/shared/models/sft",
        "backend": "skyrl",
        "eval_set": "maze64-easy-v1",
        "train_pool_size": 64,
        "mazes_per_step": 16,
        "steps": 10,
    }
    for key, value in changes.items():
        if isinstance(value, dict):
            base[key] = {**base.get(key, {}), **value}
        else:
            base[key] = value
    return TrainConfig.model_validate(base)


# --- names: every override is a real field of the pinned SkyRL -------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"grpo": {"kl_coef": 0.01, "loss_reduction": "sequence_mean"}, "eval_interval": 5, "eval_mazes": 8},
        {"skyrl": {"num_gpus": 4, "num_nodes": 2, "tensor_parallel_size": 2, "lora_sync_path": "/shared/sync"}},
        {"eval_set": "maze256-small-v1", "resume": "none", "action_format": "keyword"},
        {"lr_schedule": "cosine", "grpo": {"update_epochs": 1}},
    ],
    ids=["defaults", "kl-and-eval", "two-nodes-tp2", "embedded-world", "cosine"],
)
def test_every_override_names_a_field_of_the_pinned_skyrl_snapshot(tmp_path, changes):
    # given a config, when translated, then SkyRL's real config tree has every name with a compatible type
    overrides = build_overrides(make_config(tmp_path, **changes))
    assert schema_problems(overrides, SCHEMA) == [], "overrides must match the SkyRL snapshot"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"trainer.ckpt_dir": "/x"}, "no such field"),  # a renamed field
        ({"trainer.ckpt_interval": "ten"}, "SkyRL declares int"),  # a wrong type
        ({"trainer.policy": {"model": {}}}, "config section"),  # a section given as a value
        ({"generator.n_samples": 8}, "no such field"),
        ({"trainer.policy.model.lora.rank": 32.5}, "SkyRL declares int"),
    ],
)
def test_schema_check_catches_renamed_fields_and_wrong_types(override, expected):
    problems = schema_problems(override, SCHEMA)
    assert len(problems) == 1 and expected in problems[0], f"expected one problem mentioning {expected!r}: {problems}"


@pytest.mark.parametrize(
    "override",
    [
        {"generator.inference_engine.engine_init_kwargs.max_model_len": 4096},  # free-form dict field
        {"trainer.policy.optimizer_config.lr": 1},  # an int where a float is declared
        {"trainer.policy.model.lora.target_modules": ["q_proj"]},  # the documented list form
        {"trainer.max_training_steps": None},  # Optional
    ],
)
def test_schema_check_accepts_what_skyrl_accepts(override):
    assert schema_problems(override, SCHEMA) == []


def test_snapshot_version_and_pins_agree_with_our_pyproject():
    # given the snapshot of skyrl[fsdp] and our dependency ranges
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    ours = [Requirement(text) for text in project["dependencies"] + project["optional-dependencies"]["cluster"]]
    by_name = {}
    for requirement in ours:
        by_name.setdefault(requirement.name.lower(), []).append(requirement)
    # then the snapshot's SkyRL release is inside our pin
    (skyrl,) = by_name["skyrl"]
    assert Version(SCHEMA["skyrl_version"]) in skyrl.specifier, (
        f"skyrl {SCHEMA['skyrl_version']} (snapshot) is outside our pin {skyrl.specifier}: regenerate the snapshot"
    )
    # and every exact pin of skyrl[fsdp] that we also name is allowed by our range (or the image cannot resolve)
    checked = 0
    for name, pin in SCHEMA["fsdp_pins"].items():
        version = Version(pin.removeprefix("=="))
        for requirement in by_name.get(name, []):
            checked += 1
            assert version in requirement.specifier, f"skyrl[fsdp] pins {name}{pin} but we require {requirement}"
    assert checked >= 4, "torch, vllm, ray and peft must all be checked against SkyRL's pins"


# --- the mapping ------------------------------------------------------------------------------------


def test_mapping_of_the_issue_fields(tmp_path):
    config = make_config(tmp_path, skyrl={"num_gpus": 8, "num_nodes": 2, "tensor_parallel_size": 2})
    o = build_overrides(config)
    expected = {
        "trainer.policy.model.path": "/shared/models/sft",
        "trainer.policy.model.lora.rank": 32,
        "trainer.policy.model.lora.alpha": 64,
        "trainer.policy.model.lora.lora_sync_path": str(config.run_dir / "lora_sync"),
        "trainer.algorithm.advantage_estimator": "grpo",
        "trainer.algorithm.use_kl_loss": False,
        "generator.n_samples_per_prompt": 8,
        "generator.max_turns": 15,
        "generator.vision_language_generator": True,
        "generator.batched": False,
        "trainer.remove_microbatch_padding": False,
        "trainer.ckpt_path": str(config.checkpoint_dir),
        "trainer.ckpt_interval": 10,
        "trainer.max_ckpts_to_keep": 2,
        "trainer.resume_mode": "latest",
        "trainer.logger": "mlflow",
        "trainer.project_name": "vlm-maze-grpo",
        "trainer.run_name": "sky-1",
        "trainer.eval_interval": -1,  # our 0 (off) is SkyRL's -1
        "trainer.print_example_interval": 0,  # no "placeholder" prompt printed beside a real reply every step
        "trainer.placement.policy_num_gpus_per_node": 8,
        "trainer.placement.policy_num_nodes": 2,
        "generator.inference_engine.num_engines": 8,  # 16 GPUs / tp 2
        "generator.inference_engine.tensor_parallel_size": 2,
        "trainer.max_training_steps": 10,
        "environment.env_class": ENV_ID,
    }
    assert {key: o[key] for key in expected} == expected
    assert o["trainer.policy.model.lora.target_modules"] == list(config.lora.target_modules)


@pytest.mark.parametrize(("steps", "pool", "per_step", "epochs"), [(10, 64, 16, 3), (4, 64, 16, 1), (5, 64, 16, 2)])
def test_epochs_cover_the_requested_steps_with_dropped_partial_batches(tmp_path, steps, pool, per_step, epochs):
    o = build_overrides(make_config(tmp_path, steps=steps, train_pool_size=pool, mazes_per_step=per_step))
    assert o["trainer.epochs"] == epochs and o["trainer.max_training_steps"] == steps
    assert o["trainer.epochs"] * (pool // per_step) >= steps


@pytest.mark.parametrize(("schedule", "skyrl_name"), [("constant", "constant_with_warmup"), ("cosine", "cosine")])
def test_the_learning_rate_schedule_maps_to_skyrls_scheduler_without_warmup(tmp_path, schedule, skyrl_name):
    o = build_overrides(make_config(tmp_path, lr_schedule=schedule, grpo={"update_epochs": 1}))
    assert o["trainer.policy.optimizer_config.scheduler"] == skyrl_name
    assert o["trainer.policy.optimizer_config.num_warmup_steps"] == 0
    # transformers' get_scheduler decays over SkyRL's total_training_steps, min(batches x epochs, max_training_steps)
    assert o["trainer.max_training_steps"] == 10


def test_kl_coefficient_turns_the_kl_loss_on(tmp_path):
    o = build_overrides(make_config(tmp_path, grpo={"kl_coef": 0.02}))
    assert o["trainer.algorithm.use_kl_loss"] is True and o["trainer.algorithm.kl_loss_coef"] == 0.02


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"backend": "local"}, "backend"),
        ({"history_images": 2}, "history_images"),
        ({"freeze_vision": False}, "freeze_vision"),
        ({"grpo": {"credit": "turn", "progress_reward": 0.5}}, "grpo.credit"),
        ({"grpo": {"stop_token_loss": False}}, "grpo.stop_token_loss"),
        ({"retry_share": 0.25}, "retry_share"),
        ({"lora": {"target_modules": ["q_proj", "lm_head"]}}, "lm_head"),
        ({"lora": {"alpha": 16.5}}, "lora.alpha"),
        ({"lora": {"rank": 4, "alpha": 8}}, "lora.rank"),  # vLLM serves 1, 8, 16, 32, ... only
        ({"lora": {"rank": 48, "alpha": 96}}, "lora.rank"),
        ({"mazes_per_step": 128}, "train_pool_size"),
        ({"mazes_per_step": 3, "skyrl": {"num_gpus": 16}}, "skyrl.num_gpus"),  # 24 episodes over 16 GPUs
        ({"skyrl": {"micro_batch_size_per_gpu": 3}}, "micro_batch_size_per_gpu"),
        ({"mazes_per_step": 8, "mini_batch_mazes": 1, "skyrl": {"num_gpus": 16}}, "mini_batch_mazes"),
        ({"skyrl": {"max_input_length": 1024}}, "max_input_length"),
        ({"skyrl": {"max_model_len": 8192}}, "max_model_len"),
        ({"lr_schedule": "cosine", "grpo": {"update_epochs": 2}}, "lr_schedule"),  # SkyRL steps it per update
        ({"lr_schedule": "linear", "grpo": {"update_epochs": 1}, "mini_batch_mazes": 8}, "lr_schedule"),
    ],
)
def test_unsupported_settings_are_refused_with_the_field_named(tmp_path, changes, named):
    with pytest.raises(SkyrlConfigError, match=named.replace(".", r"\.")):
        build_overrides(make_config(tmp_path, **changes))


# --- the dataset tickets ----------------------------------------------------------------------------


def extras_as_skyrl_builds_them(row: dict, max_turns: int) -> dict:
    """PromptDataset: every column but prompt/env_class; the generator then sets max_turns."""
    extras = {k: v for k, v in copy.deepcopy(row).items() if k not in ("prompt", "env_class")}
    return {**extras, "max_turns": max_turns}


def play_solver(extras: dict) -> tuple[float, Layout]:
    register_maze_env()
    env = skyrl_gym.make(ENV_ID, env_config={}, extras=extras)
    env.init(PLACEHOLDER_PROMPT)
    layout = env.env.layout
    out = None
    for text in solve(layout):
        out = env.step(text)
    return out["reward"], layout


def test_tickets_round_trip_parquet_and_play_the_named_maze(tmp_path):
    # given the embedded world's tickets written as parquet (as SkyRL reads them)
    config = make_config(
        tmp_path, eval_set="maze256-small-v1", grpo={"format_bonus": 0.1, "progress_reward": 0.5}, eval_mazes=32
    )
    files = write_datasets(config)
    train = pq.read_table(files.train_data).to_pylist()
    evaluation = pq.read_table(files.eval_data).to_pylist()
    eval_set = load_eval_set("maze256-small-v1")
    # then train rows are distinct pool mazes, none of them an eval layout, each one group's maze
    seeds = [row["seed"] for row in train]
    assert len(train) == 64 and len(set(seeds)) == 64
    assert not {Layout.generate(s, 7) for s in seeds} & set(eval_set.layouts), "train mazes must avoid eval layouts"
    assert all(row["env_class"] == ENV_ID and row["format_bonus"] == 0.1 for row in train)
    assert all(row["progress_reward"] == 0.5 and row["bump_cost"] == 0.0 for row in train), "shaping reaches the env"
    # and eval rows carry the set's exact layouts, no format bonus
    assert [row["maze_id"] for row in evaluation] == [f"maze256-small-v1/{i}" for i in range(32)]
    assert all(row["format_bonus"] == 0.0 and row["cell_px"] == 16 for row in evaluation)
    # when SkyRL hands a row's columns to our env, then the solver plays exactly that maze to
    # 1.0 (task) + 0.1 (format bonus) + 0.5 (progress: the solver closes the whole distance)
    for row in (train[0], train[-1]):
        reward, layout = play_solver(extras_as_skyrl_builds_them(row, max_turns=60))
        assert layout == Layout.generate(row["seed"], 7) and reward == pytest.approx(1.6), "task + bonus + progress"
    for index in (0, 31):
        reward, layout = play_solver(extras_as_skyrl_builds_them(evaluation[index], max_turns=60))
        assert layout == eval_set.layouts[index] and reward == 1.0


def test_ticket_prompt_is_skyrls_visgym_placeholder_and_the_env_builds_the_real_first_message(tmp_path):
    # given a ticket as written (the prompt column of SkyRL's VisGym example: "placeholder"),
    train, _ = dataset_rows(make_config(tmp_path, eval_set="maze256-small-v1"))
    assert train[0]["prompt"] == [{"role": "user", "content": "placeholder"}] == PLACEHOLDER_PROMPT
    # when SkyRL's generator hands it to env.init, then the env replaces it with the task text and the frame.
    register_maze_env()
    env = skyrl_gym.make(ENV_ID, env_config={}, extras=extras_as_skyrl_builds_them(train[0], max_turns=15))
    (first,), _ = env.init(copy.deepcopy(train[0]["prompt"]))
    text, image = first["content"]
    assert text == {"type": "text", "text": env.env.prompt()} and "placeholder" not in text["text"]
    assert image["image_url"]["url"].startswith("data:image/png;base64,")


def test_tickets_are_a_pure_function_of_the_config(tmp_path):
    config = make_config(tmp_path)
    assert dataset_rows(config) == dataset_rows(config), "a resumed job must rewrite identical datasets"


# --- metric names -----------------------------------------------------------------------------------


def test_metric_aliases_copy_skyrl_names_onto_ours():
    payload = {
        "reward/avg_raw_reward": 0.4,
        "environment/solved": 0.375,
        "generate/avg_assistant_tokens": 61.0,
        "policy/policy_loss": -0.02,
        "policy/grad_norm": 0.7,
        "policy/loss_metrics/clip_ratio": 0.01,
        "timing/step": 33.0,
        "reward/avg_pass_at_8": 0.9,  # pass@n counts any positive reward: never our success rate
    }
    out = add_metric_aliases(payload)
    assert out["train/success_rate"] == 0.375 and out["train/reward_mean"] == 0.4
    assert out["train/step_seconds"] == 33.0 and out["train/clip_fraction"] == 0.01
    assert "eval/success_rate" not in out, "no eval in this payload: no eval alias"
    assert {k: out[k] for k in payload} == payload, "SkyRL's own names stay"
    assert add_metric_aliases({"eval/all/environment/solved": 0.5})["eval/success_rate"] == 0.5


def test_every_alias_source_is_a_name_skyrl_logs():
    # sources are built from SkyRL's prefixes; a typo would silently never match
    prefixes = ("reward/", "environment/", "generate/", "policy/", "timing/", "eval/all/")
    assert all(source.startswith(prefixes) for source in METRIC_ALIASES.values())
    assert set(METRIC_ALIASES) >= {
        "train/reward_mean",
        "train/success_rate",
        "train/response_tokens",
        "train/policy_loss",
        "train/grad_norm",
        "train/step_seconds",
        "eval/success_rate",
    }


def test_schema_path_is_the_committed_snapshot():
    assert skyrl_schema.SCHEMA_PATH.is_file() and SCHEMA["root"] == "skyrl.train.config.SkyRLTrainConfig"


def test_mini_batches_map_to_skyrl_policy_mini_batch_size(tmp_path):
    assert build_overrides(make_config(tmp_path))["trainer.policy_mini_batch_size"] == 16
    o = build_overrides(make_config(tmp_path, mini_batch_mazes=4))
    assert (o["trainer.train_batch_size"], o["trainer.policy_mini_batch_size"]) == (16, 4)
