"""The HyperPod deployment files: parsed and checked, since no cluster is reachable from here.

Kinds and API versions, ``/shared`` in every pod template, node selectors and resources that
fit the instance types, token authentication, the Prefect base job template rendered with
Prefect's own templating, the Grafana dashboard's metrics existing, and every placeholder
documented in docs/hyperpod.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deployments" / "k8s"
OBSERVABILITY = ROOT / "deployments" / "observability"
DOCS = ROOT / "docs" / "hyperpod.md"
PLACEHOLDER = re.compile(r"\$\{([A-Z][A-Z0-9_]*)\}")

# Capacities of the reference instance types (docs/hyperpod.md cites the sources).
INSTANCES = {
    "ml.r5d.16xlarge": {"cpu": 64, "memory_gib": 512, "gpus": 0},
    "ml.g7e.12xlarge": {"cpu": 48, "memory_gib": 512, "gpus": 2},
}
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
TYPE_LABEL = "node.kubernetes.io/instance-type"
SHARED_CLAIM = "mazerl-shared"


def documented_placeholders() -> dict[str, str]:
    """Placeholder -> example, from the table in docs/hyperpod.md."""
    rows = re.findall(r"^\| `\$\{([A-Z0-9_]+)\}` \|[^|]*\|[^|]*\| `([^`]*)` \|$", DOCS.read_text(), flags=re.MULTILINE)
    return dict(rows)


def filled(path: Path) -> str:
    """The file with every placeholder replaced by its documented example (as envsubst would)."""
    examples = documented_placeholders()
    return PLACEHOLDER.sub(lambda m: examples[m.group(1)], path.read_text())


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(filled(path)) if doc]


def quantity(value) -> float:
    """A Kubernetes quantity as a number (cores, or bytes for memory)."""
    text = str(value)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3}
    for suffix, factor in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def pod_templates(cluster: dict) -> list[tuple[str, dict, dict]]:
    """(group, rayStartParams, pod spec) for the head and every worker group."""
    spec = cluster["spec"]
    head = spec["headGroupSpec"]
    groups = [("head", head["rayStartParams"], head["template"]["spec"])]
    groups += [(g["groupName"], g["rayStartParams"], g["template"]["spec"]) for g in spec["workerGroupSpecs"]]
    return groups


@pytest.fixture(scope="module")
def raycluster() -> dict:
    (cluster,) = documents(K8S / "raycluster.yaml")
    return cluster


def test_every_placeholder_is_documented_and_every_documented_one_is_used():
    used = set()
    for path in [*K8S.glob("*.yaml"), *OBSERVABILITY.glob("*")]:
        used |= set(PLACEHOLDER.findall(path.read_text()))
    documented = set(documented_placeholders())
    assert used, "the manifests use placeholders for site-specific values"
    assert used - documented == set(), f"placeholders missing from the table in {DOCS.name}"
    assert documented - used == set(), "the table documents placeholders no file uses"


def test_raycluster_is_a_kuberay_cluster_with_token_auth(raycluster):
    assert (raycluster["apiVersion"], raycluster["kind"]) == ("ray.io/v1", "RayCluster")
    assert raycluster["spec"]["authOptions"] == {"mode": "token", "secretName": "mazerl-ray-token"}
    major, minor = (int(x) for x in raycluster["spec"]["rayVersion"].split(".")[:2])
    assert (major, minor) >= (2, 52), "KubeRay's token auth needs Ray >= 2.52"
    assert raycluster["metadata"]["namespace"] == "mazerl"


def test_reference_topology_one_cpu_head_and_three_gpu_workers(raycluster):
    head = raycluster["spec"]["headGroupSpec"]["template"]["spec"]
    (workers,) = raycluster["spec"]["workerGroupSpecs"]
    assert head["nodeSelector"][TYPE_LABEL] == "ml.r5d.16xlarge"
    assert workers["template"]["spec"]["nodeSelector"][TYPE_LABEL] == "ml.g7e.12xlarge"
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == 3, "a fixed GPU fleet"


def test_every_pod_template_mounts_shared_and_waits_for_healthy_nodes(raycluster):
    for group, _params, spec in pod_templates(raycluster):
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v
        }
        assert SHARED_CLAIM in claims.values(), f"{group}: the RWX claim is a volume"
        volume = next(name for name, claim in claims.items() if claim == SHARED_CLAIM)
        for container in spec["containers"]:
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts.get("/shared") == volume, f"{group}/{container['name']}: /shared must be the FSx claim"
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env.get("MAZERL_HOME") == "/shared", f"{group}: the data root is the shared mount"
        assert spec["nodeSelector"][HEALTH_LABEL] == "Schedulable", f"{group}: only nodes HyperPod marks healthy"


def test_resources_match_the_instance_types(raycluster):
    image = None
    for group, params, spec in pod_templates(raycluster):
        instance = INSTANCES[spec["nodeSelector"][TYPE_LABEL]]
        (container,) = spec["containers"]
        image = image or container["image"]
        assert container["image"] == image, f"{group}: one image for the whole cluster"
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert requests == limits, f"{group}: requests == limits (Guaranteed QoS: not evicted under pressure)"
        cpu, memory = quantity(requests["cpu"]), quantity(requests["memory"])
        assert 0.75 * instance["cpu"] <= cpu < instance["cpu"], (
            f"{group}: one pod fills most of a node but leaves room for daemons"
        )
        assert 0.75 * instance["memory_gib"] * 2**30 <= memory < instance["memory_gib"] * 2**30, f"{group}: memory"
        gpus = int(limits.get("nvidia.com/gpu", 0))
        assert gpus == instance["gpus"], f"{group}: all GPUs of the instance, no more"
        assert int(params.get("num-gpus", 0)) == gpus, f"{group}: Ray advertises exactly the GPUs the pod holds"
        if gpus:
            assert any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])), (
                f"{group}: tolerates GPU taints"
            )
    assert image == documented_placeholders()["MAZERL_IMAGE"], "the image is the documented placeholder"


def test_ports_expose_the_job_server_and_metrics(raycluster):
    head = raycluster["spec"]["headGroupSpec"]
    ports = {p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert ports["dashboard"] == 8265 and ports["metrics"] == int(head["rayStartParams"]["metrics-export-port"])
    for group, params, spec in pod_templates(raycluster)[1:]:
        worker_ports = {p["name"]: p["containerPort"] for p in spec["containers"][0]["ports"]}
        assert worker_ports["metrics"] == int(params["metrics-export-port"]), f"{group}: metrics port scraped by name"


def test_fsx_storage_is_a_read_write_many_lustre_claim():
    docs = {d["kind"]: d for d in documents(K8S / "fsx-storage.yaml")}
    assert set(docs) == {"StorageClass", "PersistentVolume", "PersistentVolumeClaim"}
    assert (docs["StorageClass"]["apiVersion"], docs["StorageClass"]["provisioner"]) == (
        "storage.k8s.io/v1",
        "fsx.csi.aws.com",
    )
    pv, pvc = docs["PersistentVolume"], docs["PersistentVolumeClaim"]
    assert pv["apiVersion"] == pvc["apiVersion"] == "v1"
    assert pv["spec"]["csi"]["driver"] == "fsx.csi.aws.com"
    assert pv["spec"]["csi"]["volumeHandle"].startswith("fs-") and {"dnsname", "mountname"} <= set(
        pv["spec"]["csi"]["volumeAttributes"]
    )
    assert pv["spec"]["accessModes"] == pvc["spec"]["accessModes"] == ["ReadWriteMany"], (
        "every node mounts it read-write"
    )
    assert pvc["metadata"]["name"] == SHARED_CLAIM and pvc["metadata"]["namespace"] == "mazerl"
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"], "the claim binds to the existing file system"
    assert pvc["spec"]["storageClassName"] == pv["spec"]["storageClassName"] == docs["StorageClass"]["metadata"]["name"]
    assert quantity(pvc["spec"]["resources"]["requests"]["storage"]) <= quantity(pv["spec"]["capacity"]["storage"])
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain", "deleting the claim must not delete checkpoints"


@pytest.fixture(scope="module")
def base_job_template() -> dict:
    values = yaml.safe_load(filled(K8S / "prefect-worker-values.yaml"))
    assert (
        values["worker"]["config"]["type"] == "kubernetes"
        and values["worker"]["config"]["workPool"] == "mazerl-hyperpod"
    )
    return json.loads(values["worker"]["config"]["baseJobTemplate"]["configuration"])


def test_prefect_base_job_template_declares_every_variable_it_uses(base_job_template):
    from prefect.utilities.templating import find_placeholders

    used = {p.name for p in find_placeholders(base_job_template["job_configuration"])}
    declared = set(base_job_template["variables"]["properties"])
    assert used <= declared, f"placeholders without a variable: {sorted(used - declared)}"


def test_prefect_flow_run_pods_mount_shared_and_the_ray_token(base_job_template):
    from prefect.utilities.templating import apply_values

    variables = base_job_template["variables"]["properties"]
    defaults = {name: spec["default"] for name, spec in variables.items() if "default" in spec}
    rendered = apply_values(
        base_job_template["job_configuration"],
        {**defaults, "name": "run-1", "command": "prefect flow-run execute", "labels": {}},
    )
    manifest = rendered["job_manifest"]
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    pod = manifest["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/shared"]]["persistentVolumeClaim"]["claimName"] == SHARED_CLAIM
    token_dir = next(path for path, name in mounts.items() if "secret" in volumes[name])
    assert volumes[mounts[token_dir]]["secret"]["secretName"] == "mazerl-ray-token"
    env = rendered["env"]
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == f"{token_dir}/auth_token"
    assert env["MAZERL_HOME"] == "/shared"
    assert env["MAZERL_RAY_ADDRESS"] == "http://mazerl-head-svc.mazerl.svc.cluster.local:8265", "KubeRay's head service"
    assert container["image"] == documented_placeholders()["MAZERL_IMAGE"]
    assert pod["nodeSelector"] == {TYPE_LABEL: "ml.r5d.16xlarge", HEALTH_LABEL: "Schedulable"}
    assert quantity(container["resources"]["requests"]["cpu"]) <= INSTANCES["ml.r5d.16xlarge"]["cpu"] - 52, (
        "the flow-run pod fits next to the Ray head on the CPU node"
    )


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((OBSERVABILITY / "mazerl-training-dashboard.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_grafana_dashboard_queries_only_metrics_that_exist():
    from ray.dashboard.modules.reporter.reporter_agent import METRICS_GAUGES

    from mazerl.cluster.metrics import PROMETHEUS_NAMES

    existing = set(PROMETHEUS_NAMES.values()) | {f"ray_{name}" for name in METRICS_GAUGES}
    used = {name for expr in dashboard_exprs() for name in re.findall(r"\b(ray_[a-z0-9_]+)\b", expr)}
    assert used - existing == set(), f"the dashboard queries metrics nobody exports: {sorted(used - existing)}"
    assert set(PROMETHEUS_NAMES.values()) <= used, "every training gauge is shown"
    assert "ray_node_gpus_utilization" in used, "GPU utilisation from Ray's node metrics"


def test_grafana_dashboard_imports_into_managed_grafana():
    dashboard = json.loads((OBSERVABILITY / "mazerl-training-dashboard.json").read_text())
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus", "AMG asks for the AMP data source on import"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", f"{panel['title']}: no hard-wired data source"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"


def test_podmonitor_scrapes_the_ray_pods_metrics_port(raycluster):
    (monitor,) = documents(OBSERVABILITY / "ray-podmonitor.yaml")
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    for template in [
        raycluster["spec"]["headGroupSpec"]["template"],
        *(g["template"] for g in raycluster["spec"]["workerGroupSpecs"]),
    ]:
        labels = template["metadata"]["labels"]
        assert selector.items() <= labels.items(), "every Ray pod is selected"
        assert any(
            p["name"] == monitor["spec"]["podMetricsEndpoints"][0]["port"]
            for p in template["spec"]["containers"][0]["ports"]
        )
