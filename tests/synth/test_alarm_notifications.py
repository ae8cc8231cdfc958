"""Who hears the stack's alarms: -c alarmEmail=... makes an SNS topic that e-mails the address, -c alarmTopicArn=...
uses a topic of yours; either way every alarm (the host-setup one and the refused-EMF ones) sends its state changes
there. With neither, the alarms notify no one, as before."""

from __future__ import annotations

from typing import Any

import pytest

from infra.settings import SettingsError, StackSettings
from tests.support.synth import synthesize

TOPIC_ARN = "arn:aws:sns:us-east-1:123456789012:iobatch-alarms"


def alarms(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::CloudWatch::Alarm"]


def of_type(template: dict[str, Any], cfn_type: str) -> list[dict[str, Any]]:
    return [r["Properties"] for r in template["Resources"].values() if r["Type"] == cfn_type]


def test_an_email_gets_every_alarm_through_the_stacks_own_topic() -> None:
    template = synthesize(alarmEmail="ops@example.com").template
    (topic_id,) = [k for k, r in template["Resources"].items() if r["Type"] == "AWS::SNS::Topic"]
    (subscription,) = of_type(template, "AWS::SNS::Subscription")
    assert (subscription["Protocol"], subscription["Endpoint"]) == ("email", "ops@example.com")
    found = alarms(template)
    assert len(found) == 3  # the host-setup alarm and the two refused-EMF alarms
    for alarm in found:
        assert alarm["AlarmActions"] == [{"Ref": topic_id}] and alarm["OKActions"] == [{"Ref": topic_id}]


def test_a_topic_of_yours_gets_them_and_none_is_made() -> None:
    template = synthesize(alarmTopicArn=TOPIC_ARN).template
    assert of_type(template, "AWS::SNS::Topic") == [] and of_type(template, "AWS::SNS::Subscription") == []
    assert all(alarm["AlarmActions"] == [TOPIC_ARN] for alarm in alarms(template))


@pytest.mark.parametrize(("ctx", "message"), [
    ({"alarmEmail": "ops at example.com"}, "alarmEmail 'ops at example.com' is not an e-mail address"),
    ({"alarmTopicArn": "iobatch-alarms"}, "alarmTopicArn 'iobatch-alarms' is not an SNS topic ARN"),
])
def test_a_bad_address_or_arn_is_one_line_naming_the_key(ctx: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        StackSettings.from_context(ctx)
