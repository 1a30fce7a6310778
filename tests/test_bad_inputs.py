"""Bad input: every case is refused before expensive work, with a message naming the parameter and the fix.

Two tables. ``CLI_CASES`` drives the real ``mazerl run``, ``mazerl eval`` and ``mazerl
build-starter`` in a subprocess, as a user types them: exit code 2, one ``error:`` line naming
the flag or field and the fix, no traceback, nothing written (no data root, no output
directory, nothing in the process's TMPDIR: no Ray head, no Prefect database), in about a
second each. ``CASES`` hands inputs to the part of the pipeline that owns them, in process.

Expensive work means loading model weights, building the starter, starting a Ray head,
submitting a stage's Ray job (eval or training) and training; the ``expensive_work`` fixture
turns each of them into a recorded failure, and every ``CASES`` entry asserts none happened.
``verify_cluster``'s probe job is the cheap check itself (seconds) and may run.

docs/bad-input.md lists every case of both tables (a test checks it does).

Where a case is refused decides what it may leave behind:

- ``pipeline``: a real flow run (Prefect's test harness) rejected by parameter validation or
  by the first task's input checks (:mod:`mazerl.preflight`): nothing is written under the data
  root, no MLflow run exists; the error record is the failed Prefect flow run with the message.
- ``cluster``: refused by ``verify_cluster`` (the pipeline's first stage, run here as the stage
  runs it). On a real run its MLflow ``verify_cluster`` run and Prefect table are the record.
- ``trainer``: the training job's entry refuses its checkpoint before the model is loaded.
- ``world`` / ``deploy``: the maze world's constructor, the deployment file's schedule check.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from mazerl.params import PipelineParams
from mazerl.training.recipes import MINIATURE_TRAINING

PROJECT = Path(__file__).resolve().parents[1]
DOCS_TABLE = PROJECT / "docs" / "bad-input.md"


@dataclass
class World:
    """What a case may need to build its input."""

    tmp: Path
    model_dir: Path
    ray_address: str
    monkeypatch: pytest.MonkeyPatch
    not_ray: str = ""  # an HTTP server that answers 404 to everything (what a wrong host:port often is)

    @property
    def root(self) -> Path:
        return self.tmp / "root"

    def params(self, **overrides) -> dict:
        """Miniature pipeline parameters (the good ones), with ``overrides`` merged into them."""
        values = {
            "base_model": str(self.model_dir),
            "eval_set": "maze256-small-v1",
            "data_root": str(self.root),
            "ray_address": self.ray_address,
            "max_eval_mazes": 4,
            "eval_workers": 1,
            "training": dict(MINIATURE_TRAINING),
        }
        for key, value in overrides.items():
            values[key] = {**values[key], **value} if isinstance(value, dict) and key == "training" else value
        return values

    def model_copy(self, name: str, without: tuple[str, ...] = ()) -> Path:
        target = self.tmp / name
        shutil.copytree(self.model_dir, target, ignore=shutil.ignore_patterns(*without))
        return target


@dataclass(frozen=True)
class Case:
    id: str
    gate: str  # pipeline | cluster | trainer | world | deploy
    attempt: Callable[[World], object]  # builds the input and hands it to the gate
    field: str  # the parameter the message must name
    fix: str  # words of the fix the message must give


# --- inputs ---------------------------------------------------------------------------------------


def closed_port_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed again: nothing listens


def text_only_model(w: World) -> Path:
    from transformers import LlamaConfig

    directory = w.model_copy("llama", without=("config.json",))
    LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(
        directory
    )
    return directory


def edited_eval_set(w: World) -> None:
    from envs import evalset

    data = w.tmp / "evalsets"
    shutil.copytree(evalset.DATA_DIR, data)
    path = data / "maze256-small-v1.json"
    content = json.loads(path.read_text())
    content["layouts"][0]["agent"] = content["layouts"][0]["target"]  # one maze made trivial
    path.write_text(json.dumps(content))
    w.monkeypatch.setattr(evalset, "DATA_DIR", data)


def edited_eval_set_with_its_digest_recomputed(w: World) -> None:
    from envs import evalset

    data = w.tmp / "evalsets"
    shutil.copytree(evalset.DATA_DIR, data)
    path = data / "maze256-small-v1.json"
    content = json.loads(path.read_text())
    content["max_moves"] = 40  # a larger budget, and its digest made to match again
    content["sha256"] = evalset.content_digest(content)
    path.write_text(json.dumps(content))
    w.monkeypatch.setattr(evalset, "DATA_DIR", data)


ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


def truncated_weights(model: Path, name: str = "model.safetensors") -> Path:
    """The model (or adapter) directory as a copy that stopped early: its weights file is cut in half."""
    weights = model / name
    with open(weights, "r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)
    return model


def garbage_config(model: Path) -> Path:
    (model / "config.json").write_text("{this is not json")
    return model


def unwritable_root(w: World) -> str:
    blocker = w.tmp / "a-file"
    blocker.write_text("not a directory")  # root ignores permissions; a path below a file cannot be created
    return str(blocker / "root")


def fake_checkpoint(w: World, fingerprint: str | None = None, adapter_config: str | None = None):
    """A complete-looking checkpoint at step 1 of run ``r`` (files the marker's verify() wants)."""
    from safetensors.torch import save_file

    from mazerl.fingerprint import model_fingerprint
    from mazerl.training import checkpoints
    from mazerl.training.config import TrainConfig

    config = TrainConfig.model_validate(
        {"run_id": "r", "data_root": str(w.root), "base_model": str(w.model_dir), "eval_set": "maze256-small-v1"}
        | MINIATURE_TRAINING
    )

    def write(path: Path) -> None:
        adapter = path / checkpoints.ADAPTER_SUBDIR
        adapter.mkdir(parents=True)
        save_file({"x.lora_A.weight": torch.zeros(1, 1)}, str(adapter / "adapter_model.safetensors"))
        lora = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
        (adapter / "adapter_config.json").write_text(adapter_config or json.dumps(lora))
        state = {"global_step": 1, "base_model_fingerprint": fingerprint or model_fingerprint(w.model_dir)}
        checkpoints.save_trainer_state(path, state)
        for name in checkpoints.LOCAL_POLICY_FILES:  # the local backend's optimizer and RNG state: a resume loads them
            torch.save({}, path / name)

    checkpoints.save(config.checkpoint_dir, 1, write, keep=2)
    return config


# --- gates: what the pipeline runs first, in the order it runs it ----------------------------------


def pipeline_gate(values: dict) -> Exception:
    """A real flow run; returns the exception it failed with (the test fails if it did not)."""
    from flows.pipeline import pipeline

    state = pipeline(params=values, return_state=True)
    assert state.is_failed(), f"the flow run should fail, it ended {state.type}"
    pipeline_gate.last_flow_run_id = state.state_details.flow_run_id
    return state.result(raise_on_failure=False)


def cluster_gate(values: dict, hyperpod_client=None) -> Exception:
    """``verify_cluster`` with the requirements and fixes the pipeline's first stage uses."""
    from mazerl.cluster.checks.fixes import CLUSTER_FIXES
    from mazerl.cluster.checks.run_requirements import requirements_for
    from mazerl.cluster.checks.verify import ReadinessRequest, verify_cluster
    from tasks.context import ray_headers

    params = PipelineParams.model_validate(values)
    config = params.train_config("r", Path(params.base_model))
    request = ReadinessRequest(
        data_root=str(params.root()),
        base_model=params.base_model,
        eval_set=params.resolved_eval_set(),
        hyperpod_cluster=params.hyperpod_cluster,
        **requirements_for(config),
    )
    report = verify_cluster(
        params.ray_address, request, headers=ray_headers(params.ray_address), sagemaker_client=hyperpod_client
    )
    with pytest.raises(Exception) as caught:
        report.raise_for_failures(CLUSTER_FIXES)
    return caught.value


def trainer_gate(config) -> Exception:
    from mazerl.training.local_trainer import LocalGRPOTrainer

    with pytest.raises(Exception) as caught:
        LocalGRPOTrainer(config, log=lambda _: None).run()
    return caught.value


def raised(fn: Callable[[], object]) -> Exception:
    with pytest.raises(Exception) as caught:
        fn()
    return caught.value


def hyperpod_not_found(w: World) -> Exception:
    import boto3
    from moto import mock_aws

    with mock_aws():
        client = boto3.client("sagemaker", region_name="us-east-1")
        values = w.params(ray_address=closed_port_address(), hyperpod_cluster="typo-cluster")
        return cluster_gate(values, hyperpod_client=client)


def bad_cron(w: World) -> Exception:
    from cli.schedules import PREFECT_YAML, check_schedules

    edited = w.tmp / "prefect.yaml"
    edited.write_text(PREFECT_YAML.read_text().replace('cron: "0 3 * * 1"', 'cron: "61 3 * * 1"'))
    assert edited.read_text() != PREFECT_YAML.read_text(), "the local deployment's schedule was edited"
    return raised(lambda: check_schedules(edited))


def even_maze(w: World) -> Exception:
    from envs.maze import MazeEnv
    from envs.skyrl_env import MazeTextEnv

    first = raised(lambda: MazeEnv(size=8))
    second = raised(lambda: MazeTextEnv(extras={"seed": 0, "size": 8}))
    assert str(first) == str(second), "the skyrl-gym env refuses it with the world's own message"
    return first


CASES = [
    Case(
        "wrong model path",
        "pipeline",
        lambda w: pipeline_gate(w.params(base_model=str(w.tmp / "no-such-model"))),
        "base_model",
        "give the Hugging Face model directory",
    ),
    Case(
        "directory without processor",
        "pipeline",
        lambda w: pipeline_gate(
            w.params(base_model=str(w.model_copy("no-proc", ("preprocessor_config.json", "processor_config.json"))))
        ),
        "base_model",
        "copy the complete model directory",
    ),
    Case(
        "non-VLM model",
        "pipeline",
        lambda w: pipeline_gate(w.params(base_model=str(text_only_model(w)))),
        "base_model",
        "needs a vision-language model such as Qwen3-VL",
    ),
    Case("even maze size", "world", even_maze, "size=8", "use an odd integer >= 5"),
    Case(
        "eval set file edited",
        "pipeline",
        lambda w: (edited_eval_set(w), pipeline_gate(w.params()))[1],
        "eval_set",
        "restore it with `git checkout",
    ),
    Case(
        "unknown eval set name",
        "pipeline",
        lambda w: pipeline_gate(w.params(eval_set="maze65-easy-v1")),
        "eval_set",
        "choose one of ['maze256-small-v1', 'maze64-easy-v1']",
    ),
    Case(
        "move budget 0",
        "pipeline",
        lambda w: pipeline_gate(w.params(training={"max_turns": 0})),
        "training.max_turns",
        "must be >= 1",
    ),
    Case(
        "move budget negative",
        "pipeline",
        lambda w: pipeline_gate(w.params(training={"max_turns": -3})),
        "training.max_turns",
        "must be >= 1",
    ),
    Case(
        "LoRA rank 0 (the pipeline always merges)",
        "pipeline",
        lambda w: pipeline_gate(w.params(training={"lora": {"rank": 0, "alpha": 8}})),
        "training.lora.rank",
        "must be >= 1",
    ),
    Case(
        "negative learning rate",
        "pipeline",
        lambda w: pipeline_gate(w.params(training={"learning_rate": -1e-4})),
        "training.learning_rate",
        "must be > 0",
    ),
    Case(
        "GRPO group size 1",
        "pipeline",
        lambda w: pipeline_gate(w.params(training={"grpo": {**MINIATURE_TRAINING["grpo"], "samples_per_maze": 1}})),
        "training.grpo.samples_per_maze",
        "must be >= 2",
    ),
    Case(
        "unreachable Ray address",
        "cluster",
        lambda w: cluster_gate(w.params(ray_address=closed_port_address())),
        "ray_address",
        "check that the head is running",
    ),
    Case(
        "Ray address of the wrong kind",
        "pipeline",
        lambda w: pipeline_gate(w.params(ray_address="ray://127.0.0.1:10001")),
        "ray_address",
        "must look like http://host:8265",
    ),
    Case(
        "too few GPUs for the placement",
        "cluster",
        lambda w: cluster_gate(
            w.params(backend="skyrl", training={"skyrl": {"num_gpus": 2, "num_nodes": 1}, "mazes_per_step": 2})
        ),
        "training.skyrl.num_gpus",
        "add GPU nodes",
    ),
    Case(
        "data root not writable",
        "pipeline",
        lambda w: pipeline_gate(w.params(data_root=unwritable_root(w))),
        "data_root",
        "choose a directory you can write",
    ),
    Case(
        "resume required, no checkpoint (pipeline)",
        "pipeline",
        lambda w: pipeline_gate(w.params(training={"resume": "required"})),
        "training.resume",
        "set training.resume='latest'",
    ),
    Case(
        "resume required, no checkpoint (training job)",
        "trainer",
        lambda w: trainer_gate(
            PipelineParams.model_validate(w.params(training={"resume": "required"})).train_config("r", w.model_dir)
        ),
        "resume='required'",
        "set resume='latest' to start from scratch",
    ),
    Case(
        "checkpoint from a different base model",
        "trainer",
        lambda w: trainer_gate(fake_checkpoint(w, fingerprint="0" * 64)),
        "base_model",
        "use the same base_model or a new run_id",
    ),
    Case(
        "malformed adapter config (not JSON)",
        "trainer",
        lambda w: trainer_gate(fake_checkpoint(w, adapter_config="{not json")),
        "adapter_config.json",
        "restore a checkpoint, or start the run anew",
    ),
    Case(
        "malformed adapter config (rank 0)",
        "trainer",
        lambda w: trainer_gate(
            fake_checkpoint(w, adapter_config=json.dumps({"peft_type": "LORA", "r": 0, "target_modules": ["q"]}))
        ),
        "adapter_config.json",
        "r is 0, not a positive integer",
    ),
    Case(
        "registered model name with illegal characters",
        "pipeline",
        lambda w: pipeline_gate(w.params(registered_model="maze/vlm:v1")),
        "registered_model",
        "may use only letters, digits",
    ),
    Case(
        "tracking URI malformed",
        "pipeline",
        lambda w: pipeline_gate(w.params(tracking_uri="mlflow-server:5000")),
        "tracking_uri",
        "use an MLflow server (http(s)://host:port)",
    ),
    Case("schedule cron invalid", "deploy", bad_cron, "cron", "e.g. '0 3 * * 1'"),
    Case(
        "HyperPod cluster not found", "cluster", hyperpod_not_found, "hyperpod_cluster", "aws sagemaker list-clusters"
    ),
    Case(
        "eval set edited, its digest recomputed",
        "pipeline",
        lambda w: (edited_eval_set_with_its_digest_recomputed(w), pipeline_gate(w.params()))[1],
        "eval_set",
        "this code pins for that set",
    ),
    Case(
        "truncated weights",
        "pipeline",
        lambda w: pipeline_gate(w.params(base_model=str(truncated_weights(w.model_copy("cut"))))),
        "base_model",
        "is truncated",
    ),
    Case(
        "garbage config.json",
        "pipeline",
        lambda w: pipeline_gate(w.params(base_model=str(garbage_config(w.model_copy("garbage"))))),
        "base_model",
        "a readable config.json",
    ),
    Case(
        "experiment name empty",
        "pipeline",
        lambda w: pipeline_gate(w.params(experiment="")),
        "experiment",
        "give an MLflow experiment name",
    ),
    Case(
        "tracking server unreachable",
        "pipeline",
        lambda w: pipeline_gate(w.params(tracking_uri=closed_port_address())),
        "tracking_uri",
        "did not answer",
    ),
    Case(
        "learning rate Infinity",
        "pipeline",
        lambda w: pipeline_gate(w.params(training={"learning_rate": float("inf")})),
        "training.learning_rate",
        "finite number",
    ),
    Case(
        "steps true",
        "pipeline",
        lambda w: pipeline_gate(w.params(training={"steps": True})),
        "training.steps",
        "must be a number, not a boolean",
    ),
    Case(
        "steps 10^20",
        "pipeline",
        lambda w: pipeline_gate(w.params(training={"steps": 10**20})),
        "training.steps",
        "less than or equal to 1000000",
    ),
    Case(
        "training pool larger than the world",
        "pipeline",
        lambda w: pipeline_gate(w.params(training={"train_pool_size": 600})),
        "train_pool_size",
        "lower train_pool_size to at most 512",
    ),
    Case(
        "Ray address answering 404",
        "cluster",
        lambda w: cluster_gate(w.params(ray_address=w.not_ray)),
        "ray_address",
        "did not answer",
    ),
]


# --- the same inputs through the real command line -------------------------------------------------


@dataclass(frozen=True)
class CliCase:
    id: str
    argv: Callable[[Path, str], list[str]]  # (a scratch dir for inputs, the 404 server's address) -> arguments
    field: str  # the flag or field the message must name
    fix: str  # words of the fix the message must give
    tmpdir: Callable[[Path], Path] | None = None  # the command's TMPDIR, when the case is about it


def write(directory: Path, name: str, content: bytes | str) -> str:
    path = directory / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def fake_model(directory: Path, damage: str) -> str:
    """A model directory of the files the preflight reads (config, weights header, processor, tokenizer), damaged."""
    import numpy as np
    from safetensors.numpy import save_file

    model = directory / f"model-{damage}"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3_vl"}' if damage != "config" else "{garbage")
    save_file({"w": np.zeros(1024, dtype=np.float32)}, str(model / "model.safetensors"))
    if damage == "weights":
        truncated_weights(model)
    for name in ("preprocessor_config.json", "tokenizer.json"):
        (model / name).write_text("{}")
    return str(model)


def lora_adapter(
    directory: Path, name: str, config_rank: int = 4, edit: Callable[[Path], object] = lambda _: None
) -> str:
    """A rank-4 LoRA adapter of one layer whose config names ``config_rank``, then edited."""
    import numpy as np
    from safetensors.numpy import save_file

    adapter = directory / name
    adapter.mkdir()
    layer = "base_model.model.model.language_model.layers.0.self_attn.q_proj"
    weights = {
        f"{layer}.lora_A.weight": np.zeros((4, 64), np.float32),
        f"{layer}.lora_B.weight": np.zeros((64, 4), np.float32),
    }
    save_file(weights, str(adapter / ADAPTER_WEIGHTS))
    config = {"peft_type": "LORA", "r": config_rank, "lora_alpha": 8, "target_modules": ["q_proj"]}
    (adapter / ADAPTER_CONFIG).write_text(json.dumps(config))
    edit(adapter)
    return str(adapter)


def cut_adapter(adapter: Path) -> None:
    truncated_weights(adapter, ADAPTER_WEIGHTS)


def fifo(directory: Path, name: str) -> str:
    """A named pipe nobody writes to: reading it would block the command forever."""
    os.mkfifo(directory / name)
    return str(directory / name)


def long_tmpdir(directory: Path) -> Path:
    path = directory / ("t" * 40)
    path.mkdir()
    return path


def adapter_without_files(directory: Path) -> str:
    (directory / "adapter").mkdir()
    return str(directory / "adapter")


SKYRL_PLACEMENT = {"backend": "skyrl", "training": {"skyrl": {"num_gpus": 3, "tensor_parallel_size": 2}}}
RUN, EVAL, BUILD = ["run"], ["eval"], ["build-starter", "--reduced"]
CLI_CASES = [
    CliCase(
        "run: --training a JSON array", lambda d, _: RUN + ["--training", "[1, 2]"], "--training", "give an object"
    ),
    CliCase("run: --training null", lambda d, _: RUN + ["--training", "null"], "--training", "give an object"),
    CliCase("run: --training not JSON", lambda d, _: RUN + ["--training", "{steps: 4"], "--training", "not valid JSON"),
    CliCase(
        "run: --params holding a list",
        lambda d, _: RUN + ["--params", write(d, "list.json", "[1]")],
        "--params",
        "give an object",
    ),
    CliCase(
        "run: --params not JSON",
        lambda d, _: RUN + ["--params", write(d, "bad.json", "{x")],
        "bad.json is not valid JSON",
        "give a JSON object",
    ),
    CliCase(
        "run: --params not UTF-8",
        lambda d, _: RUN + ["--params", write(d, "latin.json", b'{"experiment": "caf\xe9"}')],
        "latin.json is not UTF-8",
        "save it as UTF-8 JSON",
    ),
    CliCase(
        "run: --params a named pipe",
        lambda d, _: RUN + ["--params", fifo(d, "params.fifo")],
        "--params",
        "is not a regular file (a named pipe)",
    ),
    CliCase(
        "run: --params /dev/zero",
        lambda d, _: RUN + ["--params", "/dev/zero"],
        "--params /dev/zero",
        "is not a regular file (a character device)",
    ),
    CliCase(
        "run: --params missing",
        lambda d, _: RUN + ["--params", str(d / "absent.json")],
        "absent.json cannot be read",
        "give a JSON file",
    ),
    CliCase(
        "run: --data-root below a file",
        lambda d, _: RUN + ["--data-root", write(d, "a-file", "x") + "/root"],
        "data_root",
        "choose a directory you can write",
    ),
    CliCase(
        "run: --data-root /proc/x",
        lambda d, _: RUN + ["--data-root", "/proc/mazerl-x"],
        "data_root",
        "choose a directory you can write",
    ),
    CliCase(
        "run: TMPDIR too long for Ray's sockets",
        lambda d, _: RUN,
        "TMPDIR",
        "set TMPDIR to a shorter directory (e.g. export TMPDIR=/tmp",
        tmpdir=long_tmpdir,
    ),
    CliCase(
        "run: --base-model missing",
        lambda d, _: RUN + ["--base-model", str(d / "no-model")],
        "base_model",
        "give the Hugging Face model directory",
    ),
    CliCase(
        "run: --base-model with a garbage config.json",
        lambda d, _: RUN + ["--base-model", fake_model(d, "config")],
        "base_model",
        "a readable config.json",
    ),
    CliCase(
        "run: --base-model with truncated weights",
        lambda d, _: RUN + ["--base-model", fake_model(d, "weights")],
        "base_model",
        "is truncated",
    ),
    CliCase("run: --eval-set unknown", lambda d, _: RUN + ["--eval-set", "maze65"], "eval_set", "choose one of"),
    CliCase(
        "run: --steps 10^20",
        lambda d, _: RUN + ["--steps", str(10**20)],
        "training.steps",
        "less than or equal to 1000000",
    ),
    CliCase(
        "run: learning_rate Infinity",
        lambda d, _: RUN + ["--training", '{"learning_rate": Infinity}'],
        "training.learning_rate",
        "finite number",
    ),
    CliCase(
        "run: steps true",
        lambda d, _: RUN + ["--training", '{"steps": true}'],
        "training.steps",
        "not a boolean",
    ),
    CliCase(
        "run: --params backend skyrl is kept",
        lambda d, _: RUN + ["--params", write(d, "skyrl.json", json.dumps(SKYRL_PLACEMENT))],
        "skyrl.num_gpus",
        "must be divisible by skyrl.tensor_parallel_size",
    ),
    CliCase(
        "run: experiment empty",
        lambda d, _: RUN + ["--params", write(d, "exp.json", '{"experiment": ""}')],
        "experiment",
        "give an MLflow experiment name",
    ),
    CliCase(
        "run: --tracking-uri unreachable",
        lambda d, _: RUN + ["--tracking-uri", closed_port_address()],
        "tracking_uri",
        "did not answer",
    ),
    CliCase(
        "run: --ray-address unreachable",
        lambda d, _: RUN + ["--ray-address", closed_port_address()],
        "ray_address",
        "did not answer",
    ),
    CliCase(
        "run: --ray-address answering 404",
        lambda d, not_ray: RUN + ["--ray-address", not_ray],
        "ray_address",
        "did not answer as a Ray job server",
    ),
    CliCase(
        "run: --ray-address of the wrong kind",
        lambda d, _: RUN + ["--ray-address", "ray://127.0.0.1:10001"],
        "ray_address",
        "must look like http://host:8265",
    ),
    CliCase(
        "run: resume required",
        lambda d, _: RUN + ["--training", '{"resume": "required"}'],
        "training.resume",
        "set training.resume='latest'",
    ),
    CliCase(
        "run: training pool larger than the world",
        lambda d, _: RUN + ["--training", '{"train_pool_size": 600}'],
        "train_pool_size",
        "lower train_pool_size to at most 512",
    ),
    CliCase(
        "eval: --model missing",
        lambda d, _: EVAL + ["--model", str(d / "no-model")],
        "--model",
        "give the Hugging Face model directory",
    ),
    CliCase(
        "eval: --eval-workers 0",
        lambda d, _: EVAL + ["--model", fake_model(d, "ok"), "--eval-workers", "0"],
        "--eval-workers",
        ">= 1",
    ),
    CliCase(
        "eval: --eval-set unknown",
        lambda d, _: EVAL + ["--model", fake_model(d, "ok"), "--eval-set", "maze65"],
        "--eval-set",
        "choose one of",
    ),
    CliCase(
        "eval: --max-eval-mazes negative",
        lambda d, _: EVAL + ["--model", fake_model(d, "ok"), "--max-eval-mazes", "-1"],
        "--max-eval-mazes",
        ">= 1",
    ),
    CliCase(
        "eval: --max-new-tokens 0",
        lambda d, _: EVAL + ["--model", fake_model(d, "ok"), "--max-new-tokens", "0"],
        "--max-new-tokens",
        ">= 1",
    ),
    CliCase(
        "eval: --gifs negative",
        lambda d, _: EVAL + ["--model", fake_model(d, "ok"), "--gifs", "-2"],
        "--gifs",
        ">= 0",
    ),
    CliCase(
        "eval: --adapter without adapter files",
        lambda d, _: EVAL + ["--model", fake_model(d, "ok"), "--adapter", adapter_without_files(d)],
        "--adapter",
        "a PEFT adapter directory holds adapter_config.json and adapter_model.safetensors",
    ),
    CliCase(
        "eval: --model with a garbage config.json",
        lambda d, _: EVAL + ["--model", fake_model(d, "config")],
        "--model",
        "a readable config.json",
    ),
    CliCase(
        "eval: --model with truncated weights",
        lambda d, _: EVAL + ["--model", fake_model(d, "weights")],
        "--model",
        "is truncated",
    ),
    CliCase(
        "eval: --out is a file",
        lambda d, _: EVAL + ["--model", fake_model(d, "ok"), "--out", write(d, "out.txt", "x")],
        "--out",
        "give a directory",
    ),
    CliCase(
        "eval: --ray-address unreachable",
        lambda d, _: EVAL + ["--model", fake_model(d, "ok"), "--ray-address", closed_port_address()],
        "ray_address",
        "did not answer",
    ),
    CliCase(
        "build-starter: --out exists",
        lambda d, _: BUILD + ["--out", str(d)],
        "--out",
        "delete it or choose another --out",
    ),
    CliCase(
        "build-starter: --seed negative",
        lambda d, _: BUILD + ["--seed", "-1", "--out", str(d / "new" / "starter")],
        "--seed",
        "must be between 0 and",
    ),
    CliCase(
        "build-starter: --out below a file",
        lambda d, _: BUILD + ["--out", write(d, "a-file", "x") + "/starter"],
        "--out",
        "choose a directory you can write",
    ),
]


def cli_env(tmpdir: Path, data_root: Path) -> dict[str, str]:
    """The user's environment, minus settings that would point the command elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PREFECT_", "MLFLOW_"))}
    return env | {"TMPDIR": str(tmpdir), "MAZERL_HOME": str(data_root)}


@pytest.mark.parametrize("case", CLI_CASES, ids=[case.id for case in CLI_CASES])
def test_bad_input_on_the_command_line_is_refused_at_once_with_exit_2_and_leaves_nothing(case, tmp_path, not_ray):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    data_root = tmp_path / "root"
    scratch = Path(tempfile.mkdtemp(prefix="mzr-c", dir="/tmp"))  # short: Ray's socket paths live under it
    try:
        tmpdir = case.tmpdir(scratch) if case.tmpdir else scratch
        argv = [*case.argv(inputs, not_ray)]  # a copy: a case may hand back the shared RUN list itself
        if argv[0] != "build-starter" and "--data-root" not in argv:
            argv += ["--data-root", str(data_root)]
        before = sorted(inputs.rglob("*"))
        # Given one bad flag, when the command runs as the user types it,
        done = subprocess.run(
            [str(Path(sys.executable).parent / "mazerl"), *argv],
            capture_output=True,
            text=True,
            timeout=120,
            env=cli_env(tmpdir, data_root),
            cwd=tmp_path,
        )
        output = done.stdout + done.stderr
        # then it exits 2 with one error line that names the flag or field and the fix, and no traceback,
        assert done.returncode == 2, f"{case.id}: exit code {done.returncode}\n{output[-3000:]}"
        assert "Traceback" not in output, f"{case.id}: a raw traceback\n{output[-3000:]}"
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and done.stdout == "", f"{case.id}: one error line and nothing else\n{output}"
        assert case.field in errors[0], f"{case.id}: the message should name {case.field!r}: {errors[0]}"
        assert case.fix in errors[0], f"{case.id}: the message should say {case.fix!r}: {errors[0]}"
        # and leaves nothing behind: no data root, no output, no Ray head or Prefect files in its TMPDIR.
        assert not data_root.exists(), f"{case.id}: the data root was created"
        assert sorted(inputs.rglob("*")) == before, f"{case.id}: files were written next to the inputs"
        assert sorted(p.name for p in tmpdir.iterdir()) == [], f"{case.id}: its TMPDIR holds {list(tmpdir.iterdir())}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --- more inputs through the real commands, in process ----------------------------------------------
#
# The same commands as CLI_CASES (``cli.main.main``, as ``mazerl`` calls it), run in this process
# so each case costs milliseconds: exit code 2, one ``error:`` line naming the flag, variable or
# file and the fix, no traceback, no credential, nothing written, and nothing expensive attempted
# (``refused_work``: Prefect, the Ray head, an eval, a model load). Subprocess cases above are
# kept for what needs a process of its own (a FIFO that would block, /dev/zero that would fill
# memory, the exit code as the shell sees it).

SECRET = "hunter2-s3cret"  # a password some cases put into an address: no message may show it
ARN = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/mazerl-mlflow"


@dataclass
class Inputs:
    """What an in-process case may need to build its input."""

    dir: Path  # scratch directory for input files
    root: Path  # the data root the command gets (MAZERL_HOME), absent unless a case makes it
    servers: dict[str, str]  # loopback HTTP servers by kind: plain (200 HTML), auth (401), not_ray (404)
    monkeypatch: pytest.MonkeyPatch

    def env(self, name: str, value: str) -> None:
        self.monkeypatch.setenv(name, value)

    def model(self, name: str, edit: Callable[[Path], object] = lambda _: None) -> str:
        """A copy of the shipped starter (a real Qwen3-VL directory), edited."""
        from mazerl.starter.shipped import SHIPPED_DIR

        target = self.dir / name
        shutil.copytree(SHIPPED_DIR, target)
        edit(target)
        return str(target)

    def starter_in_root(self, edit: Callable[[Path], object]) -> None:
        """The data root as a earlier run left it, holding a copy of the shipped starter, then damaged."""
        from mazerl.starter.shipped import SHIPPED_DIR, SHIPPED_NAME

        target = self.root / "models" / SHIPPED_NAME
        shutil.copytree(SHIPPED_DIR, target)
        edit(target)


@dataclass(frozen=True)
class InputCase:
    id: str
    argv: Callable[[Inputs], list[str]]  # builds the input (files, environment) and returns the command line
    field: str  # the flag, parameter, variable or file the message must name
    fix: str  # words of the fix (or the rule) the message must give


def edit_json(name: str, change: Callable[[dict], object]) -> Callable[[Path], None]:
    def edit(model: Path) -> None:
        content = json.loads((model / name).read_text())
        change(content)
        (model / name).write_text(json.dumps(content))

    return edit


def garbage(name: str) -> Callable[[Path], None]:
    return lambda model: (model / name).write_text("{not json")


def nested(depth: int) -> str:
    return '{"training": ' * depth + "{}" + "}" * depth


def llava_config(model: Path) -> None:
    (model / "config.json").write_text(
        json.dumps({"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"]})
    )


INPUT_CASES = [
    # tracking URIs: each kind checked for real, or refused by its form
    InputCase(
        "run: --tracking-uri a plain web server",
        lambda i: RUN + ["--tracking-uri", i.servers["plain"]],
        "tracking_uri",
        "not as an MLflow tracking server",
    ),
    InputCase(
        "run: --tracking-uri a server refusing the client",
        lambda i: RUN + ["--tracking-uri", i.servers["auth"]],
        "tracking_uri",
        "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD",
    ),
    InputCase(
        "run: --tracking-uri with a password",
        lambda i: RUN + ["--tracking-uri", f"http://mazerl:{SECRET}@127.0.0.1:5000"],
        "tracking_uri",
        "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD",
    ),
    InputCase(
        "run: --tracking-uri sqlite in a missing directory",
        lambda i: RUN + ["--tracking-uri", f"sqlite:///{i.dir / 'no-such-dir' / 'mlflow.db'}"],
        "tracking_uri",
        "does not exist; create it",
    ),
    InputCase(
        "run: --tracking-uri sqlite in an unwritable directory",
        lambda i: RUN + ["--tracking-uri", "sqlite:////proc/mlflow.db"],
        "tracking_uri",
        "is not writable",
    ),
    InputCase(
        "run: --tracking-uri sqlite file that is no database",
        lambda i: RUN + ["--tracking-uri", f"sqlite:///{write(i.dir, 'notes.db', 'plain text')}"],
        "tracking_uri",
        "is not a SQLite database",
    ),
    InputCase(
        "run: --tracking-uri sqlite relative path",
        lambda i: RUN + ["--tracking-uri", "sqlite:///mlflow.db"],
        "tracking_uri",
        "give an absolute path",
    ),
    InputCase(
        "run: --tracking-uri file store",
        lambda i: RUN + ["--tracking-uri", f"file://{i.dir}/mlruns"],
        "tracking_uri",
        "which MLflow 3 refuses",
    ),
    InputCase(
        "run: --tracking-uri database without its driver",
        lambda i: (
            # the drivers SQLAlchemy picks for postgresql:// (by version), as absent as on a fresh install
            [i.monkeypatch.setitem(sys.modules, name, None) for name in ("psycopg", "psycopg2")],
            RUN + ["--tracking-uri", "postgresql://mlflow@127.0.0.1:5432/mlflow"],
        )[1],
        "tracking_uri",
        "driver for 'postgresql' is not installed",
    ),
    InputCase(
        "run: --tracking-uri SageMaker ARN without the plugin",
        lambda i: (i.monkeypatch.setitem(sys.modules, "sagemaker_mlflow", None), RUN + ["--tracking-uri", ARN])[1],
        "tracking_uri",
        "pip install 'mazerl[cluster]'",
    ),
    InputCase(
        "run: --tracking-uri SageMaker ARN malformed",
        lambda i: RUN + ["--tracking-uri", ARN.replace("123456789012", "1234")],
        "tracking_uri",
        "is not a 12-digit AWS account id",
    ),
    InputCase(
        "run: --tracking-uri SageMaker ARN with a #role",
        lambda i: RUN + ["--tracking-uri", ARN + "#arn:aws:iam::123456789012:role/mazerl-mlflow"],
        "tracking_uri",
        "SAGEMAKER_MLFLOW_ASSUME_ROLE_ARN=arn:aws:iam::<account>:role/<name>",
    ),
    # the --params file
    InputCase(
        "run: --params nested 10000 deep",
        lambda i: RUN + ["--params", write(i.dir, "deep.json", nested(10_000))],
        "deep.json",
        "nests deeper than 32 levels",
    ),
    InputCase(
        "run: --params a directory",
        lambda i: RUN + ["--params", str(i.dir)],
        "--params",
        "is not a regular file (a directory)",
    ),
    # names
    InputCase(
        "run: experiment with a newline",
        lambda i: RUN + ["--params", write(i.dir, "p.json", json.dumps({"experiment": "vlm\nmaze"}))],
        "experiment",
        "control character ('\\n')",
    ),
    InputCase(
        "run: experiment longer than MLflow keeps",
        lambda i: RUN + ["--params", write(i.dir, "p.json", json.dumps({"experiment": "e" * 300}))],
        "experiment",
        "keep at most 256",
    ),
    InputCase(
        "run: registered model with a NUL",
        lambda i: RUN + ["--params", write(i.dir, "p.json", json.dumps({"registered_model": "maze\x00vlm"}))],
        "registered_model",
        "control character ('\\x00')",
    ),
    InputCase(
        "run: registered model longer than MLflow keeps",
        lambda i: RUN + ["--params", write(i.dir, "p.json", json.dumps({"registered_model": "m" * 300}))],
        "registered model name",
        "keep at most 256",
    ),
    # model directories: every file parsed as what it claims to be
    InputCase(
        "run: --base-model tokenizer.json that does not parse",
        lambda i: RUN + ["--base-model", i.model("tok", garbage("tokenizer.json"))],
        "tokenizer.json",
        "copy the complete model directory",
    ),
    InputCase(
        "run: --base-model processor config that does not parse",
        lambda i: RUN + ["--base-model", i.model("proc", garbage("preprocessor_config.json"))],
        "preprocessor_config.json does not parse",
        "copy the complete model directory",
    ),
    InputCase(
        "run: --base-model chat template that does not parse",
        lambda i: RUN + ["--base-model", i.model("tpl", lambda m: (m / "chat_template.jinja").write_text("{% for %}"))],
        "chat_template.jinja",
        "does not parse as a Jinja template",
    ),
    InputCase(
        "run: --base-model config naming another architecture",
        lambda i: (
            RUN
            + [
                "--base-model",
                i.model("arch", edit_json("config.json", lambda c: c.update(architectures=["LlamaForCausalLM"]))),
            ]
        ),
        "config.json names the architecture 'LlamaForCausalLM'",
        "copy the model's own config.json",
    ),
    InputCase(
        "run: --base-model another vision-language model",
        lambda i: RUN + ["--base-model", i.model("llava", llava_config)],
        "'llava' model",
        "use a Qwen3-VL model",
    ),
    InputCase(
        "run: empty lora.target_modules",
        lambda i: RUN + ["--training", '{"lora": {"target_modules": []}}'],
        "training.lora.target_modules",
        "name the linear layers to adapt",
    ),
    # training values past anything a machine can run
    InputCase(
        "run: max_turns 10^5",
        lambda i: RUN + ["--training", '{"max_turns": 100000}'],
        "training.max_turns",
        "less than or equal to 1000",
    ),
    InputCase(
        "run: grpo.max_new_tokens 10^5",
        lambda i: RUN + ["--training", '{"grpo": {"max_new_tokens": 100000}}'],
        "training.grpo.max_new_tokens",
        "less than or equal to 4096",
    ),
    InputCase(
        "run: grpo.samples_per_maze 10^5",
        lambda i: RUN + ["--training", '{"grpo": {"samples_per_maze": 100000}}'],
        "training.grpo.samples_per_maze",
        "less than or equal to 256",
    ),
    InputCase(
        "run: torch_threads 10^5",
        lambda i: RUN + ["--training", '{"torch_threads": 100000}'],
        "training.torch_threads",
        "less than or equal to 256",
    ),
    InputCase(
        "run: seed past 2^32",
        lambda i: RUN + ["--training", '{"seed": 4294967296}'],
        "training.seed",
        "less than or equal to 4294967295",
    ),
    InputCase(
        "run: seed negative",
        lambda i: RUN + ["--training", '{"seed": -1}'],
        "training.seed",
        "greater than or equal to 0",
    ),
    InputCase(
        "run: --max-eval-mazes above the eval set's size",
        lambda i: RUN + ["--max-eval-mazes", "300"],
        "max_eval_mazes",
        "more than eval set maze256-small-v1 holds (256 mazes); lower max_eval_mazes to at most 256",
    ),
    InputCase(
        "eval: --max-eval-mazes above the eval set's size",
        lambda i: EVAL + ["--model", i.model("ok"), "--max-eval-mazes", "300"],
        "--max-eval-mazes",
        "lower --max-eval-mazes to at most 256",
    ),
    InputCase(
        "eval: --eval-engine vllm on a machine without a GPU",
        lambda i: (
            i.monkeypatch.setattr("torch.cuda.device_count", lambda: 0),
            EVAL + ["--model", i.model("ok"), "--eval-engine", "vllm"],
        )[1],
        "--eval-engine vllm",
        "give --ray-address of a Ray cluster with GPUs, or use --eval-engine hf",
    ),
    InputCase(
        "eval: --engine vllm (the old name) on a machine without a GPU",
        lambda i: (
            i.monkeypatch.setattr("torch.cuda.device_count", lambda: 0),
            EVAL + ["--model", i.model("ok"), "--engine", "vllm"],
        )[1],
        "--engine vllm",
        "or use --engine hf",
    ),
    InputCase(
        "eval: --adapter whose config names another rank",
        lambda i: EVAL + ["--model", i.model("ok"), "--adapter", lora_adapter(i.dir, "rank", config_rank=8)],
        "--adapter",
        "r=8, but adapter_model.safetensors holds",
    ),
    InputCase(
        "eval: --adapter with truncated weights",
        lambda i: EVAL + ["--model", i.model("ok"), "--adapter", lora_adapter(i.dir, "cut", edit=cut_adapter)],
        "--adapter",
        "lacks a complete adapter_model.safetensors (it is truncated",
    ),
    InputCase(
        "eval: --adapter config that does not parse",
        lambda i: (
            EVAL + ["--model", i.model("ok"), "--adapter", lora_adapter(i.dir, "bad", edit=garbage(ADAPTER_CONFIG))]
        ),
        "--adapter",
        "is not valid JSON",
    ),
    InputCase(
        "eval: --model tokenizer.json that does not parse",
        lambda i: EVAL + ["--model", i.model("tok", garbage("tokenizer.json"))],
        "tokenizer.json",
        "copy the complete model directory",
    ),
    InputCase(
        "eval: --model with a starter.json that does not parse",
        lambda i: EVAL + ["--model", i.model("rec", garbage("starter.json"))],
        "starter.json does not parse",
        "pass --eval-set",
    ),
    InputCase(
        "eval: --model config naming another architecture",
        lambda i: (
            EVAL
            + [
                "--model",
                i.model("arch", edit_json("config.json", lambda c: c.update(architectures=["LlamaForCausalLM"]))),
            ]
        ),
        "--model",
        "copy the model's own config.json",
    ),
    # the data root
    InputCase(
        "run: starter copy in the data root truncated",
        lambda i: (i.starter_in_root(truncated_weights), RUN)[1],
        "model.safetensors (it is truncated",
        "the shipped starter is copied there afresh",
    ),
    InputCase(
        "run: starter copy in the data root with a starter.json that does not parse",
        lambda i: (i.starter_in_root(garbage("starter.json")), RUN)[1],
        "starter.json",
        "the shipped starter is copied there afresh",
    ),
    InputCase(
        "run: starter copy in the data root edited",
        lambda i: (i.starter_in_root(lambda m: (m / "generation_config.json").write_text('{"do_sample": true}')), RUN)[
            1
        ],
        "is not the shipped starter",
        "the shipped starter is copied there afresh",
    ),
    InputCase(
        "run: MAZERL_HOME empty", lambda i: (i.env("MAZERL_HOME", ""), RUN)[1], "MAZERL_HOME", "unset MAZERL_HOME"
    ),
    InputCase(
        "run: --data-root with a newline",
        lambda i: RUN + ["--data-root", f"{i.dir}/data\nroot"],
        "data_root",
        "control character ('\\n')",
    ),
    InputCase(
        "run: --data-root with a name longer than the file system allows",
        lambda i: RUN + ["--data-root", f"{i.dir}/{'d' * 300}/root"],
        "data_root",
        "more than the 255 the file system",
    ),
    InputCase(
        "run: --data-root empty",
        lambda i: RUN + ["--data-root", ""],
        "data_root (--data-root) is empty",
        "leave it out for $MAZERL_HOME or ./.mazerl",
    ),
    InputCase(
        "run: --data-root with a '?'",
        lambda i: RUN + ["--data-root", f"{i.dir}/data?root"],
        "data_root",
        "starts a query in a URI",
    ),
    InputCase(
        "run: MAZERL_HOME with a '%'",
        lambda i: (i.env("MAZERL_HOME", f"{i.dir}/data%41root"), RUN)[1],
        "MAZERL_HOME",
        "without ?, # or %",
    ),
    InputCase(
        "run: --data-root a loop of symbolic links",
        lambda i: (os.symlink(i.dir / "loop", i.dir / "loop"), RUN + ["--data-root", str(i.dir / "loop")])[1],
        "data_root",
        "is a loop of symbolic links",
    ),
    InputCase(
        "run: --data-root on a full disk",
        lambda i: (i.monkeypatch.setattr(shutil, "disk_usage", full_disk), RUN)[1],
        "data_root",
        "free space there, or choose a directory",
    ),
    InputCase(
        "run: TMPDIR that does not exist",
        lambda i: (i.env("TMPDIR", str(i.dir / "no-such-tmp")), RUN)[1],
        "TMPDIR",
        "unset it (unset TMPDIR)",
    ),
    InputCase(
        "run: MAZERL_DATA_ROOT_MODE not a mode",
        lambda i: (i.env("MAZERL_DATA_ROOT_MODE", "rwx"), RUN)[1],
        "MAZERL_DATA_ROOT_MODE",
        "e.g. 0700",
    ),
    # addresses and environment
    InputCase(
        "run: --ray-address malformed IPv6",
        lambda i: RUN + ["--ray-address", "http://[::1:8265"],
        "ray_address",
        "Invalid IPv6 URL",
    ),
    InputCase(
        "run: --ray-address with a password",
        lambda i: RUN + ["--ray-address", f"http://ray:{SECRET}@127.0.0.1:8265"],
        "ray_address",
        "RAY_AUTH_TOKEN",
    ),
    InputCase(
        "run: RAY_ADDRESS garbage",
        lambda i: (i.env("RAY_ADDRESS", "garbage"), RUN)[1],
        "RAY_ADDRESS",
        "unset RAY_ADDRESS",
    ),
    InputCase(
        "run: PREFECT_API_URL unreachable",
        lambda i: (i.env("PREFECT_API_URL", closed_port_address() + "/api"), RUN)[1],
        "PREFECT_API_URL",
        "did not answer",
    ),
    InputCase(
        "run: PREFECT_API_URL not a Prefect server",
        lambda i: (i.env("PREFECT_API_URL", i.servers["plain"] + "/api"), RUN)[1],
        "PREFECT_API_URL",
        "not as a Prefect API",
    ),
    InputCase(
        "run: PREFECT_API_URL malformed IPv6",
        lambda i: (i.env("PREFECT_API_URL", "http://[::1:4200/api"), RUN)[1],
        "PREFECT_API_URL",
        "is not a valid address (Invalid IPv6 URL); start the server",
    ),
    InputCase(
        "run: PREFECT_HOME a file",
        lambda i: (i.env("PREFECT_HOME", write(i.dir, "prefect-home", "x")), RUN)[1],
        "PREFECT_HOME",
        "unset it (unset PREFECT_HOME)",
    ),
    InputCase(
        "run: PREFECT_HOME not writable",
        lambda i: (i.env("PREFECT_HOME", "/proc/prefect-home"), RUN)[1],
        "PREFECT_HOME",
        "is not writable",
    ),
    InputCase(
        "run: PREFECT_LOGGING_LEVEL unknown",
        lambda i: (i.env("PREFECT_LOGGING_LEVEL", "LOUD"), RUN)[1],
        "PREFECT_LOGGING_LEVEL",
        "give one of DEBUG, INFO, WARNING, ERROR, CRITICAL",
    ),
    InputCase(
        "eval: RAY_ADDRESS garbage",
        lambda i: (i.env("RAY_ADDRESS", "garbage"), EVAL + ["--model", i.model("ok")])[1],
        "RAY_ADDRESS",
        "unset RAY_ADDRESS",
    ),
    InputCase(
        "eval: --ray-address with a password",
        lambda i: EVAL + ["--model", i.model("ok"), "--ray-address", f"http://ray:{SECRET}@127.0.0.1:8265"],
        "--ray-address",
        "RAY_AUTH_TOKEN",
    ),
    InputCase("ui: --port out of range", lambda i: ["ui", "--port", "70000"], "--port 70000", "from 1 to 65535"),
    InputCase(
        "ui: --host that does not resolve",
        lambda i: ["ui", "--host", "no-such-host.invalid"],
        "--host 'no-such-host.invalid' does not resolve",
        "give an address of this machine to listen on",
    ),
    InputCase(
        "ui: mlflow.db that is not SQLite",
        lambda i: (i.root.mkdir(), write(i.root, "mlflow.db", "plain text"), ["ui"])[-1],
        "mlflow.db is not a SQLite database",
        "give --data-root (or $MAZERL_HOME) of a run's data root",
    ),
    InputCase(
        "build-starter: --data-root empty",
        lambda i: BUILD + ["--data-root", ""],
        "data_root (--data-root) is empty",
        "leave it out for $MAZERL_HOME",
    ),
    InputCase(
        "ui: --data-root empty",
        lambda i: ["ui", "--data-root", ""],
        "data_root (--data-root) is empty",
        "leave it out for $MAZERL_HOME",
    ),
    InputCase("demo: --seed negative", lambda i: ["demo", "--seed", "-1"], "--seed", "must be between 0 and"),
    InputCase("demo: --size even", lambda i: ["demo", "--size", "8"], "--size", "use an odd integer >= 5"),
    InputCase(
        "demo: --size 10^6", lambda i: ["demo", "--size", "1000001"], "--size", "use an odd integer from 5 to 99"
    ),
]


def full_disk(path: str | os.PathLike) -> tuple[int, int, int]:
    """``shutil.disk_usage`` of a file system with 12 KiB left (what a data root on a full disk sees)."""
    return shutil._ntuple_diskusage(2**30, 2**30 - 12 * 2**10, 12 * 2**10)


def recorder_of_refusals(attempted: list[str]):
    """``refuse(what)``: a stand-in for expensive work that records ``what`` in ``attempted`` and fails."""

    def refuse(what: str):
        def call(*args, **kwargs):
            attempted.append(what)
            raise AssertionError(f"{what} was attempted for a rejected input")

        return call

    return refuse


@pytest.fixture
def refused_work(monkeypatch):
    """Prefect, the Ray head, an eval, a model load and the MLflow UI, each replaced by a recorded refusal."""
    from transformers import PreTrainedModel

    import cli.run

    attempted: list[str] = []
    refuse = recorder_of_refusals(attempted)

    monkeypatch.setattr(cli.run, "configure_prefect", refuse("Prefect"))
    monkeypatch.setattr(os, "execve", refuse("MLflow UI"))  # mazerl ui: the UI takes over the process
    monkeypatch.setattr(cli.run, "local_ray_head", refuse("Ray head start"))
    monkeypatch.setattr("mazerl.evaluation.evaluate.evaluate", refuse("eval"))
    monkeypatch.setattr("mazerl.policy.loader.load_policy", refuse("model load"))
    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse("model weights read")))
    return attempted


class PlainWeb(http.server.BaseHTTPRequestHandler):
    """A web server that is no MLflow: every path answers 200 with an HTML page."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = b"<html><body>It works!</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class NeedsLogin(PlainWeb):
    """A server behind basic authentication (MLflow's own auth answers so): 401 without credentials."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture(scope="module")
def web_servers(not_ray):
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) for handler in (PlainWeb, NeedsLogin)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {
        "plain": f"http://127.0.0.1:{servers[0].server_address[1]}",
        "auth": f"http://127.0.0.1:{servers[1].server_address[1]}",
        "not_ray": not_ray,
    }
    for server in servers:
        server.shutdown()


@pytest.mark.parametrize("case", INPUT_CASES, ids=[case.id for case in INPUT_CASES])
def test_more_bad_inputs_are_refused_by_the_command_at_once_with_exit_2_and_leave_nothing(
    case, tmp_path, monkeypatch, capsys, web_servers, refused_work
):
    from cli.main import main

    for name in [n for n in os.environ if n.startswith(("RAY_", "PREFECT_", "MLFLOW_", "MAZERL_"))]:
        monkeypatch.delenv(name)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # the command's TMPDIR (the Ray head's temp dir)
    inputs = Inputs(tmp_path / "inputs", tmp_path / "root", web_servers, monkeypatch)
    inputs.dir.mkdir()
    monkeypatch.setenv("MAZERL_HOME", str(inputs.root))
    monkeypatch.chdir(tmp_path)
    # Given one bad input, when the command runs with it,
    argv = [*case.argv(inputs)]
    before = sorted(tmp_path.rglob("*"))
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's own refusals
        code = exit.code
    out, err = capsys.readouterr()
    # then it returns 2 with one error line naming the flag, variable or file and the fix, no traceback,
    assert code == 2, f"{case.id}: exit code {code}\n{out[-2000:]}{err[-2000:]}"
    assert "Traceback" not in out + err, f"{case.id}: a raw traceback\n{err[-3000:]}"
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and out == "", f"{case.id}: one error line and nothing else\n{out}{err}"
    assert case.field in errors[0], f"{case.id}: the message should name {case.field!r}: {errors[0]}"
    assert case.fix in errors[0], f"{case.id}: the message should say {case.fix!r}: {errors[0]}"
    assert SECRET not in out + err, f"{case.id}: the message shows the password: {errors[0]}"
    # before any expensive work, and leaves nothing behind.
    assert refused_work == [], f"{case.id}: {refused_work} happened before the refusal"
    assert sorted(tmp_path.rglob("*")) == before, f"{case.id}: it wrote {set(tmp_path.rglob('*')) - set(before)}"


def test_the_docs_table_lists_every_case():
    # Given the bad-input page of the docs, every case of both tables has its row there.
    rows = [line for line in DOCS_TABLE.read_text().splitlines() if line.startswith("| ")]
    missing = [
        case.id for case in [*CLI_CASES, *INPUT_CASES, *CASES] if not any(f"| {case.id} |" in row for row in rows)
    ]
    assert missing == [], f"{DOCS_TABLE.name} lacks rows for {missing}"


# --- every pipeline parameter has a bad-input case ------------------------------------------------

# PipelineParams field -> (a bad value, words of the rule or fix its error must give). Checked in
# process against the real model; fields whose bad values need a world (files, a cluster) have
# their case in CASES instead (base_model, data_root, hyperpod_cluster, training.*).
PARAMETER_CASES = {
    "eval_engine": ("tpu", "'hf' or 'vllm'"),
    "eval_gpus_per_worker": (-1, "greater than or equal to 0"),
    "preset": ("huge", "'smoke'"),
    "recipe": ("fast", "'embedded' or 'defaults'"),
    "eval_set": ("maze65-easy-v1", "choose one of"),
    "backend": ("jax", "'local' or 'skyrl'"),
    "training": ([1], "valid dictionary"),
    "ray_address": ("ftp://head", "http://host:8265"),
    "tracking_uri": ("nope://", "sqlite:////absolute/path/mlflow.db"),
    "experiment": ("", "give an MLflow experiment name"),
    "registered_model": ("bad/name!", "may use only letters, digits"),
    "promotion_threshold": (2.0, "less than or equal to 1"),
    "eval_workers": (0, "greater than or equal to 1"),
    "max_eval_mazes": (0, "greater than or equal to 1"),
    "gif_count": (-1, "greater than or equal to 0"),
    "train_retries": (-1, "greater than or equal to 0"),
    "local_train_gpus": (-1, "greater than or equal to 0"),
    "hang_timeout_s": (0, "greater than 0"),
    "max_artifact_mb": (-1, "greater than or equal to 0"),
    "gpu_smoke": ("maybe", "valid boolean"),
    "resource_wait_s": (-5, "greater than or equal to 0"),
    "ray_jobs_on_stop": ("never", "'auto', 'stop' or 'keep'"),
}
GOOD_PARAMS = {"eval_set": "maze256-small-v1", "max_eval_mazes": 4, "training": dict(MINIATURE_TRAINING)}


def test_every_pipeline_parameter_has_a_bad_input_case():
    # Given the pipeline's real parameter list, every field has a case here or in CASES, so a new
    # parameter without a bad-input case fails this test.
    fields = set(PipelineParams.model_fields)
    in_cases = {case.field.split(".")[0] for case in CASES} & fields
    missing = sorted(fields - set(PARAMETER_CASES) - in_cases)
    assert missing == [], f"PipelineParams fields without a bad-input case: {missing}; add them to PARAMETER_CASES"
    stale = sorted(set(PARAMETER_CASES) - fields)
    assert stale == [], f"PARAMETER_CASES names fields PipelineParams no longer has: {stale}"
    assert PipelineParams(**GOOD_PARAMS).eval_set == "maze256-small-v1", "the good parameters are accepted"


@pytest.mark.parametrize("field", sorted(PARAMETER_CASES))
def test_a_bad_pipeline_parameter_is_refused_naming_it_and_the_rule(field):
    bad, words = PARAMETER_CASES[field]
    with pytest.raises(ValueError) as caught:  # pydantic's ValidationError is a ValueError
        PipelineParams(**GOOD_PARAMS | {field: bad})
    message = str(caught.value)
    assert field in message, f"{field}={bad!r}: the error should name the field: {message}"
    assert words in message, f"{field}={bad!r}: the error should say {words!r}: {message}"


# --- the forms the parameters check themselves (no files, no network) ----------------------------

FORM_CASES = [
    # (id, field, bad value, words of the rule the error must give)
    ("ARN without partition", "tracking_uri", "arn:sagemaker:us-east-1:123456789012:x", "has the form"),
    ("ARN of another partition", "tracking_uri", ARN.replace("arn:aws:", "arn:aws-cn:"), "is not one of"),
    ("ARN region", "tracking_uri", ARN.replace("us-east-1", "useast1"), "is not an AWS region"),
    ("ARN account", "tracking_uri", ARN.replace("123456789012", "12345678901x"), "12-digit AWS account id"),
    ("ARN resource", "tracking_uri", ARN.replace("mlflow-tracking-server", "notebook-instance"), "is not mlflow"),
    ("ARN server name", "tracking_uri", ARN.replace("mazerl-mlflow", "-mazerl"), "tracking server name"),
    ("ARN with a newline", "tracking_uri", ARN + "\n", "control character"),
    ("Databricks", "tracking_uri", "databricks://profile", "not supported"),
    ("database without host", "tracking_uri", "mysql:///mlflow", "names no database host"),
    ("sqlite in memory", "tracking_uri", "sqlite://", "names no database file"),
    ("bare path", "tracking_uri", "/srv/mlruns", "which MLflow 3 refuses"),
    ("http port out of range", "tracking_uri", "http://127.0.0.1:99999", "Port out of range"),
    ("ray port out of range", "ray_address", "http://127.0.0.1:70000", "Port out of range"),
    ("ray address without host", "ray_address", "http://:8265", "must look like http://host:8265"),
    ("hyperpod cluster name", "hyperpod_cluster", "my cluster", "copy it from aws sagemaker list-clusters"),
    ("base model with a NUL", "base_model", "/models/qwen\x00", "control character"),
    ("training string with a newline", "training.run_name", None, "control character"),
    ("registered model with a trailing newline", "registered_model", "maze-vlm\n", "control character"),
]


@pytest.mark.parametrize(("field", "bad", "words"), [c[1:] for c in FORM_CASES], ids=[c[0] for c in FORM_CASES])
def test_a_malformed_value_is_refused_by_the_parameters_naming_the_rule(field, bad, words):
    values = GOOD_PARAMS | ({"training": {"lora": {"target_modules": ["q_proj\n"]}}} if bad is None else {field: bad})
    field = "training.lora.target_modules" if bad is None else field
    with pytest.raises(ValueError) as caught:  # pydantic's ValidationError is a ValueError
        PipelineParams(**values)
    message = str(caught.value)
    assert field in message, f"{field}={bad!r}: the error should name the field: {message}"
    assert words in message, f"{field}={bad!r}: the error should say {words!r}: {message}"


@pytest.mark.parametrize(
    "uri",
    [
        ARN,
        "arn:aws-us-gov:sagemaker:us-gov-west-1:123456789012:mlflow-tracking-server/a",
        "http://mlflow.internal:5000",
        "sqlite:////srv/mazerl/mlflow.db",
        "postgresql+psycopg2://mlflow@db.internal:5432/mlflow",
    ],
)
def test_a_well_formed_tracking_uri_is_accepted_by_the_parameters(uri):
    assert PipelineParams(**GOOD_PARAMS, tracking_uri=uri).tracking_uri == uri


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("auto", True),
        ("10.0.0.1:6379", True),
        ("ray://head:10001", True),
        ("http://head:8265", True),
        ("garbage", False),
        ("garbage://head", False),
        ("head:99999", False),
        (f"ray://ray:{SECRET}@head:10001", False),
    ],
)
def test_ray_address_in_the_environment_is_refused_only_where_ray_could_not_parse_it(monkeypatch, value, accepted):
    from mazerl.preflight.input_error import InputError
    from mazerl.preflight.ray_address import check_ray_address_env

    monkeypatch.setenv("RAY_ADDRESS", value)
    if accepted:
        assert check_ray_address_env() == value
    else:
        with pytest.raises(InputError, match="unset RAY_ADDRESS") as caught:
            check_ray_address_env()
        assert SECRET not in str(caught.value), str(caught.value)


def test_an_adapter_peft_saved_passes_the_adapter_check_and_one_with_another_config_does_not(tmp_path):
    from peft import LoraConfig, get_peft_model

    from mazerl.policy.loader import load_policy
    from mazerl.preflight.input_error import InputError
    from mazerl.preflight.model_dir import check_adapter
    from mazerl.starter.shipped import SHIPPED_DIR

    # Given an adapter as PEFT saves it, rank 4 but 8 for q_proj (rank_pattern),
    model = load_policy(SHIPPED_DIR, device="cpu").model
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], rank_pattern={"q_proj": 8})
    get_peft_model(model, lora).save_pretrained(tmp_path / "adapter")
    # then the check passes it,
    check_adapter(tmp_path / "adapter")
    # and refuses it once its config says rank 4 throughout.
    edit_json(ADAPTER_CONFIG, lambda config: config.update(rank_pattern={}))(tmp_path / "adapter")
    with pytest.raises(InputError, match=r"names rank r=4, but .*q_proj\.lora_A\.weight of shape \[8, "):
        check_adapter(tmp_path / "adapter")


def test_a_sagemaker_arn_passes_the_preflight_once_its_plugin_is_importable_without_asking_aws(monkeypatch):
    import importlib.util

    from mazerl.preflight.input_error import InputError
    from mazerl.preflight.tracking_store import check_tracking_uri

    # Given a well-formed ARN, the preflight asks for the plugin that resolves it, and nothing else:
    real_find_spec = importlib.util.find_spec
    asked = []

    def find_spec(name, *args):
        asked.append(name)
        return object() if name == "sagemaker_mlflow" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    check_tracking_uri(ARN, "vlm-maze-grpo")
    assert asked == ["sagemaker_mlflow"], asked
    # and without it, the refusal gives the install command.
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(InputError, match=r"pip install 'mazerl\[cluster\]'"):
        check_tracking_uri(ARN, "vlm-maze-grpo")


def test_a_real_mlflow_server_passes_the_tracking_check_and_a_look_alike_does_not(
    tmp_path, _mlflow_template_db, web_servers
):
    """A real ``mlflow server`` (the REST API the check asks), with and without the run's experiment."""
    from mlflow.tracking import MlflowClient

    from mazerl.preflight.input_error import InputError
    from mazerl.preflight.tracking_store import check_tracking_uri

    database = tmp_path / "mlflow.db"
    shutil.copy(_mlflow_template_db, database)
    MlflowClient(f"sqlite:///{database}").create_experiment("vlm-maze-grpo")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{database}",
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # seconds on an idle machine; minutes on a crowded one
        while True:
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "mlflow server did not start"
                time.sleep(0.5)
        # Given a real MLflow server, the check passes for an experiment it has and one it will create,
        check_tracking_uri(uri, "vlm-maze-grpo")
        check_tracking_uri(uri, "not-yet-created")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
    # and a web server that merely answers is refused.
    with pytest.raises(InputError, match="not as an MLflow tracking server"):
        check_tracking_uri(web_servers["plain"], "vlm-maze-grpo")


class MlflowTwo(PlainWeb):
    """Stand-in for an MLflow 2 server (none can be installed beside MLflow 3 here): its REST answer for an
    experiment the run will create, and its ``/version`` route, as MLflow 2.22 sends them."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.startswith("/version"):
            body, kind, status = b"2.22.1", "text/html", 200
        else:
            body = json.dumps({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "No experiment"}).encode()
            kind, status = "application/json", 404
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_an_mlflow_2_server_is_refused_before_the_run_naming_its_version_and_mlflow_3():
    """The merge logs the model with MLflow 3's logged-model API: an MLflow 2 server would fail it after training."""
    from mazerl.preflight.input_error import InputError
    from mazerl.preflight.tracking_store import check_tracking_uri

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MlflowTwo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(
            InputError, match=r"version 2\.22\.1, and the run needs MLflow >= 3.*pip install 'mlflow>=3'"
        ):
            check_tracking_uri(f"http://127.0.0.1:{server.server_address[1]}", "vlm-maze-grpo")
    finally:
        server.shutdown()


# --- what mazerl creates is private to its user ----------------------------------------------------


def test_the_data_root_and_mlflow_db_mazerl_creates_are_private_unless_a_deployment_says_otherwise(
    tmp_path, monkeypatch
):
    import sqlite3
    import stat

    from mazerl import paths
    from mazerl.tracking.store import client_for

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    seen_by_mlflow = {}  # the database file's mode when MLflow's client is made (it opens the file later)
    monkeypatch.setattr(
        "mazerl.tracking.store.MlflowClient",
        lambda tracking_uri, registry_uri: seen_by_mlflow.setdefault(tracking_uri, mode(Path(tracking_uri[10:]))),
    )
    monkeypatch.delenv(paths.DATA_ROOT_MODE_ENV_VAR, raising=False)
    # Given no setting, a new data root is 0700 and the embedded store's database 0600 before MLflow opens it,
    root = paths.make_data_root(tmp_path / "new" / "root")
    client_for(paths.mlflow_db_uri(root))
    assert (mode(root), mode(root / "mlflow.db")) == (0o700, 0o600)
    assert seen_by_mlflow == {paths.mlflow_db_uri(root): 0o600}
    with sqlite3.connect(root / "mlflow.db") as db:  # SQLite takes the empty file as a new database
        db.execute("create table t (x)")
    assert mode(root / "mlflow.db") == 0o600, "SQLite kept the file's mode"
    # an existing root (a cluster's mount) keeps its own mode,
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    assert mode(paths.make_data_root(shared)) == 0o755
    # and a deployment that shares the root with its group says so.
    monkeypatch.setenv(paths.DATA_ROOT_MODE_ENV_VAR, "0770")
    group = paths.make_data_root(tmp_path / "group")
    client_for(paths.mlflow_db_uri(group))
    assert (mode(group), mode(group / "mlflow.db")) == (0o770, 0o660)


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def expensive_work(monkeypatch):
    """Every kind of expensive work, replaced by a recorded refusal; the list of what was attempted."""
    from transformers import PreTrainedModel

    import tasks.setup
    from mazerl.cluster.jobs.submitter import RayJob
    from mazerl.training.local_trainer import LocalGRPOTrainer

    attempted: list[str] = []
    refuse = recorder_of_refusals(attempted)

    monkeypatch.setattr("mazerl.policy.loader.load_policy", refuse("model load"))
    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse("model weights read")))
    monkeypatch.setattr(tasks.setup, "ensure_starter", refuse("starter build"))
    monkeypatch.setattr(tasks.setup, "ensure_local_head", refuse("Ray head start"))
    monkeypatch.setattr(RayJob, "start", refuse("stage Ray job"))
    monkeypatch.setattr(LocalGRPOTrainer, "_build", refuse("trainer build"))
    return attempted


