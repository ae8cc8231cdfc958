"""Bad input, third round, the rest (issue 44): each class fixed at its root, each with a case the code before the
fix got wrong: an S3 server read as CloudWatch Logs, '-' written as a file, the AWS libraries' endpoint variables
unchecked (and one the job's s5cmd never saw), a slow child's proxy that could not parse an endpoint without a port.

The commands' actions are replaced by a stub that records they were reached, as in test_bad_input_round3.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import app
from pipeline.endpoints import chosen_endpoint, configured_endpoint, endpoint_address
from pipeline.errors import EXIT_OK, EXIT_USAGE, UsageError
from pipeline.interface import ENV
from pipeline.settings import JobSettings
from tests.support.cli import CliRunner

SECRET = "S3CR3TPASS"
ACTIONS = ["pipeline.local.demo.run_demo", "pipeline.local.runner.run_local", "pipeline.local.submit.submit_local",
           "pipeline.submit.submit_to_stack", "profiling.report.write_report", "profiling.report.write_comparison",
           "tuning.advise.advise", "pipeline.job.main", "pipeline.submit.poll_status"]
BASE_ENV = {ENV.INPUT: "s3://bkt/i/", ENV.OUTPUT: "s3://bkt/o/", ENV.IMAGES_PER_CHILD: "1",
            "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_MAX_ATTEMPTS": "1"}
# Variables of the host's own that would change what a case reads.
CLEARED = ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS", "AWS_ENDPOINT_URL_LOGS",
           "AWS_ENDPOINT_URL_BATCH", "AWS_ENDPOINT_URL_CLOUDFORMATION", "AWS_ENDPOINT_URL_STS",
           "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", ENV.S3_ENDPOINT, "AWS_PROFILE"]


class Reached(Exception):
    """A command passed its checks and would now act."""


def _reached(*_args: Any, **_kwargs: Any) -> Any:
    raise Reached


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    for target in ACTIONS:
        monkeypatch.setattr(target, _reached)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)


def refused(args: list[str], code: int, fragment: str, env: dict[str, str] | None = None) -> str:
    """The command refuses with one line holding `fragment` and exits `code`, before acting."""
    result = CliRunner().invoke(app, args, env={**BASE_ENV, **(env or {})})
    assert not isinstance(result.exception, Reached), f"{args} reached its action: it should have been refused"
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.exit_code == code, (result.exit_code, result.stderr)
    assert len(errors) == 1 and fragment in errors[0], result.stderr
    assert "Traceback" not in result.output
    return result.output


# ---- an S3 server given as the CloudWatch Logs endpoint -----------------------------------------------------

ANSWER_405 = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>MethodNotAllowed</Code><Message>The specified '
              b"method is not allowed against this resource.</Message><RequestId>PYKL</RequestId></Error>")


@pytest.fixture
def s3_like() -> Iterator[str]:
    """An HTTP server answering as an S3 server (versitygw, MinIO) answers CloudWatch Logs' POST: 405, XML, and an
    S3 request id."""

    class S3Like(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(405)
            for name, value in (("Content-Type", "application/xml"), ("x-amz-request-id", "PYKL"),
                                ("Server", "VERSITYGW"), ("Content-Length", str(len(ANSWER_405)))):
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(ANSWER_405)

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), S3Like)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_an_s3_server_as_the_logs_endpoint_is_not_cloudwatch_logs(s3_like: str, tmp_path: Path) -> None:
    # Was "CloudWatch Logs answered 405 while reading ...: <?xml version=..." (the body cut at its first line).
    output = refused(["report", "--from-cloudwatch", "/aws/batch/iobatch", "--logs-endpoint", s3_like, "--out",
                      str(tmp_path / "r.html")], EXIT_USAGE, f"{s3_like} is not CloudWatch Logs")
    assert "<?xml" not in output and "XML answer" in output and "--logs-endpoint" in output
    assert not (tmp_path / "r.html").exists()
    # From the AWS libraries' variable, the line names the variable to fix.
    refused(["report", "--from-cloudwatch", "/aws/batch/iobatch", "--out", str(tmp_path / "r.html")], EXIT_USAGE,
            "point AWS_ENDPOINT_URL at CloudWatch Logs", env={"AWS_ENDPOINT_URL": s3_like})


def test_an_xml_answer_is_foreign_only_to_a_json_api() -> None:
    from pipeline.aws import foreign_answer

    headers = {"Content-Type": "application/xml", "x-amz-request-id": "X"}
    assert foreign_answer(405, headers, "405", "json")
    assert foreign_answer(400, {**headers, "Content-Type": "text/xml; charset=utf-8"}, "Bad", "rest-json")
    assert foreign_answer(404, headers, "NoSuchKey", "rest-xml") is None  # S3 itself
    assert foreign_answer(400, headers, "ValidationError", "query") is None  # CloudFormation answers XML


# ---- '-' for an output: stdout where the flag says so, refused elsewhere, never a file named '-' --------------


def test_profile_json_dash_is_stdout_like_emf_dash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["profile", "--json", "-", "--", "true"])
    assert result.exit_code == EXIT_OK, result.output
    body = json.loads(result.stdout)  # stdout holds the profile alone: the table went to stderr
    assert body["schema"] == 1 and body["outcome"] == "ok"
    assert "metric" in result.stderr
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize(("args", "fragment"), [
    (["profile", "--json", "-", "--emf", "-", "--", "true"], "--json - and --emf - would both write to stdout"),
    (["report", "--out", "-"], "--out - is not standard output here"),
    (["report", "--compare", "a", "b", "--out", "-"], "--out - is not standard output here"),
    (["sidecar", "--profile-out", "-", "--socket", "s.sock"], "--profile-out - is not standard output here"),
], ids=["profile-both", "report-out", "compare-out", "sidecar-profile-out"])
def test_a_dash_where_only_a_file_goes_is_refused(stubbed: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 args: list[str], fragment: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    refused(args, EXIT_USAGE, fragment)
    assert not (tmp_path / "-").exists()


# ---- the AWS libraries' endpoint variables: the same check, where the CLI uses them -----------------------


def _variable_uses(folder: Path) -> list[tuple[list[str], str]]:
    """Each command that makes a client of a service, with the variable it reads for that service."""
    out = ["--out", str(folder / "r.html")]
    return [(["run", "--input", "s3://bkt/i/", "--output", "s3://bkt/o/", "--run-dir", str(folder / "new")],
             "AWS_ENDPOINT_URL_S3"),
            (["submit", "--stack", "iobatch", "--prefix", "s3://bkt/i/", "-k", "1"], "AWS_ENDPOINT_URL_S3"),
            (["submit", "--stack", "iobatch", "--prefix", "s3://bkt/i/", "-k", "1"], "AWS_ENDPOINT_URL_BATCH"),
            (["status", "0d3c3d8e-1a39-4d0d-9d8b-3e8e2c3a9b10"], "AWS_ENDPOINT_URL_CLOUDFORMATION"),
            (["report", "--from-cloudwatch", "/aws/batch/iobatch", *out], "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS"),
            (["job"], "AWS_ENDPOINT_URL_S3")]


@pytest.mark.parametrize(("url", "fragment"), [
    (f"http://AKIAUSER:{SECRET}@127.0.0.1:9000", "user name or password"),
    ("http://127.0.0.1:9000/iobatch-input", "has a path"),
    ("localhost:4566", "scheme is not http or https"),
], ids=["userinfo", "path", "no-scheme"])
@pytest.mark.parametrize("specific", [True, False], ids=["service-variable", "AWS_ENDPOINT_URL"])
def test_the_aws_endpoint_variables_get_the_flags_check(stubbed: None, tmp_path: Path, url: str, fragment: str,
                                                        specific: bool) -> None:
    for args, variable in _variable_uses(tmp_path):
        name = variable if specific else "AWS_ENDPOINT_URL"
        output = refused(args, EXIT_USAGE, f"{name} ", {name: url, ENV.SCRATCH: str(tmp_path / "scratch")})
        assert fragment in output and SECRET not in output and "AKIAUSER" not in output, output
    assert not (tmp_path / "new").exists() and not (tmp_path / "scratch").exists()


def test_a_misnamed_logs_variable_is_not_silently_ignored(stubbed: None, tmp_path: Path) -> None:
    refused(["report", "--from-cloudwatch", "/aws/batch/iobatch", "--out", str(tmp_path / "r.html")], EXIT_USAGE,
            "name it AWS_ENDPOINT_URL_CLOUDWATCH_LOGS", {"AWS_ENDPOINT_URL_LOGS": "http://127.0.0.1:4566"})


def test_the_job_gives_s5cmd_the_endpoint_boto3_takes_from_the_environment() -> None:
    # boto3 reads AWS_ENDPOINT_URL_S3 and AWS_ENDPOINT_URL; s5cmd reads neither: the job's download went to AWS
    # while its listing and upload went to the variable's server.
    env = {**BASE_ENV, "AWS_ENDPOINT_URL": "http://127.0.0.1:4566"}
    assert JobSettings.from_env(env).s3_endpoint == "http://127.0.0.1:4566"
    env["AWS_ENDPOINT_URL_S3"] = "http://127.0.0.1:9000"
    assert JobSettings.from_env(env).s3_endpoint == "http://127.0.0.1:9000"
    env[ENV.S3_ENDPOINT] = "http://127.0.0.1:7000"  # the pipeline's own variable first
    assert JobSettings.from_env(env).s3_endpoint == "http://127.0.0.1:7000"
    assert JobSettings.from_env({**env, ENV.S3_ENDPOINT: " "}).s3_endpoint == "http://127.0.0.1:9000"
    assert JobSettings.from_env({**BASE_ENV, "AWS_ENDPOINT_URL": "http://h:1",
                                 "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"}).s3_endpoint is None


def test_configured_endpoint_names_its_variable() -> None:
    assert configured_endpoint("logs", {"AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": " http://h:1 "}) == \
        ("http://h:1", "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS")
    assert configured_endpoint("s3", {"AWS_ENDPOINT_URL": ""}) is None  # botocore takes empty as none
    with pytest.raises(UsageError, match="AWS_ENDPOINT_URL_S3 'ftp://h'"):
        chosen_endpoint(None, "--s3-endpoint", "s3", {"AWS_ENDPOINT_URL_S3": "ftp://h"})


# ---- the slow child's proxy: where an endpoint connects, by its scheme ----------------------------------------


@pytest.mark.parametrize(("url", "address"), [
    ("https://s3.us-east-1.amazonaws.com", ("s3.us-east-1.amazonaws.com", 443)),
    ("http://minio.internal", ("minio.internal", 80)),
    ("http://127.0.0.1:9000/", ("127.0.0.1", 9000)),
    ("http://[::1]:9000", ("::1", 9000)),
])
def test_an_endpoint_connects_to_its_port_or_its_schemes(url: str, address: tuple[str, int]) -> None:
    assert endpoint_address(url) == address


def test_the_slow_childs_proxy_forwards_to_the_endpoints_host_and_default_port(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.local import executor
    from pipeline.settings import S3Uri

    made: list[tuple[str, int]] = []

    class Made(Exception):
        pass

    def proxy(port: int, rate_bps: float, *, upstream_host: str = "127.0.0.1") -> Any:
        made.append((upstream_host, port))
        raise Made

    monkeypatch.setattr(executor, "ThrottledProxy", proxy)
    template = JobSettings(input=S3Uri("bkt", "i/"), output=S3Uri("bkt", "o/"), manifest=None,
                           scratch_root=tmp_path / "scratch", images_per_child=1, array_index=0, job_id="t",
                           s3_endpoint="http://minio.internal")
    batch = executor.LocalBatch(template=template, children=1, workers=1, run_dir=tmp_path / "run", slow_child=0)
    with pytest.raises(Made):  # was ValueError: invalid literal for int() with base 10: '//minio.internal'
        executor.run_batch(batch, progress=False)
    assert made == [("minio.internal", 80)]  # was 127.0.0.1 whatever the endpoint's host


def test_a_slow_child_behind_tls_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--slow-child .* http://"):
        from pipeline.local.demo import DemoOptions, run_demo

        run_demo(DemoOptions(run_dir=tmp_path / "run", slow_child=0,
                             s3_endpoint="https://s3.us-east-1.amazonaws.com"), say=lambda _: None)
    assert not (tmp_path / "run").exists()
    assert os.listdir(tmp_path) == []


# ---- lab: a flag combination the guest would refuse, refused here first ----------------------------------------


def test_lab_advise_with_the_writer_workload_is_refused_before_the_guest_is_chosen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Was refused only inside the guest, after this side had generated the images and booted it.
    monkeypatch.setattr("pipeline.cli.tuning._lab_where", _reached)
    monkeypatch.setattr("pipeline.cli.tuning._lab_in_guest", _reached)
    refused(["lab", "--where", "guest", "--advise", "--workload", "writer", "--memory-gib", "1"], EXIT_USAGE,
            "--advise runs the pipeline: leave out --workload writer")
