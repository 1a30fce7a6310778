"""Bad input: every case is refused before expensive work, with a message naming the parameter and the fix.

Expensive work means loading model weights, building the starter, starting a Ray head,
submitting a stage's Ray job (eval or training) and training; the ``expensive_work`` fixture
turns each of them into a recorded failure, and every case asserts none happened.
``verify_cluster``'s probe job is the cheap check itself (seconds) and may run.

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

import json
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from mazerl.params import MINIATURE_TRAINING, PipelineParams


@dataclass
class World:
    """What a case may need to build its input."""

    tmp: Path
    model_dir: Path
    ray_address: str
    monkeypatch: pytest.MonkeyPatch

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
    from mazerl.cluster.verify import requirements_for, verify_cluster
    from tasks.cluster import CLUSTER_FIXES
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
    from flows.deployments import PREFECT_YAML, check_schedules

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
]


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


@pytest.fixture
def world(tmp_path, starter_model_dir, monkeypatch, request):
    address = closed_port_address()
    if request.param == "cluster":
        head = request.getfixturevalue("local_ray_head")
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(head.token_path))
        address = head.address
    if request.param == "pipeline":
        request.getfixturevalue("prefect_api")
    return World(tmp_path, Path(starter_model_dir), address, monkeypatch)


def flow_run_record(flow_run_id) -> tuple[str, str]:
    """(state name, state message) of a flow run, as the Prefect API keeps it."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
    return run.state.name, run.state.message or ""


# --- the test -------------------------------------------------------------------------------------


def test_the_table_covers_every_case_of_the_issue():
    ids = " | ".join(case.id for case in CASES)
    for listed in (
        "wrong model path",
        "directory without processor",
        "non-VLM model",
        "even maze size",
        "eval set file edited",
        "unknown eval set name",
        "move budget 0",
        "LoRA rank 0",
        "negative learning rate",
        "GRPO group size 1",
        "unreachable Ray address",
        "too few GPUs",
        "data root not writable",
        "resume required, no checkpoint",
        "checkpoint from a different base model",
        "malformed adapter config",
        "registered model name with illegal characters",
        "tracking URI malformed",
        "schedule cron invalid",
        "HyperPod cluster not found",
    ):
        assert listed in ids, f"issue 7 lists '{listed}'"
    assert len(CASES) >= 20


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
