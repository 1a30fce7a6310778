"""The cluster rehearsal: the pipeline's cluster paths on a real four-node Ray cluster on this machine.

The cluster has the shape of deployments/k8s/raycluster.yaml, read from the manifest: a head with
the head group's CPUs, memory and ``num-gpus: 0``, and the gpu group's replicas with theirs
(``num-gpus: 2`` each), every node labelled ``ray.io/node-group`` the way KubeRay labels them (it
sets ``RAY_NODE_TYPE_NAME`` to the group name). Each node is its own ``ray start`` process tree
with token authentication, so stopping one node's raylet is a real node failure. Every node has
its own loopback address (head 127.0.0.2, workers 127.0.0.3 and up), so nodes are told apart as on
a real cluster and no traffic leaves the machine: Ray's loopback-only mode
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``) refuses a second node, and its multi-node mode swaps
127.0.0.1 itself (only that address) for the machine's external one.

What stands in for what, as every test name says:
- **no GPU**: the worker nodes *declare* two GPUs each. Ray schedules against declared resources,
  so placement is real; nothing touches CUDA.
- **hf for vLLM**: eval workers ask for a GPU as the ``hyperpod`` deployment's vLLM workers do,
  and run the transformers engine (on CPU, since there is no CUDA).
- **local for SkyRL**: the training job is our local GRPO engine asking for one GPU
  (``local_train_gpus: 1``), so it lands on a GPU worker as SkyRL's FSDP workers do; SkyRL's own
  placement group is reserved separately, from our SkyRL mapping of the hyperpod config.

One cluster for the module (about 30 s to start on 2 cores); the node-kill test runs last.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient
from test_cluster_verify import fake_model_dir
from test_fault_injection import training_processes, wait_for  # the trainer-process helpers, one home

from mazerl.cluster.head.env import head_env
from mazerl.cluster.head.local import LocalRayHead, start_local_head
from mazerl.cluster.head.loopback import free_ports
from mazerl.params import PipelineParams
from mazerl.training import checkpoints
from mazerl.training.recipes import MINIATURE_TRAINING

pytestmark = pytest.mark.slow  # a multi-node Ray cluster and whole flow runs

PROJECT = Path(__file__).resolve().parents[1]
MANIFEST = PROJECT / "deployments" / "k8s" / "raycluster.yaml"
PREFECT_YAML = PROJECT / "prefect.yaml"
HEAD_GROUP = "headgroup"  # KubeRay's name for the head group
HEAD_IP = "127.0.0.2"  # the head's loopback address; workers take 127.0.0.3 and up
# Ray would prestart one worker process per logical CPU when the first driver connects; the
# manifest's 52 + 3 x 40 CPUs are logical here, so start worker processes on demand only.
NO_PRESTART = {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}


def quantity_bytes(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def manifest_groups() -> tuple[dict, dict]:
    """(head, gpu group) as the RayCluster manifest declares them: group name, CPUs, memory, GPUs, replicas."""
    spec = yaml.safe_load(MANIFEST.read_text())["spec"]

    def shape(group: dict, name: str) -> dict:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        return {
            "group": name,
            "cpus": int(float(limits["cpu"])),
            "memory_bytes": quantity_bytes(limits["memory"]),
            "gpus": int(group["rayStartParams"].get("num-gpus", 0)),
            "replicas": int(group.get("replicas", 1)),
        }

    (workers,) = spec["workerGroupSpecs"]
    return shape(spec["headGroupSpec"], HEAD_GROUP), shape(workers, workers["groupName"])


class RehearsalCluster:
    """A head (``mazerl.cluster.head.local``) plus worker nodes started with ``ray start --address``."""

    def __init__(self, temp: Path):
        self.temp = temp
        self.head_shape, self.worker_shape = manifest_groups()
        self.head: LocalRayHead | None = None
        self.workers: dict[str, subprocess.Popen] = {}  # node id -> its `ray start --block` process

    @property
    def address(self) -> str:
        return self.head.address

    def headers(self) -> dict[str, str]:
        return self.head.auth_headers()

    def start(self) -> None:
        self.head = start_local_head(
            self.temp,
            num_cpus=self.head_shape["cpus"],
            num_gpus=0,
            memory_mb=self.head_shape["memory_bytes"] // 2**20,
            object_store_mb=100,
            dashboard_port=0,
            node_ip=HEAD_IP,
            extra_env={"RAY_NODE_TYPE_NAME": HEAD_GROUP, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", **NO_PRESTART},
        )
        wait_for(lambda: self.nodes(), 60, "the head node in Ray's node list")
        for _ in range(self.worker_shape["replicas"]):
            self.add_worker()
        outside = [n["node_ip"] for n in self.nodes() if not n["node_ip"].startswith("127.")]
        if outside:  # the rehearsal's traffic must stay on this machine's loopback interface
            raise RuntimeError(f"rehearsal nodes on non-loopback addresses: {outside}")

    def add_worker(self, timeout_s: float = 120.0) -> str:
        known = {n["node_id"] for n in self.nodes()}
        agent, agent_grpc, runtime_env, metrics = free_ports(4)
        shape = self.worker_shape
        command = [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            f"--address={self.head.gcs_address}",
            "--block",
            "--disable-usage-stats",
            f"--node-ip-address=127.0.0.{3 + len(self.workers)}",  # each node its own loopback address
            f"--num-cpus={shape['cpus']}",
            f"--num-gpus={shape['gpus']}",
            f"--memory={shape['memory_bytes']}",
            f"--object-store-memory={100 * 2**20}",
            f"--dashboard-agent-listen-port={agent}",
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--runtime-env-agent-port={runtime_env}",
            f"--metrics-export-port={metrics}",
        ]
        env = head_env(  # a multi-node cluster on one machine must opt out of Ray's local-only mode
            self.head.token_path,
            {"RAY_NODE_TYPE_NAME": shape["group"], "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", **NO_PRESTART},
        )
        log = open(self.temp / f"worker-{len(self.workers)}.log", "w")  # noqa: SIM115 - the node outlives this call
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            new = [
                n
                for n in self.nodes()
                if n["node_id"] not in known
                and n["state"] == "ALIVE"
                and n["labels"].get("ray.io/node-group") == shape["group"]
            ]
            if new:
                self.workers[new[0]["node_id"]] = process
                return new[0]["node_id"]
            if process.poll() is not None:
                raise RuntimeError(f"a worker node exited with {process.returncode}; see {log.name}")
            time.sleep(0.5)
        raise RuntimeError(f"no new worker node registered within {timeout_s:.0f} s; see {log.name}")

    def nodes(self) -> list[dict]:
        """Ray's state API (``/api/v0/nodes``): node_id, state, resources_total, labels, ..."""
        request = urllib.request.Request(f"{self.address}/api/v0/nodes?limit=100&detail=1", headers=self.headers())

        def ask() -> list[dict]:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())["data"]["result"]["result"]

        return asked_again(ask)

    def gpu_worker_ids(self) -> set[str]:
        return {
            n["node_id"]
            for n in self.nodes()
            if n["state"] == "ALIVE" and n["labels"].get("ray.io/node-group") == self.worker_shape["group"]
        }

    def kill_raylet(self, node_id: str) -> None:
        """Stop a worker node the hard way: SIGKILL its raylet (Ray fate-shares the node's workers)."""
        group = self.workers[node_id].pid
        raylets = [
            p for p in psutil.process_iter(["pid", "name"]) if p.info["name"] == "raylet" and _pgid(p.pid) == group
        ]
        assert len(raylets) == 1, f"expected one raylet in node {node_id}'s process group, found {raylets}"
        raylets[0].send_signal(signal.SIGKILL)

    def stop(self) -> None:
        for process in self.workers.values():
            _stop_group(process.pid)
        if self.head is not None:
            self.head.stop()

    def jobs(self, pipeline_run: str | None = None, stage: str | None = None) -> list:
        from ray.job_submission import JobSubmissionClient

        return [
            j
            for j in asked_again(JobSubmissionClient(self.address, headers=self.headers()).list_jobs)
            if (pipeline_run is None or (j.metadata or {}).get("mazerl_pipeline_run") == pipeline_run)
            and (stage is None or (j.metadata or {}).get("mazerl_stage") == stage)
        ]


