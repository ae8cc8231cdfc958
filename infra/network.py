"""The VPC: a new one with private subnets behind one NAT gateway, or an existing one by id."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct


class Network(Construct):
    """Private subnets with egress for the Batch hosts, a flow log, and an S3 gateway endpoint.

    The gateway endpoint matters here: every image moves between S3 and the hosts, and through the
    endpoint it costs nothing, where through the NAT gateway it costs per GiB. An existing VPC gets one on the route
    tables of the private subnets the hosts use, unless `s3_endpoint` is False (the VPC has one there already).
    """

    def __init__(self, scope: Construct, construct_id: str, *, vpc_id: str | None = None,
                 s3_endpoint: bool = True) -> None:
        super().__init__(scope, construct_id)
        self.imported = vpc_id is not None
        self.subnets = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        if vpc_id is not None:
            # The lookup runs at synth time and is cached in cdk.context.json (needs credentials once).
            self.vpc: ec2.IVpc = ec2.Vpc.from_lookup(self, "Vpc", vpc_id=vpc_id)
            if s3_endpoint:
                # A gateway endpoint costs nothing and takes S3 traffic off the NAT gateway ("Gateway endpoints for
                # Amazon S3", AWS PrivateLink guide). A route table holds one endpoint route per service ("Gateway
                # endpoints", Routing): a VPC with one on these route tables deploys with s3GatewayEndpoint=false.
                self.vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3,
                                              subnets=[self.subnets])
            return
        vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=2,
            nat_gateways=1,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(
                    name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20
                ),
            ],
            gateway_endpoints={
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
            },
        )
        # Removed with the stack, as the README's Deploy section says (CDK retains a LogGroup by default).
        flow_log_group = logs.LogGroup(self, "FlowLogs", retention=logs.RetentionDays.ONE_MONTH,
                                       removal_policy=RemovalPolicy.DESTROY)
        vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.REJECT,
        )
        self.vpc = vpc
