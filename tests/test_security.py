"""Security: no secret in any output of a pipeline run or in any job's environment, servers on loopback
only (the pipeline's and ``mazerl eval``'s), no token where others can read it, no remote code, no
unsafe unpickling.

The pipeline test runs the miniature flow of tests/test_pipeline_flow.py on a Ray head of its own,
started from an environment that holds fake credentials (as a user's shell would), as does this
process, and greps everything the run leaves: the data root (MLflow's SQLite file, its artifact
store, the run directory), the Prefect database, results and, through the Prefect API, logs and
artifacts, and the Ray job records. Another test looks at the environment of every process of that
head and of a job on it.
"""

from __future__ import annotations

import ast
import ipaddress
import json
import os
import secrets
import shutil
import stat
import tempfile
import threading
from pathlib import Path

import psutil
import pytest
import torch

from mazerl.training.recipes import MINIATURE_TRAINING

PROJECT = Path(__file__).resolve().parents[1]


def fake_secrets() -> dict[str, str]:
    """Credentials as the environment of a laptop or a HyperPod pod would hold them (random, so unmistakable)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    return {
        "AWS_ACCESS_KEY_ID": "AKIA" + "".join(secrets.choice(alphabet) for _ in range(16)),
        "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
        "AWS_SESSION_TOKEN": secrets.token_urlsafe(96),
        "MLFLOW_TRACKING_TOKEN": secrets.token_hex(20),
        "MLFLOW_TRACKING_PASSWORD": secrets.token_hex(12),
        "MAZERL_RAY_CLUSTER_TOKEN": secrets.token_hex(32),
        "HF_TOKEN": "hf_" + secrets.token_hex(17),
    }


@pytest.fixture(scope="module")
def secret_env():
    return fake_secrets()


@pytest.fixture(scope="module")
def secret_head(secret_env):
    """A local Ray head started from an environment that holds the fake credentials (the user's shell)."""
    from mazerl.cluster.head.local import start_local_head

    temp = tempfile.mkdtemp(prefix="mzr-s", dir="/tmp")
    saved = dict(os.environ)
    os.environ.update(secret_env)
    try:
        head = start_local_head(temp, num_cpus=2, object_store_mb=100, dashboard_port=0)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    yield head
    head.stop()
    shutil.rmtree(temp, ignore_errors=True)


class ListeningSockets(threading.Thread):
    """Samples, twice a second, the listening sockets of this process, its children and a Ray head's processes."""

    def __init__(self, head_pid: int):
        super().__init__(daemon=True)
        self.head_pid = head_pid
        self.seen: set[tuple[str, str, int]] = set()
        self.done = threading.Event()

    def pipeline_pids(self) -> set[int]:
        pids = set()
        for ancestor in (os.getpid(), self.head_pid):  # this process, the head, and all their descendants
            try:
                process = psutil.Process(ancestor)
                pids |= {process.pid, *(child.pid for child in process.children(recursive=True))}
            except psutil.Error:
                continue
        for process in psutil.process_iter():
            try:
                if os.getsid(process.pid) == self.head_pid:
                    pids.add(process.pid)
            except (ProcessLookupError, PermissionError):
                continue
        return pids

    def run(self) -> None:
        while not self.done.is_set():
            pids = self.pipeline_pids()
            for conn in psutil.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
                    try:
                        name = psutil.Process(conn.pid).name()
                    except psutil.Error:
                        name = "?"
                    self.seen.add((name, conn.laddr.ip, conn.laddr.port))
            self.done.wait(0.5)


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4-mapped IPv6 loopback (::ffff:127.0.0.1: Ray's gRPC servers bind so)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def files_holding(paths, values: dict[str, str]) -> list[str]:
    """'<file>: <variable name>' for each file under ``paths`` that contains one of the values (bytes, any file)."""
    found = []
    for root in paths:
        root = Path(root)
        for path in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
            data = path.read_bytes()
            found += [f"{path}: {name}" for name, value in values.items() if value.encode() in data]
    return found


@pytest.mark.slow
def test_no_secret_reaches_any_output_of_a_pipeline_run_and_every_server_listens_on_loopback(
    prefect_api, secret_env, secret_head, mlflow_root, starter_model_dir, monkeypatch
):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
    from ray.job_submission import JobSubmissionClient

    from flows.pipeline import pipeline
    from mazerl.params import PipelineParams

    # Given fake credentials in this process and in the Ray head's environment (and the head's real token),
    for name, value in secret_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(secret_head.token_path))
    wanted = secret_env | {"the Ray head's auth token": secret_head.token_path.read_text().strip()}
    params = PipelineParams.model_validate(
        {
            "base_model": str(starter_model_dir),
            "eval_set": "maze256-small-v1",
            "data_root": str(mlflow_root),
            "ray_address": secret_head.address,
            "max_eval_mazes": 4,
            "eval_workers": 1,
            "gif_count": 2,
            "training": MINIATURE_TRAINING,
        }
    )
    sockets = ListeningSockets(secret_head.pid)
    sockets.start()
    # when the whole pipeline runs,
    try:
        state = pipeline(params, return_state=True)
    finally:
        sockets.done.set()
        sockets.join(timeout=10)
    summary = state.result()
    flow_run_id = state.state_details.flow_run_id
    assert summary.final >= 0 and (mlflow_root / "runs" / summary.run_id / "merged").is_dir(), "the run completed"

    # then no secret is in the data root (MLflow's database and artifacts, checkpoints, eval outputs, configs),
    assert (mlflow_root / "mlflow.db").is_file() and (mlflow_root / "mlartifacts").is_dir()
    assert files_holding([mlflow_root], wanted) == []
    # nor in Prefect's database (flow and task runs, parameters, states, logs, artifacts) and its results,
    database = prefect_api["database"]
    prefect_files = [p for p in database.parent.glob(database.name + "*")] + [prefect_api["storage"]]
    assert database.is_file() and files_holding(prefect_files, wanted) == []

    async def read_prefect():
        async with get_client() as client:
            runs = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
            artifacts = await client.read_artifacts(flow_run_filter=runs)
            return [log.message for log in logs], [json.dumps(a.model_dump(mode="json")) for a in artifacts]

    import asyncio

    logs, artifacts = asyncio.run(read_prefect())
    assert len(logs) > 20 and any("step 2/2" in line for line in logs), "the jobs' output reached the Prefect logs"
    assert {"pipeline-summary", "verify-cluster"} <= {json.loads(a)["key"] for a in artifacts}
    text = "\n".join(logs + artifacts)
    assert [name for name, value in wanted.items() if value in text] == [], "no secret in Prefect logs or artifacts"
    # nor in what Ray keeps of the run's jobs (entrypoint, runtime env, metadata, output),
    client = JobSubmissionClient(secret_head.address, headers=secret_head.auth_headers())
    jobs = [job for job in client.list_jobs() if (job.metadata or {}).get("mazerl_pipeline_run") == str(flow_run_id)]
    assert {job.metadata["mazerl_stage"] for job in jobs} >= {"baseline", "train", "final"}
    records = "\n".join(
        json.dumps(job.model_dump(), default=str) + client.get_job_logs(job.submission_id) for job in jobs
    )
    assert [name for name, value in wanted.items() if value in records] == [], "no secret in Ray's job records"
    # and every socket the run's processes listened on (Prefect's server, Ray, its jobs) was on loopback.
    names = {name for name, _, _ in sockets.seen}
    assert sockets.seen and any("python" in name for name in names), sockets.seen
    exposed = sorted(entry for entry in sockets.seen if not is_loopback(entry[1]))
    assert exposed == [], f"listening beyond 127.0.0.1: {exposed}"


def process_environment(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b"\n").decode(errors="replace")
    except OSError:  # ended meanwhile
        return ""


def test_no_secret_of_the_users_shell_reaches_the_head_or_a_jobs_environment(secret_env, secret_head, tmp_path):
    from mazerl.cluster.jobs.spec import JobSpec
    from mazerl.cluster.jobs.submitter import RayJob

    # Given a head started from a shell holding cloud credentials and tokens,
    script = tmp_path / "env.py"
    script.write_text("import json, os\nprint('ENV ' + json.dumps(dict(os.environ)), flush=True)\n")
    lines: list[str] = []
    # when a job runs on it,
    with RayJob(
        secret_head.address,
        JobSpec(f"python {script}", pipeline_run_id="envdump", attempt=1),
        headers=secret_head.auth_headers(),
        log=lines.append,
    ) as job:
        job.wait()
    (dump,) = [json.loads(line[4:]) for line in lines if line.startswith("ENV ")]
    # then the job saw only the allow-listed environment (no credential, and what a job needs),
    assert [name for name, value in secret_env.items() if value in json.dumps(dump)] == []
    assert {"PATH", "HOME", "RAY_AUTH_TOKEN_PATH"} <= set(dump), sorted(dump)
    # and no process of the head holds a credential in its environment either.
    processes = [psutil.Process(secret_head.pid), *psutil.Process(secret_head.pid).children(recursive=True)]
    assert len(processes) >= 3, "the head's GCS, raylet and dashboard were examined"
    leaks = {p.pid: [n for n, v in secret_env.items() if v in process_environment(p.pid)] for p in processes}
    assert {pid: names for pid, names in leaks.items() if names} == {}


@pytest.mark.slow
def test_eval_command_runs_on_a_loopback_only_head_and_leaves_no_token_where_others_can_read_it(
    starter_model_dir, tmp_path
):
    import subprocess
    import sys
    import time

    from mazerl.cluster.head.temp_dir import REGISTRY_NAME

    # Given `mazerl eval` with no --ray-address, in a fresh TMPDIR and HOME (as on a laptop),
    home, temp, out = tmp_path / "home", Path(tempfile.mkdtemp(prefix="mzr-e", dir="/tmp")), tmp_path / "eval"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"HOME": str(home), "TMPDIR": str(temp)}
    command = [str(Path(sys.executable).parent / "mazerl"), "eval", "--model", str(starter_model_dir)]
    command += ["--max-mazes", "6", "--workers", "2", "--gifs", "2", "--out", str(out)]
    registry = temp / f"mazerl-ray-{os.getuid()}" / REGISTRY_NAME
    seen: set[tuple[str, str, int]] = set()
    try:
        # when it runs,
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        sockets = None
        while process.poll() is None:
            if sockets is None and registry.is_file():
                sockets = ListeningSockets(json.loads(registry.read_text())["pid"])
                sockets.start()
            time.sleep(0.2)
        stdout, stderr = process.communicate(timeout=300)
        if sockets is not None:
            sockets.done.set()
            sockets.join(timeout=10)
            seen = sockets.seen
        # then it evaluates on the embedded head, writing the results, the summary and the GIFs,
        assert process.returncode == 0, stderr[-3000:]
        assert "success" in stdout and "budget ceiling" in stdout
        summary = json.loads((out / "summary.json").read_text())
        assert summary["eval_set"] == "maze256-small-v1" and summary["n"] == 6, "the starter's own set by default"
        assert len((out / "results.jsonl").read_text().splitlines()) == 6
        assert len(list((out / "gifs").glob("*.gif"))) == 2
        # every Ray server it started listened on loopback only,
        assert sockets is not None and len(seen) >= 5, f"the head's servers were sampled: {seen}"
        exposed = sorted(entry for entry in seen if not is_loopback(entry[1]))
        assert exposed == [], f"listening beyond 127.0.0.1: {exposed}"
        # no token was written into ~/.ray (where a bare ray.init() puts one, mode 0644),
        assert not (home / ".ray").exists(), sorted(p.name for p in (home / ".ray").iterdir())
        # and the head it started is stopped again, its private temp dir readable by this user only.
        assert not registry.exists(), "the head the command started was stopped when it ended"
        assert stat.S_IMODE(registry.parent.stat().st_mode) == 0o700
    finally:
        from mazerl.cluster.head.local import find_local_head

        left = find_local_head(registry.parent) if registry.is_file() else None
        if left is not None:  # the command failed before it stopped its head
            left.stop()
        shutil.rmtree(temp, ignore_errors=True)


