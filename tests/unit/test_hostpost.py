"""The failed host's poster (tuning/hostpost.py) as the user data carries it: code AL2023's python3 (3.9) runs, and
an endpoint override that can only reach this machine."""

from __future__ import annotations

import ast

import pytest

from tuning import hostpost
from tuning.host import HostReport, HostTuning, poster_source


def test_the_user_data_carries_the_poster_as_python_3_9_code() -> None:
    source = poster_source()
    ast.parse(source, feature_version=(3, 9))  # AL2023's python3 is 3.9: no newer syntax
    assert '"""' not in source and "#" not in source  # no docstrings or comments: bytes count
    script = HostTuning().render_script(report=HostReport("/aws/batch/iobatch", "iobatch"))
    assert "<<'IOBATCH_POST' || log" in script and f"\n{source}\nIOBATCH_POST\n" in script


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
