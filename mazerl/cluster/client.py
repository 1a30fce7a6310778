"""Ray addresses and the job client: one place that turns an address into a working
``ray.job_submission.JobSubmissionClient`` or a clear error.

Accepted addresses:

- ``http://host:8265`` / ``https://host`` — a Ray dashboard (job server), e.g. the embedded
  local head or a port-forwarded KubeRay head. ``host:port`` means ``http://host:port``.
- ``sagemaker_ray://<cluster>/<namespace>`` (or ``sagemaker_ray://<dashboard host>``) — a
  HyperPod Ray cluster. The scheme is registered by the optional package
  ``toolkit-for-ray-on-sagemaker-ai`` (extra ``hyperpod``): Ray's own client imports its
  ``sagemaker_ray`` module, which turns the user's kubeconfig/AWS credentials into a session
  cookie. The address is passed to Ray unchanged; this module only checks up front that the
  pieces exist, so the error says what is missing instead of a stack trace from inside Ray.

Authentication to a token-protected cluster (Ray >= 2.59 turns token auth on by default)
uses Ray's standard mechanisms: either ``headers={"Authorization": "Bearer ..."}`` (the
embedded head's :meth:`LocalRayHead.auth_headers`) or ``RAY_AUTH_MODE=token`` plus the token
in ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH`` / ``~/.ray/auth_token`` in this process's
environment. Tokens are never logged or put into error messages.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from mazerl.cluster.errors import ClusterAccessError, ConfigError, RetryableJobError
from mazerl.cluster.head.local import find_local_head

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

SAGEMAKER_SCHEME = "sagemaker_ray"
SAGEMAKER_MODULE = "sagemaker_ray"  # the top-level module the toolkit installs for Ray to import
HYPERPOD_INSTALL_HINT = "pip install 'mazerl[hyperpod]'  (toolkit-for-ray-on-sagemaker-ai)"
_AUTH_REFUSED = re.compile(r"status code 40[13]\b")  # Ray's job client: "Request failed with status code 401"


@dataclass(frozen=True)
class RayAddress:
    """A validated job-server address. ``value`` is what Ray's client is given, unchanged."""

    value: str
    scheme: str  # http | https | sagemaker_ray

    @property
    def is_sagemaker(self) -> bool:
        return self.scheme == SAGEMAKER_SCHEME

    def __str__(self) -> str:
        return self.value


def parse_address(address: str) -> RayAddress:
    """Validate an address before any work; the error names the value and the accepted forms."""
    if not isinstance(address, str) or not address.strip():
        raise ConfigError(
            f"ray address ({address!r}) is empty: give the Ray dashboard address, e.g. http://127.0.0.1:8265, "
            "or sagemaker_ray://<cluster>/<namespace> for HyperPod"
        )
    raw = address.strip()
    scheme, _, rest = raw.partition("://") if "://" in raw else ("http", "", raw)
    scheme, rest = scheme.lower(), rest.rstrip("/")
    value = f"{scheme}://{rest}"
    if scheme == "ray":
        raise ConfigError(
            f"ray address ({address!r}) is a Ray Client address; jobs are submitted to the dashboard's job server: "
            "use http://<head>:8265 (or sagemaker_ray://<cluster>/<namespace> on HyperPod)"
        )
    if scheme not in ("http", "https", SAGEMAKER_SCHEME):
        raise ConfigError(
            f"ray address ({address!r}) has scheme {scheme!r}; use http://<head>:8265, https://<dashboard host>, "
            "or sagemaker_ray://<cluster>/<namespace>"
        )
    if not rest or rest.startswith("/"):
        raise ConfigError(f"ray address ({address!r}) names no host or cluster after {scheme}://")
    if scheme == SAGEMAKER_SCHEME:
        cluster = rest.split("/")[0]
        if "." not in cluster and not _valid_k8s_name(cluster):
            raise ConfigError(
                f"ray address ({address!r}): {cluster!r} is not a valid RayCluster name "
                "(lowercase letters, digits and '-'); expected sagemaker_ray://<cluster>/<namespace>"
            )
    return RayAddress(value=value, scheme=scheme)


