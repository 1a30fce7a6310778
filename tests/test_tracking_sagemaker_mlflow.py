"""SageMaker managed MLflow through the ``sagemaker-mlflow`` plugin (the cluster extra and the image have it).

With the plugin installed, MLflow resolves an ``arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name>``
tracking URI to the plugin's store: a REST store whose every request is signed with SigV4 for the
``sagemaker-mlflow`` service and names the tracking server in a routing header.

Stubbed AWS: the tracking server's endpoint is a real MLflow server on loopback, put in SageMaker's
place by the plugin's own override (``SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT``) behind a proxy that
records each request's headers; the credentials are fake keys, so the signing is real and no AWS
API is called. The ARN is used at the MLflow level, not through ``PipelineParams``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import mlflow
import mlflow.tracking._tracking_service.utils as tracking_utils
import pytest
import requests
from mlflow.tracking import MlflowClient
from test_metrics_logger import free_port

from mazerl.tracking.metrics import MetricsLogger
from mazerl.tracking.store import client_for, default_artifact_location, ui_url
from mazerl.upstream_warnings import SAGEMAKER_HEADER_MESSAGE

REPO = Path(__file__).resolve().parents[1]

ARN = "arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/mazerl"


class RecordingProxy(BaseHTTPRequestHandler):
    """Forwards every request to the MLflow server and keeps its headers (SageMaker's endpoint, stubbed)."""

    upstream = ""
    seen: list[dict[str, str]] = []

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append({"method": self.command, "path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "authorization")}
        reply = requests.request(self.command, self.upstream + self.path, data=body, headers=headers, timeout=30)
        self.send_response(reply.status_code)
        self.send_header("Content-Type", reply.headers.get("Content-Type", "application/json"))
        self.send_header("Content-Length", str(len(reply.content)))
        self.end_headers()
        self.wfile.write(reply.content)

    do_GET = do_POST = do_PATCH = do_DELETE = _forward

    def log_message(self, *args) -> None:  # quiet
        pass


def mlflow_server(root, port: int) -> subprocess.Popen:
    """``mlflow server`` on loopback over ``root``'s migrated store, without its job runner (seven worker
    processes this test does not use), in a process group of its own so that stopping it leaves nothing."""
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += [
        "--backend-store-uri",
        f"sqlite:///{root / 'mlflow.db'}",
        "--default-artifact-root",
        str(root / "mlartifacts"),
    ]
    env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok:
                return server
        except requests.RequestException:
            time.sleep(0.5)
    os.killpg(server.pid, signal.SIGKILL)
    pytest.fail("mlflow server did not start within 180 s")


@pytest.fixture
def sagemaker_endpoint(mlflow_root, tmp_path, monkeypatch):
    """A real MLflow server behind the recording proxy, as the plugin's endpoint; fake AWS keys."""
    port = free_port()
    server = mlflow_server(mlflow_root, port)
    RecordingProxy.upstream, RecordingProxy.seen = f"http://127.0.0.1:{port}", []
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), RecordingProxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    monkeypatch.setenv("SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT", f"http://127.0.0.1:{proxy.server_address[1]}")
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "AKIDSTUBBED"),
        ("AWS_SECRET_ACCESS_KEY", "stubbed"),
        ("AWS_REGION", "us-west-2"),
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("SAGEMAKER_MLFLOW_ASSUME_ROLE_ARN", raising=False)
    global_uri = tracking_utils._tracking_uri  # client_for(ARN) sets the process-wide URI: restored after
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")  # any other global URI
    try:
        yield RecordingProxy.seen
    finally:
        tracking_utils._tracking_uri = global_uri
        proxy.shutdown()
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)


