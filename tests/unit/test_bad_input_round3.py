"""Bad input, third round (issue 44): each class fixed at its root, each with a case the code before the fix got
wrong (a secret echoed or kept, an input silently left out, damaged figures read as data, a permanent mistake
called transient, a check made after the network or by prefix, a traceback on an early Ctrl-C).

The commands' actions are replaced by a stub that records they were reached, as in test_bad_input_roots: a value
that must be refused and is not reaches the stub, and the case fails without running anything for real.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import SSLError
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import aws
from pipeline.cli import app
from pipeline.endpoints import checked_endpoint
from pipeline.errors import EXIT_PERMANENT, EXIT_RETRYABLE, EXIT_USAGE, UsageError
from pipeline.interface import ENV, PROCESS_ENV
from pipeline.s5cmd import CopyResult, classify_failure
from profiling import emf, runfiles
from tests.support import cli
from tests.support.loopback import Quiet, serving
from tests.support.profiles import full_profile

ROOT = Path(__file__).resolve().parents[2]
SECRET = "S3CR3TPASS"
ACTIONS = ["pipeline.local.demo.run_demo", "pipeline.local.runner.run_local", "pipeline.local.submit.submit_local",
           "pipeline.submit.submit_to_stack", "pipeline.cli.report._logs_client", "profiling.report.write_report",
           "profiling.report.write_comparison", "tuning.advise.advise", "pipeline.job.main"]


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    cli.stub_actions(monkeypatch, ACTIONS)


def refused(args: list[str], code: int, fragment: str, env: dict[str, str] | None = None) -> str:
    """The command refuses with one line holding `fragment` and exits `code`, before acting; its whole output."""
    base = {ENV.INPUT: "s3://bkt/i/", ENV.OUTPUT: "s3://bkt/o/", ENV.IMAGES_PER_CHILD: "1", "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_MAX_ATTEMPTS": "1"}
    return cli.refused(args, code, fragment, {**base, **(env or {})})[0]


# ---- endpoints: one check for every flag and variable that takes one ----------------------------------------


def _endpoint_uses(folder: Path, url: str) -> list[tuple[list[str], dict[str, str]]]:
    """Every way a command takes an endpoint: its flags, and the job's variable."""
    s3 = ["--s3-endpoint", url]
    logs = ["--logs-endpoint", url]
    return [(["demo", "--run-dir", str(folder / "new"), *s3], {}),
            (["run", "--input", "s3://bkt/i/", "--output", "s3://bkt/o/", "--run-dir", str(folder / "new"), *s3], {}),
            (["submit", "--local", "--prefix", "s3://bkt/i/", "--output", "s3://bkt/o/", "-k", "1", *s3], {}),
            (["report", "--from-cloudwatch", "/aws/batch/iobatch", "--out", str(folder / "r.html"), *logs], {}),
            (["report", "--compare", "cw:/aws/batch/iobatch@1h", "cw:/aws/batch/iobatch@2h", "--out",
              str(folder / "c.html"), *logs], {}),
            (["report", str(folder / "run"), *logs], {}),  # given beside a local run: checked all the same
            (["job"], {ENV.S3_ENDPOINT: url, ENV.SCRATCH: str(folder / "scratch")})]


@pytest.mark.parametrize(("url", "fragment"), [
    (f"http://AKIAUSER:{SECRET}@127.0.0.1:9000", "user name or password"),
    (f"http://user:{SECRET}/x@127.0.0.1:9000", "user name or password"),  # a '/' in the password splits elsewhere
    (f"ftp://user:{SECRET}@127.0.0.1:9000", "user name or password"),
    ("http://127.0.0.1:9000/iobatch-input", "has a path"),  # blamed on a missing bucket before
    ("https://s3.amazonaws.com/b/k?x=1", "has a path"),
    ("ftp://127.0.0.1:9000", "scheme is not http or https"),
    ("s3://127.0.0.1:9000", "scheme is not http or https"),
], ids=["userinfo", "slash-in-password", "userinfo-ftp", "path", "path-query", "ftp", "s3-scheme"])
def test_every_endpoint_is_checked_alike_and_its_user_info_never_shown(stubbed: None, tmp_path: Path, url: str,
                                                                          fragment: str) -> None:
    for args, env in _endpoint_uses(tmp_path, url):
        output = refused(args, EXIT_USAGE, fragment, env)
        assert SECRET not in output and "AKIAUSER" not in output, output
    assert not (tmp_path / "new").exists() and not (tmp_path / "scratch").exists()


@pytest.mark.parametrize("url", ["http://127.0.0.1:9000", "https://s3.us-east-1.amazonaws.com", "http://[::1]:9000/",
                                 " http://localhost:4566 "])
