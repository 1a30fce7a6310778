"""``verify_cluster``: refuse to spend GPU hours on a cluster that cannot finish the run.

Runs first in the pipeline and costs seconds. Every check is a row (name, expected, found,
ok) of a :class:`~mazerl.cluster.checks.report.ClusterReport`, which the orchestrator publishes as a
Prefect table artifact and an MLflow table (``report.records()``) and turns into a failure
with ``report.raise_for_failures()``.

The checks:

- ``ray.address``: the job server answers (``JobSubmissionClient`` asks ``/api/version``),
  with the token when the cluster wants one (see :mod:`mazerl.cluster.client`).
- ``ray.probe_job``: a short job, ``python -m mazerl.cluster.checks.probe``, runs on the cluster;
  it also proves the project is importable there. It reports what the cluster looks like
  from inside (:mod:`mazerl.cluster.checks.probe`), from which come:
  ``ray.version`` (same major version as this client, >= 2.52 for token auth),
  ``ray.nodes`` (enough ALIVE nodes), ``ray.dead_nodes`` (every DEAD node replaced),
  ``ray.gpus`` (enough GPUs in total), ``ray.gpu_placement`` (enough nodes with the GPUs
  per node the placement needs), ``ray.eval_placement`` (all eval workers, with their GPUs,
  fit at once: the eval waits for every one of them), ``storage.shared`` (a probe file written on each alive node
  is read back by the next), ``storage.free_space`` (free bytes under the data root on every
  node, against the run's peak footprint: :class:`~mazerl.cluster.checks.run_requirements.DiskFootprint`), ``inputs.base_model``
  (config, weights, processor, tokenizer readable on a worker),
  ``ray.merge_memory`` (a node whose Ray memory holds the merge job; only when the caller
  passes ``merge_memory``, the merge's own rule for its need, :func:`mazerl.merge.memory.merge_memory`).
- ``gpu.*`` when a :class:`~mazerl.cluster.checks.gpu_smoke.GpuSmoke` is given (the run uses GPUs): on
  every GPU worker, the compute capability against the image's torch, a flash-attn call, a
  one-token vLLM generate, a LoRA adapter through vLLM, as the run needs them (the rows:
  :func:`~mazerl.cluster.checks.gpu_smoke.gpu_rows`).
- ``inputs.eval_set``: the eval set loads and its digest verifies (here, in this process).
- ``hyperpod.*`` when a HyperPod cluster name is given (:mod:`mazerl.cluster.checks.hyperpod`);
  advisory (shown, never blocking) when the SageMaker API cannot be asked from here: no IAM
  identity, no ``AWS_REGION``, a missing permission, no route to the API.

A failure early on (address unreachable) skips the Ray rows that depend on it instead of
waiting on timeouts; the independent rows still run.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal, Protocol

from envs import evalset
from mazerl.cluster.checks.gpu_smoke import GPU_FREE_WAIT_S, GpuSmoke, gpu_rows
from mazerl.cluster.checks.hyperpod import hyperpod_rows
from mazerl.cluster.checks.probe import RESULT_PREFIX, node_name
from mazerl.cluster.checks.report import CheckRow, ClusterReport
from mazerl.cluster.checks.run_requirements import GIB, LORA_SHAPES, DiskFootprint
from mazerl.cluster.client import job_client, parse_address
from mazerl.cluster.errors import ConfigError, RetryableJobError
from mazerl.cluster.jobs.spec import TERMINAL, runtime_env_for


class MemoryNeed(Protocol):
    """What a stage needs of one node's memory (the merge's :class:`mazerl.merge.memory.MemoryNeed`)."""

    @property
    def total_bytes(self) -> int: ...

    def describe(self) -> str: ...


MIN_RAY_VERSION = (2, 52)  # token authentication


@dataclasses.dataclass(frozen=True)
class ReadinessRequest:
    """What one run needs of the cluster, for :func:`verify_cluster`; nonsense is refused when it is built.

    ``data_root`` is the path as the cluster's nodes see it (``/shared`` on HyperPod). The placement
    and disk fields are :func:`~mazerl.cluster.checks.run_requirements.requirements_for`'s, so
    ``ReadinessRequest(data_root=..., **requirements_for(config))`` asks for what a training config
    needs. ``required_free_bytes`` None: the run's ``footprint`` for the base model's weights as the
    probe found them; without a footprint, the local backend's defaults (2 checkpoints kept, rank 32).
    ``merge_memory``: the merge's memory need for the weight bytes the probe found (its task passes
    :func:`mazerl.merge.memory.merge_memory`); None leaves out the ``ray.merge_memory`` row.
    ``gpu_smoke`` None leaves out the GPU rows; ``hyperpod_cluster`` None the HyperPod rows.
    """

    data_root: str
    required_nodes: int = 1
    required_gpus: int = 0
    gpus_per_node: int = 0
    required_free_bytes: int | None = None
    footprint: DiskFootprint | None = None
    eval_workers: int = 0
    eval_gpus_per_worker: float = 0.0
    base_model: str | None = None
    eval_set: str | None = None
    hyperpod_cluster: str | None = None
    hyperpod_region: str | None = None
    gpu_smoke: GpuSmoke | None = None
    merge_memory: Callable[[int], MemoryNeed] | None = None

    def __post_init__(self) -> None:
        for name in ("required_nodes", "required_gpus", "gpus_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} ({value!r}) must be an integer >= 0")
        if self.required_nodes < 1:
            raise ConfigError(f"required_nodes ({self.required_nodes}) must be >= 1: the head is a node")
        if not isinstance(self.eval_workers, int) or self.eval_workers < 0 or not self.eval_gpus_per_worker >= 0:
            raise ConfigError(
                f"eval_workers ({self.eval_workers!r}) must be an integer >= 0 and eval_gpus_per_worker "
                f"({self.eval_gpus_per_worker!r}) a number >= 0"
            )
        if not self.data_root or not str(self.data_root).startswith("/"):
            raise ConfigError(
                f"data_root ({self.data_root!r}) must be an absolute path as the cluster's nodes see it, e.g. /shared"
            )


def verify_cluster(
    address: str,
    request: ReadinessRequest,
    *,
    headers: dict[str, str] | None = None,
    runtime_env: dict[str, Any] | None | Literal["auto"] = "auto",
    sagemaker_client: Any = None,
    timeout_s: float = 60.0,
    log: Callable[[str], None] | None = None,
) -> ClusterReport:
    """Check that the cluster at ``address`` has what ``request`` asks for; never raises for a
    failed check (each becomes a row)."""
    started = time.monotonic()
    parsed = parse_address(address)
    say = log or (lambda _line: None)
    rows: list[CheckRow] = []

    probe = _probe(parsed.value, headers, runtime_env, request, timeout_s, say, rows)
    if probe is not None:
        rows.extend(
            _ray_rows(probe, request.required_nodes, request.required_gpus, request.gpus_per_node)
            + _eval_rows(probe, request.eval_workers, request.eval_gpus_per_worker)
            + _storage_rows(probe, str(request.data_root), request.required_free_bytes, request.footprint)
            + _model_rows(probe)
            + (_merge_rows(probe, request.merge_memory) if request.merge_memory is not None else [])
            + (gpu_rows(probe, request.gpu_smoke) if request.gpu_smoke is not None else [])
        )
    if request.eval_set:
        rows.append(_eval_set_row(request.eval_set))
    if request.hyperpod_cluster:
        rows.extend(hyperpod_rows(request.hyperpod_cluster, request.hyperpod_region, sagemaker_client))
    report = ClusterReport(address=parsed.value, rows=tuple(rows), seconds=round(time.monotonic() - started, 2))
    say(
        f"verify_cluster: {'ready' if report.ok else 'NOT ready'} ({len(report.failures)} of {len(rows)} checks failed)"
    )
    return report


# --- Ray ----------------------------------------------------------------------------------


def _probe(
    address: str,
    headers: dict[str, str] | None,
    runtime_env: dict[str, Any] | None | Literal["auto"],
    readiness: ReadinessRequest,
    timeout_s: float,
    say: Callable[[str], None],
    rows: list[CheckRow],
) -> dict | None:
    """Connect, then run the probe job, each adding its row; None when either failed, so the rows that
    need the probe's findings are skipped instead of waiting on timeouts."""
    client = _connect(address, headers, rows)
    if client is None:
        return None
    env = runtime_env_for(address) if runtime_env == "auto" else runtime_env
    gpu_smoke, base_model = readiness.gpu_smoke, readiness.base_model
    request: dict[str, Any] = {
        "data_root": str(readiness.data_root),
        "base_model": str(base_model) if base_model else None,
    }
    if gpu_smoke is not None:
        request["gpu_smoke"] = gpu_smoke.request() | {"gpu_free_wait_s": GPU_FREE_WAIT_S}
        timeout_s += gpu_smoke.timeout_s + GPU_FREE_WAIT_S
        say(f"verify_cluster: the GPU smoke row tries {', '.join(gpu_smoke.checks)} on every GPU worker")
    say(f"verify_cluster: probing {address}")
    return _run_probe(client, address, request, env, timeout_s, rows)


