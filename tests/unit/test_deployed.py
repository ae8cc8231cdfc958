"""A deployed stack's plan read back from the context it publishes (tuning.deployed), and the deploy that applies an
advice to it: the context the stack's owner writes (infra.settings.StackSettings.to_context) round trips, and the
printed command hands make and the CDK CLI exactly those pairs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from infra import settings as settings_keys
from infra.settings import ALARM_EMAIL_KEY, ALARM_TOPIC_KEY, StackSettings
from tests.support.profiles import batch
from tuning import deployed as deployed_keys
from tuning.advice_text import render
from tuning.advise import advise
from tuning.deployed import KEPT_FROM_CDK_JSON, Deployed, DeployedError, make_deploy
from tuning.ebs import Volume
from tuning.host import HostTuning
from tuning.instances import lookup
from tuning.instancestore import InstanceStore
from tuning.plan import Plan

CONTEXT = {"instanceTypes": "m6i.4xlarge,r6i.4xlarge", "vcpusPerJob": "4", "childrenPerHost": "4",
           "volumeType": "gp3", "volumeSizeGiB": "300", "volumeIops": "4000", "dirtyRatio": "none",
           "dirtyBackgroundRatio": "none", "dirtyBytes": str(2 << 30), "dirtyBackgroundBytes": str(1 << 30),
           "mountOptions": "noatime,nofail", "pipelineName": "batch-a", "vpcId": "vpc-0123456789abcdef0"}


def published(context: dict[str, str]) -> str:
    """The DeployContext output of a stack deployed with `context` (infra/pipeline_stack.py writes it so)."""
    return json.dumps(StackSettings.from_context(context).published_context(), separators=(",", ":"))


def test_the_published_context_gives_back_what_the_stack_was_deployed_with() -> None:
    deployed = Deployed.from_output(published(CONTEXT), "batch-a")
    assert deployed.instance_types == ("m6i.4xlarge", "r6i.4xlarge") and deployed.vcpus_per_job == 4
    assert deployed.volume == Volume("gp3", 300, iops=4000, throughput_mibps=125.0)
    assert deployed.tuning == HostTuning(dirty_ratio=None, dirty_background_ratio=None, dirty_bytes=2 << 30,
                                         dirty_background_bytes=1 << 30, mount_options=("noatime", "nofail"))
    # Every key, as the stack wrote it: the same settings again (gp3's throughput written out at its default).
    assert StackSettings.from_context(deployed.context) == StackSettings.from_context(
        {**CONTEXT, "volumeThroughput": "125"})


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "publishes no deployed context (its DeployContext output is missing)"),
    ("[1]", "its DeployContext output is not a JSON object"),
    ('{"volumeType": "st9"}', "stack s's DeployContext output: volumeType 'st9'"),
    ('{"instanceTypes": "[\\"m6i\\""}', "stack s's DeployContext output:"),
    ('{"vcpusPerJob": "two"}', "stack s's DeployContext output:"),
])
def test_a_context_that_cannot_be_read_is_one_line_naming_the_stack_and_the_fix(text: str, fragment: str) -> None:
    with pytest.raises(DeployedError, match="redeploy it with this version") as caught:
        Deployed.from_output(text, "s")
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_the_plans_type_is_the_one_the_batch_ran_on_else_the_one_the_volume_is_sized_for() -> None:
    deployed = Deployed.from_output(published({"instanceTypes": "m6i.xlarge,m6i.2xlarge,r6i.xlarge"}), "s")
    kind, why = deployed.instance_type(["m6i.xlarge", "m6i.2xlarge", "m6i.xlarge", "c7i.large", ""])
    assert (kind and kind.name, why) == ("m6i.xlarge", "the stack's type most documents ran on (2)")
    kind, why = deployed.instance_type([])  # no document says: four 2-vCPU children fit m6i.2xlarge, two the others
    assert (kind and kind.name, why) == ("m6i.2xlarge", "the stack's type that runs the most children at once")
    unknown = Deployed.from_output(published({"instanceTypes": "m7i.2xlarge"}), "s")
    assert unknown.instance_type(["m7i.2xlarge"]) == (None, "")


def test_instance_store_scratch_is_the_store_of_the_plans_type_already_in_its_price() -> None:
    context = {"scratch": "instance-store", "instanceTypes": "m6id.2xlarge", "volumeSizeGiB": "125"}
    deployed = Deployed.from_output(published(context), "s")
    m6id = lookup("m6id.2xlarge")
    assert m6id is not None
    assert deployed.scratch_volume(m6id) == InstanceStore.of(m6id, 0.0)
    assert deployed.scratch_volume(None) == InstanceStore.of(m6id, 0.0)


def test_the_advice_replaces_the_stacks_volume_and_host_tuning_whole_and_keeps_the_rest() -> None:
    deployed = Deployed.from_output(published({**CONTEXT, "dirtyExpireCentisecs": "1500"}), "batch-a")
    advised = {"volumeType": "st1", "volumeSizeGiB": "500", "dirtyRatio": "none", "dirtyBackgroundRatio": "none",
               "dirtyBytes": "1073741824", "dirtyBackgroundBytes": "536870912", "mountOptions": "noatime,nofail",
               "instanceTypes": "m6i.4xlarge", "childrenPerHost": "4"}
    kept = deployed.apply(advised, keep_hosts=True)
    assert "volumeIops" not in kept and "dirtyExpireCentisecs" not in kept  # the advice's volume and tuning, whole
    assert {k: kept[k] for k in advised if k not in ("instanceTypes", "childrenPerHost")} == \
        {k: v for k, v in advised.items() if k not in ("instanceTypes", "childrenPerHost")}
    assert json.loads(kept["instanceTypes"]) == ["m6i.4xlarge", "r6i.4xlarge"]
    assert (kept["pipelineName"], kept["vpcId"], kept["vcpusPerJob"]) == ("batch-a", "vpc-0123456789abcdef0", "4")
    assert deployed.apply(advised, keep_hosts=False)["instanceTypes"] == "m6i.4xlarge"


def test_who_hears_the_alarms_is_not_published_and_the_advice_says_the_deploy_keeps_cdk_jsons() -> None:
    # Anyone allowed DescribeStacks reads the output: no alarm key in it, so none in the printed deploy, and the text
    # says where the user's alarm setting comes from then (above the command, which stays the last line).
    context = {**CONTEXT, ALARM_EMAIL_KEY: "ops@example.com",
               ALARM_TOPIC_KEY: "arn:aws:sns:us-east-1:123456789012:iobatch-alarms"}
    assert set(deployed_keys.UNPUBLISHED_KEYS) == set(settings_keys.UNPUBLISHED_KEYS) == {ALARM_EMAIL_KEY,
                                                                                            ALARM_TOPIC_KEY}
    text = published(context)
    assert "ops@example.com" not in text and "iobatch-alarms" not in text
    deployed = Deployed.from_output(text, "batch-a")
    assert StackSettings.from_context(deployed.context) == StackSettings.from_context(
        {**CONTEXT, "volumeThroughput": "125"})  # everything else, as before
    advice = advise(batch(), Plan(jobs_per_instance=4, memory_gib=64, jobs_per_day=100))
    command = make_deploy(deployed.apply(advice.context, keep_hosts=True))
    assert "alarm" not in command
    lines = render(advice, deploy=command).splitlines()
    assert lines[-1] == f"  {command}"
    assert lines[-2].startswith("To apply it (") and KEPT_FROM_CDK_JSON in lines[-2]


def test_the_advised_cache_keeps_the_stacks_own_host_settings() -> None:
    current = HostTuning(mount_options=("noatime", "nofail"), dirty_expire_centisecs=1500, scratch="instance-store")
    advice = advise(batch(), Plan(jobs_per_instance=4, memory_gib=32, jobs_per_day=100, current_tuning=current))
    tuning = advice.cache.tuning
    assert (tuning.mount_options, tuning.dirty_expire_centisecs) == (("noatime", "nofail"), 1500)
    assert tuning.scratch == "ebs" and tuning.dirty_ratio is None and tuning.dirty_bytes  # EBS, the bytes form


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_printed_deploy_hands_make_and_the_cdk_cli_exactly_the_pairs(tmp_path: Path) -> None:
    context = {"instanceTypes": '["m6i.xlarge", "r6i.2xlarge"]', "processCommand": "tool --in {input} $HOME it's",
               "mountOptions": "noatime,nofail", "jobImage": 'a\\b"c`d'}
    makefile = tmp_path / "Makefile"
    # The project's Makefile runs `cdk deploy $(CDK_ARGS)`: here the words the CLI would get, one a line.
    makefile.write_text("deploy:\n\t@printf '%s\\n' $(CDK_ARGS)\n", encoding="utf-8")
    command = make_deploy(context)
    assert command.startswith('make deploy CDK_ARGS="')
    # --no-print-directory: under `make test` (MAKELEVEL set) make says where it enters, in the words' stream
    words = subprocess.run(["bash", "-c", command.replace("make deploy",
                                                          f"make -s --no-print-directory -f {makefile} deploy", 1)],
                           check=True, capture_output=True, text=True).stdout.splitlines()
    assert words == [w for key, value in context.items() for w in ("-c", f"{key}={value}")]
