"""Faults a Batch job really meets, injected into the real pipeline: S3 errors and resets (through
tests/support/faultproxy.py), objects that change after freezing, orphaned multipart uploads, SIGTERM,
and credentials leaking into artifacts. Kills are in test_faults_kills.py, a full scratch volume in
test_faults_scratch.py; the helpers the three files share are in tests/support/faults.py.
"""

from __future__ import annotations

import hashlib
import json
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from pipeline import s3 as s3io
from pipeline.aws import s3_error
from pipeline.errors import EXIT_PERMANENT, EXIT_RETRYABLE, RetryableError
from pipeline.local.executor import LocalBatch, run_batch
from pipeline.local.proxy import ThrottledProxy
from pipeline.local.runner import LocalRun, run_local
from pipeline.local.s3server import EmbeddedS3
from pipeline.settings import ENV, JobSettings, S3Uri
from profiling import runfiles
from profiling.report import write_report
from tests.support.data import upload_dir
from tests.support.faultproxy import (
    INTERNAL,
    PASS,
    RESET,
    RESET_MID_BODY,
    SLOW,
    SLOWDOWN,
    FaultPlan,
    FaultProxy,
    decide,
)
from tests.support.faults import (
    TRAIN_SIZE,
    assert_child_complete,
    body,
    freeze,
    objects,
    open_uploads,
    reference_outputs,
    run_child,
    start_child,
)

# ---- the fixture ---------------------------------------------------------------------------------

@pytest.fixture
def images(s3: Any, request: pytest.FixtureRequest, small_dataset: tuple[Any, Path]) -> tuple[str, list[str], Path]:
    """The session's dataset in a bucket named after the test: the fault proxy's decisions hash the
    request path, so a fixed name makes a seeded run repeat exactly."""
    _, source = small_dataset
    bucket = "faults-" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]
    s3.create_bucket(Bucket=bucket)
    return bucket, upload_dir(s3, bucket, "images/", source), source


def _template(bucket: str, output: str, manifest: S3Uri, scratch: Path, endpoint: str) -> JobSettings:
    return JobSettings(input=S3Uri(bucket, "images/"), output=S3Uri(bucket, output), manifest=manifest,
                       scratch_root=scratch, images_per_child=2, array_index=0, job_id="faults",
                       s3_endpoint=endpoint, train_size=TRAIN_SIZE, volume_type="local")


# ---- the proxy itself -----------------------------------------------------------------------------

def test_fault_decisions_are_seeded_pure_and_at_the_set_rate() -> None:
    plan = FaultPlan(seed=3, error_rate=0.04, reset_rate=0.008, slow_rate=0.002)
    draws = [decide(plan, "GET", f"/b/k{i}", 0) for i in range(20_000)]
    assert draws == [decide(plan, "GET", f"/b/k{i}", 0) for i in range(20_000)]
    assert draws != [decide(FaultPlan(seed=4, error_rate=0.04, reset_rate=0.008, slow_rate=0.002), "GET",
                            f"/b/k{i}", 0) for i in range(20_000)]
    share = {kind: draws.count(kind) / len(draws) for kind in (SLOWDOWN, INTERNAL, RESET, RESET_MID_BODY, SLOW)}
    # Binomial, n=20000: 4 standard deviations of the rarest kind is under 0.13 percentage points.
    assert abs(share[SLOWDOWN] - 0.02) < 0.005 and abs(share[INTERNAL] - 0.02) < 0.005
    assert abs(share[RESET] + share[RESET_MID_BODY] - 0.008) < 0.0026
    assert abs(share[SLOW] - 0.002) < 0.0013
    # A retry of the same request draws afresh.
    assert len({decide(plan, "GET", "/b/same", n) for n in range(500)}) > 2
    with pytest.raises(ValueError, match="add up to at most 1"):
        FaultPlan(error_rate=0.8, reset_rate=0.3)
    assert decide(FaultPlan(error_rate=1.0, applies=lambda m, p: m == "PUT"), "GET", "/b/k", 0) == PASS


