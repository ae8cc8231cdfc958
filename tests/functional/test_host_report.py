"""A host whose setup failed says why where it outlives the host, before it shuts down: one JSON event in the
pipeline's log group, naming the instance and the reason.

The failure path runs for real, with no AWS CLI on PATH (the ECS-optimized AL2023 AMI has none): curl and python3
talk to a stand-in HTTP server on 127.0.0.1 that answers as IMDSv2 and CloudWatch Logs do, and the test checks the
calls that arrive, their Signature Version 4 recomputed with botocore's signer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.support.loopback import Quiet, serving
from tuning.host import HostReport, HostTuning

RECORDER = """#!/bin/bash
printf '%s %s\\n' "$(date +%s.%N)" "$(basename "$0") $*" >> {log}
exit 0
"""
TOKEN, ROLE = "imds-token-1", "iobatch-host-role"
CREDENTIALS = {"AccessKeyId": "ASIAEXAMPLEKEY000001", "SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
               "Token": "IQoJb3JpZ2luX2VjEXAMPLE//token=="}
META = {"instance-id": "i-0123456789abcdef0", "instance-type": "m6i.2xlarge", "iam/security-credentials/": ROLE,
        f"iam/security-credentials/{ROLE}": json.dumps({"Code": "Success", **CREDENTIALS}),
        "placement/region": "eu-west-1", "services/domain": "amazonaws.com"}


class StandIn(Quiet):
    """IMDSv2 (a token from PUT, meta-data only with it) and CloudWatch Logs (POST /, recorded)."""

    calls: list[dict[str, Any]]

    def _answer(self, code: int, body: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self._answer(200, TOKEN) if ok else self._answer(400, "")

    def do_GET(self) -> None:
        path = self.path.removeprefix("/latest/meta-data/")
        if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
            self._answer(401, "")
        else:
            self._answer(200, META[path]) if path in META else self._answer(404, "")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.calls.append({"time": time.time(), "path": self.path, "headers": dict(self.headers.items()),
                           "body": body})
        self._answer(200, "{}")


@pytest.fixture
def stand_in() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    calls: list[dict[str, Any]] = []
    handler = type("Handler", (StandIn,), {"calls": calls})
    with serving(handler) as url:
        yield url, calls


def path_without_aws() -> str:
    """This machine's PATH less every folder that has an `aws` (the dev tools install the CLI in the venv)."""
    folders = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "aws").exists()]
    path = os.pathsep.join(folders)
    assert shutil.which("aws", path=path) is None and shutil.which("python3", path=path)
    return path


def recomputed_signature(url: str, call: dict[str, Any], signed: list[str]) -> str:
    """botocore's SigV4 signature of the request as it arrived, over the headers it says it signed."""
    headers = {name: value for name, value in call["headers"].items() if name.lower() in signed}
    request = AWSRequest(method="POST", url=url, data=call["body"], headers=headers)
    request.context["timestamp"] = call["headers"]["X-Amz-Date"]
    auth = SigV4Auth(Credentials(CREDENTIALS["AccessKeyId"], CREDENTIALS["SecretAccessKey"], CREDENTIALS["Token"]),
                     "logs", "eu-west-1")
    return auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)


def test_a_failed_setup_posts_its_reason_signed_without_the_aws_cli_before_shutting_down(
        tmp_path: Path, stand_in: tuple[str, list[dict[str, Any]]]) -> None:
    base, calls = stand_in
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for tool in ("systemctl", "shutdown"):
        (bin_dir / tool).write_text(RECORDER.format(log=log))
        (bin_dir / tool).chmod(0o755)
    mount_point = tmp_path / "scratch"
    mount_point.mkdir()
    script = HostTuning(mount_point=str(mount_point)).render_script(
        device="/dev/iobatch-no-such-disk", report=HostReport("/aws/batch/iobatch", "iobatch"))
    env = {"PATH": f"{bin_dir}{os.pathsep}{path_without_aws()}", "HOME": str(tmp_path), "IOBATCH_FSTAB": "",
           "IOBATCH_SYSCTL_CONF": str(tmp_path / "90-iobatch.conf"), "IOBATCH_IMDS": base,
           "IOBATCH_LOGS_ENDPOINT": f"{base}/"}
    started = time.time()
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "not written" not in result.stderr and "could not write" not in result.stderr, result.stderr

    targets = [call["headers"]["X-Amz-Target"] for call in calls]
    assert targets == ["Logs_20140328.CreateLogStream", "Logs_20140328.PutLogEvents"]
    shutdown = [float(line.split()[0]) for line in log.read_text().splitlines() if " shutdown " in line]
    assert shutdown and calls[-1]["time"] < shutdown[0]
    where = {"logGroupName": "/aws/batch/iobatch", "logStreamName": "host-setup/i-0123456789abcdef0"}
    assert json.loads(calls[0]["body"]) == where
    put = json.loads(calls[1]["body"])
    [event] = put.pop("logEvents")
    assert put == where and started * 1000 - 1000 <= event["timestamp"] <= time.time() * 1000
    assert json.loads(event["message"]) == {
        "HostSetup": "failed", "Pipeline": "iobatch", "InstanceId": "i-0123456789abcdef0",
        "InstanceType": "m6i.2xlarge", "Reason": "scratch device /dev/iobatch-no-such-disk is not a block device"}

    for call in calls:
        headers = call["headers"]
        assert call["path"] == "/" and headers["Content-Type"] == "application/x-amz-json-1.1"
        assert headers["X-Amz-Security-Token"] == CREDENTIALS["Token"]
        scheme, credential, signed_headers, signature = headers["Authorization"].replace(",", "").split()
        assert scheme == "AWS4-HMAC-SHA256"
        assert credential == f"Credential={CREDENTIALS['AccessKeyId']}/{headers['X-Amz-Date'][:8]}/eu-west-1/logs/" \
                             "aws4_request"
        signed = signed_headers.removeprefix("SignedHeaders=").split(";")
        assert {"host", "x-amz-date", "x-amz-security-token", "x-amz-target", "content-type"} <= set(signed)
        assert signature == f"Signature={recomputed_signature(f'{base}/', call, signed)}"
