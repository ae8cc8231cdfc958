"""The CDK app: `cdk synth` / `cdk deploy` run `python -m infra.app` (see cdk.json).

The settings come from CDK context; cdk-nag's AwsSolutions checks run on every synth and fail it on
any finding that is not acknowledged with a reason.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from infra.pipeline_stack import PipelineStack
from infra.settings import CONTEXT_KEYS, SettingsError, StackSettings

# Feature flags the stack relies on, set here so the CLI and in-process tests synthesize the same thing.
FEATURE_FLAGS: dict[str, Any] = {
    # Access-log delivery by bucket policy, so every bucket can keep ACLs disabled (BucketOwnerEnforced).
    "@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy": True,
    # aws-cdk-lib validates every template on synth (its bundled CloudFormation validation plugin; off only
    # with CDK_VALIDATION=false or --no-validation) but reports findings as warnings unless this flag is
    # set: a template CloudFormation would reject then fails the synth, in tests and in `cdk deploy` alike.
    "@aws-cdk/core:validateAgainstDefaultRules": True,
}


def read_context(app: cdk.App) -> dict[str, Any]:
    """The iobatch keys present in the app's context (cdk.json and -c flags)."""
    values = {key: app.node.try_get_context(key) for key in CONTEXT_KEYS}
    return {key: value for key, value in values.items() if value is not None}


def build_app(context: Mapping[str, Any] | None = None, *, outdir: str | None = None) -> tuple[cdk.App, PipelineStack]:
    """The app with its one stack; `context` adds to (and overrides) cdk.json's context."""
    app = cdk.App(context={**FEATURE_FLAGS, **(context or {})}, outdir=outdir)
    settings = StackSettings.from_context(read_context(app))
    env = None
    if settings.vpc_id is not None:
        # Looking up an existing VPC needs a concrete account and region (the CLI's credentials).
        env = cdk.Environment(
            account=os.environ.get("CDK_DEFAULT_ACCOUNT"), region=os.environ.get("CDK_DEFAULT_REGION")
        )
    stack = PipelineStack(
        app,
        settings.pipeline_name,
        settings=settings,
        env=env,
        description=f"iobatch pipeline {settings.pipeline_name}: Batch jobs with I/O profiling",
    )
    # Findings fail the synth; acknowledged ones are listed in cdk.out/validation-report.json.
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack


def main() -> None:
    try:
        app, _ = build_app()
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(64)
    app.synth()


if __name__ == "__main__":
    main()
