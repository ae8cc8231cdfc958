"""Security of the synthesized stack as a whole: what the job role can read, whatever grants it.

tests/synth/test_stack.py checks the statements the stack writes for the job role by Sid; this file
checks the effect: every statement of every policy that reaches the job role (inline, attached or
managed), so a grant added anywhere later cannot widen what a job may read.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.synth import Synthesized, cfn_text, job_role_statements, listed

# Actions that read object bytes or metadata, or list keys.
READS = re.compile(r"^(s3:(Get|List)\w*|s3:\*|\*)$")
ROOT = Path(__file__).resolve().parents[2]


def test_job_role_reads_nothing_outside_its_input_and_output_prefixes(synthesized: Synthesized) -> None:
    _, found = job_role_statements(synthesized)
    [input_bucket] = [k for k in synthesized.resources("AWS::S3::Bucket") if k.startswith("StorageInput")]
    [output_bucket] = [k for k in synthesized.resources("AWS::S3::Bucket") if k.startswith("StorageOutput")]
    input_objects, output_objects = f"<{input_bucket}.Arn>/images/*", f"<{output_bucket}.Arn>/shards/*"
    readers = 0
    for statement in found:
        assert statement["Effect"] == "Allow" and "NotAction" not in statement and "NotResource" not in statement
        reads = [a for a in listed(statement["Action"]) if READS.match(a)]
        if not reads:
            continue
        readers += 1
        resources = [cfn_text(r) for r in listed(statement["Resource"])]
        assert "*" not in resources, statement
        for action in reads:
            if action == "s3:ListBucketMultipartUploads":
                # Upload keys and ids, not object contents; no s3:prefix condition key exists for it.
                assert resources == [f"<{output_bucket}.Arn>"], statement
            elif action == "s3:ListBucket":
                # Listing is on the bucket ARN, narrowed to the prefix by a condition.
                prefixes = statement["Condition"]["StringLike"]["s3:prefix"]
                assert (resources, prefixes) in (([f"<{input_bucket}.Arn>"], ["images/*"]),
                                                 ([f"<{output_bucket}.Arn>"], ["shards/*"])), statement
            else:
                # Objects: the input prefix, or its own output prefix (markers, the frozen manifest).
                assert set(resources) <= {input_objects, output_objects}, statement
    assert readers >= 2
    # The input images in particular: exactly one statement reads them, and only under the prefix.
    image_readers = [s for s in found if any(cfn_text(r).startswith(f"<{input_bucket}.Arn>/")
                                             for r in listed(s["Resource"]))]
    assert [[cfn_text(r) for r in listed(s["Resource"])] for s in image_readers] == [[input_objects]]


def test_the_container_runs_as_a_non_root_user() -> None:
    dockerfile = (ROOT / "containers" / "job" / "Dockerfile").read_text()
    users = [line.split(None, 1)[1].strip() for line in dockerfile.splitlines() if line.startswith("USER ")]
    assert users, "the job image has no USER line: it would run as root"
    assert users[-1] not in ("root", "0", "0:0"), users[-1]
