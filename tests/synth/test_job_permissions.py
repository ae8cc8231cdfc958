"""The job's "does it exist" checks (a child's _SUCCESS marker, the frozen index) against the job role's
synthesized policy: the calls the real code makes, recorded by botocore's Stubber, are each allowed by a
statement of the policy, with the request's s3:prefix matched against the statement's condition.

HeadObject is not used: for a missing key it answers 403 instead of 404 to a caller without s3:ListBucket,
and the role's ListBucket is scoped by an s3:prefix condition a HeadObject request does not carry.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from pipeline import s3 as s3io
from pipeline.settings import JobSettings, S3Uri
from tests.support.synth import Synthesized, cfn_text, job_role_statements, listed

# The IAM action each S3 operation needs ("Actions, resources, and condition keys for Amazon S3", Service
# Authorization Reference: ListObjectsV2 is authorized by s3:ListBucket, HeadObject by s3:GetObject).
IAM_ACTION = {"ListObjectsV2": "s3:ListBucket", "HeadObject": "s3:GetObject"}
OUTPUT = "out-bucket"


def allowed(statements: list[dict[str, Any]], arns: dict[str, str], action: str, resource: str,
            prefix: str | None) -> bool:
    """Whether an Allow statement grants `action` on `resource` (with its s3:prefix condition, if any)."""
    for statement in statements:
        if statement["Effect"] != "Allow" or action not in listed(statement["Action"]):
            continue
        patterns = [cfn_text(r) for r in listed(statement["Resource"])]
        patterns = [arns.get(p.split("/", 1)[0], p) + ("/" + p.split("/", 1)[1] if "/" in p else "")
                    for p in patterns]
        if not any(fnmatch.fnmatchcase(resource, p) for p in patterns):
            continue
        condition = statement.get("Condition", {})
        wanted = condition.get("StringLike", {}).get("s3:prefix")
        if wanted is not None and (prefix is None or not any(fnmatch.fnmatchcase(prefix, w) for w in wanted)):
            continue
        assert set(condition) <= {"StringLike"}, f"a condition this check does not read: {condition}"
        return True
    return False


@pytest.fixture
def recorded() -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
    calls: list[tuple[str, dict[str, Any]]] = []
    client.meta.events.register("provide-client-params.s3.*",
                                lambda params, model, **kw: calls.append((model.name, dict(params))))
    return client, calls


def test_the_marker_and_index_checks_are_listings_the_job_role_may_make(
    synthesized: Synthesized, recorded: tuple[Any, list[tuple[str, dict[str, Any]]]]
) -> None:
    client, calls = recorded
    settings = JobSettings(input=S3Uri("in-bucket", "images/"), output=S3Uri(OUTPUT, "shards/2026-11-22-k200/"),
                           manifest=None, scratch_root=Path("/scratch"), images_per_child=200,
                           array_index=7, job_id="j")
    marker = settings.child_output.join(s3io.SUCCESS_MARKER)
    index = settings.output.join("_batch/manifest.idx")
    with Stubber(client) as stub:  # an unexpected call (HeadObject) fails the stub
        stub.add_response("list_objects_v2", {"Contents": [{"Key": marker.key + ".tmp", "Size": 1}]},
                          {"Bucket": OUTPUT, "Prefix": marker.key, "MaxKeys": 1})
        stub.add_response("list_objects_v2", {"Contents": [{"Key": index.key, "Size": 48}]},
                          {"Bucket": OUTPUT, "Prefix": index.key, "MaxKeys": 1})
        assert s3io.exists(client, marker) is False  # a longer key under the same prefix is not the marker
        assert s3io._size(client, index) == 48
        stub.assert_no_pending_responses()

    _, statements = job_role_statements(synthesized)
    [output_id] = [k for k in synthesized.resources("AWS::S3::Bucket") if k.startswith("StorageOutput")]
    arns = {f"<{output_id}.Arn>": f"arn:aws:s3:::{OUTPUT}"}
    assert [name for name, _ in calls] == ["ListObjectsV2", "ListObjectsV2"]
    for name, params in calls:
        assert allowed(statements, arns, IAM_ACTION[name], f"arn:aws:s3:::{params['Bucket']}", params["Prefix"]), \
            (name, params)
    # The same check outside the output prefix is refused: the evaluation can say no.
    assert not allowed(statements, arns, "s3:ListBucket", f"arn:aws:s3:::{OUTPUT}", "elsewhere/_SUCCESS")
