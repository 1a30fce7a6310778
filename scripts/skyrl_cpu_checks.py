"""Drive the CPU-reachable parts of the real SkyRL release with our backend (Python >= 3.12).

The GPU parts of a SkyRL run (FSDP workers, vLLM engines) cannot run without GPUs, but the
seams between SkyRL and our code can, and this script exercises each of them with SkyRL's
own functions, not with our reading of them:

1. config: our overrides through ``SkyRLTrainConfig.from_cli_overrides`` and ``validate_cfg``;
   every override must come back unchanged from the built config.
2. tickets: our parquet files through SkyRL's ``PromptDataset`` and ``prepare_generator_input``
   (which repeats each row ``n_samples_per_prompt`` times), then ``skyrl_gym.make('maze2d', ...)``
   exactly as its VLM generator calls it; the solver must earn reward 1.0 on the ticketed maze.
3. metrics: SkyRL's ``get_rollout_metrics`` on our env's metrics gives the names our aliases
   read, and SkyRL's MLflow ``Tracking`` (through our ``MazePPOExp.get_tracker``) logs SkyRL's
   params and our aliased metrics into an existing run when that run is active.
4. trainer_state: a ``trainer_state.pt`` shaped as SkyRL writes it loads through our
   checkpoint reader (``weights_only=True``).

Usage (a Python 3.12 venv outside the repo with ``skyrl==0.4.0``, ``skyrl-gym``, ``mlflow``)::

    /work/venv312/bin/python scripts/skyrl_cpu_checks.py CONFIG.yaml

Prints one line per check and exits 1 if any fails. Results are recorded in docs/skyrl.md.
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from envs.evalset import load as load_eval_set  # noqa: E402
from envs.maze import Layout, solve  # noqa: E402
from mazerl.training.config import TrainConfig, load_config  # noqa: E402
from mazerl.training.skyrl_backend import (  # noqa: E402
    METRIC_ALIASES,
    PLACEHOLDER_PROMPT,
    build_overrides,
    write_datasets,
)


def check_config(config: TrainConfig):
    from skyrl.train.config import SkyRLTrainConfig
    from skyrl.train.utils import validate_cfg

    overrides = build_overrides(config)
    cfg = SkyRLTrainConfig.from_cli_overrides(overrides)
    for name, value in overrides.items():
        node = cfg
        for part in name.split("."):
            node = node[part] if isinstance(node, dict) else getattr(node, part)
        assert node == value, f"{name}: SkyRL built {node!r} from {value!r}"
    validate_cfg(cfg)
    return cfg, f"from_cli_overrides + validate_cfg accepted all {len(overrides)} overrides unchanged"


def tiny_tokenizer():
    """A word-level tokenizer with a chat template: enough for PromptDataset's length filter."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<eos>": 1, "user": 2, "assistant": 3, "placeholder": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="<eos>")
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} <eos> {% endfor %}"
        "{% if add_generation_prompt %}assistant {% endif %}"
    )
    return tokenizer


def play(extras: dict, layout: Layout) -> float:
    import skyrl_gym
    from skyrl.train.config import SkyRLGymConfig

    from envs.skyrl_env import ENV_ID, register_maze_env

    register_maze_env()
    env_config = getattr(SkyRLGymConfig(), ENV_ID, dict())  # what SkyRLVLMGymGenerator passes
    env = skyrl_gym.make(ENV_ID, env_config=env_config, extras=extras)
    env.init(PLACEHOLDER_PROMPT)
    assert env.env.layout == layout, "the env plays a different maze than the ticket names"
    out = None
    for text in solve(layout):
        out = env.step(text)
    return out["reward"]


def check_tickets(config: TrainConfig, cfg):
    from skyrl.train.dataset import PromptDataset
    from skyrl.train.generators.utils import prepare_generator_input

    files = write_datasets(config)
    tokenizer = tiny_tokenizer()
    train = PromptDataset([str(files.train_data)], tokenizer, cfg.trainer.max_prompt_length, num_workers=1)
    batch = train.collate_fn([train[i] for i in range(cfg.trainer.train_batch_size)])
    n = cfg.generator.n_samples_per_prompt
    generator_input, uids = prepare_generator_input(batch, n, {}, cfg.environment.env_class, "train", 1)
    extras = generator_input["env_extras"]
    assert len(extras) == len(batch) * n
    for group in range(len(batch)):
        seeds = {extras[group * n + k]["seed"] for k in range(n)}
        assert len(seeds) == 1, f"group {group} mixes mazes {seeds}"
    budget = cfg.generator.max_turns
    played = 0
    for row in extras[::n]:
        layout = Layout.generate(row["seed"], row["size"])
        if len(solve(layout)) <= budget:  # mazes beyond the move budget cannot earn 1.0 by design
            row = {**copy.deepcopy(row), "max_turns": budget}  # the generator adds max_turns itself
            assert play(row, layout) == 1.0
            played += 1
    assert played > 0, "no ticketed training maze fits the move budget"
    eval_set = load_eval_set(config.eval_set)
    evaluation = PromptDataset([str(files.eval_data)], tokenizer, cfg.trainer.max_prompt_length, num_workers=1)
    for index in range(len(evaluation)):
        _, env_class, extra, _ = evaluation[index]
        assert env_class == "maze2d" and extra["maze_id"] == f"{eval_set.name}/{index}"
        layout = eval_set.layouts[index]
        if len(solve(layout)) <= budget:
            assert play({**extra, "max_turns": budget}, layout) == 1.0
    return (
        f"{len(train)} train and {len(evaluation)} eval rows read by PromptDataset; every GRPO group of "
        f"{n} shares one maze; solver episodes through skyrl_gym.make earn 1.0 on the ticketed mazes "
        f"({played} train groups, every eval maze within the {budget}-move budget)"
    )


