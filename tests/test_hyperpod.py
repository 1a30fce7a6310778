"""HyperPod health checks against moto's SageMaker (and botocore's Stubber where moto lacks a field).

No AWS account is reachable from here: every test is mocked, and says so in its name.
"""

from __future__ import annotations

import datetime
import socket

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID
from moto.sagemaker.models import sagemaker_backends

from mazerl.cluster.checks.hyperpod import HyperPodAccessError, HyperPodClusterNotFound, check_hyperpod
from mazerl.cluster.checks.report import ClusterNotReadyError

REGION = "us-east-1"


def instance_group(name: str, instance_type: str, count: int) -> dict:
    return {
        "InstanceGroupName": name,
        "InstanceType": instance_type,
        "InstanceCount": count,
        "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lifecycle/scripts/", "OnCreate": "on_create.sh"},
        "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod",
        "ThreadsPerCore": 1,
    }


@pytest.fixture
def moto_cluster(monkeypatch):
    """A HyperPod cluster in moto: 1 CPU head node and 3 GPU workers (moto knows no g7e, so g5)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        client = boto3.client("sagemaker", region_name=REGION)
        client.create_cluster(
            ClusterName="mazerl-hp",
            InstanceGroups=[instance_group("head", "ml.c5.xlarge", 1), instance_group("gpu", "ml.g5.12xlarge", 3)],
            VpcConfig={"SecurityGroupIds": ["sg-1"], "Subnets": ["subnet-1"]},
        )
        yield client


def test_in_service_cluster_with_all_nodes_running_passes_mocked_aws(moto_cluster):
    # moto's paging of list_cluster_nodes repeats its token; paging is covered with the Stubber below.
    rows = check_hyperpod("mazerl-hp", client=moto_cluster)
    assert [r.name for r in rows] == ["hyperpod.cluster", "hyperpod.instance_groups", "hyperpod.nodes"]
    assert all(r.ok for r in rows), rows
    assert rows[2].found == "4/4 Running", "every node was counted"
    assert "gpu (ml.g5.12xlarge): 3/3" in rows[1].found


def test_a_node_in_failure_is_listed_with_its_message_mocked_aws(moto_cluster):
    node = sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].clusters["mazerl-hp"].nodes["gpu-1"]
    node.status = "Failure"
    rows = {r.name: r for r in check_hyperpod("mazerl-hp", client=moto_cluster)}
    assert rows["hyperpod.cluster"].ok, "the cluster itself stays InService while a node is replaced"
    assert not rows["hyperpod.nodes"].ok
    assert "3/4 Running" in rows["hyperpod.nodes"].found
    assert "gpu-1 (gpu, ml.g5.12xlarge): Failure" in rows["hyperpod.nodes"].found, "the failing node is named"


def test_cluster_not_found_names_the_cluster_mocked_aws(moto_cluster):
    with pytest.raises(HyperPodClusterNotFound, match="'typo-cluster'.*list-clusters"):
        check_hyperpod("typo-cluster", client=moto_cluster)


def stubbed_client():
    client = boto3.client("sagemaker", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="y")
    return client, Stubber(client)


def test_degraded_instance_group_and_pagination_mocked_aws_with_stubber():
    """moto has no instance-group Status; the Stubber gives the API's real shape, two pages of nodes."""
    client, stubber = stubbed_client()
    launched = datetime.datetime(2026, 1, 1)
    stubber.add_response(
        "describe_cluster",
        {
            "ClusterArn": "arn:aws:sagemaker:us-east-1:123456789012:cluster/abc",
            "ClusterName": "mazerl-hp",
            "ClusterStatus": "InService",
            "InstanceGroups": [
                {
                    "InstanceGroupName": "head",
                    "InstanceType": "ml.r5d.16xlarge",
                    "CurrentCount": 1,
                    "TargetCount": 1,
                    "Status": "InService",
                },
                {
                    "InstanceGroupName": "gpu",
                    "InstanceType": "ml.g7e.12xlarge",
                    "CurrentCount": 2,
                    "TargetCount": 3,
                    "Status": "Degraded",
                },
            ],
        },
        {"ClusterName": "mazerl-hp"},
    )

    def node(instance_id: str, group: str, status: str, message: str = "") -> dict:
        return {
            "InstanceGroupName": group,
            "InstanceId": instance_id,
            "InstanceType": "ml.g7e.12xlarge" if group == "gpu" else "ml.r5d.16xlarge",
            "LaunchTime": launched,
            "InstanceStatus": {"Status": status, "Message": message},
        }

    stubber.add_response(
        "list_cluster_nodes",
        {
            "ClusterNodeSummaries": [node("i-head", "head", "Running"), node("i-gpu1", "gpu", "Running")],
            "NextToken": "page2",
        },
        {"ClusterName": "mazerl-hp", "MaxResults": 2},
    )
    stubber.add_response(
        "list_cluster_nodes",
        {"ClusterNodeSummaries": [node("i-gpu2", "gpu", "Pending", "Replacing faulty instance (GPU Xid 79)")]},
        {"ClusterName": "mazerl-hp", "MaxResults": 2, "NextToken": "page2"},
    )
    with stubber:
        rows = {r.name: r for r in check_hyperpod("mazerl-hp", client=client, page_size=2)}
    stubber.assert_no_pending_responses()
    assert rows["hyperpod.cluster"].ok
    assert (
        not rows["hyperpod.instance_groups"].ok
        and "gpu (ml.g7e.12xlarge): 2/3 Degraded DEGRADED" in rows["hyperpod.instance_groups"].found
    )
    assert "2/3 Running" in rows["hyperpod.nodes"].found and "Xid 79" in rows["hyperpod.nodes"].found, "page 2 was read"


