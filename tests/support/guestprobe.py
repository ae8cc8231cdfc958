"""The eBPF checks of the guest tier's first boot, run inside the guest as one plain program (`python -m
tests.support.guestprobe BENCH`): pytest and this suite's conftest take about 30 s to start under TCG.

A profiler holds the programs first (taking fentry hooks on 6.1), then, while it holds them: a static program's and
forked processes' writes through a second profiler, and the exact-count tests of this suite (EBPF_EXACT) called as
pytest would call them, each on the shared copy as a packed host's children use it. Once the holder leaves, nothing
may stay pinned. Prints one JSON object: what tests/guest reads.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from profiling.metrics import by_call
from profiling.probes import ebpf, ebpf_host
from tests.support.probed import run_probed
from tests.support.writebench import writebench

# The exact-count eBPF tests of this suite, run again inside the guest: CO-RE relocates the object built against
# this machine's kernel onto 6.1's, and the counts must hold there too. Their files live on the guest's tmpfs: on the
# 9p share the per-file records miss a file written with pwrite (9p's own write path), which no Batch host has.
EBPF_EXACT = ("tests/functional/test_ebpf.py::test_counts_every_write_of_the_process_tree",
              "tests/functional/test_ebpf.py::test_min_and_max_are_exact_with_one_slow_call",
              "tests/functional/test_ebpf.py::test_a_job_in_a_pid_namespace_is_found_and_counted",
              "tests/functional/test_ebpf_files.py::test_two_files_exact_per_file_with_their_access_pattern")


def run_test(node: str, workload: Path) -> str:
    """Call one test function with the fixtures these tests take (`workload`: the writebench fixture's program);
    "passed", or what it raised."""
    path, name = node.split("::")
    function = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)
    fixtures = {"probe_ok": None, "writebench": workload, "tmp_path": Path(tempfile.mkdtemp(dir="/tmp"))}
    try:
        function(**{arg: fixtures[arg] for arg in inspect.signature(function).parameters})
    except BaseException:  # a failed assertion, or pytest's skip: either is what the guest test reports
        return traceback.format_exc()
    return "passed"


def main(bench: str) -> dict[str, Any]:
    idle = subprocess.Popen(["sleep", "600"])
    holder = ebpf.EbpfProbe(keep_running=True)
    holder.start(idle.pid)
    try:
        assert holder._loaded is not None, "the holding profiler loaded no programs"
        out: dict[str, Any] = {"release": os.uname().release, "hooks": holder._loaded.slot.hooks,
                               "programs": len(ebpf_host.loaded_programs())}
        static = by_call(run_probed([bench, "/dev/null", "3000", "4096"]))["write"]
        out["shared"] = len(ebpf_host.loaded_programs())
        forked = by_call(run_probed(["sh", "-c", f"{bench} /dev/null 500 512 & {bench} /dev/null 700 100; wait"]))
        out["static"] = [static["count"], static["bytes"]]
        out["forked"] = [forked["write"]["count"], forked["write"]["bytes"]]
        workload = writebench()
        out["tests"] = {node: run_test(node, workload) for node in EBPF_EXACT}
    finally:
        holder.close()
        idle.kill()
    out["left"] = sorted(ebpf_host.loaded_programs())
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
