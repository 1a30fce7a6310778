"""The GPU cluster image agrees with the SkyRL release the backend was checked against.

The image is not built here (no Docker daemon, no CUDA); these checks keep its pinned
versions, the snapshot of the real SkyRL config, and the RayCluster manifest in step.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from mazerl.training.skyrl_backend import load_schema

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "deployments" / "docker" / "Dockerfile"


def build_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), flags=re.MULTILINE))


def test_image_installs_the_snapshotted_skyrl_with_its_pinned_torch_and_vllm():
    args, schema = build_args(), load_schema()
    assert args["SKYRL_VERSION"] == schema["skyrl_version"], "regenerate the snapshot or change SKYRL_VERSION"
    assert f"=={args['TORCH_VERSION']}" == schema["fsdp_pins"]["torch"]
    assert f"=={args['VLLM_VERSION']}" == schema["fsdp_pins"]["vllm"]


def test_image_is_python_3_12_with_the_ray_skyrl_pins():
    base = build_args()["BASE_IMAGE"]
    ray_pin = load_schema()["fsdp_pins"]["ray"].removeprefix("==")
    assert "py312" in base and f"ray:{ray_pin}" in base, f"{base}: SkyRL needs Python 3.12 and Ray {ray_pin}"


def test_raycluster_ray_version_matches_the_image():
    docs = list(yaml.safe_load_all((REPO / "deployments" / "k8s" / "raycluster.yaml").read_text()))
    (cluster,) = [d for d in docs if d and d.get("kind") == "RayCluster"]
    assert cluster["spec"]["rayVersion"] == load_schema()["fsdp_pins"]["ray"].removeprefix("==")


def test_image_installs_the_project_with_its_cluster_extra_and_checks_the_imports():
    text = DOCKERFILE.read_text()
    assert '".[cluster]"' in text, "the image must resolve our own cluster extra"
    for module in ("mazerl.training.skyrl_entry", "envs.skyrl_env", "mazerl.policy.vllm_engine"):
        assert f"import {module}" in text, f"the build must fail if {module} does not import"
        assert (REPO / (module.replace(".", "/") + ".py")).is_file()
