"""The HyperPod deployment files: parsed and checked, since no cluster is reachable from here.

Kinds and API versions, ``/shared`` in every pod template and its ownership, node selectors and
resources that fit the instance types, token authentication, the Prefect base job template
rendered with Prefect's own templating, the IAM pieces, the Grafana dashboard's metrics and
import inputs, and every placeholder documented in docs/hyperpod.md.

The Helm values and the RayCluster are validated against the real upstream schemas (snapshots in
``deployments/k8s/schemas/``, made by ``scripts/k8s_schema_snapshot.py``), unknown fields refused.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shlex
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deployments" / "k8s"
SCHEMAS = K8S / "schemas"
AWS = ROOT / "deployments" / "aws"
OBSERVABILITY = ROOT / "deployments" / "observability"
DOCKERFILE = ROOT / "deployments" / "docker" / "Dockerfile"
DOCS = ROOT / "docs" / "hyperpod.md"
PLACEHOLDER = re.compile(r"\$\{([A-Z][A-Z0-9_]*)\}")
# What envsubst replaces when it is given no list of names: every $NAME and ${NAME}.
ENVSUBST_REFERENCE = re.compile(r"\$(?:\{(\w+)\}|([A-Za-z_]\w*))")

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


def grafana_inputs() -> set[str]:
    """Names of the dashboard's import inputs: Grafana fills ``${NAME}`` for them on import, not envsubst."""
    dashboard = json.loads((OBSERVABILITY / "mazerl-training-dashboard.json").read_text())
    return {item["name"] for item in dashboard.get("__inputs", [])}


def test_every_placeholder_is_documented_and_every_documented_one_is_used():
    used = set()
    for path in [*K8S.glob("*.yaml"), *AWS.glob("*.json"), *OBSERVABILITY.glob("*")]:
        used |= set(PLACEHOLDER.findall(path.read_text()))
    used -= grafana_inputs()
    documented = set(documented_placeholders())
    assert used, "the manifests use placeholders for site-specific values"
    assert used - documented == set(), f"placeholders missing from the table in {DOCS.name}"
    assert documented - used == set(), "the table documents placeholders no file uses"


def test_files_applied_through_envsubst_reference_only_placeholders():
    """envsubst fills every $NAME it meets, so a shell variable in an embedded script would become ''."""
    for path in [*K8S.glob("*.yaml"), *AWS.glob("*.json")]:
        for match in ENVSUBST_REFERENCE.finditer(path.read_text()):
            assert match.group(1), (
                f"{path.name}: {match.group(0)} would be emptied by envsubst; write ${{...}} placeholders only"
            )
            assert match.group(1) in documented_placeholders(), (
                f"{path.name}: {match.group(0)} is not a documented placeholder"
            )


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


def grafana_import(dashboard: dict, answers: dict[str, str]):
    """What Grafana's importer does with the answers to ``__inputs`` (its DashTemplateEvaluator): every
    ``${NAME}`` of an input, in every string, becomes the answer; other ``${...}`` stay; ``__inputs`` goes."""

    def evaluate(value):
        if isinstance(value, str):
            return re.sub(r"\$\{.+?\}", lambda m: answers.get(m.group(0)[2:-1], m.group(0)), value)
        if isinstance(value, list):
            return [evaluate(item) for item in value]
        if isinstance(value, dict):
            return {key: evaluate(item) for key, item in value.items() if key != "__inputs"}
        return value

    return evaluate(dashboard)


