"""The failed host's poster (tuning/hostpost.py) as the user data carries it: code AL2023's python3 (3.9) runs, and
an endpoint override that can only reach this machine."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from tuning import hostpost
from tuning.host import HostReport, HostTuning
from tuning.hostprogram import LAUNCHER, program_blob, program_source


def test_the_user_data_carries_the_poster_and_qualifier_as_python_3_9_code() -> None:
    source = program_source()
    ast.parse(source, feature_version=(3, 9))  # AL2023's python3 is 3.9: no newer syntax
    assert '"""' not in source and "#" not in source  # no docstrings or comments: bytes count
    assert "def post_event(" in source and "def measure(" in source and "def qualify_main(" in source
    assert "import profiling" not in source and "from tuning" not in source  # one program, no project imports
    script = HostTuning().render_script(report=HostReport("/aws/batch/iobatch", "iobatch"))
    assert f"\nHOST_PY='{program_blob()}'\n" in script and "hostpy post || log" in script
    # The script's launcher runs that program: `hostpy post` without its variables says so in one line, exit 1.
    done = subprocess.run([sys.executable, "-I", "-c", LAUNCHER, program_blob(), "post"], capture_output=True,
                          text=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert done.returncode == 1 and done.stderr.startswith("iobatch-host: the failure was not written"), done.stderr


@pytest.mark.parametrize("url", ["https://logs.example.com/", "http://10.0.0.5:8080/", "http://localhost.evil:1/",
                                 "http://169.254.169.254/"])
def test_an_endpoint_override_off_loopback_is_refused(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("IOBATCH_LOGS_ENDPOINT", url)
    with pytest.raises(ValueError, match="not on a loopback address"):
        hostpost.endpoint("eu-west-1", "amazonaws.com")


def test_the_endpoint_is_the_regions_own_unless_a_loopback_stand_in_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IOBATCH_LOGS_ENDPOINT", raising=False)
    assert hostpost.endpoint("cn-north-1", "amazonaws.com.cn") == "https://logs.cn-north-1.amazonaws.com.cn/"
    monkeypatch.setenv("IOBATCH_LOGS_ENDPOINT", "http://127.0.0.1:8123/")
    assert hostpost.endpoint("eu-west-1", "amazonaws.com") == "http://127.0.0.1:8123/"
