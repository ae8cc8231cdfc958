"""Who hears the stack's alarms: an SNS topic of yours (alarmTopicArn), or one the stack makes that e-mails an
address (alarmEmail); with neither, the alarms show on the dashboard and notify no one."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Validations
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct


class Notifications(Construct):
    """`topic`: the alarms' SNS topic (None: no one is told); `watch(*alarms)` sends each one's state changes to it."""

    def __init__(self, scope: Construct, construct_id: str, *, topic_arn: str | None, email: str | None) -> None:
        super().__init__(scope, construct_id)
        self.topic: sns.ITopic | None = None
        if topic_arn is not None:
            self.topic = sns.Topic.from_topic_arn(self, "Topic", topic_arn)
        elif email is not None:
            topic = sns.Topic(self, "Topic", enforce_ssl=True)
            # Not encrypted: CloudWatch cannot publish an alarm to a topic under the AWS-managed key aws/sns, whose
            # policy does not let cloudwatch.amazonaws.com use it (AWS Knowledge Center, "Why didn't I receive an SNS
            # notification for my CloudWatch alarm trigger?"); a key of the stack's own would cost $1 a month to
            # guard an alarm's name and state.
            Validations.of(topic).acknowledge(Acknowledgment(
                id="AwsSolutions::AwsSolutions-SNS2",
                reason="the topic carries alarm state changes only; CloudWatch cannot publish to a topic under the "
                "AWS-managed aws/sns key, and a customer key for alarm names is not worth its monthly price"))
            self.topic = topic
        if email is not None and self.topic is not None:
            # SNS e-mails a confirmation first: nothing is delivered until the address confirms the subscription.
            self.topic.add_subscription(subscriptions.EmailSubscription(email))

    def watch(self, *alarms: cw.Alarm) -> None:
        if self.topic is None:
            return
        action = cw_actions.SnsAction(self.topic)
        for alarm in alarms:
            alarm.add_alarm_action(action)
            alarm.add_ok_action(action)
