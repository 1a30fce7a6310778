"""Snapshot the upstream schemas our Kubernetes files are validated against.

No cluster and no Helm are reachable from CI, so ``tests/test_deploy_schemas.py`` validates
``deployments/k8s/prefect-worker-values.yaml`` and ``deployments/k8s/raycluster.yaml`` against
copies of the real upstream schemas kept in ``deployments/k8s/schemas/``:

- ``prefect-worker-chart.json``: the prefect-worker chart's ``values.schema.json`` and its
  default ``values.yaml`` (Helm merges our values over those defaults, then validates), from
  PrefectHQ/prefect-helm at a release tag;
- ``kuberay-raycluster-crd.json``: the ``openAPIV3Schema`` of the ``v1`` version of KubeRay's
  ``rayclusters.ray.io`` CRD, from ray-project/kuberay at a release tag.

Both are copied unchanged (parsed and written as JSON), with the repository, path, tag,
commit and the SHA-256 of each upstream file recorded beside them. The sources are read from
local git clones (``git show TAG:PATH``), e.g. the mirrors the ``fetch`` tool makes or a
``git clone --bare`` of each repository::

    python scripts/k8s_schema_snapshot.py --prefect-helm /path/to/prefect-helm.git --kuberay /path/to/kuberay.git
    python scripts/k8s_schema_snapshot.py --prefect-helm ... --kuberay ... --check   # exit 1 if a file differs

Change ``PREFECT_HELM_TAG`` / ``KUBERAY_TAG`` below to move to another release.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = REPO / "deployments" / "k8s" / "schemas"

# prefect-helm releases are tagged with the chart version (Chart.yaml says 0.0.0; the release
# workflow stamps the tag into the packaged chart).
PREFECT_HELM_TAG = "2026.8.18172642"
PREFECT_WORKER_CHART = "charts/prefect-worker"
KUBERAY_TAG = "v1.7.0"
RAYCLUSTER_CRD = "ray-operator/config/crd/bases/ray.io_rayclusters.yaml"  # the Helm chart's crds/ copy is identical


def git_show(git_dir: Path, ref: str, path: str) -> bytes:
    return subprocess.run(["git", "-C", str(git_dir), "show", f"{ref}:{path}"], check=True, capture_output=True).stdout


def git_commit(git_dir: Path, ref: str) -> str:
    command = ["git", "-C", str(git_dir), "rev-parse", f"{ref}^{{commit}}"]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def prefect_worker_chart(git_dir: Path) -> dict[str, Any]:
    schema_path, values_path = f"{PREFECT_WORKER_CHART}/values.schema.json", f"{PREFECT_WORKER_CHART}/values.yaml"
    schema_bytes = git_show(git_dir, PREFECT_HELM_TAG, schema_path)
    values_bytes = git_show(git_dir, PREFECT_HELM_TAG, values_path)
    return {
        "source": {
            "repository": "PrefectHQ/prefect-helm",
            "chart": "prefect-worker",
            "chart_version": PREFECT_HELM_TAG,
            "tag": PREFECT_HELM_TAG,
            "commit": git_commit(git_dir, PREFECT_HELM_TAG),
            "files": {schema_path: sha256(schema_bytes), values_path: sha256(values_bytes)},
        },
        "generated_by": "scripts/k8s_schema_snapshot.py",
        "values_schema": json.loads(schema_bytes),
        "default_values": yaml.safe_load(values_bytes),
    }


def raycluster_crd(git_dir: Path) -> dict[str, Any]:
    crd_bytes = git_show(git_dir, KUBERAY_TAG, RAYCLUSTER_CRD)
    crd = yaml.safe_load(crd_bytes)
    (v1,) = [version for version in crd["spec"]["versions"] if version["name"] == "v1"]
    return {
        "source": {
            "repository": "ray-project/kuberay",
            "tag": KUBERAY_TAG,
            "commit": git_commit(git_dir, KUBERAY_TAG),
            "files": {RAYCLUSTER_CRD: sha256(crd_bytes)},
            "crd": crd["metadata"]["name"],
            "version": v1["name"],
            "controller_gen": crd["metadata"].get("annotations", {}).get("controller-gen.kubebuilder.io/version"),
        },
        "generated_by": "scripts/k8s_schema_snapshot.py",
        "openAPIV3Schema": v1["schema"]["openAPIV3Schema"],
    }


def render(content: dict[str, Any]) -> str:
    return json.dumps(content, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefect-helm", type=Path, required=True, help="git clone of PrefectHQ/prefect-helm")
    parser.add_argument("--kuberay", type=Path, required=True, help="git clone of ray-project/kuberay")
    parser.add_argument("--check", action="store_true", help="exit 1 if a stored snapshot differs")
    args = parser.parse_args(argv)
    outputs = {
        SCHEMAS / "prefect-worker-chart.json": prefect_worker_chart(args.prefect_helm),
        SCHEMAS / "kuberay-raycluster-crd.json": raycluster_crd(args.kuberay),
    }
    differs = 0
    for output, content in outputs.items():
        text = render(content)
        if args.check:
            same = output.exists() and output.read_text() == text
            differs += not same
            print(f"{output.relative_to(REPO)}: {'up to date' if same else 'DIFFERS'}")
            continue
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = output.with_name(output.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, output)
        print(f"wrote {output.relative_to(REPO)} ({content['source']['repository']} {content['source']['tag']})")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
