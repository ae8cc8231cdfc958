"""infra.settings.StackSettings: CDK context in, validated settings out (pure)."""

from __future__ import annotations

import pytest

from infra.settings import CONTEXT_KEYS, SettingsError, StackSettings
from tuning.ebs import CONTEXT_KEYS as VOLUME_CONTEXT_KEYS
from tuning.ebs import Volume, VolumeError


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