class NotRay(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_error(404)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def not_ray():
    """An HTTP server on loopback that answers 404 to every path: a wrong port, or a gateway for no host."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotRay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def world(tmp_path, starter_model_dir, monkeypatch, request):
    address = closed_port_address()
    if request.param == "cluster":
        head = request.getfixturevalue("local_ray_head")
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(head.token_path))
        address = head.address
    if request.param == "pipeline":
        request.getfixturevalue("prefect_api")
    return World(tmp_path, Path(starter_model_dir), address, monkeypatch, request.getfixturevalue("not_ray"))


def flow_run_record(flow_run_id) -> tuple[str, str]:
    """(state name, state message) of a flow run, as the Prefect API keeps it."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
    return run.state.name, run.state.message or ""


# --- the test -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "world"), [(case, case.gate) for case in CASES], ids=[case.id for case in CASES], indirect=["world"]
)
def test_bad_input_is_refused_before_expensive_work_naming_the_field_and_the_fix(case, world, expensive_work):
    # Given one bad input, when the pipeline (or the part of it that owns the input) receives it,
    error = case.attempt(world)
    message = str(error)
    # then it is refused with a message that names the parameter and says what to do,
    assert isinstance(error, Exception), f"{case.id}: expected an error, got {error!r}"
    assert case.field in message, f"{case.id}: the message should name {case.field!r}: {message}"
    assert case.fix in message, f"{case.id}: the message should say {case.fix!r}: {message}"
    # before any expensive work,
    assert expensive_work == [], f"{case.id}: {expensive_work} happened before the refusal"
    if case.gate == "pipeline":
        # and a rejected pipeline run leaves nothing but its failed flow run.
        assert not world.root.exists(), f"{case.id}: {sorted(p.name for p in world.root.rglob('*'))} was written"
        state, record = flow_run_record(pipeline_gate.last_flow_run_id)
        assert state == "Failed" and case.field in record, f"the failed flow run records the reason: {record}"