def test_an_endpoint_of_scheme_host_and_port_is_taken(url: str) -> None:
    assert checked_endpoint(url, "--s3-endpoint") == url.strip()


def _ssl_error(url: str, text: str) -> SSLError:
    return SSLError(endpoint_url=url, error=text)


@pytest.mark.parametrize("translate", [lambda e: aws.s3_error(e, what="s3://b/k"),
                                       lambda e: aws.aws_error(e, doing="submitting"),
                                       lambda e: aws.logs_error(e, log_group="g")], ids=["s3", "batch", "logs"])
@pytest.mark.parametrize("text", ["[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)",
                                  "[SSL] record layer failure (_ssl.c:1000)"])
def test_tls_to_a_plain_http_server_is_a_wrong_scheme_not_a_transient_fault(translate: Any, text: str) -> None:
    error = translate(_ssl_error("https://127.0.0.1:9000/b/k", text))
    assert isinstance(error, UsageError) and error.exit_code == EXIT_USAGE, error
    assert "https://127.0.0.1:9000 answers in plain HTTP" in error.headline and "http://" in error.headline


def test_a_tls_failure_of_another_kind_stays_transient() -> None:
    error = aws.s3_error(_ssl_error("https://h/b", "EOF occurred in violation of protocol"), what="s3://b/k")
    assert error.exit_code == EXIT_RETRYABLE  # type: ignore[attr-defined]


def test_s5cmd_meeting_a_plain_http_server_over_tls_names_the_scheme() -> None:
    failed = CopyResult("s3://b/k", "/tmp/k", None, 'Get "https://127.0.0.1:9000/b/k": http: server gave HTTP '
                        "response to HTTPS client")
    error = classify_failure(failed)
    assert isinstance(error, UsageError) and "https://127.0.0.1:9000 answers in plain HTTP" in error.headline


@pytest.fixture
def plain_http() -> Iterator[str]:
    """A plain HTTP server on loopback: what an https:// endpoint that should have been http:// reaches."""
    with serving(Quiet) as url:
        yield url.replace("http://", "https://", 1)


def test_report_against_a_plain_http_logs_endpoint_over_tls_exits_64(plain_http: str, tmp_path: Path) -> None:
    refused(["report", "--from-cloudwatch", "/aws/batch/iobatch", "--logs-endpoint", plain_http, "--out",
             str(tmp_path / "r.html")], EXIT_USAGE, f"{plain_http} answers in plain HTTP")


def test_s3_against_a_plain_http_endpoint_over_tls_is_a_usage_error(plain_http: str) -> None:
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=plain_http, region_name="us-east-1", aws_access_key_id="a",
                          aws_secret_access_key="b", config=Config(retries={"max_attempts": 1}))
    with pytest.raises(SSLError) as caught:
        client.head_bucket(Bucket="b")
    error = aws.s3_error(caught.value, what="bucket b")
    assert isinstance(error, UsageError) and f"{plain_http} answers in plain HTTP" in error.headline, error


# ---- process: every input a regular file, by stat ---------------------------------------------------------


def _image_folder(folder: Path) -> Path:
    from PIL import Image

    images = folder / "in"
    images.mkdir()
    Image.new("RGB", (16, 12), (200, 10, 10)).save(images / "a.png")
    return images


@pytest.mark.parametrize("odd", ["fifo", "device-link", "broken-link", "folder"])
def test_process_refuses_an_input_that_is_not_a_regular_file(tmp_path: Path, odd: str) -> None:
    images, out = _image_folder(tmp_path), tmp_path / "out"
    entry = images / "b.png"
    {"fifo": lambda: os.mkfifo(entry), "device-link": lambda: entry.symlink_to("/dev/null"),
     "broken-link": lambda: entry.symlink_to(tmp_path / "gone.png"), "folder": entry.mkdir}[odd]()
    started = time.monotonic()
    refused(["process", str(images), str(out)], EXIT_PERMANENT, "b.png")  # was exit 0, one image short
    assert time.monotonic() - started < 10  # the FIFO was never opened
    assert not (out / "shard.tar").exists() and not (out / "index.json").exists()


@pytest.mark.parametrize("line", ['{"volume": "gp3", "why": "any object"}', "[1, 2]",
                                  '{"file": "../a.png", "key": "k"}', '{"file": "a.png", "key": "a.png", "etag": 5}'])
def test_process_refuses_an_images_file_of_another_shape(tmp_path: Path, line: str) -> None:
    images, listed = _image_folder(tmp_path), tmp_path / "images.jsonl"
    listed.write_text(line + "\n")
    refused(["process", str(images), str(tmp_path / "out")], EXIT_USAGE, "line 1 is not",  # was a KeyError traceback
            {PROCESS_ENV.IMAGES: str(listed)})


