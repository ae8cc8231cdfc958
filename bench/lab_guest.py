"""`iobatch lab` in the cgroup v2 guest, as a user runs it: the closed loop at baseline, timed whole.

    python -m bench.lab_guest [--volume sc1:125] [--memory-gib 0.5] [--images 8 --image-mib 16 --images-per-child 4]

Runs `iobatch lab --where guest --advise --after-cliff --json` (no root needed) and prints the whole wall time
(image generation here, the guest's boot, both runs, power-off), and per run the advisor's predicted download
stage beside the measured one. The guest runs under TCG wherever KVM cannot run a stock kernel: its CPU-bound
work (Python start-up, s5cmd, image decoding) is 10-50x slower than on this machine: the advised download, the
whole batch in the write cache, still takes 8-10 s for 128 MiB. So the default volume is the smallest sc1 (1.5 MiB/s
at baseline) with a batch a little over the emulated cache, where the volume, not the emulation, bounds the
default run; on the smallest st1 (4.9 MiB/s, `--volume st1:125`) the same batch is 1.7-2.2x faster tuned, bounded
by that floor. The figures say how far that holds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--volume", default="sc1:125")
    parser.add_argument("--memory-gib", default="0.5")
    parser.add_argument("--images", default="8")
    parser.add_argument("--image-mib", default="16")
    parser.add_argument("--images-per-child", default="4")
    parser.add_argument("--workers", default="2")
    args = parser.parse_args()
    from tuning.guest.machine import unavailable

    if reason := unavailable():
        print(f"lab_guest: skipped, the guest cannot boot: {reason}")
        return 0
    iobatch = str(Path(sys.executable).with_name("iobatch"))
    with tempfile.TemporaryDirectory(prefix="iobatch-lab-guest-") as run_dir:
        command = [iobatch, "lab", "--where", "guest", "--advise", "--after-cliff", "--json", "--volume", args.volume,
                   "--memory-gib", args.memory_gib, "--images", args.images, "--image-mib", args.image_mib,
                   "--images-per-child", args.images_per_child, "--workers", args.workers, "--run-dir", run_dir]
        started = time.monotonic()
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, check=False)
        wall = time.monotonic() - started
    print(f"# iobatch lab in the guest, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} "
          f"cores; {args.volume} at baseline, {args.memory_gib} GiB emulated, {args.images} images of "
          f"~{args.image_mib} MiB, {args.images_per_child} per child, {args.workers} at once\n")
    print("`" + " ".join(command[1:-2]) + "`\n")
    if done.returncode != 0:
        print(f"lab_guest: the lab exited {done.returncode} after {wall:.0f} s")
        return 1
    try:
        result = json.loads(done.stdout)
    except ValueError:
        print(f"lab_guest: the lab's stdout is not its JSON: {done.stdout[:300]!r}")
        return 1
    print("| run | predicted download s | measured download s | error |")
    print("|---|---:|---:|---:|")
    for run in result["runs"]:
        error = "-" if run["error"] is None else f"{run['error']:+.0%}"
        print(f"| {run['setting']} | {run['predicted_download_s']:.1f} | {run['measured_download_s']} | {error} |")
    measured = [r["measured_download_s"] for r in result["runs"] if r["measured_download_s"]]
    predicted = [r["predicted_download_s"] for r in result["runs"]]
    if len(measured) >= 2:
        print(f"\nspeed-up measured {measured[0] / measured[-1]:.1f}x, predicted {predicted[0] / predicted[-1]:.1f}x; "
              f"whole run (images, boot, both runs, power-off) {wall:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
