"""The in-cluster half of ``verify_cluster``: a short Ray job that looks at the cluster from inside.

Run as ``python -m mazerl.cluster.checks.probe '<json request>'`` by :mod:`mazerl.cluster.checks.verify`
through the job API, so it works on every address the submitter accepts (the embedded head,
a port-forwarded KubeRay head, ``sagemaker_ray://``). It prints one line
``MAZERL_PROBE_RESULT {json}`` and exits 0; the caller turns the JSON into report rows.

What it measures:

- the cluster's Ray version and its nodes (ALIVE/DEAD; GPUs, CPUs, memory and labels per node);
- shared storage: a task pinned to each alive node (``NodeAffinitySchedulingStrategy``,
  hard) writes ``<data_root>/.mazerl-probe/<token>/<node>``, then the *next* node reads it
  back; a mount that is missing or node-local on any node shows up as a failed read. Each
  node also reports the free bytes under the data root;
- the base model directory, read from a worker node (a GPU node if there is one): config,
  weights (every shard an index names), processor and tokenizer files;
- with ``gpu_smoke`` in the request, the GPU stack on every GPU worker: one actor per node, with
  one GPU, runs the checks of :mod:`mazerl.cluster.checks.gpu_smoke` there.

Tasks ask for no CPU (``num_cpus=0``) so they run even when the cluster's CPUs are taken; the GPU
smoke actors ask for one GPU each (a GPU another job holds is reported, not waited for).
"""

from __future__ import annotations

import importlib
import json
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mazerl import atomic

RESULT_PREFIX = "MAZERL_PROBE_RESULT "
PROBE_DIR = ".mazerl-probe"
TASK_TIMEOUT_S = 30.0
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}
MODEL_DIMS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


def node_name(node: dict[str, Any]) -> str:
    """A node as reports show it: its address, and its id's start (nodes may share an address)."""
    return f"{node['address']} ({node['node_id'][:8]})" if node.get("node_id") else node["address"]


def safetensors_header(handle: Any, size: int) -> dict[str, Any] | str:
    """A safetensors file's header (tensor name -> dtype, shape, data_offsets) once the file is complete, else
    what is wrong with it; from the header alone (milliseconds, whatever its size).

    The format is an 8-byte little-endian header length, a JSON header giving every tensor's byte
    range, then the data: a file shorter than the largest range's end was cut off (a copy that stopped).
    """
    head = handle.read(8)
    if len(head) < 8:
        return f"is {size} bytes, too short for a safetensors header"
    length = int.from_bytes(head, "little")
    if length > size - 8:
        return f"declares a {length}-byte header but holds {size} bytes in all: it is truncated or not safetensors"
    try:
        header = json.loads(handle.read(length))
        end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return "has no readable safetensors header"
    if size < 8 + length + end:
        return f"is truncated: {size} of the {8 + length + end} bytes its header declares"
    return header