# ---- EMF: the profile reader's value check, the pipeline's namespace -------------------------------------


def _emf_line(**metrics: Any) -> str:
    doc = json.loads(emf.serialize(full_profile())[0])
    doc.update(metrics)
    return json.dumps(doc)  # NaN and Infinity as Python's json writes them, which json.loads reads back


BAD_FIGURES = [{"StageDuration": math.nan}, {"StageDuration": math.inf}, {"WriteBytes": -5},
               {"ReadBytes": "12"}, {"PeakDirtyBytes": [1, "x"]}, {"WriteCalls": []}, {"WriteBytes": None}]


@pytest.mark.parametrize("figures", BAD_FIGURES, ids=lambda f: f"{next(iter(f))}={next(iter(f.values()))!r}")
def test_advise_and_report_refuse_damaged_emf_figures_in_one_line(tmp_path: Path, figures: dict[str, Any]) -> None:
    name = next(iter(figures))
    file = tmp_path / "part-00000.emf"
    file.write_text(_emf_line(**figures) + "\n")
    refused(["advise", str(file), "--jobs-per-instance", "4", "--memory-gib", "32", "--jobs-per-day", "8"],
            EXIT_PERMANENT, name)
    run = tmp_path / "run"
    (run / runfiles.EMF).mkdir(parents=True)
    runfiles.write_run(run, {"job_id": "t"})
    (run / runfiles.EMF / "part-00000.emf").write_text(file.read_text())
    with pytest.raises(runfiles.DamagedFileError, match=name):
        runfiles.read_run_profiles(run)
    refused(["report", str(run), "--out", str(tmp_path / "r.html")], EXIT_PERMANENT, name)


def test_one_value_check_for_profile_lines_and_emf_documents() -> None:
    line = json.dumps({**full_profile().to_dict(), "write_bytes": -5})
    with pytest.raises(ValueError, match="finite figures of 0 or more") as from_profile:
        runfiles.profile_from_line(line)
    with pytest.raises(runfiles.DamagedFileError, match="finite figures of 0 or more") as from_emf:
        runfiles.profiles_from_emf_lines([_emf_line(WriteBytes=-5)], where="x.emf")
    tail = str(from_profile.value).rsplit(": ", 1)[1]
    assert str(from_emf.value).endswith(tail)


def test_another_namespace_is_not_read_as_the_pipelines(tmp_path: Path) -> None:
    file = tmp_path / "other.emf"
    file.write_text(_emf_line().replace('"Namespace": "IoBatch"', '"Namespace": "SomeApp"') + "\n")
    assert runfiles.read_emf(file) == []
    refused(["advise", str(file), "--jobs-per-instance", "4", "--memory-gib", "32", "--jobs-per-day", "8"],
            EXIT_USAGE, "no EMF stage documents of namespace IoBatch")


PLAN = ["--jobs-per-instance", "4", "--memory-gib", "32", "--jobs-per-day", "8"]