def check_sagemaker_prerequisites(address: RayAddress) -> None:
    """Say which piece is missing for a ``sagemaker_ray://`` address: the toolkit package, a
    kubeconfig, or the AWS credentials its ``aws eks get-token`` plugin needs."""
    try:
        importlib.import_module(SAGEMAKER_MODULE)
    except ImportError as exc:
        raise ClusterAccessError(
            f"ray address {address} needs the HyperPod job-submission toolkit, which is not installed here "
            f"({exc}); install it with: {HYPERPOD_INSTALL_HINT}"
        ) from None
    kubeconfig = _find_kubeconfig()
    if kubeconfig is None:
        where = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
        raise ClusterAccessError(
            f"ray address {address} needs a kubeconfig for the HyperPod EKS cluster, and none was found at {where}; "
            "create one with: aws eks update-kubeconfig --name <eks-cluster> --region <region>"
        )
    if _kubeconfig_uses_aws_cli(kubeconfig) and not _aws_credentials_available():
        raise ClusterAccessError(
            f"ray address {address}: the kubeconfig {kubeconfig} gets its EKS token from `aws eks get-token`, but no "
            "AWS credentials are configured here; set AWS_PROFILE (or run `aws configure` / `aws sso login`) and "
            "check with: aws sts get-caller-identity"
        )


def job_client(address: str | RayAddress, headers: dict[str, str] | None = None) -> JobSubmissionClient:
    """A connected ``JobSubmissionClient``; errors are ours, name the address, and say whether a retry helps.

    Unreachable address, token service temporarily down -> ``RetryableJobError``;
    missing toolkit/kubeconfig/credentials, rejected token -> ``ClusterAccessError``.
    """
    from ray.job_submission import JobSubmissionClient  # lazy: ray takes seconds to import

    parsed = address if isinstance(address, RayAddress) else parse_address(address)
    if parsed.is_sagemaker:
        check_sagemaker_prerequisites(parsed)
    try:
        return JobSubmissionClient(parsed.value, headers=dict(headers) if headers else None)
    except ConnectionError as exc:
        raise RetryableJobError(
            f"Ray at {parsed} is unreachable ({exc}); is the head running and the address right?", address=parsed.value
        ) from None
    except Exception as exc:  # Ray and the toolkit raise plain exceptions; map them by what they say
        raise _map_client_error(parsed, exc) from None