def asked_again(ask, attempts: int = 5, pause_s: float = 1.0):
    """The answer of ``ask()``, asked again after a dropped connection.

    The head's dashboard closes open connections for a moment while a node it tracks dies
    (seen with Ray 2.60: ``RemoteDisconnected`` from the jobs API right after a raylet was
    killed). The pipeline's own polling rides that out (``RayJob.wait`` tolerates outages);
    the test's observers must too, or the observer dies and the test fails for the wrong reason.
    """
    for attempt in range(attempts):
        try:
            return ask()
        except OSError:  # requests' ConnectionError and urllib's URLError are OSErrors
            if attempt == attempts - 1:
                raise
            time.sleep(pause_s)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _stop_group(pgid: int) -> None:
    """A test node's whole process tree at once: nothing of it is kept (its temp dir goes too)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return


@pytest.fixture(scope="module")
def cluster():
    temp = Path(tempfile.mkdtemp(prefix="mzr-r", dir="/tmp" if os.path.isdir("/tmp") else None))
    rehearsal = RehearsalCluster(temp)
    try:
        rehearsal.start()
        yield rehearsal
    finally:
        rehearsal.stop()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def cluster_token(cluster, monkeypatch):
    """The tasks look the Ray token up where a cluster keeps it (RAY_AUTH_TOKEN_PATH)."""
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(cluster.head.token_path))


def hyperpod_params() -> PipelineParams:
    (deployment,) = [d for d in yaml.safe_load(PREFECT_YAML.read_text())["deployments"] if d["name"] == "hyperpod"]
    values = {k: v for k, v in deployment["parameters"]["params"].items() if "{{" not in str(v)}
    return PipelineParams.model_validate(values)


# --------------------------------------------------------------------------------------
# verify_cluster and placement
# --------------------------------------------------------------------------------------


def test_rehearsal_no_gpu_verify_cluster_counts_gpus_checks_storage_and_smokes_each_worker(cluster, tmp_path):
    """Stand-ins for CUDA and vLLM (no GPU here): verify_cluster counts GPUs per node, checks the shared
    storage from every node and smokes each GPU worker."""
    from mazerl.cluster.checks.fixes import CLUSTER_FIXES
    from mazerl.cluster.checks.gpu_smoke import CHECKS, GpuSmoke
    from mazerl.cluster.checks.report import ClusterNotReadyError
    from mazerl.cluster.checks.run_requirements import requirements_for
    from mazerl.cluster.checks.verify import ReadinessRequest, verify_cluster
    from mazerl.merge.memory import merge_memory

    # given the hyperpod deployment's training placement (3 nodes x 2 GPUs) and its eval (6 vLLM workers),
    params = hyperpod_params()
    config = params.train_config("r", tmp_path / "model")
    model = fake_model_dir(tmp_path / "model")  # real safetensors: verify reads the header
    # and its GPU smoke row, CUDA and vLLM answered by stand-ins (there is no GPU here)
    smoke = GpuSmoke(CHECKS, base_model=str(model), checks_module="tests.gpu_smoke_standins")

    def verify(**overrides):
        kwargs = {
            "data_root": str(tmp_path / "shared"),
            "base_model": str(model),
            "eval_workers": params.eval_workers,
            "eval_gpus_per_worker": params.resolved_eval_gpus(),
            "gpu_smoke": smoke,
            "merge_memory": merge_memory,
            **requirements_for(config, max_artifact_mb=params.max_artifact_mb),
        }
        return verify_cluster(cluster.address, ReadinessRequest(**(kwargs | overrides)), headers=cluster.headers())

    (tmp_path / "shared").mkdir()
    report = verify()
    rows = {row.name: row for row in report.rows}
    # then every row passes, and the rows show the per-node counts the placement needs,
    assert report.ok, report.markdown()
    assert rows["ray.nodes"].found == "4 ALIVE, 0 DEAD"
    assert rows["ray.gpus"].found.startswith("6 GPUs")
    assert (
        rows["ray.gpu_placement"].found.startswith("3 such nodes") and rows["ray.gpu_placement"].found.count(": 2") == 3
    )
    assert rows["storage.shared"].found == "4/4 nodes ok", "every node wrote under the data root, the next read it"
    assert rows["ray.eval_placement"].found.startswith("room for 6"), rows["ray.eval_placement"]
    assert rows["ray.merge_memory"].ok
    # the disk row sizes SkyRL's checkpoints (the whole model each) and the merged copies,
    assert "3 checkpoints x" in rows["storage.free_space"].expected, rows["storage.free_space"]
    assert "SkyRL FSDP state: the whole model" in rows["storage.free_space"].expected
    # and the GPU smoke ran once on each GPU worker, with a GPU of its own, never on the head;
    workers = {node_id[:8] for node_id in cluster.gpu_worker_ids()}
    head = next(n["node_id"][:8] for n in cluster.nodes() if n["is_head_node"] and n["state"] == "ALIVE")
    for check in CHECKS:
        row = rows[f"gpu.{check}"]
        assert row.ok and row.found.startswith(f"{len(workers)}/{len(workers)} GPU workers ok"), row
        assert all(row.found.count(f"({worker})") == 1 for worker in workers) and head not in row.found, row.found
        assert row.found.count(" GPU 0:") + row.found.count(" GPU 1:") == len(workers), "one Ray GPU id per worker"
    # A GPU stack that fails each check fails each row with what was found, and the error says each fix.
    broken = verify(
        gpu_smoke=GpuSmoke(
            CHECKS, base_model=str(model), checks_module="tests.gpu_smoke_standins", options={"fail": list(CHECKS)}
        )
    )
    assert {row.name for row in broken.failures} == {f"gpu.{check}" for check in CHECKS}, broken.markdown()
    assert "no kernel image is available" in {row.name: row for row in broken.rows}["gpu.flash_attn"].found
    with pytest.raises(ClusterNotReadyError) as refused:
        broken.raise_for_failures(CLUSTER_FIXES)
    assert all(CLUSTER_FIXES[f"gpu.{check}"] in str(refused.value) for check in CHECKS), str(refused.value)
    # and a placement the cluster cannot hold fails with the numbers.
    too_many = {row.name: row for row in verify(eval_workers=7, gpus_per_node=3, gpu_smoke=None).rows}
    assert not too_many["ray.eval_placement"].ok and "room for 6" in too_many["ray.eval_placement"].found
    assert not too_many["ray.gpu_placement"].ok and too_many["ray.gpu_placement"].found.startswith("0 such nodes")


PLACEMENT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
    bundles, strategy = json.loads(sys.argv[1])
    ray.init(address="auto", log_to_driver=False)
    pg = placement_group(bundles, strategy=strategy)
    ray.get(pg.ready(), timeout=60)
    print("PLACED " + json.dumps(placement_group_table(pg)["bundles_to_node_id"]), flush=True)
    remove_placement_group(pg)
    """
)