def test_proxy_speaks_http11_keep_alive_and_s3_errors(s3_server: EmbeddedS3, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x" * 100_000)
    with FaultProxy(s3_server.port, FaultPlan(seed=0)) as clean:
        via = s3io.client(clean.endpoint, s3_server.env())
        for _ in range(5):
            assert via.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x" * 100_000
        via.put_object(Bucket=bucket, Key="k2", Body=b"y" * 70_000)  # a body, forwarded intact
        assert body(s3, bucket, "k2") == b"y" * 70_000
        assert clean.counts[PASS] == 6
        assert clean.connections == 1  # one kept-alive connection for all six requests
    # Every request faulted with errors: boto3 sees the S3 error code and gives up after its retries.
    with FaultProxy(s3_server.port, FaultPlan(seed=0, error_rate=1.0)) as broken:
        via = boto3.session.Session().client(
            "s3", endpoint_url=broken.endpoint, aws_access_key_id=s3_server.access_key,
            aws_secret_access_key=s3_server.secret_key, region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": 2}))
        with pytest.raises(ClientError) as caught:
            via.get_object(Bucket=bucket, Key="k")
        assert caught.value.response["Error"]["Code"] in ("SlowDown", "InternalError")
        error = s3_error(caught.value, what=f"s3://{bucket}/k")
        assert isinstance(error, RetryableError) and error.exit_code == EXIT_RETRYABLE
        assert broken.injected == broken.requests >= 2


# ---- S3 errors under a whole batch ----------------------------------------------------------------

def test_low_error_rate_batch_completes_with_identical_outputs(
    s3_server: EmbeddedS3, s3: Any, images: tuple[str, list[str], Path], tmp_path: Path
) -> None:
    bucket, keys, source = images
    plan = FaultPlan(seed=11, error_rate=0.03, reset_rate=0.015, slow_rate=0.005, slow_s=0.2)
    assert plan.total_rate == pytest.approx(0.05)
    frozen = s3io.freeze_batch(s3, input=S3Uri(bucket, "images/"), manifest=None, output=S3Uri(bucket, "faulty/"),
                               per_child=2)
    with FaultProxy(s3_server.port, plan) as proxy:
        result = run_batch(LocalBatch(template=_template(bucket, "faulty/", frozen.manifest, tmp_path / "scratch",
                                                         proxy.endpoint),
                                      children=frozen.children, workers=2, run_dir=tmp_path / "run",
                                      env=s3_server.env(), sidecar=False), progress=False)
    print(f"faultproxy seed {plan.seed}: {proxy.requests} requests, {dict(proxy.counts)}")
    assert result.failed == [] and result.succeeded == 4
    assert proxy.injected >= 1, f"no fault was injected in {proxy.requests} requests: the test proves nothing"
    for child in range(4):
        assert_child_complete(s3, bucket, "faulty/", child, reference_outputs(source, keys, child, 2, tmp_path))


def test_faults_beyond_retries_fail_retryable_and_a_rerun_completes(
    s3_server: EmbeddedS3, s3: Any, images: tuple[str, list[str], Path], tmp_path: Path
) -> None:
    bucket, keys, source = images
    # Every GET of an image fails: no number of retries absorbs that.
    plan = FaultPlan(seed=5, error_rate=0.7, reset_rate=0.3,
                     applies=lambda method, path: method == "GET" and "/images/" in path)
    frozen = s3io.freeze_batch(s3, input=S3Uri(bucket, "images/"), manifest=None, output=S3Uri(bucket, "hard/"),
                               per_child=4)
    template = replace(_template(bucket, "hard/", frozen.manifest, tmp_path / "scratch", s3_server.endpoint),
                       images_per_child=4)
    with FaultProxy(s3_server.port, plan) as proxy:
        failing = run_batch(LocalBatch(template=replace(template, s3_endpoint=proxy.endpoint),
                                       children=frozen.children, workers=2, run_dir=tmp_path / "run1",
                                       env={**s3_server.env(), ENV.S5CMD_RETRIES: "1"}, sidecar=False),
                            progress=False)
    print(f"faultproxy seed {plan.seed}: {proxy.requests} requests, {dict(proxy.counts)}; "
          f"failed: {failing.failed}")
    assert [(i, code) for i, code, _ in failing.failed] == [(0, EXIT_RETRYABLE), (1, EXIT_RETRYABLE)]
    assert all("images/" in headline for _, _, headline in failing.failed), failing.failed
    assert objects(s3, bucket, "hard/part-") == {}
    rerun = run_batch(LocalBatch(template=template, children=frozen.children, workers=2, run_dir=tmp_path / "run2",
                                 env=s3_server.env(), sidecar=False), progress=False)
    assert rerun.failed == [] and rerun.succeeded == 2
    for child in range(2):
        assert_child_complete(s3, bucket, "hard/", child, reference_outputs(source, keys, child, 4, tmp_path))


# ---- corrupt data and checksums -------------------------------------------------------------------

def test_object_changed_after_freezing_fails_permanent_naming_the_key(
    s3_server: EmbeddedS3, s3: Any, images: tuple[str, list[str], Path], tmp_path: Path
) -> None:
    bucket, keys, source = images
    batch = freeze(s3_server, s3, bucket, keys, source, "changed/", 2, tmp_path / "scratch")
    ordered = sorted(keys)
    # Same size, other bytes: only the MD5 == ETag check can see it.
    same_size = ordered[1]
    original = body(s3, bucket, same_size)
    s3.put_object(Bucket=bucket, Key=same_size, Body=original[:-1] + bytes([original[-1] ^ 0xFF]))
    # Another size: the size check sees it.
    s3.put_object(Bucket=bucket, Key=ordered[2], Body=b"short")
    code, output = run_child(batch, 0, tmp_path / "run", sidecar=False)
    assert code == EXIT_PERMANENT, output
    assert f"error: s3://{bucket}/{same_size} has MD5" in output and "refreeze" in output
    # A command of the user's own: the download stage checks the bytes (the command, which would fail otherwise,
    # never runs).
    code, output = run_child(batch, 0, tmp_path / "run", sidecar=False,
                             **{ENV.PROCESS_COMMAND: "sh -c 'exit 99' {input} {output}"})
    assert code == EXIT_PERMANENT, output
    assert f"error: s3://{bucket}/{same_size} has MD5" in output and "refreeze" in output
    code, output = run_child(batch, 1, tmp_path / "run", sidecar=False)
    assert code == EXIT_PERMANENT, output
    assert f"error: s3://{bucket}/{ordered[2]} is 5 bytes, the batch listed" in output
    assert "Traceback" not in output
    assert objects(s3, bucket, "changed/part-") == {}
    # The download was verified, and left nothing behind on scratch.
    assert list((tmp_path / "scratch").iterdir()) == []


def test_outputs_carry_crc32c_and_orphaned_multipart_uploads_are_aborted(
    s3_server: EmbeddedS3, s3: Any, images: tuple[str, list[str], Path], tmp_path: Path
) -> None:
    bucket, keys, source = images
    batch = freeze(s3_server, s3, bucket, keys, source, "crc/", 2, tmp_path / "scratch")
    # What a run killed mid multipart upload leaves: an upload with a part, never completed.
    orphan = s3.create_multipart_upload(Bucket=bucket, Key="crc/part-00003/shard.tar")
    s3.upload_part(Bucket=bucket, Key="crc/part-00003/shard.tar", UploadId=orphan["UploadId"], PartNumber=1,
                   Body=b"half a shard")
    elsewhere = s3.create_multipart_upload(Bucket=bucket, Key="crc/part-00002/shard.tar")
    code, output = run_child(batch, 3, tmp_path / "run", sidecar=False)
    assert code == 0, output
    assert '"aborted_multipart_uploads"' in output and "crc/part-00003/shard.tar" in output
    assert open_uploads(s3, bucket, "crc/part-00003/") == []
    # Another child's upload is none of this child's business.
    assert open_uploads(s3, bucket, "crc/part-00002/") == ["crc/part-00002/shard.tar"]
    s3.abort_multipart_upload(Bucket=bucket, Key="crc/part-00002/shard.tar", UploadId=elsewhere["UploadId"])
    expected = reference_outputs(source, keys, 3, 2, tmp_path)
    assert_child_complete(s3, bucket, "crc/", 3, expected)
    marker = json.loads(body(s3, bucket, "crc/part-00003/_SUCCESS"))
    for name, data in expected.items():
        (tmp_path / name).write_bytes(data)
        stored = s3.head_object(Bucket=bucket, Key=f"crc/part-00003/{name}", ChecksumMode="ENABLED")
        listed = {o["key"]: o["crc32c"] for o in marker["objects"]}
        assert stored["ChecksumCRC32C"] == s3io.file_crc32c(str(tmp_path / name)) == listed[name]


# ---- SIGTERM --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("sig", "said"), [(signal.SIGTERM, "stopped by SIGTERM"),
                                           (signal.SIGINT, "interrupted (SIGINT, Ctrl-C)")], ids=["sigterm", "ctrl-c"])
