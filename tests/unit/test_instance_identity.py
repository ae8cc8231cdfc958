"""The instance a child runs on, from the file the host's user data writes on the scratch volume (the containers
cannot reach IMDS: the launch template's hop limit is 1)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from profiling.identity import INSTANCE_FILE, instance_identity
from tuning.host import HostTuning

ECS = {"ECS_CONTAINER_METADATA_URI_V4": "http://169.254.170.2/v4/x"}


def test_in_a_container_the_instance_comes_from_the_hosts_file(tmp_path: Path) -> None:
    (tmp_path / INSTANCE_FILE).write_text(json.dumps({"InstanceId": "i-0123456789abcdef0",
                                                      "InstanceType": "m6i.2xlarge"}))
    assert instance_identity(ECS, tmp_path) == ("i-0123456789abcdef0", "m6i.2xlarge")


def test_no_file_or_a_bad_one_is_unknown_never_a_guess(tmp_path: Path) -> None:
    assert instance_identity(ECS, tmp_path) == ("unknown", "unknown")
    for body in ("{", "[]", '{"InstanceId": "i-0123456789abcdef0"}',
                 '{"InstanceId": "i-0123456789abcdef0\\nX: y", "InstanceType": "m6i.large"}',
                 '{"InstanceId": "i-0123456789abcdef0", "InstanceType": "<script>"}'):
        (tmp_path / INSTANCE_FILE).write_text(body)
        assert instance_identity(ECS, tmp_path) == ("unknown", "unknown"), body


def test_outside_a_container_the_instance_is_this_host(tmp_path: Path) -> None:
    assert instance_identity({}, tmp_path) == (socket.gethostname(), "local")


def test_the_host_script_writes_the_file_the_profiler_reads() -> None:
    script = HostTuning().render_script()
    assert f"\nINSTANCE_FILE={INSTANCE_FILE}\n" in script and '> "$MOUNT_POINT/$INSTANCE_FILE.tmp"' in script
    assert "imds instance-id" in script and "imds instance-type" in script and "/latest/meta-data/$1" in script
