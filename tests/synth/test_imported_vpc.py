"""`-c vpcId=...`: the stack in an existing VPC gets an S3 gateway endpoint on the route tables of the private subnets
its hosts use (image bytes would otherwise pay the NAT gateway per GB), and none with -c s3GatewayEndpoint=false for a
VPC that has one there already. The VPC lookup is answered as `cdk` answers it from cdk.context.json."""

from __future__ import annotations

from typing import Any

import pytest

from infra.app import build_app

VPC_ID = "vpc-0a1b2c3d4e5f60718"
ROUTE_TABLES = ["rtb-0aaaaaaaaaaaaaaa1", "rtb-0aaaaaaaaaaaaaaa2"]
# What the VPC context provider records for a VPC with two private subnets with egress and one public subnet
# (cdk.context.json's vpc-provider entry, asymmetric form).
LOOKUP = {
    "vpcId": VPC_ID, "vpcCidrBlock": "10.0.0.0/16", "ownerAccountId": "123456789012",
    "availabilityZones": [],
    "subnetGroups": [
        {"name": "private", "type": "Private", "subnets": [
            {"subnetId": "subnet-0aaaaaaaaaaaaaaa1", "cidr": "10.0.0.0/20", "availabilityZone": "us-east-1a",
             "routeTableId": ROUTE_TABLES[0]},
            {"subnetId": "subnet-0aaaaaaaaaaaaaaa2", "cidr": "10.0.16.0/20", "availabilityZone": "us-east-1b",
             "routeTableId": ROUTE_TABLES[1]}]},
        {"name": "public", "type": "Public", "subnets": [
            {"subnetId": "subnet-0bbbbbbbbbbbbbbb1", "cidr": "10.0.32.0/24", "availabilityZone": "us-east-1a",
             "routeTableId": "rtb-0bbbbbbbbbbbbbbb1"}]},
    ],
}


def synth(monkeypatch: pytest.MonkeyPatch, **context: str) -> dict[str, Any]:
    """The stack's template in the imported VPC, its lookup answered under the key Vpc.from_lookup asks for."""
    import aws_cdk as cdk

    monkeypatch.setenv("CDK_DEFAULT_ACCOUNT", "123456789012")
    monkeypatch.setenv("CDK_DEFAULT_REGION", "us-east-1")
    scratch = cdk.Stack(cdk.App(), "Lookup", env=cdk.Environment(account="123456789012", region="us-east-1"))
    key = cdk.ContextProvider.get_key(scratch, provider="vpc-provider", props={
        "filter": {"vpc-id": VPC_ID}, "returnAsymmetricSubnets": True}).key
    app, stack = build_app({"vpcId": VPC_ID, **context, key: LOOKUP})
    # Unanswered (its key changed), the lookup's dummy ids (vpc-12345) would fail the template validation here.
    return dict(app.synth().get_stack_artifact(stack.artifact_id).template)


def endpoints(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::EC2::VPCEndpoint"]


def test_an_imported_vpc_gets_an_s3_gateway_endpoint_on_its_private_route_tables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    template = synth(monkeypatch)
    (endpoint,) = endpoints(template)
    assert endpoint["VpcEndpointType"] == "Gateway" and endpoint["VpcId"] == VPC_ID
    assert endpoint["ServiceName"] == {"Fn::Join": ["", ["com.amazonaws.", {"Ref": "AWS::Region"}, ".s3"]]}
    assert sorted(endpoint["RouteTableIds"]) == ROUTE_TABLES  # the hosts' subnets' tables, not the public one
    # The hosts are in those subnets.
    (environment,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Batch::ComputeEnvironment"]
    assert sorted(environment["Properties"]["ComputeResources"]["Subnets"]) == [
        "subnet-0aaaaaaaaaaaaaaa1", "subnet-0aaaaaaaaaaaaaaa2"]


def test_a_vpc_that_has_one_already_gets_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert endpoints(synth(monkeypatch, s3GatewayEndpoint="false")) == []