@pytest.mark.parametrize(
    ("code", "error", "says"),
    [
        ("ResourceNotFound", HyperPodClusterNotFound, "does not exist"),
        ("AccessDeniedException", HyperPodAccessError, "sagemaker:DescribeCluster and sagemaker:ListClusterNodes"),
        ("ExpiredTokenException", HyperPodAccessError, "refresh them"),
    ],
)
def test_api_errors_say_what_to_fix_mocked_aws_with_stubber(code, error, says):
    client, stubber = stubbed_client()
    stubber.add_client_error("describe_cluster", service_error_code=code, service_message="denied or missing")
    with stubber, pytest.raises(error, match=says):
        check_hyperpod("mazerl-hp", client=client)


def test_missing_credentials_are_named_without_network(no_aws_identity):
    with pytest.raises(HyperPodAccessError, match="no AWS credentials"):
        check_hyperpod("mazerl-hp", region=REGION)


def test_aws_region_alone_gives_the_region_boto3_itself_would_not_read(monkeypatch, tmp_path):
    # given a pod with only AWS_REGION set (as EKS Pod Identity setups and our manifests do),
    from mazerl.cluster.checks.hyperpod import sagemaker_client

    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert boto3.Session().region_name is None, "boto3 alone ignores AWS_REGION"
    # when the HyperPod client is built, then it uses that region.
    assert sagemaker_client().meta.region_name == "eu-west-1"


def test_missing_region_is_named(monkeypatch, tmp_path):
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(HyperPodAccessError, match="AWS_REGION"):
        check_hyperpod("mazerl-hp")


# --- inside verify_cluster: advisory when the API cannot be asked, blocking when it answers badly ---


def hyperpod_rows_of(sagemaker_client=None):
    from mazerl.cluster.checks.verify import ReadinessRequest, verify_cluster

    with socket.socket() as probe:  # a closed port: the Ray rows fail fast, the HyperPod rows still run
        probe.bind(("127.0.0.1", 0))
        address = f"http://127.0.0.1:{probe.getsockname()[1]}"
    request = ReadinessRequest(data_root="/shared", hyperpod_cluster="mazerl-hp")
    return verify_cluster(address, request, sagemaker_client=sagemaker_client)


@pytest.mark.parametrize("missing", ["identity", "region"])
def test_a_flow_pod_without_iam_identity_or_region_gets_an_advisory_row_not_a_stop(
    no_aws_identity, monkeypatch, missing
):
    if missing == "region":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
            monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv("AWS_REGION", REGION)
    report = hyperpod_rows_of()
    (row,) = [r for r in report.rows if r.name.startswith("hyperpod.")]
    assert row.advisory and not row.ok, row
    assert ("no AWS credentials" if missing == "identity" else "AWS_REGION") in row.found, row.found
    assert "Pod Identity" in row.found and "sagemaker:ListClusterNodes" in row.found, "the message says the fix"
    assert row in report.warnings and row not in report.failures, "an optional check never stops the run"
    assert "hyperpod.cluster" not in str(ClusterNotReadyError(report)), "the not-ready message leaves it out"


def test_a_missing_permission_is_advisory_mocked_aws_with_stubber():
    client, stubber = stubbed_client()
    stubber.add_client_error(
        "describe_cluster", service_error_code="AccessDeniedException", service_message="not authorized"
    )
    with stubber:
        report = hyperpod_rows_of(sagemaker_client=client)
    (row,) = [r for r in report.rows if r.name.startswith("hyperpod.")]
    assert row.advisory and "sagemaker:DescribeCluster" in row.found


def test_a_failed_node_still_stops_the_run_mocked_aws(moto_cluster):
    node = sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].clusters["mazerl-hp"].nodes["gpu-1"]
    node.status = "Failure"
    report = hyperpod_rows_of(sagemaker_client=moto_cluster)
    rows = {r.name: r for r in report.rows}
    assert not rows["hyperpod.nodes"].ok and not rows["hyperpod.nodes"].advisory
    assert rows["hyperpod.nodes"] in report.failures, "HyperPod's answer that a node failed is a real finding"