# --------------------------------------------------------------------------------------
# No code from a model directory is ever run; no pickle is loaded unsafely
# --------------------------------------------------------------------------------------

MALICIOUS_MODULE = """
from pathlib import Path
Path({marker!r}).write_text("remote code ran")
"""


def with_remote_code(starter_model_dir: Path, target: Path, model_type: str) -> Path:
    """The starter, plus an ``auto_map`` to a module that writes a marker file when imported."""
    shutil.copytree(starter_model_dir, target)
    marker = target.parent / f"{target.name}.ran"
    for name in ("configuration_evil.py", "modeling_evil.py", "processing_evil.py"):
        (target / name).write_text(MALICIOUS_MODULE.format(marker=str(marker)))
    config = json.loads((target / "config.json").read_text())
    config["model_type"] = model_type
    config["auto_map"] = {
        "AutoConfig": "configuration_evil.EvilConfig",
        "AutoModelForImageTextToText": "modeling_evil.EvilModel",
    }
    (target / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer_config.json", "preprocessor_config.json", "processor_config.json"):
        content = json.loads((target / name).read_text())
        content["auto_map"] = {"AutoProcessor": "processing_evil.EvilProcessor"}
        (target / name).write_text(json.dumps(content))
    return marker


@pytest.mark.parametrize(
    ("model_type", "accepted"),
    [("qwen3_vl", True), ("evil_vl", False)],
    ids=["known type with an auto_map: built-in classes", "unknown type with an auto_map: refused"],
)
def test_model_directory_with_remote_code_is_loaded_without_running_it(
    starter_model_dir, tmp_path, model_type, accepted
):
    from mazerl.policy.loader import ModelLoadError, load_policy
    from mazerl.preflight.input_error import InputError
    from mazerl.preflight.model_dir import check_base_model

    model_dir = tmp_path / "model"
    marker = with_remote_code(Path(starter_model_dir), model_dir, model_type)
    # Given a model directory that maps its classes to code of its own, when every project path reads it,
    if accepted:
        check_base_model(model_dir)
        policy = load_policy(model_dir, device="cpu")
        # then it loads with transformers' own Qwen3-VL classes,
        assert type(policy.model).__module__.startswith("transformers.models.qwen3_vl"), type(policy.model)
    else:
        with pytest.raises(InputError, match="base_model"):
            check_base_model(model_dir)
        with pytest.raises((ModelLoadError, ValueError)):
            load_policy(model_dir, device="cpu")
    # and the directory's code never ran.
    assert not marker.exists(), "trust_remote_code must stay off: the model directory's module was imported"


class Payload:
    """Unpickling this touches a file: what a poisoned checkpoint would do with an arbitrary command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_poisoned_optimizer_state_in_a_checkpoint_is_refused_not_executed(starter_model_dir, tmp_path):
    from mazerl.training import checkpoints
    from mazerl.training.config import TrainConfig
    from mazerl.training.local_trainer import LocalGRPOTrainer

    values = {"run_id": "r", "data_root": str(tmp_path), "base_model": str(starter_model_dir)}
    config = TrainConfig.model_validate(values | MINIATURE_TRAINING | {"eval_set": "maze256-small-v1", "steps": 1})
    LocalGRPOTrainer(config, log=lambda _: None).run()
    optimizer_file = checkpoints.latest(config.checkpoint_dir).path / "policy" / "optimizer.pt"
    marker = tmp_path / "payload.ran"
    torch.save({"state": {}, "param_groups": [], "extra": Payload(marker)}, optimizer_file)
    torch.load(optimizer_file, weights_only=False)  # control: an unsafe load runs the payload
    assert marker.exists(), "the payload is live"
    marker.unlink()
    # Given that file in the checkpoint the marker names, when training resumes from it,
    resumed = TrainConfig.model_validate(values | MINIATURE_TRAINING | {"eval_set": "maze256-small-v1", "steps": 2})
    with pytest.raises(Exception, match="Weights only load failed"):
        LocalGRPOTrainer(resumed, log=lambda _: None).run()
    # then it is refused and its code never ran.
    assert not marker.exists(), "torch.load must use weights_only=True"


def project_calls():
    """Every call in the project's own Python code, with the file it is in."""
    for folder in ("mazerl", "envs", "tasks", "flows", "bench", "scripts"):
        for path in sorted((PROJECT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Call):
                    yield path.relative_to(PROJECT), node


def keyword(node: ast.Call, name: str):
    return next((k.value for k in node.keywords if k.arg == name), None)


def test_the_code_never_enables_remote_code_nor_loads_pickles_unsafely():
    problems, loads = [], 0
    for path, call in project_calls():
        func = ast.unparse(call.func)
        remote = keyword(call, "trust_remote_code")
        if remote is not None and not (isinstance(remote, ast.Constant) and remote.value is False):
            problems.append(f"{path}:{call.lineno} {func}(trust_remote_code={ast.unparse(remote)})")
        if func == "torch.load":
            loads += 1
            safe = keyword(call, "weights_only")
            if not (isinstance(safe, ast.Constant) and safe.value is True):
                problems.append(f"{path}:{call.lineno} torch.load without weights_only=True")
        if func in ("pickle.load", "pickle.loads", "yaml.load", "yaml.unsafe_load", "dill.load"):
            problems.append(f"{path}:{call.lineno} {func}")
        allow = keyword(call, "allow_pickle")
        if allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False):
            problems.append(f"{path}:{call.lineno} {func}(allow_pickle=...)")
    assert loads >= 2, "the scan sees the checkpoint loads (trainer state, optimizer)"
    assert problems == []
