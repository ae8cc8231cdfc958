"""infra.settings.StackSettings: CDK context in, validated settings out (pure)."""

from __future__ import annotations

import pytest

from infra.settings import CONTEXT_KEYS, SettingsError, StackSettings
from tuning.ebs import CONTEXT_KEYS as VOLUME_CONTEXT_KEYS
from tuning.ebs import Volume, VolumeError
from tuning.instances import children_per_host, types_of


def test_defaults() -> None:
    settings = StackSettings.from_context({})
    assert settings == StackSettings()
    assert (settings.volume.kind, settings.volume.size_gib, settings.vcpus_per_job) == ("st1", 500, 2)
    assert settings.memory_per_job_mib == 7168
    assert settings.host.sysctls() == {"vm.dirty_ratio": "30", "vm.dirty_background_ratio": "20"}


def test_round_trip_through_context() -> None:
    settings = StackSettings.from_context({
        "pipelineName": "camera-prep", "volumeType": "gp3", "volumeSizeGiB": 300, "volumeIops": 5000,
        "volumeThroughput": 400, "instanceTypes": '["m7i", "c7i.4xlarge"]', "spot": True, "maxvCpus": "64",
        "vcpusPerJob": "4", "dirtyBytes": "2147483648", "dirtyBackgroundBytes": "536870912",
        "vpcId": "vpc-0123456789abcdef0",
    })
    assert settings.instance_types == ("m7i", "c7i.4xlarge")
    assert settings.host.dirty_bytes == 2147483648
    assert StackSettings.from_context(settings.to_context()) == settings
    assert set(settings.to_context()) <= set(CONTEXT_KEYS)


