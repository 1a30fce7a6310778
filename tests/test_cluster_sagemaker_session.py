"""A ``sagemaker_ray://`` session that expires while a job is followed, with the real toolkit.

The address goes through Ray's real ``JobSubmissionClient`` and the real
``toolkit-for-ray-on-sagemaker-ai`` (its module hook, kubeconfig reader, RayDashboardConnection
request and bearer-token exchange). What cannot exist here, the HyperPod endpoint, is a stub on
loopback (HTTPS with a throw-away certificate): it plays the Kubernetes API that vends a
connection token, the dashboard's ``/bearer-auth`` that trades it for a session cookie, and the
authenticating proxy in front of the session's real local Ray head, which answers 401 once the
test expires the sessions.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from mazerl.cluster.errors import ClusterAccessError
from mazerl.cluster.jobs.spec import JobSpec
from mazerl.cluster.jobs.submitter import RayJob

KUBE_TOKEN = "kube-bearer-token"
CONNECTIONS = "/apis/connection.access.sagemaker.amazonaws.com/v1alpha1/namespaces/mazerl/raydashboardconnections"


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert, key_file = folder / "endpoint.crt", folder / "endpoint.key"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert, key_file


class HyperPodEndpoint(ThreadingHTTPServer):
    """The stubbed HyperPod side: token vending, cookie exchange, and an authenticating proxy to Ray."""

    daemon_threads = True

    def __init__(self, ray_address: str, ray_headers: dict[str, str]):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ray_address, self.ray_headers = ray_address, ray_headers
        self.connections = 0  # RayDashboardConnection requests served (one per client the toolkit builds)
        self.sessions: set[str] = set()  # cookies currently honoured
        self.refused = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server_address[1]}"

    def expire_sessions(self) -> None:
        with self.lock:
            self.sessions.clear()


class _Handler(BaseHTTPRequestHandler):
    server: HyperPodEndpoint

    def log_message(self, *_args) -> None:  # quiet
        return

    def _reply(self, status: int, body: bytes, content_type: str = "application/json", headers=()) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers:
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        if self.path == CONNECTIONS:  # the Kubernetes API of the HyperPod EKS cluster
            if self.headers.get("Authorization") != f"Bearer {KUBE_TOKEN}":
                return self._reply(401, b'{"message": "Unauthorized"}')
            with self.server.lock:
                self.server.connections += 1
                token = f"jwt-{self.server.connections}"
            url = f"{self.server.url}/?token={token}"
            return self._reply(201, json.dumps({"status": {"connectionUrl": url}}).encode())
        return self._proxy("POST")

    def do_GET(self) -> None:  # noqa: N802
        parsed = urlparse(self.path)
        if parsed.path == "/bearer-auth":
            cookie = f"session-{parse_qs(parsed.query)['token'][0]}"
            with self.server.lock:
                self.server.sessions.add(cookie)
            return self._reply(200, b"{}", headers=[("Set-Cookie", f"ray_session={cookie}; Path=/; Secure")])
        if parsed.path.endswith("/logs/tail"):  # no websocket through this stub: the submitter polls instead
            return self._reply(404, b"{}")
        return self._proxy("GET")

    def _proxy(self, method: str) -> None:
        cookies = dict(
            part.strip().split("=", 1) for part in (self.headers.get("Cookie") or "").split(";") if "=" in part
        )
        with self.server.lock:
            valid = cookies.get("ray_session") in self.server.sessions
            self.server.refused += not valid
        if not valid:
            return self._reply(401, b"session expired", "text/plain")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {"Content-Type": self.headers.get("Content-Type", "application/json"), **self.server.ray_headers}
        request = urllib.request.Request(self.server.ray_address + self.path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, data, kind = response.status, response.read(), response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as error:
            status, data, kind = error.code, error.read(), error.headers.get("Content-Type", "")
        self._reply(status, data, kind or "application/json")


@pytest.fixture
def hyperpod_endpoint(local_ray_head, tmp_path, monkeypatch):
    import ssl

    cert, key = self_signed_certificate(tmp_path)
    server = HyperPodEndpoint(local_ray_head.address, local_ray_head.auth_headers())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "hyperpod",
        "clusters": [{"name": "eks", "cluster": {"server": server.url, "certificate-authority": str(cert)}}],
        "contexts": [{"name": "hyperpod", "context": {"cluster": "eks", "user": "me"}}],
        "users": [{"name": "me", "user": {"token": KUBE_TOKEN}}],
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))  # requests (Ray's client, the toolkit) trusts the stub
    yield server
    server.shutdown()


JOB = textwrap.dedent(
    """
    import time
    for i in range(12):
        print(f"line {i}", flush=True)
        time.sleep(0.4)
    """
)


def test_expired_sagemaker_session_is_renewed_and_the_same_job_followed_real_toolkit_stubbed_endpoint(
    hyperpod_endpoint, tmp_path
):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    lines: list[str] = []
    job = RayJob(
        "sagemaker_ray://mazerl/mazerl",
        JobSpec(f"{sys.executable} {script}", pipeline_run_id=f"s{uuid.uuid4().hex[:10]}", attempt=1),
        log=lines.append,
        poll_s=0.25,
    )

    def expire_once_the_job_talks() -> None:
        deadline = time.monotonic() + 120
        while "line 3" not in lines and time.monotonic() < deadline:
            time.sleep(0.05)
        hyperpod_endpoint.expire_sessions()

    # Given a job followed through the HyperPod endpoint, when the session expires while it runs,
    with job:
        threading.Thread(target=expire_once_the_job_talks, daemon=True).start()
        outcome = job.wait()
    # then the submitter signed in again (a second connection through the toolkit) and followed the
    # same job to its end, every line of its log handed on once and in order.
    assert outcome.status == "SUCCEEDED" and outcome.submission_id == job.submission_id
    assert hyperpod_endpoint.refused >= 1, "the expired cookie was refused at least once"
    assert hyperpod_endpoint.connections == 2, "one sign-in at the start, one after the expiry"
    assert [line for line in lines if line.startswith("line ")] == [f"line {i}" for i in range(12)], lines
    assert any("expired" in line and "signed in again" in line for line in lines)


def test_a_renewed_session_refused_at_once_is_an_access_error_real_toolkit_stubbed_endpoint(
    hyperpod_endpoint, tmp_path, monkeypatch
):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    job = RayJob(
        "sagemaker_ray://mazerl/mazerl",
        JobSpec(f"{sys.executable} {script}", pipeline_run_id=f"s{uuid.uuid4().hex[:10]}", attempt=1),
        log=lambda _line: None,
        poll_s=0.25,
    )
    # given an endpoint that stops honouring any session once the job started (revoked access),
    job.start()
    monkeypatch.setattr(hyperpod_endpoint, "sessions", _Nothing())
    # when the submitter renews and is refused again at once, then it says so instead of looping.
    with pytest.raises(ClusterAccessError, match="refused"):
        job.wait()


class _Nothing(set):
    def add(self, _item) -> None:  # every new cookie is refused
        return