def test_rehearsal_no_gpu_skyrls_placement_group_for_the_hyperpod_config_puts_two_gpus_on_each_worker(
    cluster, tmp_path
):
    from mazerl.cluster.jobs.spec import JobSpec
    from mazerl.cluster.jobs.submitter import RayJob
    from mazerl.training.skyrl_backend import placement_bundles

    # given the placement group SkyRL reserves for the hyperpod config (6 x {GPU: 1, CPU: 1}, PACK),
    bundles, strategy = placement_bundles(hyperpod_params().train_config("r", tmp_path / "model"))
    assert len(bundles) == 6
    script = tmp_path / "placement.py"
    script.write_text(PLACEMENT_SCRIPT)
    lines: list[str] = []
    # when a job reserves it on the cluster,
    entrypoint = f"{sys.executable} {script} '{json.dumps([bundles, strategy])}'"
    with RayJob(
        cluster.address,
        JobSpec(entrypoint, pipeline_run_id="placement", attempt=1, stage="probe"),
        headers=cluster.headers(),
        log=lines.append,
    ) as job:
        assert job.wait().status == "SUCCEEDED", lines
    placed = json.loads(next(line for line in lines if line.startswith("PLACED "))[len("PLACED ") :])
    # then Ray puts two bundles on each GPU worker and none on the head.
    per_node = {node: list(placed.values()).count(node) for node in set(placed.values())}
    assert set(per_node) == cluster.gpu_worker_ids() and set(per_node.values()) == {2}, per_node


