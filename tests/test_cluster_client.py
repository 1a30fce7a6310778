"""Addresses and the job client: what is accepted, and what an error says is missing.

The ``sagemaker_ray://`` tests go through Ray's real ``JobSubmissionClient`` and the real
``toolkit-for-ray-on-sagemaker-ai`` module; a HyperPod endpoint cannot be reached from here,
so they cover address handling and the error paths only (their names say so).
"""

from __future__ import annotations

import socket
import sys

import pytest
import yaml

from mazerl.cluster.client import job_client, parse_address
from mazerl.cluster.errors import ClusterAccessError, ConfigError, RetryableJobError

# Ray's client address handling, on the Ray the image ships too (`make test-image-stack`).
pytestmark = pytest.mark.image_stack


@pytest.mark.parametrize(
    ("given", "value", "scheme"),
    [
        ("127.0.0.1:8265", "http://127.0.0.1:8265", "http"),
        ("http://ray-head.mazerl.svc:8265/", "http://ray-head.mazerl.svc:8265", "http"),
        ("https://ray-dashboard.example.com", "https://ray-dashboard.example.com", "https"),
        ("sagemaker_ray://mazerl/mazerl", "sagemaker_ray://mazerl/mazerl", "sagemaker_ray"),
        ("sagemaker_ray://mazerl", "sagemaker_ray://mazerl", "sagemaker_ray"),
        (
            "sagemaker_ray://ray-dashboard.spaces.example.com",
            "sagemaker_ray://ray-dashboard.spaces.example.com",
            "sagemaker_ray",
        ),
    ],
)
def test_accepted_addresses_pass_through_unchanged(given, value, scheme):
    parsed = parse_address(given)
    assert (parsed.value, parsed.scheme) == (value, scheme)
    assert parsed.is_sagemaker == (scheme == "sagemaker_ray")


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("", "empty"),
        ("   ", "empty"),
        (None, "empty"),
        ("ray://head:10001", "Ray Client"),
        ("ftp://head:8265", "scheme 'ftp'"),
        ("http://", "names no host"),
        ("sagemaker_ray://My_Cluster/team", "not a valid RayCluster name"),
    ],
)
def test_bad_addresses_are_config_errors_naming_the_value(given, says):
    with pytest.raises(ConfigError, match=says):
        parse_address(given)


def test_sagemaker_address_without_toolkit_says_install_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sagemaker_ray", None)  # as if the package were not installed
    with pytest.raises(ClusterAccessError, match=r"mazerl\[hyperpod\]"):
        job_client("sagemaker_ray://mazerl/mazerl")


def test_sagemaker_address_without_kubeconfig_says_how_to_make_one(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    with pytest.raises(ClusterAccessError, match="aws eks update-kubeconfig"):
        job_client("sagemaker_ray://mazerl/mazerl")


def write_kubeconfig(path, user: dict, server: str = "https://example.invalid") -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "hp",
                "contexts": [{"name": "hp", "context": {"cluster": "eks", "user": "me"}}],
                "clusters": [{"name": "eks", "cluster": {"server": server}}],
                "users": [{"name": "me", "user": user}],
            }
        )
    )


def test_sagemaker_address_without_aws_credentials_says_so(monkeypatch, tmp_path, no_aws_identity):
    kubeconfig = tmp_path / "config"
    write_kubeconfig(
        kubeconfig,
        {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "command": "aws",
                "args": ["eks", "get-token"],
            }
        },
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    with pytest.raises(ClusterAccessError, match="no AWS credentials"):
        job_client("sagemaker_ray://mazerl/mazerl")


def test_sagemaker_address_goes_through_the_real_toolkit_endpoint_unreachable_here(monkeypatch, tmp_path):
    """With a kubeconfig holding a static token, Ray hands the address to the toolkit, which
    calls the Kubernetes API; nothing listens there on this machine, so the outcome is a
    retryable error naming the address (the real endpoint cannot be reached from here)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = tmp_path / "config"
    write_kubeconfig(kubeconfig, {"token": "not-a-real-token"}, server=f"https://127.0.0.1:{port}")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    with pytest.raises(RetryableJobError) as caught:
        job_client("sagemaker_ray://mazerl/mazerl")
    assert "sagemaker_ray://mazerl/mazerl" in str(caught.value)
    assert "not-a-real-token" not in str(caught.value), "a credential never appears in an error"


def test_token_protected_head_rejects_a_client_without_the_token(local_ray_head):
    import json
    import urllib.request

    with pytest.raises(ClusterAccessError, match="token"):
        job_client(local_ray_head.address)
    # with the token, the client lists exactly the jobs the head's HTTP API lists with that token
    listed = job_client(local_ray_head.address, local_ray_head.auth_headers()).list_jobs()
    request = urllib.request.Request(local_ray_head.address + "/api/jobs/", headers=local_ray_head.auth_headers())
    with urllib.request.urlopen(request, timeout=10) as response:
        expected = {job["submission_id"] for job in json.loads(response.read())}
    assert isinstance(listed, list) and {job.submission_id for job in listed} == expected