def _connect(address: str, headers: dict[str, str] | None, rows: list[CheckRow]):
    expected = "the job API answers (/api/version)"
    try:
        client = job_client(address, headers)
    except (ConfigError, RetryableJobError) as exc:
        rows.append(CheckRow("ray.address", expected, str(exc), False))
        return None
    rows.append(CheckRow("ray.address", expected, f"answers at {address}", True))
    return client


def _run_probe(client, address: str, request: dict, runtime_env, timeout_s: float, rows: list[CheckRow]) -> dict | None:
    expected = "probe job SUCCEEDED (mazerl importable on the cluster)"
    submission_id = f"mazerl-verify-{uuid.uuid4().hex[:10]}"
    entrypoint = f"python -m mazerl.cluster.checks.probe {shlex.quote(json.dumps(request))}"
    started = time.monotonic()
    try:
        client.submit_job(
            entrypoint=entrypoint,
            submission_id=submission_id,
            runtime_env=runtime_env,
            metadata={"mazerl_stage": "verify"},
        )
        while True:
            info = client.get_job_info(submission_id)
            if str(getattr(info.status, "value", info.status)) in TERMINAL:
                break
            if time.monotonic() - started > timeout_s:
                client.stop_job(submission_id)
                rows.append(
                    CheckRow("ray.probe_job", expected, f"did not finish within {timeout_s:.0f} s; stopped", False)
                )
                return None
            time.sleep(0.2)
        logs = client.get_job_logs(submission_id)
    except (OSError, RuntimeError) as exc:
        rows.append(CheckRow("ray.probe_job", expected, f"job API failed: {type(exc).__name__}: {exc}", False))
        return None
    status = str(getattr(info.status, "value", info.status))
    result = next(
        (json.loads(line[len(RESULT_PREFIX) :]) for line in logs.splitlines() if line.startswith(RESULT_PREFIX)), None
    )
    seconds = time.monotonic() - started
    if status != "SUCCEEDED" or result is None:
        last = " | ".join(line for line in logs.splitlines()[-6:] if line.strip())
        hint = " (is mazerl installed in the cluster image / on PYTHONPATH?)" if "No module named" in logs else ""
        rows.append(CheckRow("ray.probe_job", expected, f"{status} after {seconds:.1f} s{hint}: {last}", False))
        return None
    rows.append(CheckRow("ray.probe_job", expected, f"SUCCEEDED in {seconds:.1f} s ({submission_id})", True))
    return result