def test_rehearsal_no_gpu_a_job_asking_for_more_memory_than_the_head_has_starts_on_a_worker_that_has_it(cluster):
    from mazerl.cluster.jobs.spec import JobSpec
    from mazerl.cluster.jobs.submitter import RayJob

    # given the manifest's memory (head 420 GiB, GPU workers 440 GiB), when a job asks for 430 GiB
    # (as the merge job asks for a whole model copy's memory),
    asked = (cluster.head_shape["memory_bytes"] + cluster.worker_shape["memory_bytes"]) // 2
    with RayJob(
        cluster.address,
        JobSpec(f"{sys.executable} -c 'print(1)'", pipeline_run_id="memory", attempt=1, stage="probe", memory=asked),
        headers=cluster.headers(),
        log=lambda _line: None,
    ) as job:
        outcome = job.wait()
    # then Ray starts it on a node with that much memory: a GPU worker, not the head.
    (details,) = [j for j in cluster.jobs("memory") if j.submission_id == outcome.submission_id]
    assert details.driver_node_id in cluster.gpu_worker_ids()
    assert int(details.metadata["mazerl_entrypoint_memory"]) == asked


# --------------------------------------------------------------------------------------
# re-attach across flow runs
# --------------------------------------------------------------------------------------

TRAIN_STAGE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from prefect import flow
    from mazerl.params import PipelineParams
    from mazerl.training.config import TrainConfig
    from tasks.context import RunContext
    from tasks.training import train

    spec = json.loads(sys.argv[1])
    context = RunContext(**spec["context"] | {"root": Path(spec["context"]["root"]),
                                              "base_model": Path(spec["context"]["base_model"]),
                                              "train_config": TrainConfig.model_validate(spec["context"]["train_config"])})

    @flow
    def orchestrator():
        return train(context, PipelineParams.model_validate(spec["params"]))

    orchestrator()
    """
)


def stage_context(root: Path, model: Path, address: str, run_id: str, flow_run_id: str, params: PipelineParams):
    from mazerl.paths import mlflow_db_uri
    from mazerl.tracking.lineage import start_pipeline_run
    from tasks.context import RunContext

    uri = mlflow_db_uri(root)
    runs = start_pipeline_run(uri, flow_run_id=flow_run_id)
    return RunContext(
        run_id=run_id,
        flow_run_id=flow_run_id,
        root=root,
        tracking_uri=uri,
        ray_address=address,
        base_model=model,
        eval_set="maze256-small-v1",
        stage_run_ids=runs.stage_run_ids,
        pipeline_run_id=runs.parent_run_id,
        train_config=params.train_config(run_id, model),  # what prepare resolves for the stages
    )


def stage_params(root: Path, model: Path, address: str, **training) -> PipelineParams:
    return PipelineParams.model_validate(
        {
            "base_model": str(model),
            "eval_set": "maze256-small-v1",
            "data_root": str(root),
            "ray_address": address,
            "local_train_gpus": 1,
            "hang_timeout_s": 600,
            "training": MINIATURE_TRAINING | {"steps": 3} | training,
        }
    )


def test_rehearsal_no_gpu_a_new_flow_run_reattaches_to_the_same_training_and_refuses_another(
    cluster, cluster_token, prefect_api, mlflow_root, starter_model_dir, tmp_path, monkeypatch
):
    from prefect import flow

    from mazerl.cluster.errors import JobConflictError
    from mazerl.cluster.jobs.submitter import RayJob
    from mazerl.training.progress import TrainingProgress
    from tasks.training import train

    params = stage_params(mlflow_root, starter_model_dir, cluster.address)
    first = stage_context(mlflow_root, starter_model_dir, cluster.address, "run-a", "flow-a", params)
    script = tmp_path / "train_stage.py"
    script.write_text(TRAIN_STAGE_SCRIPT)
    spec = {
        "context": {k: str(v) if isinstance(v, Path) else v for k, v in vars(first).items()}
        | {"train_config": first.train_config.model_dump(mode="json")},
        "params": params.model_dump(mode="json"),
    }
    env = os.environ | {"PREFECT_API_URL": prefect_api["url"], "RAY_AUTH_TOKEN_PATH": str(cluster.head.token_path)}
    suspended: list[psutil.Process] = []
    orchestrator = subprocess.Popen(
        [sys.executable, str(script), json.dumps(spec)],
        cwd=PROJECT,
        env=env,
        start_new_session=True,
        stdout=open(tmp_path / "flow-a.log", "w"),  # noqa: SIM115 - the child writes it while it lives
        stderr=subprocess.STDOUT,
    )
    try:
        # Given flow run A's train stage, whose job trains on a GPU worker, and whose orchestrator then dies
        # (its training process held still, so that it is certainly running while the others look),
        (job_a,) = wait_for(
            lambda: [j for j in cluster.jobs("flow-a", "train") if str(j.status) == "RUNNING"], 300, "A's train job"
        )
        trainers = wait_for(lambda: training_processes(mlflow_root / "runs" / "run-a"), 300, "A's trainer process")
        for process in trainers:
            process.suspend()
            suspended.append(process)
        os.killpg(orchestrator.pid, signal.SIGKILL)
        orchestrator.wait(timeout=30)
        assert job_a.driver_node_id in cluster.gpu_worker_ids(), "local_train_gpus: 1 starts the job on a GPU worker"

        @flow
        def stage_alone(context, stage_params):
            return train.with_options(retries=0)(context, stage_params, return_state=True).result(
                raise_on_failure=False
            )

        # when flow run C, another training (another learning rate), reaches its train stage,
        other = stage_params(mlflow_root, starter_model_dir, cluster.address, learning_rate=2e-3)
        refused = stage_alone(
            stage_context(mlflow_root, starter_model_dir, cluster.address, "run-c", "flow-c", other), other
        )
        # then it is refused with A's job id and the command that stops it, and starts nothing;
        assert isinstance(refused, JobConflictError), refused
        assert f"ray job stop {job_a.submission_id} --address {cluster.address}" in str(refused), str(refused)
        assert cluster.jobs("flow-c") == []

        # and when flow run B, the same training started anew after the crash, reaches its train stage,
        attach = RayJob._attach_other_run

        def attach_then_resume(self, others):
            submission_id = attach(self, others)
            for process in suspended:
                process.resume()
            suspended.clear()
            return submission_id

        monkeypatch.setattr(RayJob, "_attach_other_run", attach_then_resume)
        outcome = stage_alone(
            stage_context(mlflow_root, starter_model_dir, cluster.address, "run-b", "flow-b", params), params
        )
    finally:
        for process in suspended:
            process.resume()
        if orchestrator.poll() is None:
            os.killpg(orchestrator.pid, signal.SIGKILL)
    # then it followed A's job to its end instead of starting a second one, and reports A's checkpoints.
    assert not isinstance(outcome, Exception), outcome
    assert outcome.submission_id == job_a.submission_id and outcome.final_step == 3
    assert outcome.checkpoints_dir == mlflow_root / "runs" / "run-a" / "checkpoints"
    assert cluster.jobs("flow-b") == [] and [str(j.status) for j in cluster.jobs("flow-a", "train")] == ["SUCCEEDED"]
    # The job's own log and its checkpoint marker both tell the watchdog the run reached step 3.
    from ray.job_submission import JobSubmissionClient

    progress = TrainingProgress(mlflow_root / "runs" / "run-b" / "checkpoints")
    progress.follow(job_a.metadata)  # the submitter does this when it re-attaches
    for line in (
        JobSubmissionClient(cluster.address, headers=cluster.headers()).get_job_logs(job_a.submission_id).splitlines()
    ):
        progress.feed(line)
    assert (progress._logged, progress.marker_step(), progress.fraction) == (3, 3, 1.0)


# --------------------------------------------------------------------------------------
# SkyRL's placement group and a GPU node lost, then replaced (it leaves a node dead, a replacement alive)
# --------------------------------------------------------------------------------------

REPLACEMENT_DELAY_S = 20.0  # after Ray marked the node DEAD: past the first retry delay (10 s), so the retry waits


def skyrl_params(root: Path, model: Path, address: str) -> PipelineParams:
    """The hyperpod placement (3 nodes x 2 GPUs, one placement group) with the miniature training."""
    return PipelineParams.model_validate(
        {
            "base_model": str(model),
            "eval_set": "maze256-small-v1",
            "data_root": str(root),
            "ray_address": address,
            "backend": "skyrl",
            "hang_timeout_s": 600,
            "resource_wait_s": 300,
            "training": MINIATURE_TRAINING | {"steps": 4, "skyrl": {"num_gpus": 2, "num_nodes": 3}},
        }
    )


def test_rehearsal_no_gpu_a_lost_gpu_node_is_waited_for_and_training_resumes_on_its_replacement(
    cluster, cluster_token, prefect_api, mlflow_root, starter_model_dir, monkeypatch
):
    """The local trainer stands in for SkyRL (no GPU here): a GPU node lost mid-run is waited for, and
    training resumes on its replacement."""
    from prefect import flow
    from ray.job_submission import JobSubmissionClient
    from rehearsal_skyrl_entry import TRAINING_ON

    import tasks.training
    from mazerl.cluster.jobs import capacity
    from tasks.training import train

    # Given the train stage of a SkyRL run of the hyperpod shape, whose job reserves SkyRL's placement
    # group (all 6 GPUs, driver on the head) and trains in it (the local engine standing in for SkyRL),
    monkeypatch.setitem(tasks.training.ENTRYPOINTS, "skyrl", "tests.rehearsal_skyrl_entry")
    monkeypatch.setattr(capacity, "REPORT_EVERY_S", 5.0)  # a waiting line every 5 s instead of every minute
    params = skyrl_params(mlflow_root, starter_model_dir, cluster.address)
    context = stage_context(mlflow_root, starter_model_dir, cluster.address, "run-lost", "flow-lost", params)
    run_dir = mlflow_root / "runs" / "run-lost"
    head = next(n["node_id"] for n in cluster.nodes() if n["is_head_node"] and n["state"] == "ALIVE")
    client = JobSubmissionClient(cluster.address, headers=cluster.headers())
    events: dict = {}

    def lose_the_training_node_then_replace_it():
        def training_node():
            running = [j for j in cluster.jobs("flow-lost", "train") if str(j.status) == "RUNNING"]
            steps = metric_steps(run_dir)
            if not running or 2 not in steps:
                return None
            line = next((x for x in client.get_job_logs(running[0].submission_id).splitlines() if TRAINING_ON in x), "")
            return line.split(TRAINING_ON, 1)[1].split()[0] if line else None

        # when the GPU worker that trains dies after step 2,
        events["killed"] = node = wait_for(training_node, 300, "step 2 of the first train job", poll_s=0.2)
        cluster.kill_raylet(node)
        wait_for(lambda: [j for j in cluster.jobs("flow-lost", "train") if str(j.status) == "FAILED"], 120, "a1 failed")
        wait_for(
            lambda: [n for n in cluster.nodes() if n["node_id"] == node and n["state"] == "DEAD"],
            120,
            "Ray to mark the lost node DEAD",
        )
        # and HyperPod brings a replacement node only a while later,
        time.sleep(REPLACEMENT_DELAY_S)
        events["replacing_from"] = time.time()  # before it starts: no retry may be submitted earlier
        events["replacement"] = cluster.add_worker()

    @flow
    def train_stage(context, stage_params):
        return train.with_options(retries=1)(context, stage_params)

    replacer = threading.Thread(target=lose_the_training_node_then_replace_it, daemon=True)
    replacer.start()
    state = train_stage(context, params, return_state=True)
    replacer.join(timeout=5)
    outcome = state.result()
    assert "replacement" in events, f"the node was never lost and replaced: {events}"
    # then the first job failed as an infrastructure error, and the retry waited for the 6 GPUs
    trains = sorted(cluster.jobs("flow-lost", "train"), key=lambda j: j.start_time)
    assert [(j.submission_id.rsplit("-", 1)[-1], str(j.status)) for j in trains] == [
        ("a1", "FAILED"),
        ("a2", "SUCCEEDED"),
    ]
    assert {j.driver_node_id for j in trains} == {head}, "SkyRL's driver runs on the head"
    (waited,) = cluster.jobs("flow-lost", "train-resources")
    wait_log = client.get_job_logs(waited.submission_id)
    assert "waiting for 6 GPUs: 4 free" in wait_log, wait_log
    assert "resources ready after" in wait_log, wait_log
    # before it submitted again, once the replacement had joined;
    assert trains[1].start_time / 1000 >= events["replacing_from"], "the retry was submitted before the node was back"
    # and it resumed from the checkpoint marker: every step logged exactly once, in the file and in MLflow.
    assert metric_steps(run_dir) == [1, 2, 3, 4]
    assert outcome.final_step == 4 and checkpoints.read_marker(run_dir / "checkpoints") == 4
    history = MlflowClient(context.tracking_uri).get_metric_history(context.stage_run_id("train"), "train/reward_mean")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]
    # The wait is in the flow run's own log, where an operator looks.
    wait_for(
        lambda: any("waiting for 6 GPUs: 4 free" in m for m in prefect_messages(state.state_details.flow_run_id)),
        30,
        "the waiting line in the Prefect log",
    )


def prefect_messages(flow_run_id) -> list[str]:
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    messages: list[str] = []
    with get_client(sync_client=True) as client:
        while page := client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200, offset=len(messages)
        ):
            messages += [log.message for log in page]
    return messages


def metric_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------------------
# the whole pipeline, and a GPU worker lost while it trains (last: it leaves a node dead)
# --------------------------------------------------------------------------------------


def test_rehearsal_no_gpu_hf_for_vllm_pipeline_survives_a_gpu_worker_killed_while_training(
    cluster, cluster_token, prefect_api, mlflow_root, starter_model_dir
):
    from flows.pipeline import pipeline

    params = PipelineParams.model_validate(
        {
            "base_model": str(starter_model_dir),
            "eval_set": "maze256-small-v1",
            "data_root": str(mlflow_root),
            "ray_address": cluster.address,
            "max_eval_mazes": 2,
            "eval_workers": 2,
            "gif_count": 0,
            "eval_engine": "hf",  # standing in for vLLM
            "eval_gpus_per_worker": 1,
            "local_train_gpus": 1,
            "train_retries": 2,
            "hang_timeout_s": 600,
            "gpu_smoke": False,  # the GPUs are declared, not real (the smoke row's stand-ins are tested above)
            "training": MINIATURE_TRAINING | {"steps": 4},
        }
    )
    gpu_workers = cluster.gpu_worker_ids()
    killed: dict = {}

    def kill_the_training_node_after_step_2():
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and not killed:
            for metrics in mlflow_root.glob("runs/*/metrics.jsonl"):
                steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.strip()]
                running = [j for j in cluster.jobs(stage="train") if str(j.status) == "RUNNING"]
                if 2 in steps and running and running[0].driver_node_id in cluster.workers:
                    killed.update(node=running[0].driver_node_id, job=running[0].submission_id, steps=steps)
                    cluster.kill_raylet(running[0].driver_node_id)
                    return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_training_node_after_step_2, daemon=True)
    killer.start()
    # Given the pipeline on the rehearsal cluster, when the GPU worker its training job runs on dies after step 2,
    summary = pipeline(params)
    killer.join(timeout=5)
    assert killed, "the training node was never killed"
    flow_run = MlflowClient(summary.tracking_uri).get_run(summary.mlflow_run_id).data.tags["prefect.flow_run_id"]
    run_dir = mlflow_root / "runs" / summary.run_id
    # then the first training job failed as an infrastructure error, the stage retried on another GPU worker,
    trains = sorted(cluster.jobs(flow_run, "train"), key=lambda j: j.start_time)
    assert [(j.submission_id.rsplit("-", 1)[-1], str(j.status)) for j in trains] == [
        ("a1", "FAILED"),
        ("a2", "SUCCEEDED"),
    ]
    assert trains[0].driver_node_id == killed["node"]
    assert trains[1].driver_node_id in gpu_workers - {killed["node"]}, "the retry lands on a GPU worker still alive"
    # and resumed from the checkpoint marker: every step trained once, none lost, none repeated.
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4], f"steps {steps} (killed after {killed['steps']})"
    assert checkpoints.read_marker(run_dir / "checkpoints") == 4
    # The eval workers that asked for a GPU got one, on the GPU workers (the hf engine on CPU, standing in for vLLM),
    for stage in ("baseline", "final"):
        placement = json.loads((run_dir / "eval" / stage / "summary.json").read_text())["worker_placement"]
        assert {w["node_id"] for w in placement} <= gpu_workers and all(len(w["gpu_ids"]) == 1 for w in placement)
        assert {w["device"] for w in placement} == {"cpu"}, "no CUDA here: the hf engine ran on CPU"
    # and the merge ran as a job that asked Ray for a whole model copy's memory, on a node that has it.
    from mazerl.merge.memory import merge_memory, weights_bytes

    (merge,) = cluster.jobs(flow_run, "merge_lora")
    asked = int(merge.metadata["mazerl_entrypoint_memory"])
    assert str(merge.status) == "SUCCEEDED" and asked == merge_memory(weights_bytes(starter_model_dir)).total_bytes
    nodes = {n["node_id"]: n for n in cluster.nodes()}
    assert nodes[merge.driver_node_id]["resources_total"]["memory"] >= asked
    # and for the CPUs of the roomiest such node, at most 16 (the head's 52 here), which became its torch threads.
    from ray.job_submission import JobSubmissionClient

    from mazerl.cluster.jobs.spec import META_CPUS
    from mazerl.merge.memory import MAX_MERGE_CPUS

    assert float(merge.metadata[META_CPUS]) == MAX_MERGE_CPUS
    merge_log = JobSubmissionClient(cluster.address, headers=cluster.headers()).get_job_logs(merge.submission_id)
    assert f"torch threads (asked Ray for {MAX_MERGE_CPUS} CPUs;" in merge_log, merge_log[:2000]
    assert summary.final is not None
