"""An endpoint that is some other HTTP server, not S3 or CloudWatch Logs: one line that says so, exit 64.

Without the check, a web server's 404 page reads as "the key does not exist" (exit 65), its 200 page as an
empty listing, and its redirects send botocore's bucket-region lookup round until Python's recursion limit.
The servers here are real: Python's http.server on loopback, and the embedded versitygw as the S3 that must
pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import s3 as s3io
from pipeline.cli import app
from pipeline.errors import EXIT_USAGE, MissingObjectError, UsageError
from pipeline.local.s3server import EmbeddedS3
from pipeline.settings import S3Uri
from tests.support.cli import CliRunner
from tests.support.loopback import Quiet, serving

pytestmark = pytest.mark.untimed  # runs beside the guest's boots (tests/conftest.py)

PAGE = b"<html><body><h1>Welcome to nginx!</h1><p>If you see this page, the web server works.</p></body></html>\n"


class _Site(Quiet):
    """A web site: a page for every path (200 or 404, by the first path segment), and `/moved...` redirects."""

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.startswith("/moved"):
            self.send_response(301)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(404 if self.path.startswith("/missing") else 200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(PAGE)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _answer


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    with serving(_Site) as url:
        yield url


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(("bucket", "status"), [("missing", "HTTP 404"), ("there", "HTTP 200"),
                                                 ("moved", "HTTP 301")])
def test_a_web_server_as_s3_is_named_not_taken_for_missing_data(site: str, credentials: None, bucket: str,
                                                                status: str) -> None:
    s3 = s3io.client(site)
    with pytest.raises(UsageError) as caught:
        s3io.freeze_batch(s3, input=S3Uri(bucket, "images/"), manifest=None, output=S3Uri(bucket, "out/"),
                          per_child=2)
    assert caught.value.headline.startswith(f"{site} is not an S3 server: it answered ListObjectsV2 with {status}")
    assert "--s3-endpoint" in caught.value.headline and "<html" not in caught.value.headline


def test_a_web_server_as_s3_is_named_for_a_manifest_read(site: str, credentials: None) -> None:
    with pytest.raises(UsageError, match="is not an S3 server: it answered GetObject with HTTP 404"):
        list(s3io.read_manifest(s3io.client(site), S3Uri("missing", "m.jsonl"), bucket="missing"))


def test_versitygw_passes_the_check_and_a_missing_key_stays_missing(s3_server: EmbeddedS3, bucket: str) -> None:
    s3 = s3io.client(s3_server.endpoint, s3_server.env())
    s3.put_object(Bucket=bucket, Key="images/a.png", Body=b"x")
    frozen = s3io.freeze_batch(s3, input=S3Uri(bucket, "images/"), manifest=None, output=S3Uri(bucket, "out/"),
                               per_child=1)
    assert frozen.images == 1 and s3io.exists(s3, S3Uri(bucket, "out/_batch/manifest.jsonl"))
    with pytest.raises(MissingObjectError):
        list(s3io.read_manifest(s3, S3Uri(bucket, "absent.jsonl"), bucket=bucket))


@pytest.mark.parametrize("args", [
    ["run", "--input", "s3://missing/i/", "--output", "s3://missing/o/"],
    ["submit", "--local", "--prefix", "s3://there/i/", "-k", "2"],
])
def test_the_commands_say_the_s3_endpoint_is_not_s3(site: str, tmp_path: Path, args: list[str]) -> None:
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1",
           "IOBATCH_CACHE": str(tmp_path / "cache")}
    result = CliRunner().invoke(app, [*args, "--s3-endpoint", site, "--run-dir", str(tmp_path / "run")], env=env)
    assert result.exit_code == EXIT_USAGE, (result.stdout, result.stderr, result.exception)
    assert result.stderr.startswith(f"error: {site} is not an S3 server") and result.stderr.count("\n") == 1


def test_a_web_server_as_cloudwatch_logs_is_named_and_its_page_not_shown(site: str, tmp_path: Path) -> None:
    # CloudWatch Logs takes every call at POST / (the JSON protocol): the site answers it with a page.
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"}
    result = CliRunner().invoke(app, ["report", "--from-cloudwatch", "/aws/batch/iobatch", "--logs-endpoint", site,
                                      "--out", str(tmp_path / "r.html")], env=env)
    assert result.exit_code == EXIT_USAGE, (result.stdout, result.stderr, result.exception)
    assert result.stderr.startswith(f"error: {site} is not CloudWatch Logs: it answered FilterLogEvents with "
                                    "HTTP 200")
    assert "nginx" not in result.stderr and "IAM" not in result.stderr and "permission" not in result.stderr
    assert not list(tmp_path.iterdir())  # no report, not even a half-written one