def _ray_rows(probe: dict, required_nodes: int, required_gpus: int, gpus_per_node: int) -> list[CheckRow]:
    import ray  # lazy: ray takes seconds to import, and only this row needs the client's version

    client_version = ray.__version__
    cluster_version = probe.get("ray_version", "unknown")
    major_minor = _version_tuple(cluster_version)
    version_ok = major_minor[:1] == _version_tuple(client_version)[:1] and major_minor >= MIN_RAY_VERSION
    rows = [
        CheckRow(
            "ray.version",
            f"major {client_version.split('.')[0]} like this client ({client_version}), >= {'.'.join(map(str, MIN_RAY_VERSION))}",
            f"{cluster_version} (python {probe.get('python', '?')})",
            version_ok,
        )
    ]
    nodes = probe.get("nodes", [])
    alive = [n for n in nodes if n["alive"]]
    dead = [n for n in nodes if not n["alive"]]
    rows.append(
        CheckRow(
            "ray.nodes",
            f">= {required_nodes} ALIVE",
            f"{len(alive)} ALIVE, {len(dead)} DEAD",
            len(alive) >= required_nodes,
        )
    )
    dead_text = ", ".join(node_name(n) for n in dead[:8]) + (" ..." if len(dead) > 8 else "")
    rows.append(
        CheckRow(
            "ray.dead_nodes",
            f"no DEAD node missing from the {required_nodes} needed",
            f"{len(dead)} DEAD ({dead_text}); {len(alive)} ALIVE" if dead else "none",
            not dead or len(alive) >= required_nodes,
        )
    )
    total_gpus = sum(n["gpus"] for n in alive)
    rows.append(
        CheckRow(
            "ray.gpus",
            f">= {required_gpus} GPUs in total",
            f"{total_gpus:g} GPUs on ALIVE nodes",
            total_gpus >= required_gpus,
        )
    )
    if gpus_per_node > 0:
        fitting = [n for n in alive if n["gpus"] >= gpus_per_node]
        per_node = ", ".join(f"{node_name(n)}: {n['gpus']:g}" for n in alive if n["gpus"] > 0) or "no GPU nodes"
        rows.append(
            CheckRow(
                "ray.gpu_placement",
                f">= {required_nodes} nodes with >= {gpus_per_node} GPUs each",
                f"{len(fitting)} such nodes ({per_node})",
                len(fitting) >= required_nodes,
            )
        )
    return rows


