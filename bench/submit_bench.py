"""Planning and submitting a 1,000,000-key batch: wall time, API calls, peak memory.

AWS's control plane is moto (its own process, so its memory is not ours): a CloudFormation stack carries
the outputs, Batch runs in simple mode. S3 is the embedded S3 server (versitygw), which holds the
manifest and receives the frozen copy. The submission runs in a fresh child process that
does exactly what `iobatch submit --manifest ... --stack ...` does and reports:

- wall time of planning + submission (stack outputs, job definition, freezing the manifest: read,
  validate and write it once, sharding, SubmitJob calls), and of each phase;
- every AWS call, counted with botocore event hooks on every client (S3 included);
- peak RSS (VmHWM of /proc/self/status, ru_maxrss as fallback);
- then one `iobatch status` poll: its ListJobs/DescribeJobs calls against one DescribeJobs per 100 children.

    python bench/submit_bench.py [--keys 1000000] [--images-per-job 50]

Targets: <= 10 s planning + submission, <= 200 MB peak RSS, exactly ceil(children / 10,000) SubmitJob
calls. Prints a markdown table for BENCHMARKS.md. moto's own work (it builds every child job object
during SubmitJob) is inside the SubmitJob phase; it is shown apart so the two can be told apart.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STACK = "iobatch-bench"
INPUT_BUCKET = "iobatch-bench-input"
OUTPUT_BUCKET = "iobatch-bench-output"
MANIFEST_KEY = "batches/bench.jsonl"
TARGET_WALL_S = 10.0
TARGET_RSS_MB = 200.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(url: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/config", timeout=1).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _aws_env(url: str) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": url, "AWS_EC2_METADATA_DISABLED": "true"}


def setup(url: str, s3: Any, keys: int) -> None:
    """On moto: the stack (outputs), a queue and a job definition. On the S3 server: buckets, manifest."""
    import boto3

    post = urllib.request.Request(url + "/moto-api/config", data=json.dumps({"batch": {"use_docker": False}})
                                  .encode(), method="POST")
    urllib.request.urlopen(post, timeout=10).read()
    session = boto3.session.Session()
    role = session.client("iam").create_role(RoleName="batch", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    batch = session.client("batch")
    env_arn = batch.create_compute_environment(computeEnvironmentName="bench-ce", type="UNMANAGED",
                                               state="ENABLED", serviceRole=role)["computeEnvironmentArn"]
    queue = batch.create_job_queue(jobQueueName="bench-queue", state="ENABLED", priority=1,
                                   computeEnvironmentOrder=[{"order": 1, "computeEnvironment": env_arn}])
    definition = batch.register_job_definition(jobDefinitionName="bench-job", type="container",
                                               containerProperties={"image": "iobatch", "vcpus": 1, "memory": 512})
    outputs = {"InputBucketName": INPUT_BUCKET, "OutputBucketName": OUTPUT_BUCKET,
               "JobQueueArn": queue["jobQueueArn"], "JobDefinitionArn": definition["jobDefinitionArn"],
               "LogGroupName": {"Ref": "Logs"}, "PipelineName": "iobatch", "DashboardName": "iobatch",
               "VolumeType": "st1"}
    template = {"Resources": {"Logs": {"Type": "AWS::Logs::LogGroup", "Properties": {"LogGroupName": "bench"}}},
                "Outputs": {k: {"Value": v} for k, v in outputs.items()}}
    session.client("cloudformation").create_stack(StackName=STACK, TemplateBody=json.dumps(template))
    for bucket in (INPUT_BUCKET, OUTPUT_BUCKET):
        s3.create_bucket(Bucket=bucket)
    body = b"".join(b'{"key":"images/cam%d/%08d.png","size":26214400}\n' % (i % 8, i) for i in range(keys))
    s3.put_object(Bucket=INPUT_BUCKET, Key=MANIFEST_KEY, Body=body)


def _peak_rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(images_per_child: int, s3_endpoint: str) -> dict[str, Any]:
    """In a fresh process: submit the batch exactly as `iobatch submit --stack` does, counting everything."""
    import boto3

    from pipeline import s3 as s3io
    from pipeline.submit import submission
    from pipeline.submit.status import poll_status

    calls: Counter[str] = Counter()
    phases: dict[str, float] = {}

    def count(model: Any, **_: Any) -> None:
        calls[f"{model.service_model.service_name}:{model.name}"] += 1

    session = boto3.session.Session()
    session.events.register("before-call", count)
    make_s3 = s3io.client

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - started
        return wrapper

    def counted_s3(*args: Any, **kwargs: Any) -> Any:
        client = make_s3(*args, **kwargs)
        client.meta.events.register("before-call", count)
        # The freeze's uploads apart from its read-and-validate pass.
        client.upload_fileobj = timed("freeze: upload", client.upload_fileobj)
        return client

    s3io.client = counted_s3
    s3io.freeze_batch = timed("freeze", s3io.freeze_batch)
    # Wrapped in the module whose submit_to_stack calls them.
    submission.plan_requests = timed("plan", submission.plan_requests)
    submission.submit_planned = timed("submit_job", submission.submit_planned)
    rss_before = _peak_rss_mb()
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    result = submission.submit_to_stack(stack=STACK, manifest=f"s3://{INPUT_BUCKET}/{MANIFEST_KEY}", prefix=None,
                                        images_per_child=images_per_child, s3_endpoint=s3_endpoint,
                                        session=session)
    wall = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    rss = _peak_rss_mb()
    submit_calls = dict(calls)
    calls.clear()
    _, batch = submission.aws_clients(session)
    started = time.perf_counter()
    state = poll_status(batch, [j.job_id for j in result.jobs])
    poll_s = time.perf_counter() - started
    return {"images": result.images, "children": result.children, "array_jobs": len(result.jobs),
            "wall_s": wall, "cpu_s": cpu, "phases": phases, "calls": submit_calls, "peak_rss_mb": rss,
            "rss_after_imports_mb": rss_before, "status_calls": dict(calls), "status_s": poll_s,
            "status_succeeded": state.count("SUCCEEDED"), "status_images_done": state.images_done}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--images-per-job", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3, help="fresh submitting processes; medians reported")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # the S3 endpoint, in the child process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.images_per_job, args.measure)))
        return
    from pipeline.local.s3server import EmbeddedS3

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile("w+", prefix="moto-", suffix=".log")  # noqa: SIM115 - closed below
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        with tempfile.TemporaryDirectory(prefix="submit-bench-") as data, EmbeddedS3(Path(data)) as s3_server:
            _wait(url)
            # One set of credentials for both: moto takes any, the S3 server takes these.
            env = {**_aws_env(url), "AWS_ACCESS_KEY_ID": s3_server.access_key,
                   "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
            os.environ.update(env)
            started = time.perf_counter()
            setup(url, s3_server.client(), args.keys)
            print(f"setup (stack on moto, {args.keys:,}-line manifest on the S3 server): "
                  f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
            rounds = []
            for _ in range(args.rounds):
                child = subprocess.run([sys.executable, __file__, "--measure", s3_server.endpoint,
                                        "--images-per-job", str(args.images_per_job)],
                                       capture_output=True, text=True, env={**os.environ, **env}, check=False)
                if child.returncode != 0:
                    log.seek(0)
                    errors = [line for line in log.read().splitlines() if " - - [" not in line][-30:]
                    sys.exit(f"measurement failed:\n{child.stderr}\nmoto said:\n" + "\n".join(errors))
                rounds.append(json.loads(child.stdout.splitlines()[-1]))
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:  # moto busy with tens of thousands of jobs may ignore SIGTERM
            server.kill()
            server.wait()
        log.close()
    report(rounds, args.keys, args.images_per_job)


def report(rounds: list[dict[str, Any]], keys: int, per_child: int) -> None:
    """Medians over the rounds (wall, phases), the largest peak RSS, and the calls (identical every round)."""
    import statistics

    if any(r["calls"] != rounds[0]["calls"] for r in rounds):
        sys.exit("the rounds made different API calls: " + json.dumps([r["calls"] for r in rounds]))
    found = dict(rounds[0])
    walls = sorted(r["wall_s"] for r in rounds)
    found["wall_s"] = statistics.median(walls)
    found["peak_rss_mb"] = max(r["peak_rss_mb"] for r in rounds)
    found["phases"] = {k: statistics.median(r["phases"][k] for r in rounds) for k in rounds[0]["phases"]}
    children = found["children"]
    expected_submits = math.ceil(children / 10_000)
    submits = found["calls"].get("batch:SubmitJob", 0)
    phases = found["phases"]
    naive_status = math.ceil(children / 100)
    status_calls = sum(found["status_calls"].values())
    print(f"\n{keys:,} keys, {per_child} images per child -> {children:,} children in {found['array_jobs']} "
          f"array jobs ({time.strftime('%Y-%m-%d UTC', time.gmtime())}, `python bench/submit_bench.py --keys {keys} "
          f"--images-per-job {per_child} --rounds {len(rounds)}`)\n")
    print("| measure | measured | target | measured / target |")
    print("|---|---:|---:|---:|")
    print(f"| planning + submission, wall (median of {len(rounds)}: "
          f"{', '.join(f'{w:.2f}' for w in walls)}) | {found['wall_s']:.2f} s | {TARGET_WALL_S:.0f} s | "
          f"{found['wall_s'] / TARGET_WALL_S:.2f} |")
    print(f"| peak RSS (VmHWM, largest of {len(rounds)}) | {found['peak_rss_mb']:.0f} MB | {TARGET_RSS_MB:.0f} MB | "
          f"{found['peak_rss_mb'] / TARGET_RSS_MB:.2f} |")
    print(f"| SubmitJob calls | {submits} | ceil({children:,} / 10,000) = {expected_submits} | "
          f"{submits / expected_submits:.2f} |")
    print(f"| status poll: API calls | {status_calls} | one DescribeJobs per 100 children = {naive_status} | "
          f"{status_calls / naive_status:.3f} |")
    top = sum(v for k, v in phases.items() if ":" not in k)  # "freeze: upload" is inside "freeze"
    cpu = statistics.median(r["cpu_s"] for r in rounds)
    print("\nphases (s, medians): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
          + f"; other (stack outputs, job definition) {found['wall_s'] - top:.2f}")
    print(f"CPU time of the submitting process (user + system, median): {cpu:.2f} s; "
          f"the rest of the wall time is waiting on moto and the S3 server, or on a busy machine")
    print("API calls, submission: " + ", ".join(f"{k} {v}" for k, v in sorted(found["calls"].items())))
    print("API calls, one status poll: " + ", ".join(f"{k} {v}" for k, v in sorted(found["status_calls"].items()))
          + f" ({found['status_s']:.2f} s; {found['status_succeeded']:,} children succeeded, "
          f"{found['status_images_done']:,} images done)")
    print(f"peak RSS after imports, before submitting: {found['rss_after_imports_mb']:.0f} MB")


if __name__ == "__main__":
    main()