def test_an_arn_tracking_uri_resolves_to_the_plugins_signed_store_stubbed_aws(sagemaker_endpoint, tmp_path):
    from mlflow.tracking._tracking_service.utils import _get_store
    from sagemaker_mlflow.mlflow_sagemaker_store import MlflowSageMakerStore

    # Given the ARN of a SageMaker managed MLflow tracking server,
    # when MLflow resolves it, then the store is the plugin's, with the plugin's SigV4 signer,
    store = _get_store(ARN)
    assert isinstance(store, MlflowSageMakerStore) and store.store_uri == ARN
    assert store.get_host_creds().auth == "arn"
    # and a run logged through mazerl's clients (the metric logger too) lands in the server behind its endpoint,
    # although another tracking URI was the process-wide one (the plugin signs for that one: client_for switches it),
    client = client_for(ARN)
    run_id = client.create_run(client.create_experiment("sagemaker-arn")).info.run_id
    logger = MetricsLogger(ARN, run_id, tmp_path / "metrics.jsonl", warn=pytest.fail)
    logger.log(1, {"train/reward_mean": 0.5})
    logger.close()
    direct = MlflowClient(RecordingProxy.upstream)
    assert [(m.step, m.value) for m in direct.get_metric_history(run_id, "train/reward_mean")] == [(1, 0.5)]
    # every request signed with SigV4 for SageMaker MLflow in the ARN's region and routed by the ARN,
    seen = sagemaker_endpoint
    assert len(seen) >= 3, seen
    for request in seen:
        assert request["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDSTUBBED/"), request
        assert "/us-west-2/sagemaker-mlflow/aws4_request" in request["authorization"], request
        assert request["x-mlflow-sm-tracking-server-arn"] == ARN, request
    # the service the IAM policy of docs/hyperpod.md allows,
    service = seen[0]["authorization"].split("/")[3]
    policy = json.loads((REPO / "deployments" / "aws" / "mazerl-mlflow-policy.json").read_text())
    assert [f"{service}:*"] in [statement["Action"] for statement in policy["Statement"]]
    # and the server keeps the artifacts (its S3 bucket on SageMaker), not the data root; its UI is SageMaker's.
    assert default_artifact_location(ARN, tmp_path) is None and ui_url(ARN) is None


def test_the_plugins_header_noise_for_other_tracking_uris_is_dropped_and_only_that(monkeypatch):
    from mlflow.tracking.request_header.registry import resolve_request_headers

    registry_log = logging.getLogger("mlflow.tracking.request_header.registry")
    (ours,) = [f for f in registry_log.filters if type(f).__name__ == "_NotAnArnTrackingUri"]
    records: list[str] = []
    catcher = logging.Handler()
    catcher.emit = lambda record: records.append(record.getMessage())
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    global_uri = tracking_utils._tracking_uri
    registry_log.addHandler(catcher)
    try:
        # Given the plugin installed and a self-hosted server as the tracking URI: MLflow builds every REST
        # call's headers, and the plugin fails to read that URI as an ARN,
        mlflow.set_tracking_uri("http://127.0.0.1:5000")
        registry_log.removeFilter(ours)
        resolve_request_headers()
        assert records == [SAGEMAKER_HEADER_MESSAGE], "the plugin's noise, without our filter"
        # then with the filter (mazerl installs it on import) nothing is logged, and the request gets no ARN header;
        registry_log.addFilter(ours)
        records.clear()
        assert "x-mlflow-sm-tracking-server-arn" not in resolve_request_headers()
        assert records == []
        # with an ARN the plugin's header is there.
        mlflow.set_tracking_uri(ARN)
        assert resolve_request_headers()["x-mlflow-sm-tracking-server-arn"] == ARN
    finally:
        if ours not in registry_log.filters:
            registry_log.addFilter(ours)
        registry_log.removeHandler(catcher)
        tracking_utils._tracking_uri = global_uri


def test_a_role_after_a_hash_is_not_the_plugins_and_is_refused_naming_the_variable_it_reads(monkeypatch):
    """sagemaker-mlflow takes the role to assume from SAGEMAKER_MLFLOW_ASSUME_ROLE_ARN, never from the URI."""
    from sagemaker_mlflow.mlflow_sagemaker_helpers import SageMakerMLflowHostMetadataProvider

    from mazerl.address_forms import ASSUME_ROLE_VAR
    from mazerl.params import PipelineParams

    role = "arn:aws:iam::123456789012:role/mazerl-mlflow"
    # Given the real plugin, a "#<role>" after the ARN stays in the server's ARN it sends (its routing header),
    provider = SageMakerMLflowHostMetadataProvider()
    provider.set_arn(f"{ARN}#{role}")
    assert provider.resource_id != "mazerl" and provider.arn == f"{ARN}#{role}"
    # while the variable is where it looks for a role,
    monkeypatch.setenv(ASSUME_ROLE_VAR, role)
    assert provider.maybe_assume_role_arn == role
    # so the parameters take the bare ARN and refuse the suffix, naming the variable.
    assert PipelineParams(tracking_uri=ARN).tracking_uri == ARN
    with pytest.raises(ValueError, match=f"{ASSUME_ROLE_VAR}=arn:aws:iam::<account>:role/<name>"):
        PipelineParams(tracking_uri=f"{ARN}#{role}")