def test_grafana_dashboard_imports_into_managed_grafana_with_the_chosen_data_source():
    dashboard = json.loads((OBSERVABILITY / "mazerl-training-dashboard.json").read_text())
    (source_input,) = dashboard["__inputs"]
    assert source_input["pluginId"] == "prometheus", "AMG asks for the AMP data source on import"
    imported = grafana_import(dashboard, {source_input["name"]: "amp-workspace-uid"})
    assert imported != {k: v for k, v in dashboard.items() if k != "__inputs"}, "the import input is used somewhere"
    variables = {v["name"]: v for v in imported["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["datasource"]["current"]["value"] == "amp-workspace-uid", "the answer selects the data source"
    dashboard = imported
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


# --------------------------------------------------------------------------------------
# Upstream schemas: the prefect-worker chart's values.schema.json and KubeRay's RayCluster CRD
# --------------------------------------------------------------------------------------


@functools.cache
def snapshot(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


def forbid_unknown_fields(schema):
    """The schema with ``additionalProperties: false`` on every object that lists its properties and is silent on others.

    Helm accepts and ignores such keys, and the API server prunes them from a custom resource, so
    a misspelt field would pass unnoticed and do nothing; here it fails. What a schema does say is
    kept: an explicit ``additionalProperties`` (``true`` or a map's value schema) and
    ``x-kubernetes-preserve-unknown-fields``. Only nodes that declare fields (reached through
    properties, items, additionalProperties) get the default: the branches of a oneOf or of
    ``dependencies`` constrain a node declared elsewhere and are left as they are.
    """
    if not isinstance(schema, dict):
        return schema
    strict = dict(schema)
    if isinstance(schema.get("properties"), dict):
        strict["properties"] = {name: forbid_unknown_fields(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            strict["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            strict[key] = forbid_unknown_fields(schema[key])
    return strict


def kubernetes_list_type(validator, list_type, instance, schema):
    """The API server's ``x-kubernetes-list-type``: a ``set`` has unique items, a ``map`` unique keys."""
    if not validator.is_type(instance, "array") or list_type not in ("set", "map"):
        return
    if list_type == "set":
        keys = [json.dumps(item, sort_keys=True) for item in instance]
    else:
        fields = schema.get("items", {}).get("properties", {})
        names = schema.get("x-kubernetes-list-map-keys", [])
        keys = [tuple(item.get(name, fields.get(name, {}).get("default")) for name in names) for item in instance]
    duplicates = sorted({str(key) for key in keys if keys.count(key) > 1})
    if duplicates:
        yield jsonschema.ValidationError(f"duplicate entries {duplicates} in a list of type {list_type!r}")


# Draft 7 for both: the chart's "$schema" names no draft, and Draft 7 honours its `dependencies`;
# a CRD's OpenAPI v3 schema uses only keywords that mean the same in Draft 7 (CEL rules in
# x-kubernetes-validations are not evaluated here).
KubernetesValidator = jsonschema.validators.extend(
    jsonschema.Draft7Validator, {"x-kubernetes-list-type": kubernetes_list_type}
)


@functools.cache
def strict_validator(name: str, *path: str) -> jsonschema.protocols.Validator:
    schema = snapshot(name)
    for key in path:
        schema = schema[key]
    return KubernetesValidator(forbid_unknown_fields(schema))


def schema_errors(validator: jsonschema.protocols.Validator, instance) -> list[str]:
    return sorted(
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(instance)
    )


def chart_errors(values: dict) -> list[str]:
    return schema_errors(strict_validator("prefect-worker-chart.json", "values_schema"), values)


def crd_errors(cluster: dict) -> list[str]:
    return schema_errors(strict_validator("kuberay-raycluster-crd.json", "openAPIV3Schema"), cluster)


def helm_merge(defaults: dict, values: dict) -> dict:
    """Helm's coalescing of a user's values over the chart's: maps merge key by key, ``null`` deletes, the rest replaces."""
    merged = copy.deepcopy(defaults)
    for key, value in values.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = helm_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def pod_spec_validator() -> jsonschema.protocols.Validator:
    """core/v1 PodSpec, as the CRD embeds it for the head group's pod template (the same Kubernetes type a Job's template has)."""
    path = ["openAPIV3Schema", "properties", "spec", "properties", "headGroupSpec", "properties", "template"]
    return strict_validator("kuberay-raycluster-crd.json", *path, "properties", "spec")


@pytest.fixture(scope="module")
def worker_values() -> dict:
    return yaml.safe_load(filled(K8S / "prefect-worker-values.yaml"))


@pytest.mark.parametrize(
    "name, repository, tag_prefix",
    [
        ("prefect-worker-chart.json", "PrefectHQ/prefect-helm", "20"),
        ("kuberay-raycluster-crd.json", "ray-project/kuberay", "v1.7."),
    ],
)
def test_schema_snapshots_name_their_upstream_release(name, repository, tag_prefix):
    source = snapshot(name)["source"]
    assert source["repository"] == repository and source["tag"].startswith(tag_prefix), source
    assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]), "the exact upstream commit"
    assert source["files"] and all(re.fullmatch(r"[0-9a-f]{64}", digest) for digest in source["files"].values())
    assert (ROOT / snapshot(name)["generated_by"]).is_file(), "the script that re-snapshots it"


def test_chart_schema_with_unknown_keys_forbidden_still_accepts_the_charts_own_defaults():
    chart = snapshot("prefect-worker-chart.json")
    assert chart["source"]["chart"] == "prefect-worker"
    assert chart_errors(chart["default_values"]) == [], "the strict reading of the schema is too strict"


def test_worker_values_merged_over_the_chart_defaults_pass_the_chart_schema(worker_values):
    chart = snapshot("prefect-worker-chart.json")
    assert chart_errors(helm_merge(chart["default_values"], worker_values)) == []
    # The schema's root admits unknown keys (subchart values); ours uses none of that room.
    assert set(worker_values) <= set(chart["values_schema"]["properties"]), "a top-level key the chart does not know"


def test_worker_talks_to_the_self_hosted_server_and_gets_the_aws_region(worker_values):
    worker = worker_values["worker"]
    assert worker["apiConfig"] == "selfHostedServer"
    assert worker["selfHostedServerApiConfig"]["apiUrl"] == documented_placeholders()["PREFECT_API_URL"]
    env = {e["name"]: e["value"] for e in worker["extraEnvVars"]}
    assert env["AWS_REGION"] == documented_placeholders()["AWS_REGION"]
    container_env = pod_spec_validator().schema["properties"]["containers"]["items"]["properties"]["env"]
    assert schema_errors(KubernetesValidator(container_env), worker["extraEnvVars"]) == [], "Kubernetes EnvVar items"


def test_raycluster_passes_the_kuberay_v1_crd_schema(raycluster):
    assert snapshot("kuberay-raycluster-crd.json")["source"]["crd"] == "rayclusters.ray.io"
    assert crd_errors(raycluster) == []


def set_at(document: dict, path: tuple, value) -> dict:
    changed = copy.deepcopy(document)
    target = changed
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return changed


HEAD_CONTAINER = ("spec", "headGroupSpec", "template", "spec", "containers", 0)


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (("worker", "apiConfig"), "server", "'server' is not one of"),
        (("worker", "serverApiConfig"), {"apiUrl": "http://x/api"}, "'serverApiConfig' was unexpected"),
        (("worker", "selfHostedServerApiConfig", "uiUrl"), "http://x", "'uiUrl' was unexpected"),
        (("serviceAccount", "annotation"), {}, "'annotation' was unexpected"),
    ],
    ids=["old-apiConfig", "old-block-name", "uiUrl", "typo-in-silent-schema"],
)
def test_chart_schema_refuses_todays_mistakes_and_unknown_keys(worker_values, path, value, expected):
    merged = helm_merge(snapshot("prefect-worker-chart.json")["default_values"], set_at(worker_values, path, value))
    assert any(expected in error for error in chart_errors(merged)), chart_errors(merged)


@pytest.mark.parametrize(
    "path, value, expected",
    [
        ((*HEAD_CONTAINER, "resource"), {}, "'resource' was unexpected"),
        (("spec", "workerGroupSpecs", 0, "replica"), 3, "'replica' was unexpected"),
        (("spec", "workerGroupSpecs", 0, "replicas"), "3", "'3' is not of type 'integer'"),
        ((*HEAD_CONTAINER, "ports", 1, "containerPort"), 6379, "duplicate entries"),
        (
            ("spec", "headGroupSpec", "template", "spec", "initContainers", 0, "securityContext", "runAsUser"),
            "0",
            "type",
        ),
    ],
    ids=["unknown-container-field", "unknown-group-field", "wrong-type", "duplicate-port", "uid-as-string"],
)
def test_crd_schema_refuses_unknown_fields_wrong_types_and_duplicate_keys(raycluster, path, value, expected):
    errors = crd_errors(set_at(raycluster, path, value))
    assert any(expected in error for error in errors), errors


# --------------------------------------------------------------------------------------
# /shared ownership, the flow-run pods' environment, IAM
# --------------------------------------------------------------------------------------


def image_user() -> str:
    """``uid:gid`` the cluster image runs as (its last USER, and the group its files are given to)."""
    text = DOCKERFILE.read_text()
    uid = re.findall(r"^USER (\d+)$", text, flags=re.MULTILINE)[-1]
    (owner,) = set(re.findall(r"chown -R (\d+:\d+) ", text))
    assert owner.startswith(f"{uid}:"), f"the image's files belong to {owner}, it runs as {uid}"
    return owner


def test_head_hands_a_root_owned_shared_volume_to_the_image_user_before_ray_starts(raycluster):
    head = raycluster["spec"]["headGroupSpec"]["template"]["spec"]
    (init,) = head["initContainers"]
    assert init["securityContext"]["runAsUser"] == 0, "only root can chown a root-owned directory"
    assert init["image"] == head["containers"][0]["image"], "no second image to pull"
    script = "\n".join(init["args"])
    owner = image_user()
    assert f"chown {owner} /shared" in script and "chown -R" not in script, "the top directory only (a big volume)"
    assert f'[ "$(stat -c %u:%g /shared)" = "{owner}" ]' in script, "nothing to do when it is already theirs"
    shared_volume = next(
        v["name"] for v in head["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == SHARED_CLAIM
    )
    assert {"name": shared_volume, "mountPath": "/shared"} in init["volumeMounts"]
    assert init["resources"]["requests"] == init["resources"]["limits"], "keeps the pod's Guaranteed QoS"


def test_shared_ownership_script_fixes_a_root_owned_directory_and_leaves_a_good_one_with_stand_in_chown(
    raycluster, tmp_path
):
    """The init container's script, run here as it is; stat/chown/chmod are stand-ins (no root, no /shared here)."""
    (init,) = raycluster["spec"]["headGroupSpec"]["template"]["spec"]["initContainers"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    # stat reports the owner we pretend the directory has; chown/chmod only record (no root here).
    (bin_dir / "stat").write_text(f'#!/bin/sh\ncat "{tmp_path}/owner"\n')
    (bin_dir / "chown").write_text(f'#!/bin/sh\necho chown "$@" >> "{calls}"; echo "$1" > "{tmp_path}/owner"\n')
    (bin_dir / "chmod").write_text(f'#!/bin/sh\necho chmod "$@" >> "{calls}"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    script = init["args"][0]
    for before, expected_calls in [("0:0", f"chown {image_user()} /shared\nchmod 2775 /shared\n"), (image_user(), "")]:
        (tmp_path / "owner").write_text(before + "\n")
        calls.write_text("")
        result = subprocess.run([*init["command"], script], env=env, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
        assert calls.read_text() == expected_calls, f"owner {before}"
    (bin_dir / "chown").write_text("#!/bin/sh\necho 'Operation not permitted' >&2; exit 1\n")
    (tmp_path / "owner").write_text("0:0\n")
    result = subprocess.run([*init["command"], script], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "root squash" in result.stderr, "a refused chown stops the pod with the reason"


def test_every_ray_pod_gets_the_aws_region(raycluster):
    for group, _params, spec in pod_templates(raycluster):
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env.get("AWS_REGION") == documented_placeholders()["AWS_REGION"], group


def hyperpod_job_variables() -> dict:
    text = (ROOT / "prefect.yaml").read_text()
    text = re.sub(r"\{\{\s*\$(\w+)\s*\}\}", lambda m: documented_placeholders().get(m.group(1), m.group(0)), text)
    (deployment,) = [d for d in yaml.safe_load(text)["deployments"] if d["name"] == "hyperpod"]
    return deployment["work_pool"]["job_variables"]


def test_hyperpod_flow_run_pod_is_a_valid_pod_with_the_aws_region_and_ray_token(base_job_template):
    """The deployment's job variables over the pool's template, merged by Prefect's own worker code, then the pod
    spec as prefect-kubernetes submits it (env dict to a list, the command split) against Kubernetes' PodSpec."""
    import asyncio

    from prefect.utilities.templating import apply_values
    from prefect.workers.base import BaseJobConfiguration

    class NoApi:
        def __getattr__(self, name):
            raise AssertionError(f"the template should not need the Prefect API ({name})")

    job_variables = {**hyperpod_job_variables(), "name": "run-1", "command": "prefect flow-run execute"}
    configuration = asyncio.run(
        BaseJobConfiguration.from_template_and_values(base_job_template, job_variables, client=NoApi())
    )
    assert configuration.env["AWS_REGION"] == documented_placeholders()["AWS_REGION"]
    assert configuration.env["RAY_AUTH_TOKEN_PATH"] == "/etc/mazerl/ray-token/auth_token"
    variables = base_job_template["variables"]["properties"]
    values = {name: spec["default"] for name, spec in variables.items() if "default" in spec}
    values |= {**job_variables, "env": configuration.env, "labels": {}}
    pod = apply_values(base_job_template["job_configuration"], values)["job_manifest"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    container["env"] = [{"name": k, "value": v} for k, v in container["env"].items()]
    container["args"] = shlex.split(container["args"])
    assert schema_errors(pod_spec_validator(), pod) == []


def test_iam_policy_allows_exactly_the_sagemaker_calls_the_hyperpod_rows_make_mocked_aws(monkeypatch):
    """check_hyperpod against moto, every API call recorded: the policy must allow each, and nothing more."""
    import boto3
    from moto import mock_aws

    from mazerl.cluster.checks.hyperpod import check_hyperpod

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    called = set()
    with mock_aws():
        client = boto3.client("sagemaker", region_name="us-west-2")
        group = {
            "InstanceGroupName": "gpu",
            "InstanceType": "ml.g5.12xlarge",
            "InstanceCount": 1,
            "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lifecycle/", "OnCreate": "on_create.sh"},
            "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod",
            "ThreadsPerCore": 1,
        }
        client.create_cluster(ClusterName="c", InstanceGroups=[group])
        client.meta.events.register("before-call.sagemaker", lambda model, **_: called.add(f"sagemaker:{model.name}"))
        check_hyperpod("c", client=client)
    (statement,) = json.loads((AWS / "mazerl-pods-policy.json").read_text())["Statement"]
    assert called and set(statement["Action"]) == called, f"the rows call {sorted(called)}"
    assert statement["Resource"] == "${HYPERPOD_CLUSTER_ARN}", "only the one cluster"
    trust = json.loads((AWS / "pod-identity-trust-policy.json").read_text())["Statement"][0]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"} and set(trust["Action"]) == {
        "sts:AssumeRole",
        "sts:TagSession",
    }, "EKS Pod Identity's trust policy"


def test_node_role_policy_lets_the_pod_identity_agent_fetch_credentials_and_the_walkthrough_applies_it():
    """The agent on each node calls eks-auth:AssumeRoleForPodIdentity with the node's role (HyperPod's ExecutionRole)."""
    (statement,) = json.loads((AWS / "pod-identity-agent-node-policy.json").read_text())["Statement"]
    assert statement["Action"] == ["eks-auth:AssumeRoleForPodIdentity"] and statement["Effect"] == "Allow"
    applied = [w for w in aws_cli_commands() if w[1:3] == ["iam", "put-role-policy"]]
    assert any("file://deployments/aws/pod-identity-agent-node-policy.json" in w for w in applied), applied
    assert any(
        w[1:3] == ["sagemaker", "describe-cluster"] and "InstanceGroups[].ExecutionRole" in w
        for w in aws_cli_commands()
    )


def aws_cli_commands() -> list[list[str]]:
    """Every ``aws <service> <command> ...`` in docs/hyperpod.md's code blocks, as words (continuation lines joined)."""
    blocks = re.findall(r"```bash\n(.*?)```", DOCS.read_text(), flags=re.DOTALL)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    commands = []
    for line in lines:
        # comments and quotes dropped: a "$(aws ...)" inside an argument is split out as a command of its own
        line = re.sub(r"(^|\s)#.*$", "", line).replace('"', "")
        for part in re.split(r"\$\(|\||&&|;|\)", line):
            words = shlex.split(part)
            if words[:1] == ["aws"]:
                commands.append(words)
    return commands


# Commands of the AWS CLI that are its own, not an API operation, with the options they take.
CLI_ONLY = {("ecr", "get-login-password"): set(), ("eks", "update-kubeconfig"): {"name", "region"}}
CLI_GLOBAL = {"query", "output", "region", "profile", "no-cli-pager"}


def test_every_aws_command_in_the_walkthrough_is_a_real_operation_with_real_options():
    import botocore.session
    from botocore import xform_name

    session = botocore.session.get_session()
    commands = aws_cli_commands()
    assert len(commands) >= 5, "the walkthrough creates the IAM role and the Pod Identity associations"
    for words in commands:
        service, command = words[1], words[2]
        options = {w[2:].split("=")[0] for w in words[3:] if w.startswith("--")} - CLI_GLOBAL
        if (service, command) in CLI_ONLY:
            assert options <= CLI_ONLY[service, command], words
            continue
        model = session.get_service_model(service)
        operations = {xform_name(name, "-"): name for name in model.operation_names}
        assert command in operations, f"aws {service} {command}: no such operation"
        members = model.operation_model(operations[command]).input_shape.members
        known = {xform_name(name, "-") for name in members}
        assert options <= known, f"aws {service} {command}: unknown options {sorted(options - known)}"
