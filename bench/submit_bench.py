"""Planning and submitting a 1,000,000-key batch: wall time, the project's own work, API calls, peak memory.

AWS's control plane is moto (its own process, so its memory is not ours): a CloudFormation stack carries
the outputs, Batch runs in simple mode. S3 is the embedded S3 server (versitygw), which holds the
manifest and receives the frozen copy. Each round is a fresh child process that does exactly what
`iobatch submit --manifest ... --stack ...` does and reports:

- wall time of planning + submission (stack outputs, job definition, freezing the manifest: read,
  validate and write it once, sharding, SubmitJob calls), and of each phase;
- moto's calls apart: the time between each CloudFormation/Batch call's start and its answer (botocore's
  before-call and after-call events), moto's own work (it builds every child job object during SubmitJob);
  the project's own work is the wall time without them. The S3 server's calls count as the project's;
- every AWS call, counted with botocore event hooks on every client (S3 included);
- peak RSS (VmHWM of /proc/self/status, ru_maxrss as fallback);
- then one `iobatch status` poll: its ListJobs/DescribeJobs calls against one DescribeJobs per 100 children.

Side by side in one run, alternating rounds: the freeze as it is (pipeline.manifest.freeze_manifest, a block of
lines at a time) and line by line (manifest_lines, parse_manifest and FrozenManifestWriter.add per line, as the
freeze was before it; `--paths block` runs the first alone).

    python -m bench.submit_bench [--keys 1000000] [--images-per-job 50] [--rounds 3] [--paths block,lines]

Targets (issue 43): <= 3 s of the project's own work (moto's calls apart), <= 200 MB peak RSS, exactly
ceil(children / 10,000) SubmitJob calls. Prints a markdown table for BENCHMARKS.md.
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
TARGET_OWN_S = 3.0  # planning + submission without moto's calls
TARGET_RSS_MB = 200.0
PATHS = ("block", "lines")  # the freeze as it is; line by line, as it was


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


def _line_by_line(chunks: Any, writer: Any, *, bucket: str, source: str, prefix: str = "") -> None:
    """The freeze as it was: every line through manifest_lines, parse_manifest (parse_line) and writer.add."""
    from pipeline.manifest import manifest_lines, parse_manifest

    for entry in parse_manifest(manifest_lines(chunks, source=source), bucket=bucket, source=source, prefix=prefix):
        writer.add(entry)


def measure(images_per_child: int, s3_endpoint: str, path: str) -> dict[str, Any]:
    """In a fresh process: submit the batch exactly as `iobatch submit --stack` does, counting everything."""
    import threading

    import boto3

    from pipeline import s3 as s3io
    from pipeline.submit import submission
    from pipeline.submit.status import poll_status

    calls: Counter[str] = Counter()
    phases: dict[str, float] = {}
    moto_s = [0.0]
    began: dict[int, float] = {}

    def count(model: Any, **_: Any) -> None:
        calls[f"{model.service_model.service_name}:{model.name}"] += 1

    def moto_call(**_: Any) -> None:
        began[threading.get_ident()] = time.perf_counter()

    def moto_answer(**_: Any) -> None:
        started = began.pop(threading.get_ident(), None)
        if started is not None:
            moto_s[0] += time.perf_counter() - started

    session = boto3.session.Session()
    session.events.register("before-call", count)
    # Every client of this session talks to moto (CloudFormation, Batch); S3 has its own (s3io.client).
    session.events.register("before-call", moto_call)
    session.events.register("after-call", moto_answer)
    session.events.register("after-call-error", moto_answer)
    make_s3 = s3io.client

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - started
        return wrapper

    before_upload: list[float] = []

    def counted_s3(*args: Any, **kwargs: Any) -> Any:
        client = make_s3(*args, **kwargs)
        client.meta.events.register("before-call", count)
        # The freeze's uploads apart from its read-and-validate pass, and the peak memory before them.
        upload = timed("freeze: upload", client.upload_fileobj)

        def first_noted(*args: Any, **kwargs: Any) -> Any:
            before_upload.append(_peak_rss_mb())
            return upload(*args, **kwargs)

        client.upload_fileobj = first_noted
        return client

    s3io.client = counted_s3
    if path == "lines":
        s3io.freeze_manifest = _line_by_line
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
    moto = moto_s[0]
    submit_calls = dict(calls)
    calls.clear()
    _, batch = submission.aws_clients(session)
    started = time.perf_counter()
    state = poll_status(batch, [j.job_id for j in result.jobs])
    poll_s = time.perf_counter() - started
    return {"path": path, "images": result.images, "children": result.children, "array_jobs": len(result.jobs),
            "wall_s": wall, "moto_s": moto, "own_s": wall - moto, "cpu_s": cpu, "phases": phases,
            "calls": submit_calls, "peak_rss_mb": rss, "rss_after_imports_mb": rss_before,
            "rss_before_upload_mb": before_upload[0] if before_upload else None,
            "status_calls": dict(calls), "status_s": poll_s, "status_succeeded": state.count("SUCCEEDED"),
            "status_images_done": state.images_done}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--images-per-job", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3, help="fresh submitting processes a path; medians reported")
    parser.add_argument("--paths", default=",".join(PATHS), help="the freezes to measure, in alternating rounds: "
                        "block (as it is), lines (line by line, as it was)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # the S3 endpoint, in the child process
    parser.add_argument("--path", default="block", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.images_per_job, args.measure, args.path)))
        return
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or set(paths) - set(PATHS):
        parser.error(f"--paths takes some of {', '.join(PATHS)}")
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
            for _, path in ((r, p) for r in range(args.rounds) for p in paths):
                child = subprocess.run([sys.executable, __file__, "--measure", s3_server.endpoint,
                                        "--images-per-job", str(args.images_per_job), "--path", path],
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
    report(rounds, args.keys, args.images_per_job, paths)


def report(rounds: list[dict[str, Any]], keys: int, per_child: int, paths: list[str]) -> None:
    """Per path, medians over its rounds (wall, own work, moto's calls, phases, CPU), the largest peak RSS, and the
    calls (identical every round); the path as it is against the targets, the other beside it."""
    import statistics

    if any(r["calls"] != rounds[0]["calls"] for r in rounds):
        sys.exit("the rounds made different API calls: " + json.dumps([r["calls"] for r in rounds]))
    found: dict[str, dict[str, Any]] = {}
    for path in paths:
        mine = [r for r in rounds if r["path"] == path]
        row = dict(mine[0])
        for name in ("wall_s", "own_s", "moto_s", "cpu_s"):
            row[name] = statistics.median(r[name] for r in mine)
        row["owns"] = sorted(r["own_s"] for r in mine)
        row["peak_rss_mb"] = max(r["peak_rss_mb"] for r in mine)
        row["phases"] = {k: statistics.median(r["phases"][k] for r in mine) for k in mine[0]["phases"]}
        found[path] = row
    first = found[paths[0]]
    children = first["children"]
    expected_submits = math.ceil(children / 10_000)
    submits = first["calls"].get("batch:SubmitJob", 0)
    naive_status = math.ceil(children / 100)
    status_calls = sum(first["status_calls"].values())
    names = {"block": "as it is (a block at a time)", "lines": "line by line (as it was)"}
    print(f"\n{keys:,} keys, {per_child} images per child -> {children:,} children in {first['array_jobs']} "
          f"array jobs ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, `python -m bench.submit_bench --keys "
          f"{keys} --images-per-job {per_child} --rounds {len(rounds) // len(paths)} --paths {','.join(paths)}`, "
          f"alternating rounds, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end)\n")
    print("| measure (medians of " + str(len(rounds) // len(paths)) + " rounds) | "
          + " | ".join(f"freeze {names[p]}" for p in paths) + " | target | first / target |")
    print("|---|" + "---:|" * len(paths) + "---:|---:|")

    def line(label: str, values: list[str], target: str = "-", ratio: str = "-") -> None:
        print(f"| {label} | " + " | ".join(values) + f" | {target} | {ratio} |")

    line("project's own work: wall without moto's calls (s; every round)",
         [f"{found[p]['own_s']:.2f} ({', '.join(f'{v:.2f}' for v in found[p]['owns'])})" for p in paths],
         f"{TARGET_OWN_S:.0f} s", f"{first['own_s'] / TARGET_OWN_S:.2f}")
    line("moto's calls: CloudFormation, Batch (s)", [f"{found[p]['moto_s']:.2f}" for p in paths])
    line("planning + submission, wall (s)", [f"{found[p]['wall_s']:.2f}" for p in paths])
    line("of which the freeze: read, validate, write, upload (s)",
         [f"{found[p]['phases'].get('freeze', 0.0):.2f}" for p in paths])
    line("CPU time of the submitting process (s)", [f"{found[p]['cpu_s']:.2f}" for p in paths])
    line("peak RSS (VmHWM, largest round)", [f"{found[p]['peak_rss_mb']:.0f} MB" for p in paths],
         f"{TARGET_RSS_MB:.0f} MB", f"{first['peak_rss_mb'] / TARGET_RSS_MB:.2f}")
    line("peak RSS before the frozen copy's upload (largest round)",
         [f"{max(r['rss_before_upload_mb'] or 0.0 for r in rounds if r['path'] == p):.0f} MB" for p in paths])
    line("SubmitJob calls", [str(found[p]["calls"].get("batch:SubmitJob", 0)) for p in paths],
         f"ceil({children:,} / 10,000) = {expected_submits}", f"{submits / expected_submits:.2f}")
    line("status poll: API calls", [str(sum(found[p]["status_calls"].values())) for p in paths],
         f"one DescribeJobs per 100 children = {naive_status}", f"{status_calls / naive_status:.3f}")
    for path in paths:
        phases = found[path]["phases"]
        top = sum(v for k, v in phases.items() if ":" not in k)  # "freeze: upload" is inside "freeze"
        print(f"\nphases, freeze {names[path]} (s, medians): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
              + f"; other (stack outputs, job definition) {found[path]['wall_s'] - top:.2f}")
    print("\nmoto's calls are the time from each CloudFormation or Batch call's start to its answer (SubmitJob: moto "
          "builds every child job); the S3 server's calls (the manifest's GET, the frozen copy's upload) are counted "
          "as the project's own work")
    print("API calls, submission: " + ", ".join(f"{k} {v}" for k, v in sorted(first["calls"].items())))
    print("API calls, one status poll: " + ", ".join(f"{k} {v}" for k, v in sorted(first["status_calls"].items()))
          + f" ({first['status_s']:.2f} s; {first['status_succeeded']:,} children succeeded, "
          f"{first['status_images_done']:,} images done)")
    print(f"peak RSS after imports, before submitting: {first['rss_after_imports_mb']:.0f} MB")


if __name__ == "__main__":
    main()
