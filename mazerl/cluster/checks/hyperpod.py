"""HyperPod health from the SageMaker API: is the cluster InService and is every node Running?

``describe_cluster`` gives the cluster status and each instance group's status and counts;
``list_cluster_nodes`` (paginated: large clusters span several pages) gives every node's
status and the message HyperPod attached to it. A node in ``Failure`` is being replaced by
HyperPod's auto-resume; training should wait for the replacement rather than start short.

Credentials come from boto3's usual chain (``AWS_PROFILE``, SSO, instance role). Errors say
what is missing: no credentials, no region, a missing IAM permission (the two actions are
``sagemaker:DescribeCluster`` and ``sagemaker:ListClusterNodes``), or a cluster name that
does not exist in that account and region.
"""

from __future__ import annotations

import os
from typing import Any

from mazerl.cluster.checks.report import CheckRow
from mazerl.cluster.errors import ClusterAccessError, ConfigError, RetryableJobError

REQUIRED_ACTIONS = "sagemaker:DescribeCluster and sagemaker:ListClusterNodes"
HYPERPOD_ACCESS_HINT = (
    "The run goes on without HyperPod's node health (the Ray rows above decide readiness). To turn it on, "
    "give the flow-run pods' service account an EKS Pod Identity association with a role that allows "
    "sagemaker:DescribeCluster and sagemaker:ListClusterNodes, and set AWS_REGION in their env (docs/hyperpod.md)"
)


class HyperPodAccessError(ClusterAccessError):
    """No credentials, no region, or no permission to read the cluster."""


class HyperPodClusterNotFound(ConfigError):
    """The cluster name does not exist in this account/region."""


def sagemaker_client(region: str | None = None):
    """A boto3 SageMaker client; a missing region is a clear error, not botocore's.

    The region: the argument, else ``AWS_REGION`` (what EKS, Lambda and most AWS SDKs set, and
    what our manifests template), else boto3's own chain (``AWS_DEFAULT_REGION``, the profile).
    boto3 itself does not read ``AWS_REGION``, so without this a pod given only ``AWS_REGION``
    would still have no region.
    """
    # lazy: boto3 is an optional extra (mazerl[hyperpod]) and slow to import
    import boto3
    from botocore.exceptions import NoRegionError

    region = region or os.environ.get("AWS_REGION") or None
    try:
        return boto3.client("sagemaker", region_name=region)
    except NoRegionError:
        raise HyperPodAccessError(
            "no AWS region for the HyperPod checks: set AWS_REGION (or AWS_DEFAULT_REGION), or pass the region "
            "of the cluster"
        ) from None


def check_hyperpod(
    cluster_name: str, *, region: str | None = None, client: Any = None, page_size: int = 100
) -> list[CheckRow]:
    """Rows ``hyperpod.cluster``, ``hyperpod.instance_groups``, ``hyperpod.nodes``.

    Raises :class:`HyperPodAccessError` / :class:`HyperPodClusterNotFound` /
    ``RetryableJobError`` (endpoint unreachable) instead of returning rows when the API
    cannot be asked at all.
    """
    if not isinstance(cluster_name, str) or not cluster_name.strip():
        raise ConfigError(
            f"hyperpod cluster name ({cluster_name!r}) is empty; give the name shown by `aws sagemaker list-clusters`"
        )
    client = client or sagemaker_client(region)
    description = _call(client.describe_cluster, cluster_name, ClusterName=cluster_name)
    nodes: list[dict[str, Any]] = []
    paginator = client.get_paginator("list_cluster_nodes")
    pages = paginator.paginate(ClusterName=cluster_name, PaginationConfig={"PageSize": page_size})
    for page in _call(lambda **_: list(pages), cluster_name):
        nodes.extend(page.get("ClusterNodeSummaries", []))
    return [_cluster_row(description), _groups_row(description), _nodes_row(nodes)]


def _cluster_row(description: dict[str, Any]) -> CheckRow:
    status = description.get("ClusterStatus", "unknown")
    found = status
    if description.get("FailureMessage"):
        found += f" ({description['FailureMessage']})"
    return CheckRow("hyperpod.cluster", "InService", found, status == "InService")