@pytest.mark.parametrize("world", ["pipeline"], indirect=True)
def test_an_unready_cluster_stops_the_flow_at_verify_cluster(world, expensive_work):
    # Given good inputs but a Ray address nothing answers at, when the pipeline runs,
    from mlflow.tracking import MlflowClient

    error = pipeline_gate(world.params())
    # then verify_cluster refuses it naming the parameter and the fix, before any stage job or model load,
    assert "ray_address" in str(error) and "check that the head is running" in str(error), str(error)
    assert expensive_work == [], f"{expensive_work} happened before the refusal"
    # and its record is the failed verify_cluster run in MLflow; no later stage ever started.
    client = MlflowClient(f"sqlite:///{world.root / 'mlflow.db'}")
    experiments = [experiment.experiment_id for experiment in client.search_experiments()]
    runs = {run.info.run_name: run.info.status for run in client.search_runs(experiments)}
    assert runs["verify_cluster"] == "FAILED", runs
    assert not {"baseline_eval", "train", "merge_lora", "final_eval"} & set(runs), runs  # created when they start
    assert not (world.root / "runs").exists(), "no stage wrote a run directory"


# --- the training job's entry: configuration errors exit 2 (never retried) ------------------------


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"train_pool_size": 600}, "lower train_pool_size to at most 512"),
        ({"lora": {"rank": 4, "alpha": 8, "target_modules": ["no_such_proj"]}}, "lora.target_modules matches no layer"),
    ],
    ids=["pool larger than the world (the config)", "LoRA target modules match no layer (after the model loads)"],
)
def test_the_training_entry_exits_2_on_a_configuration_error_so_the_stage_does_not_retry_it(
    tmp_path, starter_model_dir, capsys, overrides, says
):
    from mazerl.training import local_entry

    values = {"run_id": "r", "data_root": str(tmp_path), "base_model": str(starter_model_dir)}
    values |= MINIATURE_TRAINING | {"eval_set": "maze256-small-v1"} | overrides
    config = tmp_path / "train.json"
    config.write_text(json.dumps(values))
    # Given a training config that cannot work, when the job's entry runs it,
    code = local_entry.main(["--config", str(config)])
    out = capsys.readouterr().out
    # then it exits 2 (the submitter's "bad configuration", not retried) naming the field and the fix.
    assert code == local_entry.EXIT_CONFIG_ERROR, out[-2000:]
    assert "configuration error: " in out and says in out, out[-2000:]


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_the_training_entry_refuses_a_config_nested_too_deep_with_exit_2(tmp_path, capsys, suffix):
    from mazerl.training import local_entry

    config = tmp_path / f"train{suffix}"
    config.write_text(nested(10_000))  # JSON, and YAML's flow style: Python's parsers recurse on it
    # Given a config file nested 10,000 deep, when the job's entry reads it,
    code = local_entry.main(["--config", str(config)])
    out = capsys.readouterr().out
    # then it exits 2 naming the file, instead of a RecursionError traceback.
    assert code == local_entry.EXIT_CONFIG_ERROR, out[-2000:]
    assert f"--config {config} nests" in out and "Traceback" not in out, out[-2000:]


def test_a_real_models_run_on_the_embedded_set_gets_the_pool_the_world_has(starter_model_dir, tmp_path):
    from mazerl.preflight.pipeline import check_pipeline_inputs
    from mazerl.training.local_trainer import LocalGRPOTrainer

    # Given `mazerl run --base-model <starter dir> --eval-set maze256-small-v1` (no recipe: TrainConfig's defaults),
    params = PipelineParams.model_validate(
        {"base_model": str(starter_model_dir), "eval_set": "maze256-small-v1", "data_root": str(tmp_path / "root")}
    )
    check_pipeline_inputs(params)
    config = params.train_config("r", Path(starter_model_dir))
    # then the training pool is every maze of the 7x7 world outside the set, which the trainer can build.
    assert config.train_pool_size == 512
    assert len(LocalGRPOTrainer(config, log=lambda _: None).pool) == 512
