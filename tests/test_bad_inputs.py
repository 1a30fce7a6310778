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

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
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


def truncated_weights(model: Path) -> Path:
    """The model directory as a copy that stopped early: its weights file is cut in half."""
    weights = model / "model.safetensors"
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
    from mazerl.cluster.fixes import CLUSTER_FIXES
    from mazerl.cluster.verify import requirements_for, verify_cluster
    from tasks.context import ray_headers

    params = PipelineParams.model_validate(values)
    config = params.train_config("r", Path(params.base_model))
    report = verify_cluster(
        params.ray_address,
        data_root=str(params.root()),
        base_model=params.base_model,
        eval_set=params.resolved_eval_set(),
        headers=ray_headers(params.ray_address),
        hyperpod_cluster=params.hyperpod_cluster,
        sagemaker_client=hyperpod_client,
        **requirements_for(config),
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
        "restore that checkpoint, or delete",
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
        "use http(s)://host:port",
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
        "eval: --workers 0", lambda d, _: EVAL + ["--model", fake_model(d, "ok"), "--workers", "0"], "--workers", ">= 1"
    ),
    CliCase(
        "eval: --eval-set unknown",
        lambda d, _: EVAL + ["--model", fake_model(d, "ok"), "--eval-set", "maze65"],
        "--eval-set",
        "choose one of",
    ),
    CliCase(
        "eval: --max-mazes negative",
        lambda d, _: EVAL + ["--model", fake_model(d, "ok"), "--max-mazes", "-1"],
        "--max-mazes",
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
        "pass a PEFT adapter directory",
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
        argv = case.argv(inputs, not_ray)
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


def test_the_docs_table_lists_every_case():
    # Given the bad-input page of the docs, every case of both tables has its row there.
    rows = [line for line in DOCS_TABLE.read_text().splitlines() if line.startswith("| ")]
    missing = [case.id for case in [*CLI_CASES, *CASES] if not any(f"| {case.id} |" in row for row in rows)]
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
    "tracking_uri": ("nope://", "sqlite:///path/mlflow.db"),
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


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def expensive_work(monkeypatch):
    """Every kind of expensive work, replaced by a recorded refusal; the list of what was attempted."""
    from transformers import PreTrainedModel

    import tasks.setup
    from mazerl.cluster.submitter import RayJob
    from mazerl.training.local_trainer import LocalGRPOTrainer

    attempted: list[str] = []

    def refuse(what: str):
        def call(*args, **kwargs):
            attempted.append(what)
            raise AssertionError(f"{what} was attempted for a rejected input")

        return call

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


def test_a_real_models_run_on_the_embedded_set_gets_the_pool_the_world_has(starter_model_dir, tmp_path):
    from mazerl.preflight import check_pipeline_inputs
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