@pytest.mark.parametrize(("ctx", "message"), [
    ({"volumeType": "standard"}, "volumeType 'standard' is not one of"),
    ({"volumeSizeGiB": "100"}, "outside 125-16384 for st1"),
    ({"volumeIops": "3000"}, "volumeIops applies to gp3, io1 and io2, not st1"),
    ({"volumeType": "io2", "volumeSizeGiB": 100}, "needs volumeIops"),
    ({"volumeType": "gp3", "volumeThroughput": "2001"}, "outside 125-2000"),
    ({"pipelineName": "My Pipeline"}, "pipelineName 'My Pipeline'"),
    ({"vpcId": "default"}, "vpcId 'default' is not a VPC id"),
    ({"minvCpus": 8, "maxvCpus": 4}, "minvCpus 8 / maxvCpus 4"),
    ({"spot": "maybe"}, "spot='maybe' is not true or false"),
    ({"maxvCpus": "lots"}, "maxvCpus='lots' is not a whole number"),
    ({"instanceTypes": "[m6i"}, "not a JSON list"),
    ({"inputPrefix": "images"}, "inputPrefix 'images' is not a key prefix"),
    ({"retryAttempts": 11}, "retryAttempts 11 is outside 1-10"),
    ({"mountOptions": "noatime"}, "lack 'nofail'"),
    ({"dirtyRatio": 10, "dirtyBackgroundRatio": 20}, "not below dirty_ratio=10"),
    ({"childrenPerHost": 0}, "childrenPerHost 0 is outside 1-256"),
])
def test_bad_context_names_the_key_and_the_fix(ctx: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        StackSettings.from_context(ctx)


VOLUME_CONTEXTS: list[dict[str, object]] = [
    {},
    {"volumeType": "gp3", "volumeSizeGiB": 300, "volumeIops": 5000, "volumeThroughput": 400},
    {"volumeType": "io1", "volumeSizeGiB": "100", "volumeIops": "4000"},
    {"volumeType": "io2", "volumeSizeGiB": "100", "volumeIops": "64000"},
    {"volumeType": "io2", "volumeSizeGiB": 20000, "volumeIops": 3000},  # io2 goes to 64 TiB ...
    {"volumeType": "sc1", "volumeSizeGiB": "125", "volumeIops": ""},
]
BAD_VOLUME_CONTEXTS: list[dict[str, object]] = [
    {"volumeType": "standard"},
    {"volumeType": "gp2", "volumeSizeGiB": 20000},  # ... gp2 to 16 TiB
    {"volumeType": "io1", "volumeSizeGiB": 100, "volumeIops": 6000},  # io1 allows 50 IOPS per GiB
    {"volumeType": "gp3", "volumeIops": 90000},  # gp3 goes to 80,000 IOPS
    {"volumeType": "gp3", "volumeThroughput": 1000},  # needs 4000 IOPS
]


@pytest.mark.parametrize(("ctx", "good"), [(c, True) for c in VOLUME_CONTEXTS]
                         + [(c, False) for c in BAD_VOLUME_CONTEXTS])
def test_stack_reads_the_volume_exactly_as_the_model_does(ctx: dict[str, object], good: bool) -> None:
    # One validator: the stack accepts a volume exactly when Volume.from_context does, with its message.
    if not good:
        with pytest.raises(VolumeError) as model:
            Volume.from_context(ctx)
        with pytest.raises(SettingsError) as stack:
            StackSettings.from_context(ctx)
        assert str(stack.value) == str(model.value)
        return
    volume = Volume.from_context(ctx)
    settings = StackSettings.from_context(ctx)
    assert settings.volume == volume
    assert {k: v for k, v in settings.to_context().items() if k in VOLUME_CONTEXT_KEYS} == volume.to_context()
    assert StackSettings.from_context(settings.to_context()).volume.to_context() == volume.to_context()


def test_stack_context_keys_include_the_models() -> None:
    assert set(VOLUME_CONTEXT_KEYS) <= set(CONTEXT_KEYS)


def test_the_default_instance_types_fit_the_default_job_at_one_per_core() -> None:
    settings = StackSettings()
    assert settings.instance_types and all(types_of(e) for e in settings.instance_types)
    for kind in (k for e in settings.instance_types for k in types_of(e)):
        fits = children_per_host(kind, settings.vcpus_per_job)
        assert fits == kind.vcpus // settings.vcpus_per_job <= settings.children_per_host, kind.name


@pytest.mark.parametrize(("ctx", "message"), [
    # c6i: 2 GiB per vCPU cannot hold a 2-vCPU 7 GiB job at one per core (two on 8 vCPUs).
    ({"instanceTypes": "c6i.2xlarge"}, r"c6i.2xlarge has 2 GiB per vCPU and holds 2 jobs of 7 GiB .* 4 idle"),
    ({"instanceTypes": "m6i.2xlarge,c6i"}, r"entry 'c6i': c6i.large has 2 GiB per vCPU and holds 0 jobs"),
    # A family: Batch may launch its largest size, where 64 children share the one volume.
    ({"instanceTypes": "m6i"}, r"entry 'm6i' lets Batch launch m6i.32xlarge, which runs 64 children at once: each "
                               r"gets 8 GiB and 0.3 MiB/s of st1 500 GiB, less than the plan's share "
                               r"\(childrenPerHost 4: 125 GiB, 4.9 MiB/s\)"),
    # vcpusPerJob 1 reserves 2 vCPUs (a whole one per container): m6i.4xlarge's 16 run 8.
    ({"instanceTypes": "m6i.4xlarge", "vcpusPerJob": 1}, "entry m6i.4xlarge runs 8 children at once"),
    ({"instanceTypes": "r6i.4xlarge", "childrenPerHost": 7}, "runs 8 children"),
])
def test_synth_refuses_hosts_that_give_a_child_less_than_the_plan(ctx: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        StackSettings.from_context(ctx)


def test_hosts_within_the_plan_and_types_the_table_does_not_know_pass() -> None:
    assert StackSettings.from_context({"instanceTypes": "m6i", "childrenPerHost": 64}).children_per_host == 64
    assert StackSettings.from_context({"instanceTypes": "r6i.4xlarge", "childrenPerHost": 8}).instance_types
    assert StackSettings.from_context({"instanceTypes": "m7i.48xlarge"}).instance_types == ("m7i.48xlarge",)


STORE = {"scratch": "instance-store"}


@pytest.mark.parametrize(("ctx", "message"), [
    ({}, r"entry 'm6i.xlarge' has no instance store"),  # the default types have none
    ({"instanceTypes": "m6id"}, r"entry 'm6id': instance-store scratch needs exact types"),  # sizes differ
    ({"instanceTypes": "m7i.2xlarge"}, r"entry 'm7i.2xlarge': instance-store scratch needs exact types the stack "
                                       "knows"),
    ({"instanceTypes": "m6id.16xlarge"}, r"has 2 store devices"),  # striping is not built
    ({"instanceTypes": "c6id.2xlarge"}, r"c6id.2xlarge has 2 GiB per vCPU and holds 2 jobs"),
    # 474 GB (441 GiB) over 4 children: 110 GiB each, under 500 GiB / 4 = 125.
    ({"instanceTypes": "m6id.2xlarge"}, r"runs 4 children of 7 GiB, 110 GiB of store each, against the plan's "
                                        r"125 GiB \(volumeSizeGiB 500 over childrenPerHost 4\)"),
    ({"scratch": "nvme"}, r"scratch 'nvme' is not a scratch kind: use ebs or instance-store"),
])
def test_instance_store_scratch_refuses_types_it_cannot_prepare(ctx: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        StackSettings.from_context({**STORE, **ctx})


def test_instance_store_scratch_on_types_with_one_store_large_enough() -> None:
    settings = StackSettings.from_context({**STORE, "instanceTypes": "m6id.2xlarge,r6id.2xlarge,i4i.xlarge",
                                           "volumeSizeGiB": 400})
    assert settings.host.scratch == "instance-store"
    assert StackSettings.from_context(settings.to_context()) == settings
    assert "scratch" not in StackSettings().to_context()  # EBS, the default, is left implicit
