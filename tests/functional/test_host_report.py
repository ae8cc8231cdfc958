"""A host whose setup failed says why where it outlives the host, before it shuts down: one JSON event in the
pipeline's log group (through the AWS CLI, stood in for here), naming the instance (from IMDS, stood in for by a
curl that answers as IMDSv2 does) and the reason."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tuning.host import HostReport, HostTuning

RECORDER = """#!/bin/bash
printf '%s\\n' "$(basename "$0") $*" >> {log}
exit 0
"""
# IMDSv2 from the host: a token from PUT /latest/api/token, then the meta-data with it.
CURL = """#!/bin/bash
for arg in "$@"; do url="$arg"; done
case "$url" in
  */latest/api/token) echo -n token-1 ;;
  */meta-data/instance-id) echo -n i-0123456789abcdef0 ;;
  */meta-data/instance-type) echo -n m6i.2xlarge ;;
  *) exit 22 ;;
esac
"""


def test_a_failed_setup_writes_its_reason_to_the_log_group_before_shutting_down(tmp_path: Path) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for tool in ("systemctl", "shutdown", "aws"):
        (bin_dir / tool).write_text(RECORDER.format(log=log))
        (bin_dir / tool).chmod(0o755)
    (bin_dir / "curl").write_text(CURL)
    (bin_dir / "curl").chmod(0o755)
    mount_point = tmp_path / "scratch"
    mount_point.mkdir()
    script = HostTuning(mount_point=str(mount_point)).render_script(
        device="/dev/iobatch-no-such-disk", report=HostReport("/aws/batch/iobatch", "eu-west-1", "iobatch"))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "IOBATCH_FSTAB": "",
           "IOBATCH_SYSCTL_CONF": str(tmp_path / "90-iobatch.conf"), "IOBATCH_IMDS": "http://127.0.0.1:1"}
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    calls = log.read_text().splitlines()
    put = [n for n, call in enumerate(calls) if call.startswith("aws --region eu-west-1 logs put-log-events")]
    shutdown = [n for n, call in enumerate(calls) if call.startswith("shutdown")]
    assert put and shutdown and put[0] < shutdown[0], calls
    assert "--log-group-name /aws/batch/iobatch --log-stream-name host-setup/i-0123456789abcdef0" in calls[put[0]]
    events = json.loads(calls[put[0]].split("--log-events ", 1)[1])
    assert json.loads(events[0]["message"]) == {
        "HostSetup": "failed", "Pipeline": "iobatch", "InstanceId": "i-0123456789abcdef0",
        "InstanceType": "m6i.2xlarge", "Reason": "scratch device /dev/iobatch-no-such-disk is not a block device"}
