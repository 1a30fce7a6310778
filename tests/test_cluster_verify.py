"""verify_cluster against the real local Ray head, and its in-cluster probe pieces on their own."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from mazerl.cluster.checks.probe import check_model_dir, read_probe, remove_probe, write_probe
from mazerl.cluster.checks.report import CheckRow, ClusterNotReadyError, ClusterReport
from mazerl.cluster.checks.run_requirements import requirements_for
from mazerl.cluster.checks.verify import ReadinessRequest, verify_cluster
from mazerl.cluster.errors import ConfigError
from mazerl.merge.memory import merge_memory
from mazerl.training.config import TrainConfig

# The probe job through Ray's job client, on the Ray the image ships too (`make test-image-stack`).
pytestmark = pytest.mark.image_stack

EMBEDDED_ROWS = {
    "ray.address",
    "ray.probe_job",
    "ray.version",
    "ray.nodes",
    "ray.dead_nodes",
    "ray.gpus",
    "storage.shared",
    "storage.free_space",
    "inputs.base_model",
    "ray.merge_memory",
    "inputs.eval_set",
}


def fake_model_dir(path: Path, *, weights: bool = True, processor: bool = True, tokenizer: bool = True) -> Path:
    """The files verify_cluster looks for in a Hugging Face VLM directory (weights: a header and 16 bytes)."""
    import numpy as np
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3_vl"}))
    if weights:
        save_file({"w": np.zeros(4, dtype=np.float32)}, str(path / "model.safetensors"))
    if processor:
        (path / "preprocessor_config.json").write_text("{}")
    if tokenizer:
        (path / "tokenizer.json").write_text("{}")
    return path


def truncated(weights: Path) -> Path:
    """A copy that stopped early: the last bytes of the data are missing (the header still declares them)."""
    data = weights.read_bytes()
    weights.write_bytes(data[:-6])
    return weights.parent


def closed_port_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def test_embedded_default_passes_against_the_local_head(local_ray_head, tmp_path):
    config = TrainConfig(run_id="r1", base_model=fake_model_dir(tmp_path / "starter"), data_root=tmp_path / "root")
    request = ReadinessRequest(
        data_root=str(config.data_root),
        base_model=str(config.base_model),
        eval_set="maze256-small-v1",
        merge_memory=merge_memory,
        **requirements_for(config),
    )
    report = verify_cluster(local_ray_head.address, request, headers=local_ray_head.auth_headers())
    assert report.ok, report.markdown()
    assert {row.name for row in report.rows} == EMBEDDED_ROWS
    assert report.seconds < 60, f"verification must cost seconds, took {report.seconds}"
    records = report.records()
    assert records[0] == {
        "name": "ray.address",
        "expected": records[0]["expected"],
        "found": records[0]["found"],
        "ok": True,
        "advisory": False,
    }
    assert all(set(r) == {"name", "expected", "found", "ok", "advisory"} for r in records), "rows for Prefect, MLflow"
    assert not (config.data_root / ".mazerl-probe").exists() or not any(
        (config.data_root / ".mazerl-probe").iterdir()
    ), "the probe cleans up its files"


def test_each_unmet_requirement_is_a_failed_row(local_ray_head, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    request = ReadinessRequest(
        data_root=str(blocker / "root"),  # cannot be created: a file is in the way
        base_model=str(fake_model_dir(tmp_path / "model", weights=False)),
        required_nodes=2,
        required_gpus=4,
        gpus_per_node=2,
    )
    report = verify_cluster(local_ray_head.address, request, headers=local_ray_head.auth_headers())
    by_name = {row.name: row for row in report.rows}
    failed = {row.name for row in report.failures}
    assert failed == {
        "ray.nodes",
        "ray.gpus",
        "ray.gpu_placement",
        "storage.shared",
        "storage.free_space",
        "inputs.base_model",
    }
    assert by_name["ray.address"].ok and by_name["ray.probe_job"].ok and by_name["ray.version"].ok
    assert (
        "NotADirectoryError" in by_name["storage.shared"].found or "FileExistsError" in by_name["storage.shared"].found
    )
    assert "weights" in by_name["inputs.base_model"].found
    assert "0 GPUs" in by_name["ray.gpus"].found
    with pytest.raises(ClusterNotReadyError) as caught:
        report.raise_for_failures()
    assert "ray.gpus" in str(caught.value) and local_ray_head.address in str(caught.value)


def test_unreachable_address_fails_fast_and_still_checks_the_rest_mocked_aws(tmp_path):
    import boto3
    from moto import mock_aws

    address = closed_port_address()
    with mock_aws():
        client = boto3.client("sagemaker", region_name="us-east-1")
        request = ReadinessRequest(
            data_root=str(tmp_path), eval_set="maze256-small-v1", hyperpod_cluster="no-such-cluster"
        )
        report = verify_cluster(address, request, sagemaker_client=client)
    by_name = {row.name: row for row in report.rows}
    assert not by_name["ray.address"].ok and address in by_name["ray.address"].found
    assert "ray.probe_job" not in by_name, "Ray rows that need the address are skipped, not timed out"
    assert by_name["inputs.eval_set"].ok
    assert not by_name["hyperpod.cluster"].ok and "no-such-cluster" in by_name["hyperpod.cluster"].found
    assert report.seconds < 10


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"data_root": "relative/root"}, "data_root"),
        ({"data_root": "/shared", "required_nodes": 0}, "required_nodes"),
        ({"data_root": "/shared", "required_gpus": -1}, "required_gpus"),
        ({"data_root": "/shared", "gpus_per_node": 1.5}, "gpus_per_node"),
    ],
)
def test_nonsense_requests_are_refused_before_any_work(kwargs, names):
    with pytest.raises(ConfigError, match=names):
        ReadinessRequest(**kwargs)


def test_requirements_follow_the_training_config(tmp_path):
    local = TrainConfig(run_id="r", base_model=tmp_path)
    placement = {k: v for k, v in requirements_for(local).items() if k != "footprint"}
    assert placement == {"required_nodes": 1, "required_gpus": 0, "gpus_per_node": 0}
    skyrl = TrainConfig(run_id="r", base_model=tmp_path, backend="skyrl", skyrl={"num_gpus": 2, "num_nodes": 3})
    needs = requirements_for(skyrl)
    assert {k: needs[k] for k in ("required_nodes", "required_gpus", "gpus_per_node")} == {
        "required_nodes": 3,
        "required_gpus": 6,
        "gpus_per_node": 2,
    }
    assert needs["footprint"].backend == "skyrl" and needs["footprint"].checkpoints == skyrl.checkpoints_kept + 1


# Qwen3-VL-8B-Instruct's text_config and the size of its bf16 weights (4 shards, 17.5 GB).
QWEN3_VL_8B_DIMS = {
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
QWEN3_VL_8B_WEIGHTS = 17_534_000_000


def test_the_free_space_row_sizes_skyrls_full_model_checkpoints_and_the_merged_copies(tmp_path):
    from mazerl.cluster.checks.run_requirements import GIB, lora_parameters
    from mazerl.cluster.checks.verify import _storage_rows

    config = TrainConfig(run_id="r", base_model=tmp_path, backend="skyrl", skyrl={"num_gpus": 2, "num_nodes": 3})
    skyrl = requirements_for(config, max_artifact_mb=512)["footprint"]
    # rank 32 on the seven projections of 36 blocks: 32 x 36 x (8192 + 5120 + 5120 + 8192 + 3 x 16384)
    assert lora_parameters(QWEN3_VL_8B_DIMS, 32, skyrl.lora_targets) == 87_293_952
    checkpoint = skyrl.checkpoint_bytes(QWEN3_VL_8B_WEIGHTS, QWEN3_VL_8B_DIMS)
    # SkyRL trains the policy in fp32 (FSDP2 keeps fp32 shards): twice the bf16 files, plus the adapter state
    assert 36e9 < checkpoint < 37e9, "the whole model in fp32 (35.1 GB) plus the adapter and its optimizer state"
    parts = skyrl.parts(QWEN3_VL_8B_WEIGHTS, QWEN3_VL_8B_DIMS)
    total = sum(size for _, size in parts)
    assert total == 3 * checkpoint + QWEN3_VL_8B_WEIGHTS, "3 checkpoints at the peak, the merged model, no MLflow copy"
    assert total > 3.3 * 1.25 * QWEN3_VL_8B_WEIGHTS, "the old rule (1.25 x the weights) asked for a fraction of it"
    # The row says the numbers; a data root with 60 GiB free fails it.
    probe = {
        "storage": [
            {"writer": "w", "reader": "w", "write": {"ok": True, "free_bytes": 60 * GIB}, "read": {"ok": True}}
        ],
        "base_model": {"weights_bytes": QWEN3_VL_8B_WEIGHTS, "dims": QWEN3_VL_8B_DIMS},
    }
    _, row = _storage_rows(probe, "/shared", None, skyrl)
    assert not row.ok and f">= {total / GIB:.1f} GiB free under /shared" in row.expected
    assert "3 checkpoints x 33.96 GiB (SkyRL FSDP state: the whole model in fp32" in row.expected, row.expected
    assert "about 4 min each at 150 MB/s" in row.expected and 118 < total / GIB < 119, row.expected
    # A model stored in fp32 already is not doubled.
    _, fp32_row = _storage_rows(probe | {"base_model": probe["base_model"] | {"dtype_bytes": 4}}, "/s", None, skyrl)
    assert "3 checkpoints x 17.6" in fp32_row.expected, fp32_row.expected
    assert "MLflow copy 0 (above max_artifact_mb 512" in row.expected, row.expected
    # The local backend's checkpoints are the adapter and its optimizer state only; a small model is copied to MLflow.
    local = requirements_for(TrainConfig(run_id="r", base_model=tmp_path), mlflow_store_in_data_root=True)["footprint"]
    small = 100 * 2**20
    assert local.checkpoint_bytes(small, QWEN3_VL_8B_DIMS) == 87_293_952 * 12
    assert [size for _, size in local.parts(small, {})][1:] == [small, 2 * small], "merged + MLflow model + store"


@pytest.mark.parametrize(
    ("build", "missing"),
    [
        (lambda p: fake_model_dir(p), []),
        (lambda p: fake_model_dir(p, weights=False), ["weights (*.safetensors or pytorch_model*.bin)"]),
        (
            lambda p: fake_model_dir(p, processor=False),
            ["a processor config (preprocessor_config.json or processor_config.json)"],
        ),
        (lambda p: fake_model_dir(p, tokenizer=False), ["a tokenizer (tokenizer.json or tokenizer_config.json)"]),
        (lambda p: p, ["the directory itself"]),
        (
            lambda p: truncated(fake_model_dir(p) / "model.safetensors"),
            ["a complete model.safetensors (it is truncated: 74 of the 80 bytes its header declares)"],
        ),
    ],
)
def test_model_dir_check_names_what_is_missing(tmp_path, build, missing):
    assert check_model_dir(str(build(tmp_path / "m")))["missing"] == missing


def test_model_dir_check_follows_the_shard_index(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    model = fake_model_dir(tmp_path / "m", weights=False)
    save_file({"a": np.zeros(2, dtype=np.float32)}, str(model / "model-00001-of-00002.safetensors"))
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    assert check_model_dir(str(model))["missing"] == ["weight shard model-00002-of-00002.safetensors"]


def test_storage_probe_detects_a_mount_that_is_not_shared(tmp_path):
    shared = tmp_path / "shared"
    assert write_probe(str(shared), "tok", "node-a")["ok"]
    assert read_probe(str(shared), "tok", "node-a")["ok"], "the same mount reads back what was written"
    elsewhere = read_probe(str(tmp_path / "node-b-local-disk"), "tok", "node-a")
    assert not elsewhere["ok"] and "cannot read" in elsewhere["error"], "a node-local path misses the file"
    remove_probe(str(shared), "tok")
    assert not (shared / ".mazerl-probe" / "tok").exists()


def test_eval_placement_counts_the_actors_every_node_holds_at_once():
    from mazerl.cluster.checks.verify import _eval_rows, actors_that_fit

    # the HyperPod shape: a CPU head and three 2-GPU workers (one of them DEAD)
    nodes = [
        {"address": "head", "alive": True, "gpus": 0.0, "cpus": 52.0},
        {"address": "w1", "alive": True, "gpus": 2.0, "cpus": 40.0},
        {"address": "w2", "alive": True, "gpus": 2.0, "cpus": 40.0},
        {"address": "w3", "alive": False, "gpus": 2.0, "cpus": 40.0},
    ]
    assert actors_that_fit(nodes, gpus=1.0) == {"head": 0, "w1": 2, "w2": 2}
    assert actors_that_fit(nodes, gpus=0.5) == {"head": 0, "w1": 4, "w2": 4}
    assert actors_that_fit(nodes, gpus=0.0) == {"head": 52, "w1": 40, "w2": 40}, "hf workers need a CPU only"
    (row,) = _eval_rows({"nodes": nodes}, workers=6, gpus=1.0)
    assert not row.ok and "room for 4 (w1: 2, w2: 2)" in row.found, row
    (row,) = _eval_rows({"nodes": nodes}, workers=4, gpus=1.0)
    assert row.ok
    assert _eval_rows({"nodes": nodes}, workers=0, gpus=1.0) == [], "no eval requested, no row"


def test_report_renders_for_people_and_tables():
    report = ClusterReport(
        address="http://h:8265",
        rows=(CheckRow("a", "x", "x", True), CheckRow("b", "y | z", "none", False)),
        seconds=1.5,
    )
    assert not report.ok and [r.name for r in report.failures] == ["b"]
    text = report.markdown()
    assert "| b | y \\| z | none | **NO** |" in text and "NOT ready (1 failed)" in text
    assert ClusterReport(address="h").ok is False, "no checks is not a pass"
    advisory = ClusterReport(
        address="h", rows=(CheckRow("a", "x", "x", True), CheckRow("hyperpod.cluster", "y", "not checked", False, True))
    )
    assert advisory.ok and advisory.failures == () and [r.name for r in advisory.warnings] == ["hyperpod.cluster"]
    advisory.raise_for_failures()  # an advisory row never stops the run
    assert "| hyperpod.cluster | y | not checked | advisory: no |" in advisory.markdown()
    assert advisory.records()[1]["advisory"] is True


def test_gpu_smoke_checks_follow_what_the_run_runs_on_gpus():
    from mazerl.cluster.checks.gpu_smoke import smoke_for

    def checks(**run):
        base = {"backend": "local", "local_gpus": 0, "eval_engine": "hf", "eval_gpus": 0.0}
        smoke = smoke_for(**(base | run), base_model="/m", lora_rank=32, lora_targets=("q_proj",))
        return smoke.checks if smoke else None

    assert checks() is None, "the embedded run uses no GPU: no smoke row"
    assert checks(backend="skyrl", eval_engine="vllm", eval_gpus=1.0) == (
        "compute_capability",
        "flash_attn",
        "vllm_generate",
        "lora_adapter",
    )
    assert checks(eval_engine="vllm", eval_gpus=1.0) == ("compute_capability", "vllm_generate")
    assert checks(local_gpus=1) == ("compute_capability",)


def test_gpu_smoke_real_checks_without_gpu_say_that_no_cuda_device_is_visible():
    from mazerl.cluster.checks.gpu_smoke import CHECKS, run_checks

    found = run_checks({"checks": list(CHECKS), "base_model": None})
    assert set(found) == set(CHECKS) and not any(result["ok"] for result in found.values())
    assert all("no CUDA device visible" in result["found"] for result in found.values())


def test_gpu_smoke_generates_from_a_maze_frame_through_the_vllm_engines_request():
    from mazerl.cluster.checks.gpu_smoke import smoke_prompt
    from mazerl.policy.chat import image_token_id
    from mazerl.policy.loader import load_processor
    from mazerl.starter.shipped import shipped_starter

    # the smoke's request is the vllm engine's first turn of a maze: token ids with one image placeholder
    # and the frame as multi-modal data (vLLM's image path runs, not text alone)
    prompt = smoke_prompt(str(shipped_starter()))
    (frame,) = prompt["multi_modal_data"]["image"]
    assert frame.mode == "RGB" and frame.size == (7 * 16, 7 * 16)
    assert prompt["prompt_token_ids"].count(image_token_id(load_processor(shipped_starter()))) == 1


def test_gpu_rows_report_each_worker_and_a_worker_whose_gpus_are_taken_without_blocking():
    from mazerl.cluster.checks.gpu_smoke import GpuSmoke, gpu_rows

    smoke = GpuSmoke(("compute_capability", "vllm_generate"))
    ok = {"ok": True, "found": "sm_120"}
    workers = [
        {"node": "a", "checked": True, "gpu_ids": ["0"], "checks": {"compute_capability": ok, "vllm_generate": ok}},
        {"node": "b", "checked": False},
    ]
    rows = {row.name: row for row in gpu_rows({"gpu_smoke": workers}, smoke)}
    assert rows["gpu.compute_capability"].ok and rows["gpu.compute_capability"].found.startswith("1/2 GPU workers ok")
    assert "b: not checked, its GPUs stay taken by another job" in rows["gpu.vllm_generate"].found
    taken = {row.name: row for row in gpu_rows({"gpu_smoke": workers[1:]}, smoke)}
    assert all(not row.ok and row.advisory for row in taken.values()), "nothing checked: shown, not blocking"


def test_skyrls_wait_for_its_vllm_servers_is_sized_to_the_weights_each_node_reads():
    from mazerl.cluster.checks.run_requirements import SKYRL_HEALTH_TIMEOUT_DEFAULT_S, inference_start_timeout_s

    # 3 nodes read 17.5 GB each at 150 MB/s: 350 s; twice that plus 5 minutes, past SkyRL's 600 s
    assert inference_start_timeout_s(QWEN3_VL_8B_WEIGHTS, 3) == 1001
    assert inference_start_timeout_s(100 * 2**20, 1) == SKYRL_HEALTH_TIMEOUT_DEFAULT_S, "a small model: the default"


def test_a_skyrl_train_job_gets_skyrls_vllm_wait_sized_to_its_model_and_a_local_one_nothing(tmp_path):
    from types import SimpleNamespace

    from tasks.training import _backend_env

    model = tmp_path / "model"
    model.mkdir()
    with open(model / "model.safetensors", "wb") as weights:  # sparse: the size of Qwen3-VL-8B's files, no disk
        weights.truncate(QWEN3_VL_8B_WEIGHTS)
    run = SimpleNamespace(base_model=model)
    skyrl = TrainConfig(run_id="r", base_model=model, backend="skyrl", skyrl={"num_gpus": 2, "num_nodes": 3})
    assert _backend_env(run, skyrl) == {"SKYRL_WAIT_UNTIL_INFERENCE_SERVER_HEALTHY_TIMEOUT_S": "1001"}
    assert _backend_env(run, TrainConfig(run_id="r", base_model=model)) == {}
