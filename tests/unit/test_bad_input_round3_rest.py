"""Bad input, third round, the rest (issue 44): each class fixed at its root, each with a case the code before the
fix got wrong: an S3 server read as CloudWatch Logs, '-' written as a file, the AWS libraries' endpoint variables
unchecked (and one the job's s5cmd never saw), a slow child's proxy that could not parse an endpoint without a port.

The commands' actions are replaced by a stub that records they were reached, as in test_bad_input_round3.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import app
from pipeline.endpoints import chosen_endpoint, configured_endpoint, endpoint_address
from pipeline.errors import EXIT_OK, EXIT_PERMANENT, EXIT_USAGE, UsageError
from pipeline.interface import ENV
from pipeline.settings import JobSettings
from tests.support import cli
from tests.support.cli import CliRunner
from tests.support.loopback import Quiet, serving

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


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    cli.stub_actions(monkeypatch, ACTIONS)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)


def refused(args: list[str], code: int, fragment: str, env: dict[str, str] | None = None) -> str:
    """The command refuses with one line holding `fragment` and exits `code`, before acting; its whole output."""
    return cli.refused(args, code, fragment, {**BASE_ENV, **(env or {})})[0]


# ---- an S3 server given as the CloudWatch Logs endpoint -----------------------------------------------------

ANSWER_405 = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>MethodNotAllowed</Code><Message>The specified '
              b"method is not allowed against this resource.</Message><RequestId>PYKL</RequestId></Error>")


@pytest.fixture
def s3_like() -> Iterator[str]:
    """An HTTP server answering as an S3 server (versitygw, MinIO) answers CloudWatch Logs' POST: 405, XML, and an
    S3 request id."""

    class S3Like(Quiet):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(405)
            for name, value in (("Content-Type", "application/xml"), ("x-amz-request-id", "PYKL"),
                                ("Server", "VERSITYGW"), ("Content-Length", str(len(ANSWER_405)))):
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(ANSWER_405)

    with serving(S3Like) as url:
        yield url


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
    monkeypatch.setattr("pipeline.cli.tuning._lab_where", cli.reached)
    monkeypatch.setattr("pipeline.cli.tuning._lab_in_guest", cli.reached)
    refused(["lab", "--where", "guest", "--advise", "--workload", "writer", "--memory-gib", "1"], EXIT_USAGE,
            "--advise runs the pipeline: leave out --workload writer")


# ---- run.json: read strictly, its fields through the bounds of the flags they came from ----------------------


def _run_dir(folder: Path, run_json: str) -> Path:
    from profiling import runfiles
    from tests.support.profiles import batch

    run = folder / "run"
    (run / runfiles.PROFILES).mkdir(parents=True)
    for index in range(3):
        lines = [json.dumps(p.to_dict()) for p in batch(3) if p.properties["ArrayIndex"] == str(index)]
        (run / runfiles.PROFILES / f"part-{index:05d}.jsonl").write_text("\n".join(lines) + "\n")
    (run / runfiles.RUN_FILE).write_text(run_json)
    return run


GOOD_RUN = {"job_id": "t", "workers": 4, "memory_gib": 16.0, "endpoint": "http://127.0.0.1:9000",
            "images_per_child": 5, "children": 3, "started": 1.0}
DAMAGED_RUNS = {
    "truncated": json.dumps(GOOD_RUN)[:30],  # was blamed on missing --jobs-per-instance, --memory-gib, ...
    "array": "[1, 2]",
    "workers-huge": json.dumps({**GOOD_RUN, "workers": 100_000}),  # was a plan of 100,000 jobs per instance
    "workers-true": json.dumps({**GOOD_RUN, "workers": True}),  # was read as 1
    "workers-float": json.dumps({**GOOD_RUN, "workers": 4.5}),
    "memory-huge": json.dumps({**GOOD_RUN, "memory_gib": 1e12}),  # was a plan of 1e12 GiB
    "memory-nan": json.dumps({**GOOD_RUN, "memory_gib": float("nan")}),
    "endpoint-secret": json.dumps({**GOOD_RUN, "endpoint": f"http://u:{SECRET}@h:1"}),
    "elapsed-negative": json.dumps({**GOOD_RUN, "child_elapsed_s": {"0": -3}}),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED_RUNS))
def test_a_damaged_run_json_is_one_line_naming_it_for_every_reader(tmp_path: Path, damage: str) -> None:
    run = _run_dir(tmp_path, DAMAGED_RUNS[damage])
    fragment = f"{run / 'run.json'}"
    for args in (["advise", str(run)], ["report", str(run), "--out", str(tmp_path / "r.html")],
                 ["report", "--compare", str(run), str(run), "--out", str(tmp_path / "c.html")]):
        output = refused(args, EXIT_PERMANENT, fragment)
        assert "rerun the batch" in output and SECRET not in output, output
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "c.html").exists()


def test_a_whole_run_json_gives_the_plan_and_the_report(tmp_path: Path) -> None:
    from pipeline.local.runjson import read_run

    run = _run_dir(tmp_path, json.dumps(GOOD_RUN))
    assert read_run(run) == GOOD_RUN
    assert CliRunner().invoke(app, ["advise", str(run), "--json"]).exit_code == EXIT_OK
    report = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "r.html")])
    assert report.exit_code == EXIT_OK, report.output


def test_run_json_is_checked_with_the_flags_bounds() -> None:
    from pipeline.local.runjson import run_problem
    from pipeline.settings import MAX_WORKERS
    from tuning.instances import MAX_MEMORY_GIB

    assert run_problem({"workers": MAX_WORKERS, "memory_gib": MAX_MEMORY_GIB}) is None
    assert "--workers" in str(run_problem({"workers": MAX_WORKERS + 1}))
    assert "--memory-gib" in str(run_problem({"memory_gib": MAX_MEMORY_GIB * 2}))
    assert run_problem({"endpoint": None, "slow_child": None, "unknown": [1]}) is None  # AWS's; a newer field


# ---- report --advice: the shape advise --json writes, one owner --------------------------------------------


@pytest.fixture(scope="module")
def advice_json() -> dict[str, Any]:
    from tests.support.profiles import batch
    from tuning.advise import advise
    from tuning.plan import Plan

    return advise(batch(3), Plan(jobs_per_instance=4, memory_gib=16, jobs_per_day=500)).to_json()


def test_the_advice_tables_are_what_advise_json_writes(advice_json: dict[str, Any]) -> None:
    from tuning.advice_json import ADVICE_FIELDS, CANDIDATE_FIELDS, FINDING_FIELDS, advice_problem

    assert set(advice_json) == set(ADVICE_FIELDS)
    assert advice_json["findings"] and set(advice_json["findings"][0]) == set(FINDING_FIELDS)
    assert set(CANDIDATE_FIELDS) <= set(advice_json["candidates"][0])
    assert advice_problem(advice_json) is None
    assert advice_problem({**advice_json, "source": "a stack", "make_deploy": "make deploy"}) is None


def _without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}


@pytest.mark.parametrize(("change", "fragment"), [
    (lambda a: {"volume": "gp3", "why": "st1 credits ran out"}, "has no plan, workload"),  # was shown as an advice
    (lambda a: {}, "has no plan"),
    (lambda a: _without(a, "cdk_args"), "has no cdk_args"),
    (lambda a: {**a, "findings": {"code": "X"}}, "findings is dict, not a list"),
    (lambda a: {**a, "findings": [{"code": "X"}]}, "findings[0] has no severity"),
    (lambda a: {**a, "findings": ["x"]}, "findings[0] is str, not an object"),
    (lambda a: {**a, "untuned_download_s": True}, "untuned_download_s is bool, not a number"),
    (lambda a: {**a, "recommended": "io2 9 GiB"}, "is none of its candidates"),
], ids=["any-object", "empty", "no-cdk-args", "findings-object", "finding-partial", "finding-text", "bool-number",
        "recommended-elsewhere"])
def test_report_refuses_an_advice_of_another_shape_naming_the_file(stubbed: None, tmp_path: Path,
                                                                   advice_json: dict[str, Any], change: Any,
                                                                   fragment: str) -> None:
    advice = tmp_path / "advice.json"
    advice.write_text(json.dumps(change(advice_json)))
    output = refused(["report", str(tmp_path), "--advice", str(advice)], EXIT_PERMANENT, fragment)
    assert f"--advice {advice}" in output


# ---- advise's plan checks with --instance-type ----------------------------------------------------------------


def test_a_refused_job_memory_is_never_the_suggested_fix(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, json.dumps(GOOD_RUN))
    for args, fix in ((["--memory-gib", "4", "--job-memory-gib", "6.75", "--jobs-per-instance", "2"], "2 (its memory "
                       "shared by its 2 jobs)"),
                      (["--instance-type", "c6i.large", "--vcpus-per-job", "1", "--job-memory-gib", "6.75"], "4 (its "
                       "memory, for its one job)")):
        output = refused(["advise", str(run), "--jobs-per-day", "10", *args], EXIT_USAGE, "not within the instance's")
        assert "--job-memory-gib 6.75" not in output and f"--job-memory-gib {fix}" in output, output


def test_a_default_store_candidate_is_left_out_when_memory_gib_overrides_the_type(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, json.dumps(GOOD_RUN))
    result = CliRunner().invoke(app, ["advise", str(run), "--instance-type", "m6i.large", "--memory-gib", "16",
                                      "--jobs-per-day", "10", "--json"])
    assert result.exit_code == EXIT_OK, result.stderr  # was "not the plan's size (m6i.large: 2 vCPUs, 8 GiB)"
    assert not [c for c in json.loads(result.stdout)["candidates"] if c["type"] == "instance-store"]
    # Given as a candidate, it is refused with the plan's own figures, never two identical sizes.
    output = refused(["advise", str(run), "--instance-type", "m6i.large", "--memory-gib", "16", "--jobs-per-day",
                      "10", "-C", "nvme:m6id.large"], EXIT_USAGE, "(m6i.large with --memory-gib 16: 2 vCPUs, 16 GiB)")
    assert "8 GiB) is not the plan's size" in output


@pytest.mark.parametrize(("args", "fragment"), [
    (["--instance-type", "c6i.2xlarge", "--jobs-per-instance", "1024"], "its 8 vCPUs and 16 GiB hold 2 jobs"),
    (["--instance-type", "c6i.2xlarge", "--jobs-per-instance", "5", "--vcpus-per-job", "1"], "hold 4 jobs"),
])
def test_more_jobs_than_the_instance_runs_never_reach_the_cdk_context(tmp_path: Path, args: list[str],
                                                                      fragment: str) -> None:
    run = _run_dir(tmp_path, json.dumps(GOOD_RUN))
    output = refused(["advise", str(run), "--jobs-per-day", "10", *args], EXIT_USAGE, fragment)
    assert "childrenPerHost" not in output and "cdk deploy" not in output
    assert CliRunner().invoke(app, ["advise", str(run), "--jobs-per-day", "10", "--instance-type", "c6i.2xlarge",
                                    "--jobs-per-instance", "4", "--vcpus-per-job", "1"]).exit_code == EXIT_OK


# ---- flags given where the run would not use them: refused, never silently ignored -------------------------


@pytest.mark.parametrize(("args", "fragment"), [
    (["report", "RUN", "--since", "2h"], "--since applies only with --from-cloudwatch or --stack"),
    (["report", "RUN", "--namespace", "Other", "--region", "us-east-1"], "error: --region applies only"),
    (["report", "RUN", "--logs-endpoint", "http://127.0.0.1:4566"], "--logs-endpoint applies only"),
    (["report", "--compare", "RUN", "RUN", "--since", "1h"], "--since applies only"),
    (["report", "--compare", "RUN", "RUN", "--region", "us-east-1"], "a cw: side of --compare"),
    (["advise", "RUN", "--since", "2h"], "--since applies only with --stack or --from-cloudwatch"),
    (["advise", "RUN", "--region", "us-east-1", "--namespace", "X"], "error: --region applies only"),
    (["submit", "--stack", "iobatch", "--prefix", "s3://bkt/i/", "-k", "1", "--workers", "3"],
     "--workers applies only with --local"),
    (["submit", "--stack", "iobatch", "--prefix", "s3://bkt/i/", "-k", "1", "--run-dir", "RUN"],
     "--run-dir applies only with --local"),
    (["submit", "--local", "--prefix", "s3://bkt/i/", "-k", "1", "--region", "us-east-1"],
     "--region applies only with --stack"),
    (["status", "0d3c3d8e-1a39-4d0d-9d8b-3e8e2c3a9b10", "--interval", "5"], "--interval applies only with --watch"),
    (["lab", "--after-cliff", "--credits-gib", "5", "--memory-gib", "1"], "leave out --credits-gib, or --after-cliff"),
], ids=["report-since", "report-region", "report-logs-endpoint", "compare-since", "compare-region", "advise-since",
        "advise-region", "submit-stack-workers", "submit-stack-run-dir", "submit-local-region", "status-interval",
        "lab-credits-after-cliff"])
def test_a_flag_the_run_would_ignore_is_refused(stubbed: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                args: list[str], fragment: str) -> None:
    monkeypatch.setattr("pipeline.cli.tuning._lab_where", cli.reached)
    run = _run_dir(tmp_path, json.dumps(GOOD_RUN))
    refused([str(run) if word == "RUN" else word for word in args], EXIT_USAGE, fragment)


def test_the_lab_in_the_guest_refuses_the_hosts_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pipeline.cli.tuning._lab_where", lambda where: "guest")
    monkeypatch.setattr("pipeline.cli.tuning._lab_in_guest", cli.reached)
    refused(["lab", "--throttle", "blkio", "--memory-gib", "1"], EXIT_USAGE, "--throttle applies only with --where "
            "host")  # the guest's own --throttle hypervisor came after it, silently
    with pytest.raises(cli.Reached):
        CliRunner().invoke(app, ["lab", "--memory-gib", "1"], catch_exceptions=False)


def test_a_volume_flag_is_named_as_itself_not_as_a_candidate(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, json.dumps(GOOD_RUN))
    refused(["advise", str(run), "--volume", "gp3:5"], EXIT_USAGE, "--volume 'gp3:5': provisioned iops")
    refused(["lab", "--volume", "st1:5", "--memory-gib", "1"], EXIT_USAGE, "--volume 'st1:5': size (GiB) 5")


# ---- the job and its profiler read the same variables the same way -----------------------------------------


@pytest.mark.parametrize("env", [{ENV.JOB_ID: "0d3c3d8e-1a39:7"}, {ENV.JOB_ID: "j:7", ENV.ARRAY_INDEX: "2"},
                                 {ENV.JOB_ID: "j:7", ENV.ARRAY_INDEX: ""}, {ENV.ARRAY_INDEX: " 3",
                                                                          ENV.ARRAY_OFFSET: "+10"}, {ENV.JOB_ID: "j"}])
def test_the_job_and_its_profiler_agree_on_the_child(env: dict[str, str]) -> None:
    from pipeline.settings import job_identity

    both = {**BASE_ENV, "IOBATCH_TASK_ID": "t1", **env}
    # The job read a job id's ":7" as child 0 where its profiler labelled the stages child 7.
    assert JobSettings.from_env(both).array_index == job_identity(both).array_index