def check_metrics(cfg):
    import mlflow
    from skyrl.train.generators.utils import get_rollout_metrics

    from envs.skyrl_env import ENV_ID, register_maze_env
    from mazerl.training.skyrl_entry import _experiment_class

    register_maze_env()
    env_metrics = [{"moves": 4, "parse_failures": 0, "solved": 1.0}, {"moves": 15, "parse_failures": 2, "solved": 0.0}]
    rollout = get_rollout_metrics(
        responses=[[1, 2, 3], [1, 2, 3, 4, 5]],
        rewards=[1.0, 0.0],
        env_metrics=env_metrics,
        env_classes=[ENV_ID, ENV_ID],
        loss_masks=[[1, 0, 1], [1, 1, 0, 0, 1]],
    )
    missing = [m for m in ("environment/solved", "generate/avg_assistant_tokens") if m not in rollout]
    assert not missing, f"SkyRL's rollout metrics lack {missing}: {sorted(rollout)}"
    assert rollout["environment/solved"] == 0.5

    with tempfile.TemporaryDirectory() as tmp:
        mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
        experiment = mlflow.set_experiment(cfg.trainer.project_name)
        ours = mlflow.start_run(run_name="train")
        mlflow.end_run()
        payload = {
            **{f"generate/{k}": 1.0 for k in ("avg_assistant_tokens",)},
            "environment/solved": 0.5,
            "reward/avg_raw_reward": 0.5,
            "policy/policy_loss": -0.1,
            "policy/grad_norm": 0.3,
            "policy/loss_metrics/clip_ratio": 0.02,
            "timing/step": 12.5,
            "eval/all/environment/solved": 0.75,
        }
        exp = object.__new__(_experiment_class())
        exp.cfg = cfg
        with mlflow.start_run(run_id=ours.info.run_id):
            tracker = exp.get_tracker()
            tracker.log(payload, step=3, commit=True)
            tracker.finish()
            assert mlflow.active_run().info.run_id == ours.info.run_id, "SkyRL ended or replaced our run"
        run = mlflow.get_run(ours.info.run_id)
        logged = run.data.metrics
        absent = [name for name in METRIC_ALIASES if name not in logged]
        assert not absent, f"aliases not logged: {absent}"
        assert logged["train/success_rate"] == 0.5 and logged["eval/success_rate"] == 0.75
        assert "trainer/policy/model/path" in run.data.params, "SkyRL's params went elsewhere"
        runs = mlflow.search_runs([experiment.experiment_id], output_format="list")
        assert len(runs) == 1, f"SkyRL created a run of its own ({len(runs)} runs)"
    return (
        f"SkyRL's rollout metrics carry {', '.join(sorted(set(METRIC_ALIASES.values()) & set(rollout)))}; "
        f"Tracking(mlflow) logged SkyRL's {len(run.data.params)} params and all {len(METRIC_ALIASES)} aliases "
        "into the active run, and created no run of its own"
    )


def check_trainer_state(cfg):
    """SkyRL's trainer_state.pt (``{"global_step", "config": asdict(cfg)}``, trainer.save_checkpoints) must
    load through our reader, which unpickles with ``weights_only=True``."""
    from dataclasses import asdict

    import torch

    from mazerl.training import checkpoints

    with tempfile.TemporaryDirectory() as tmp:
        step_dir = Path(tmp) / "global_step_3"
        step_dir.mkdir()
        torch.save({"global_step": 3, "config": asdict(cfg)}, step_dir / checkpoints.TRAINER_STATE)
        state = checkpoints.load_trainer_state(checkpoints.Checkpoint(3, step_dir))
    assert state["global_step"] == 3 and state["config"]["trainer"]["ckpt_path"] == cfg.trainer.ckpt_path
    return "a trainer_state.pt shaped as SkyRL saves it loads with weights_only=True through checkpoints.load_trainer_state"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    config = load_config(argv[0])
    failed = 0
    cfg = None
    checks = [
        ("config", lambda: check_config(config)),
        ("tickets", lambda: check_tickets(config, cfg)),
        ("metrics", lambda: check_metrics(cfg)),
        ("trainer_state", lambda: check_trainer_state(cfg)),
    ]
    for name, check in checks:
        try:
            result = check()
            if name == "config":
                cfg, result = result
            print(f"PASS {name}: {result}", flush=True)
        except Exception as error:  # report every check, then fail
            failed += 1
            print(f"FAIL {name}: {type(error).__name__}: {error}", flush=True)
            if cfg is None:
                break
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