def test_a_custom_namespace_is_named_then_read_back_by_advise_and_report(tmp_path: Path) -> None:
    """EMF the sidecar wrote with --namespace Foo: without --namespace the error names Foo and the flag; with it both
    commands read the files (it was refused for local files before, as CloudWatch's alone)."""
    file, run = tmp_path / "x.emf", tmp_path / "run"
    file.write_text("\n".join(emf.serialize(full_profile(), namespace="Foo")) + "\n")
    (run / runfiles.EMF).mkdir(parents=True)
    runfiles.write_run(run, {"job_id": "t"})
    (run / runfiles.EMF / "part-00000.emf").write_text(file.read_text())
    fix = "its stage documents are of namespace Foo: give --namespace Foo"
    for args in (["advise", str(file), *PLAN], ["advise", str(run), *PLAN],
                 ["report", str(run), "--out", str(tmp_path / "r.html")]):
        refused(args, EXIT_USAGE, fix)
    for args in (["advise", str(file), "--namespace", "Foo", *PLAN, "--json"],
                 ["advise", str(run), "--namespace", "Foo", *PLAN, "--json"]):
        result = cli.CliRunner().invoke(app, args)
        assert result.exit_code == 0 and json.loads(result.stdout)["recommended"], (args, result.output[-600:])
    result = cli.CliRunner().invoke(app, ["report", str(run), "--namespace", "Foo", "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0 and (tmp_path / "r.html").stat().st_size > 0, result.output[-600:]
    compare = ["report", "--compare", str(run), str(run), "--namespace", "Foo", "--out", str(tmp_path / "c.html")]
    assert cli.CliRunner().invoke(app, compare).exit_code == 0


def test_namespace_given_with_only_profile_files_is_refused_not_ignored(tmp_path: Path) -> None:
    profiles = tmp_path / "p.jsonl"
    profiles.write_text(json.dumps(full_profile().to_dict()) + "\n")
    refused(["advise", str(profiles), "--namespace", "Foo", *PLAN], EXIT_USAGE, "--namespace applies only with EMF")


# ---- a log group, checked before the network; --kernel, whole ----------------------------------------


@pytest.mark.parametrize("group", ["", "my group", "g" * 513, "/aws/batch@1h"])
def test_a_log_group_name_is_checked_before_the_network(stubbed: None, tmp_path: Path, group: str) -> None:
    refused(["report", "--from-cloudwatch", group, "--out", str(tmp_path / "r.html")], EXIT_USAGE,
            "is not a log group name")
    refused(["advise", "--from-cloudwatch", group], EXIT_USAGE, "is not a log group name")  # the same one check
    refused(["advise", "--from-cloudwatch", group, "--jobs-per-instance", "4", "--memory-gib", "32", "--jobs-per-day",
             "8", "--json"], EXIT_USAGE, "is not a log group name")


@pytest.mark.parametrize("kernel", ["6.1.0;rm -rf /", "6.1.0 extra", "latest", "6.1.0-18-amd64\x7f", "6" * 70])
def test_kernel_is_validated_whole_before_anything_is_read(stubbed: None, tmp_path: Path, kernel: str) -> None:
    refused(["advise", str(tmp_path / "none"), "--kernel", kernel, "--jobs-per-instance", "4", "--memory-gib", "32",
             "--jobs-per-day", "8"], EXIT_USAGE, "--kernel")


@pytest.mark.parametrize("kernel", ["6.1.0-18-amd64", "6.1.115-126.197.amzn2023.x86_64", "6.12.0-rc1+", "4.19.0"])
def test_a_uname_release_is_taken(kernel: str) -> None:
    from tuning.host import parse_kernel_release

    assert parse_kernel_release(kernel, "--kernel") == tuple(int(x) for x in kernel.split(".")[:2])


# ---- Ctrl-C or SIGTERM while the CLI imports ------------------------------------------------------------

# Sends this process a signal (argv[2]) when `module` (argv[1]) is first imported: it lands inside the CLI's imports.
# The rest of argv is the command line.
EARLY_SIGNAL = """
import os, signal, sys
module, sig, argv = sys.argv[1], getattr(signal, sys.argv[2]), sys.argv[3:]
class Hook:
    def find_spec(self, name, path=None, target=None):
        if name == module:
            os.kill(os.getpid(), sig)
        return None
sys.meta_path.insert(0, Hook())
from pipeline.cli import main
main(argv)
"""
# Modules `import pipeline.cli` imports after its start-up handler is installed, first to last.
START_UP_MODULES = ["typer", "typer._click.core", "typer.main", "pipeline.cli.checks", "pipeline.cli.batch",
                    "pipeline.settings", "pipeline.cli.local", "pipeline.endpoints", "profiling.metrics",
                    "pipeline.cli.profiler", "tuning.instances", "pipeline.cli.qualify", "pipeline.cli.report",
                    "pipeline.cli.tuning", "profiling.numbers"]


def _interrupted_at(module: str, sig: signal.Signals, argv: list[str]) -> None:
    """The CLI given `sig` while it imports `module` exits 75 with one line, no traceback (the signals' default
    actions are restored for it: a runner that ignores them would pass that on)."""

    def defaults() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    result = subprocess.run([sys.executable, "-c", EARLY_SIGNAL, module, sig.name, *argv], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, preexec_fn=defaults)
    assert (result.returncode, result.stderr) == (EXIT_RETRYABLE, "error: interrupted\n"), \
        (module, sig.name, argv, result.returncode, result.stderr[-600:])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.parametrize("module", ["typer", "pipeline.cli.local", "profiling.numbers"])
def test_ctrl_c_during_the_clis_imports_is_one_line_and_75(module: str, sig: signal.Signals) -> None:
    _interrupted_at(module, sig, ["--help"])  # SIGTERM was its default action before: 143, no line


def _commands() -> list[str]:
    return sorted(c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands)


@settings(max_examples=12)
@given(command=st.sampled_from(_commands()), module=st.sampled_from(START_UP_MODULES),
       sig=st.sampled_from([signal.SIGINT, signal.SIGTERM]))
def test_any_early_signal_to_any_command_is_one_line_and_75(command: str, module: str, sig: signal.Signals) -> None:
    _interrupted_at(module, sig, [command])
