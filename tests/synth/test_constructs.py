"""Constructs alone in a bare stack, for the settings the full-stack fixture does not cover."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import assertions
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs

from infra.app import build_app
from infra.compute import Compute, block_device_volume, ebs_volume_type
from infra.settings import SettingsError, StackSettings
from tuning.ebs import LIMITS, VOLUME_TYPES, Volume


def compute_template(settings: StackSettings) -> assertions.Template:
    stack = cdk.Stack()
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1, nat_gateways=0, subnet_configuration=[
        ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])
    Compute(stack, "Compute", settings=settings, vpc=vpc,
            subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED),
            log_group=logs.LogGroup.from_log_group_name(stack, "Logs", "/iobatch/test"))
    return assertions.Template.from_stack(stack)


def test_gp3_with_iops_throughput_on_spot() -> None:
    settings = StackSettings.from_context({
        "volumeType": "gp3", "volumeSizeGiB": "200", "volumeIops": "6000", "volumeThroughput": "500",
        "spot": "true", "instanceTypes": "m6i.2xlarge,c7i",
    })
    template = compute_template(settings)
    template.has_resource_properties("AWS::EC2::LaunchTemplate", {
        "LaunchTemplateData": assertions.Match.object_like({
            "BlockDeviceMappings": [{"DeviceName": "/dev/xvdb", "Ebs": {
                "DeleteOnTermination": True, "Encrypted": True, "VolumeSize": 200, "VolumeType": "gp3",
                "Iops": 6000, "Throughput": 500}}],
        })
    })
    template.has_resource_properties("AWS::Batch::ComputeEnvironment", {
        "ComputeResources": assertions.Match.object_like({
            "Type": "SPOT",
            "AllocationStrategy": "SPOT_PRICE_CAPACITY_OPTIMIZED",
            "InstanceTypes": ["m6i.2xlarge", "c7i"],
        })
    })


@pytest.mark.parametrize("kind", VOLUME_TYPES)
def test_every_kind_the_model_accepts_maps_to_a_cdk_volume_type(kind: str) -> None:
    # infra keeps no list of kinds: whatever tuning.ebs accepts must be a CDK EbsDeviceVolumeType.
    assert ebs_volume_type(kind).value == kind.upper()
    limits = LIMITS[kind]
    iops = limits.iops[0] if limits.iops is not None and limits.iops_required else None
    block_device_volume(Volume(kind, max(limits.size_gib[0], 6), iops=iops))


def test_io1_reaches_the_launch_template() -> None:
    settings = StackSettings.from_context({"volumeType": "io1", "volumeSizeGiB": "100", "volumeIops": "4000"})
    compute_template(settings).has_resource_properties("AWS::EC2::LaunchTemplate", {
        "LaunchTemplateData": assertions.Match.object_like({
            "BlockDeviceMappings": [{"DeviceName": "/dev/xvdb", "Ebs": {
                "DeleteOnTermination": True, "Encrypted": True, "VolumeSize": 100, "VolumeType": "io1",
                "Iops": 4000}}],
        })
    })


def test_bytes_form_tuning_reaches_the_user_data() -> None:
    settings = StackSettings.from_context({"dirtyBytes": 1 << 30, "dirtyBackgroundBytes": 1 << 28,
                                           "mountOptions": "noatime,nofail"})
    script = settings.host.render_script()
    assert "vm.dirty_bytes = 1073741824\n" in script and "vm.dirty_ratio" not in script
    template = compute_template(settings)
    user_data = next(iter(template.find_resources("AWS::EC2::LaunchTemplate").values()))[
        "Properties"]["LaunchTemplateData"]["UserData"]
    # The script is one part of the multipart user data, with the log group's name resolved into it.
    assert json.dumps(script.split("\nFAILURE_LOG_GROUP=")[0])[1:-1] in json.dumps(user_data)


def test_bad_context_stops_the_app_with_the_key_named() -> None:
    with pytest.raises(SettingsError, match=r"mount option 'nobarrier'"):
        build_app({"mountOptions": "noatime,nobarrier,nofail"})
    with pytest.raises(SettingsError, match="instanceTypes entry 'q9z'"):
        build_app({"instanceTypes": "q9z"})
    # The families of old: c6i cannot hold the default job at one per core, and m6i.32xlarge runs 64 children.
    with pytest.raises(SettingsError, match=r"entry 'm6i' lets Batch launch m6i.32xlarge, which runs 64 children"):
        build_app({"instanceTypes": '["m6i", "c6i", "r6i"]'})
    with pytest.raises(SettingsError, match=r"c6i\.2xlarge has 2 GiB per vCPU"):
        build_app({"instanceTypes": "c6i.2xlarge"})