def test_sigterm_stops_within_10s_with_an_interrupted_profile_and_exit_75(
    s3_server: EmbeddedS3, s3: Any, images: tuple[str, list[str], Path], tmp_path: Path, sig: int, said: str
) -> None:
    bucket, keys, source = images
    batch = freeze(s3_server, s3, bucket, keys, source, f"term{int(sig)}/", 4, tmp_path / "scratch")
    run_dir = tmp_path / "run"
    # 2 MiB of images at 256 KiB/s: the download lasts seconds, so SIGTERM lands inside it.
    with ThrottledProxy(s3_server.port, 256 * 1024) as slow:
        run = start_child(batch, 0, run_dir, endpoint=slow.endpoint)
        assert run.wait_for("stage_start", "download"), run.output
        time.sleep(0.5)
        assert run.stage_now() == "download"
        sent = time.monotonic()
        # ECS stops a task by sending SIGTERM to every container; a person at a terminal presses Ctrl-C.
        run.job.send_signal(sig)
        assert run.sidecar is not None
        run.sidecar.send_signal(signal.SIGTERM)
        code = run.finish(timeout=30)
        stopped_s = time.monotonic() - sent
    assert code == EXIT_RETRYABLE, run.output
    assert stopped_s < 10, f"the job took {stopped_s:.1f} s to stop"
    assert f"error: the child was {said}" in run.output and "Traceback" not in run.output
    profiles = list(runfiles.read_profiles(run_dir))
    assert [(p.stage, p.outcome) for p in profiles] == [("download", "interrupted")]
    assert objects(s3, bucket, f"term{int(sig)}/part-") == {}