def _groups_row(description: dict[str, Any]) -> CheckRow:
    groups = description.get("InstanceGroups", [])
    parts, ok = [], bool(groups)
    for group in groups:
        status = group.get("Status")  # absent in older API answers: judge by the counts alone
        current, target = group.get("CurrentCount", 0), group.get("TargetCount", 0)
        healthy = current >= target and status in (None, "InService")
        ok &= healthy
        parts.append(
            f"{group.get('InstanceGroupName')} ({group.get('InstanceType')}): {current}/{target}"
            + (f" {status}" if status else "")
            + ("" if healthy else " DEGRADED")
        )
    return CheckRow(
        "hyperpod.instance_groups",
        "every group InService with CurrentCount == TargetCount",
        "; ".join(parts) or "no instance groups",
        ok,
    )


def _nodes_row(nodes: list[dict[str, Any]]) -> CheckRow:
    failing = [n for n in nodes if n.get("InstanceStatus", {}).get("Status") != "Running"]
    if not nodes:
        return CheckRow("hyperpod.nodes", "every node Running", "no nodes listed", False)
    if not failing:
        return CheckRow("hyperpod.nodes", "every node Running", f"{len(nodes)}/{len(nodes)} Running", True)
    details = "; ".join(
        f"{n.get('InstanceId')} ({n.get('InstanceGroupName')}, {n.get('InstanceType')}): "
        f"{n.get('InstanceStatus', {}).get('Status')} - {n.get('InstanceStatus', {}).get('Message') or 'no message'}"
        for n in failing
    )
    return CheckRow(
        "hyperpod.nodes",
        "every node Running",
        f"{len(nodes) - len(failing)}/{len(nodes)} Running; not Running: {details}",
        False,
    )


def _call(fn, cluster_name: str, **kwargs):
    """One SageMaker call with its failures turned into errors that say what to fix."""
    from botocore.exceptions import (  # lazy: optional extra, see above
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
    )

    try:
        return fn(**kwargs)
    except (NoCredentialsError, PartialCredentialsError):
        raise HyperPodAccessError(
            f"no AWS credentials to check HyperPod cluster {cluster_name!r}: set AWS_PROFILE (or run `aws configure` / "
            "`aws sso login`) and check with `aws sts get-caller-identity`"
        ) from None
    except NoRegionError:
        raise HyperPodAccessError("no AWS region for the HyperPod checks: set AWS_REGION or pass region") from None
    except EndpointConnectionError as exc:
        raise RetryableJobError(
            f"the SageMaker API is unreachable ({exc})", address=f"hyperpod:{cluster_name}"
        ) from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = error.get("Code", ""), error.get("Message", "")
        if code in ("ResourceNotFound", "ResourceNotFoundException") or (
            code == "ValidationException" and "could not find" in message.lower()
        ):
            raise HyperPodClusterNotFound(
                f"HyperPod cluster {cluster_name!r} does not exist in this account/region ({message}); check the name "
                "and AWS_REGION with `aws sagemaker list-clusters`"
            ) from None
        if code in ("AccessDeniedException", "AccessDenied", "UnauthorizedOperation"):
            raise HyperPodAccessError(
                f"not allowed to read HyperPod cluster {cluster_name!r} ({message}); the caller's IAM policy needs "
                f"{REQUIRED_ACTIONS}"
            ) from None
        if code in ("ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "UnrecognizedClientException"):
            raise HyperPodAccessError(
                f"the AWS credentials were rejected ({code}: {message}); refresh them (e.g. `aws sso login`)"
            ) from None
        if code in ("ThrottlingException", "ServiceUnavailable", "InternalFailure"):
            raise RetryableJobError(f"SageMaker API {code}: {message}", address=f"hyperpod:{cluster_name}") from None
        raise


def hyperpod_rows(cluster: str, region: str | None, client: Any) -> list[CheckRow]:
    """HyperPod's own view of the nodes. Optional: the Ray rows already say whether the cluster
    can run the job, so when the SageMaker API cannot be asked at all (a flow pod without an IAM
    identity, region or permission; no route to the API) the row is advisory. A wrong cluster
    name, or an answer that shows failed nodes, still stops the run."""
    expected = f"HyperPod cluster {cluster} readable and InService"
    try:
        return check_hyperpod(cluster, region=region, client=client)
    except HyperPodClusterNotFound as exc:
        return [CheckRow("hyperpod.cluster", expected, str(exc), False)]
    except (HyperPodAccessError, RetryableJobError) as exc:
        found = f"not checked: {exc}. {HYPERPOD_ACCESS_HINT}"
        return [CheckRow("hyperpod.cluster", expected, found, False, advisory=True)]
    except ConfigError as exc:
        return [CheckRow("hyperpod.cluster", expected, str(exc), False)]