def ray_headers(address: str) -> dict[str, str] | None:
    """The bearer header for a token-protected cluster, read fresh where the token lives.

    The embedded head keeps its token in a 0600 file of its own; a cluster's token comes from
    Ray's standard variables (``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``, e.g. a mounted
    Kubernetes Secret). None: no token known, Ray's client decides.
    """
    head = find_local_head()
    if head is not None and head.address.rstrip("/") == address.rstrip("/"):
        return head.auth_headers()
    token = os.environ.get("RAY_AUTH_TOKEN")
    if not token and os.environ.get("RAY_AUTH_TOKEN_PATH"):
        token = Path(os.environ["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else None


def cluster_nodes(
    address: str | RayAddress, headers: dict[str, str] | None = None, timeout_s: float = 10.0
) -> list[dict]:
    """The cluster's nodes as Ray's state API lists them (``/api/v0/nodes``: ``node_id``, ``state``,
    ``is_head_node``, ``resources_total``, ``labels``, ...), asked through the job client so the
    token and a HyperPod session apply as for jobs. Raises :class:`RetryableJobError` when the head
    does not answer."""
    client = job_client(address, headers)
    try:
        # the state API has no client taking our headers and session; the job client's request is the one
        response = client._do_request("GET", "/api/v0/nodes?limit=10000&detail=1", timeout=timeout_s)
        response.raise_for_status()
        return list(response.json()["data"]["result"]["result"])
    except Exception as exc:  # noqa: BLE001 - any failure to answer is the same "cannot tell now"
        raise RetryableJobError(
            f"Ray at {address} did not list its nodes: {type(exc).__name__}: {str(exc)[:200]}", address=str(address)
        ) from None


def auth_refused(exc: Exception) -> bool:
    """A 401/403 from the job API: Ray >= 2.5x raises AuthenticationError, older clients a
    RuntimeError naming the status code."""
    return type(exc).__name__ == "AuthenticationError" or bool(_AUTH_REFUSED.search(str(exc)))


def _map_client_error(address: RayAddress, exc: Exception) -> Exception:
    name, text = type(exc).__name__, str(exc)
    if address.is_sagemaker and (
        name == "AuthenticationError" or "status code 401" in text or "status code 403" in text
    ):
        return ClusterAccessError(
            f"the HyperPod Ray endpoint {address} refused the session the toolkit just obtained "
            f"({text.splitlines()[0][:120] if text else name}); check that these AWS credentials may submit jobs to "
            "that cluster"
        )
    if name == "AuthenticationError" or "Authentication required" in text or "status code 401" in text:
        return ClusterAccessError(
            f"Ray at {address} requires token authentication and this client sent no valid token; pass the "
            "embedded head's auth headers, or set RAY_AUTH_MODE=token with RAY_AUTH_TOKEN_PATH (or RAY_AUTH_TOKEN) "
            "to the cluster's token"
        )
    if "status code 403" in text or "Forbidden" in text:
        return ClusterAccessError(f"Ray at {address} rejected the authentication token (403); use the cluster's token")
    if name == "KubeconfigError":
        return ClusterAccessError(f"ray address {address}: cannot get EKS credentials from the kubeconfig: {text}")
    if name == "TokenAcquisitionError":
        if "temporarily unavailable" in text or "Unable to connect" in text or "timed out" in text:
            return RetryableJobError(f"ray address {address}: {text}", address=address.value)
        return ClusterAccessError(f"ray address {address}: HyperPod did not grant a dashboard session: {text}")
    if "Version check returned 404" in text:  # something answers there, but not Ray (or a gateway for no host)
        return RetryableJobError(
            f"Ray at {address} did not answer: the address answered HTTP 404 for /api/version, so no Ray job server "
            "is there; check that the head is running and that the address is its dashboard (http://<head>:8265)",
            address=address.value,
        )
    return RetryableJobError(f"Ray at {address} did not answer the job API: {name}: {text}", address=address.value)


def _valid_k8s_name(name: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-")
    return 0 < len(name) <= 63 and set(name) <= allowed and name[0].isalnum() and name[-1].isalnum()


def _find_kubeconfig() -> Path | None:
    configured = os.environ.get("KUBECONFIG")
    candidates = configured.split(os.pathsep) if configured else [str(Path.home() / ".kube" / "config")]
    for candidate in candidates:
        path = Path(candidate).expanduser()
        if candidate and path.is_file():
            return path
    return None


def _kubeconfig_uses_aws_cli(path: Path) -> bool:
    """Whether the current context's user gets its token by running ``aws`` (EKS's default)."""
    try:
        config = yaml.safe_load(path.read_text()) or {}
        context_name = config.get("current-context")
        context = next(c for c in config.get("contexts", []) if c.get("name") == context_name)
        user_name = context["context"]["user"]
        user = next(u for u in config.get("users", []) if u.get("name") == user_name)
        command = (user.get("user", {}).get("exec") or {}).get("command", "")
    except (OSError, yaml.YAMLError, StopIteration, KeyError, TypeError, AttributeError):
        return False  # malformed: let the toolkit report it precisely
    return Path(str(command)).name == "aws"


def _aws_credentials_available() -> bool:
    import boto3  # lazy: an optional extra (hyperpod), and slow to import

    return boto3.Session().get_credentials() is not None