# ---- security: no secret in any artifact ----------------------------------------------------------

def test_no_credential_in_any_artifact_of_a_run(
    s3_server: EmbeddedS3, s3: Any, images: tuple[str, list[str], Path], tmp_path: Path
) -> None:
    bucket, keys, _ = images
    run_dir = tmp_path / "run"
    # One child fails: error paths are where credentials leak.
    s3.put_object(Bucket=bucket, Key=sorted(keys)[0], Body=b"not an image")
    result = run_local(LocalRun(input=S3Uri(bucket, "images/"), output=S3Uri(bucket, "sec/"),
                                endpoint=s3_server.endpoint, run_dir=run_dir, images_per_child=4, workers=2,
                                env=s3_server.env(), train_size=TRAIN_SIZE), progress=False, say=lambda _: None)
    assert [(i, code) for i, code, _ in result.failed] == [(0, EXIT_PERMANENT)] and result.succeeded == 1
    artifacts = [p for p in run_dir.rglob("*") if p.is_file()]
    artifacts.append(write_report(run_dir))
    assert any(p.parent.name == runfiles.LOGS for p in artifacts)
    assert any(p.parent.name == runfiles.EMF and p.stat().st_size for p in artifacts)
    assert any(p.parent.name == runfiles.PROFILES and p.stat().st_size for p in artifacts)
    secrets = [s3_server.access_key.encode(), s3_server.secret_key.encode()]
    for path in artifacts:
        data = path.read_bytes()
        for secret in secrets:
            assert secret not in data, f"{path} holds a credential"
        for marker in (b"X-Amz-Signature", b"X-Amz-Credential", b"AWS4-HMAC-SHA256 Credential"):
            assert marker not in data, f"{path} holds a signed request or presigned URL"