def check_model_dir(model_dir: str) -> dict[str, Any]:
    """What a Hugging Face VLM directory needs to be loadable, as found on this node."""
    path = Path(model_dir)
    result: dict[str, Any] = {"host": socket.gethostname(), "path": model_dir, "missing": [], "weights_bytes": 0}
    if not path.is_dir():
        result["missing"].append("the directory itself")
        return result
    try:
        config = json.loads((path / "config.json").read_text())
        text = config.get("text_config") or config if isinstance(config, dict) else {}
        # the language model's dimensions: verify_cluster sizes the run's LoRA checkpoints from them
        result["dims"] = {key: text[key] for key in MODEL_DIMS if isinstance(text.get(key), int)}
        # bytes per weight in the files (bf16: 2), against which SkyRL's fp32 checkpoints are sized
        dtype = config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype") or text.get("dtype")
        result["dtype_bytes"] = DTYPE_BYTES.get(str(dtype), 2)
    except FileNotFoundError:
        result["missing"].append("config.json")
    except (OSError, ValueError) as exc:
        result["missing"].append(f"a readable config.json ({exc})")
    shards: set[Path] = set()
    for index_name in WEIGHT_INDEXES:
        index = path / index_name
        if index.is_file():
            try:
                names = set(json.loads(index.read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError) as exc:
                result["missing"].append(f"a readable {index_name} ({exc})")
                continue
            absent = sorted(n for n in names if not (path / n).is_file())
            result["missing"].extend(f"weight shard {n}" for n in absent)
            shards |= {path / n for n in names if (path / n).is_file()}
    for pattern in WEIGHT_PATTERNS:
        shards |= set(path.glob(pattern))
    if not shards:
        result["missing"].append("weights (*.safetensors or pytorch_model*.bin)")
    for shard in sorted(shards):
        try:
            with open(shard, "rb") as handle:
                header = safetensors_header(handle, shard.stat().st_size) if shard.suffix == ".safetensors" else None
            problem = header if isinstance(header, str) else None
            result["weights_bytes"] += shard.stat().st_size
        except OSError as exc:
            problem = f"cannot be read ({exc.strerror})"
        if problem:
            result["missing"].append(f"a complete {shard.name} (it {problem})")
    if not any((path / name).is_file() for name in PROCESSOR_FILES):
        result["missing"].append(f"a processor config ({' or '.join(PROCESSOR_FILES)})")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        result["missing"].append(f"a tokenizer ({' or '.join(TOKENIZER_FILES)})")
    return result


def write_probe(data_root: str, token: str, node_id: str) -> dict[str, Any]:
    """On one node: write this node's probe file (temp name + rename) and measure free space."""
    result: dict[str, Any] = {"node_id": node_id, "host": socket.gethostname(), "ok": False, "error": ""}
    try:
        probe_dir = Path(data_root) / PROBE_DIR / token
        probe_dir.mkdir(parents=True, exist_ok=True)
        target = probe_dir / node_id
        atomic.write_text(target, f"{token}:{node_id}")
        result["free_bytes"] = shutil.disk_usage(data_root).free
        result["ok"] = True
    except OSError as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result


def read_probe(data_root: str, token: str, writer_node_id: str) -> dict[str, Any]:
    """On the next node: read back what the previous node wrote."""
    target = Path(data_root) / PROBE_DIR / token / writer_node_id
    result: dict[str, Any] = {"host": socket.gethostname(), "ok": False, "error": ""}
    try:
        content = target.read_text()
    except OSError as exc:
        result["error"] = f"cannot read {target}: {exc.strerror or exc}"
        return result
    expected = f"{token}:{writer_node_id}"
    result["ok"] = content == expected
    if not result["ok"]:
        result["error"] = f"{target} holds {content[:40]!r}, expected {expected!r}"
    return result


def remove_probe(data_root: str, token: str) -> None:
    shutil.rmtree(Path(data_root) / PROBE_DIR / token, ignore_errors=True)


def run_probe(request: dict[str, Any]) -> dict[str, Any]:
    """Connect to the cluster this job runs in and measure it (see the module docstring)."""
    # lazy: ray takes seconds to import; the model-directory checks above run without it (preflight)
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    started = time.monotonic()
    ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    nodes = [_node_entry(n) for n in ray.nodes()]
    alive = [n for n in nodes if n["alive"]]
    result: dict[str, Any] = {"ray_version": ray.__version__, "python": sys.version.split()[0], "nodes": nodes}

    def pinned(fn, node_id: str):
        strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        return ray.remote(num_cpus=0, max_retries=0)(fn).options(scheduling_strategy=strategy)

    def gather(refs: list) -> list:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=TASK_TIMEOUT_S)
        done = set(ready)
        out = []
        for ref in refs:
            if ref not in done:
                out.append({"ok": False, "error": f"no answer within {TASK_TIMEOUT_S:.0f} s"})
                continue
            try:
                out.append(ray.get(ref))
            except Exception as exc:  # noqa: BLE001 - a failed task is a finding, not a crash
                out.append({"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        return out

    data_root = request.get("data_root")
    if data_root:
        result["storage"] = _storage_round(pinned, gather, data_root, alive)

    model_dir = request.get("base_model")
    if model_dir and alive:
        workers = sorted(alive, key=lambda n: (n["gpus"] == 0, n["is_head"]))  # a GPU worker first
        node = workers[0]
        (found,) = gather([pinned(check_model_dir, node["node_id"]).remote(model_dir)])
        result["base_model"] = {"node": node_name(node), **found}

    smoke = request.get("gpu_smoke")
    if smoke:
        result["gpu_smoke"] = _gpu_smoke(ray, pinned_options=NodeAffinitySchedulingStrategy, smoke=smoke, nodes=alive)

    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def _node_entry(node: dict[str, Any]) -> dict[str, Any]:
    """One node of ``ray.nodes()`` as the report rows read it (plain JSON: it travels in the job's log)."""
    return {
        "node_id": node["NodeID"],
        "address": node["NodeManagerAddress"],
        "alive": bool(node["Alive"]),
        "gpus": float(node.get("Resources", {}).get("GPU", 0)),
        "cpus": float(node.get("Resources", {}).get("CPU", 0)),
        "memory_bytes": float(node.get("Resources", {}).get("memory", 0)),  # what Ray schedules against
        "labels": dict(node.get("Labels") or {}),
        "is_head": "node:__internal_head__" in node.get("Resources", {}),
    }


def _storage_round(
    pinned: Callable[[Callable, str], Any], gather: Callable[[list], list], data_root: str, alive: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each alive node writes a probe file that the next one reads back, then the files go: a mount that is
    missing or node-local anywhere shows up as a failed read. ``pinned``/``gather``: run_probe's task helpers."""
    token = uuid.uuid4().hex[:12]
    writes = gather([pinned(write_probe, n["node_id"]).remote(data_root, token, n["node_id"]) for n in alive])
    reads = gather(
        [
            pinned(read_probe, alive[(i + 1) % len(alive)]["node_id"]).remote(data_root, token, n["node_id"])
            for i, n in enumerate(alive)
        ]
    )
    gather([pinned(remove_probe, n["node_id"]).remote(data_root, token) for n in alive])
    return [
        {"writer": node_name(n), "reader": node_name(alive[(i + 1) % len(alive)]), "write": w, "read": r}
        for i, (n, w, r) in enumerate(zip(alive, writes, reads, strict=True))
    ]


class GpuWorkerSmoke:
    """The GPU smoke row's actor on one GPU worker: one GPU, the checks module's ``run_checks``."""

    def ready(self) -> dict[str, Any]:
        import ray

        return {"gpu_ids": [str(g) for g in ray.get_gpu_ids()], "host": socket.gethostname()}

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        return importlib.import_module(request["checks_module"]).run_checks(request)


def _gpu_smoke(ray, *, pinned_options, smoke: dict[str, Any], nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One :class:`GpuWorkerSmoke` per ALIVE node with GPUs, pinned there; a worker whose GPUs stay taken by
    another job for ``gpu_free_wait_s`` is reported as not checked instead of holding the row up."""
    gpu_nodes = [n for n in nodes if n["gpus"] > 0]
    actors = [
        ray.remote(num_cpus=0, num_gpus=1, max_restarts=0)(GpuWorkerSmoke)
        .options(scheduling_strategy=pinned_options(node_id=n["node_id"], soft=False))
        .remote()
        for n in gpu_nodes
    ]
    out: list[dict[str, Any]] = []
    try:
        readies = [a.ready.remote() for a in actors]
        ray.wait(readies, num_returns=len(readies), timeout=float(smoke.get("gpu_free_wait_s", 60.0)))
        runs = {}
        for node, actor, ready in zip(gpu_nodes, actors, readies, strict=True):
            done, _ = ray.wait([ready], timeout=0)
            if not done:
                out.append({"node": node_name(node), "node_id": node["node_id"], "checked": False})
                continue
            runs[node["node_id"]] = (node, ray.get(ready), actor.run.remote(smoke))
        ray.wait([r for *_, r in runs.values()], num_returns=len(runs), timeout=float(smoke["timeout_s"]))
        for node, ready, ref in runs.values():
            entry = {"node": node_name(node), "node_id": node["node_id"], "checked": True, **ready}
            try:
                done, _ = ray.wait([ref], timeout=0)
                entry["checks"] = ray.get(ref) if done else {}
                if not done:
                    entry["error"] = f"no answer within {float(smoke['timeout_s']):.0f} s"
            except Exception as exc:  # noqa: BLE001 - a crashed check is a finding
                entry["checks"], entry["error"] = {}, f"{type(exc).__name__}: {str(exc)[:300]}"
            out.append(entry)
    finally:
        for actor in actors:
            ray.kill(actor)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m mazerl.cluster.checks.probe '<json request>'", file=sys.stderr)
        return 2
    try:
        request = json.loads(args[0])
    except ValueError as exc:
        print(f"the probe request is not JSON: {exc}", file=sys.stderr)
        return 2
    print(RESULT_PREFIX + json.dumps(run_probe(request)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