def actors_that_fit(nodes: list[dict], gpus: float, cpus: float = 1.0) -> dict[str, int]:
    """How many actors of ``{GPU: gpus, CPU: cpus}`` each ALIVE node can hold at once (by its totals)."""
    fit = {}
    for node in nodes:
        if not node["alive"]:
            continue
        by_gpu = int(node["gpus"] // gpus + 1e-9) if gpus > 0 else None
        by_cpu = int(node.get("cpus", 0) // cpus + 1e-9) if cpus > 0 else None
        counts = [c for c in (by_gpu, by_cpu) if c is not None]
        fit[node_name(node)] = min(counts) if counts else 0
    return fit


def _eval_rows(probe: dict, workers: int, gpus: float) -> list[CheckRow]:
    """The eval stage starts all its workers at once and waits for every one to load the model,
    so they must all fit together; otherwise the eval job waits for resources forever."""
    if workers == 0:
        return []
    fit = actors_that_fit(probe.get("nodes", []), gpus)
    room = sum(fit.values())
    per_node = ", ".join(f"{address}: {count}" for address, count in fit.items() if count) or "none anywhere"
    return [
        CheckRow(
            "ray.eval_placement",
            f"{workers} eval workers of {gpus:g} GPU + 1 CPU each fit at once",
            f"room for {room} ({per_node})",
            room >= workers,
        )
    ]


def _storage_rows(
    probe: dict, data_root: str, required_free_bytes: int | None, footprint: DiskFootprint | None
) -> list[CheckRow]:
    storage = probe.get("storage") or []
    failures = []
    for entry in storage:
        if not entry["write"].get("ok"):
            failures.append(f"write on {entry['writer']}: {entry['write'].get('error')}")
        elif not entry["read"].get("ok"):
            failures.append(f"read on {entry['reader']} of {entry['writer']}'s file: {entry['read'].get('error')}")
    rows = [
        CheckRow(
            "storage.shared",
            f"a file written under {data_root} on each ALIVE node is read back by the next",
            f"{len(storage)}/{len(storage)} nodes ok"
            if storage and not failures
            else "; ".join(failures) or "no nodes probed",
            bool(storage) and not failures,
        )
    ]
    expected = f">= {(required_free_bytes or 0) / GIB:.1f} GiB free under {data_root}"
    if required_free_bytes is None:
        model = probe.get("base_model") or {}
        weights = int(model.get("weights_bytes", 0))
        plan = footprint or DiskFootprint("local", 3, 32, tuple(LORA_SHAPES), 512 * 2**20)
        plan = dataclasses.replace(plan, stored_bytes_per_param=int(model.get("dtype_bytes", 2)))
        parts = plan.parts(weights, model.get("dims")) if weights else []
        required_free_bytes = sum(size for _, size in parts)
        expected = f">= {required_free_bytes / GIB:.1f} GiB free under {data_root}" + (
            f" ({' + '.join(what for what, _ in parts)})" if parts else " (no base model to size the run by)"
        )
    free = [(e["write"]["free_bytes"], e["writer"]) for e in storage if "free_bytes" in e["write"]]
    if free:
        least, where = min(free)
        found = f"{least / GIB:.1f} GiB free (least: {where})"
        ok = least >= required_free_bytes
    else:
        found, ok = "not measured (no node could write)", False
    rows.append(CheckRow("storage.free_space", expected, found, ok))
    return rows


def _model_rows(probe: dict) -> list[CheckRow]:
    model = probe.get("base_model")
    if model is None:
        return []
    expected = f"config, weights, processor, tokenizer readable in {model.get('path')} on a worker"
    if "missing" not in model:  # the task itself failed
        return [
            CheckRow("inputs.base_model", expected, f"check failed on {model.get('node')}: {model.get('error')}", False)
        ]
    if model["missing"]:
        return [
            CheckRow("inputs.base_model", expected, f"on {model['node']} missing: {', '.join(model['missing'])}", False)
        ]
    return [
        CheckRow(
            "inputs.base_model",
            expected,
            f"ok on {model['node']} ({model['weights_bytes'] / GIB:.2f} GiB of weights)",
            True,
        )
    ]


def _merge_rows(probe: dict, merge_memory: Callable[[int], MemoryNeed]) -> list[CheckRow]:
    """The merge job asks Ray for a whole model copy's memory; a cluster where no node has it would
    leave the job pending until Ray gives up, after all the training."""
    model = probe.get("base_model") or {}
    if not model.get("weights_bytes"):
        return []
    need = merge_memory(int(model["weights_bytes"]))
    alive = [n for n in probe.get("nodes", []) if n["alive"]]
    roomy = [n for n in alive if n.get("memory_bytes", 0) >= need.total_bytes]
    largest = max((n.get("memory_bytes", 0) for n in alive), default=0)
    found = (
        f"{len(roomy)} such nodes (e.g. {node_name(roomy[0])}: {roomy[0]['memory_bytes'] / GIB:.0f} GiB)"
        if roomy
        else f"none: the largest offers {largest / GIB:.1f} GiB to Ray"
    )
    return [
        CheckRow("ray.merge_memory", f"a node with Ray memory >= {need.describe()} for merge_lora", found, bool(roomy))
    ]


def _eval_set_row(name: str) -> CheckRow:
    expected = f"eval set {name} loads and its digest verifies"
    try:
        loaded = evalset.load(name)
    except evalset.EvalSetError as exc:
        return CheckRow("inputs.eval_set", expected, str(exc), False)
    return CheckRow("inputs.eval_set", expected, f"sha256 {loaded.digest[:12]}..., {len(loaded)} mazes", True)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)
