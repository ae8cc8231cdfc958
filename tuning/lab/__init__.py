"""The lab: an st1-like volume on this machine (loop device + XFS + a throughput limit that follows the
credit bucket), to see the write cache and the credit cliff before paying for them. Root only.

- config: what to build (LabConfig, its validation) and the page-cache sysctls of an emulated memory size;
- credits: the credit controller (burst while credits last, then baseline);
- restore: the state file, restore on every exit path, the guard process, `recover`;
- volume: the lab volume itself (Lab: loop device, XFS, throttle);
- compare: the workload under the default and the tuned write cache, and the comparison.

`python -m tuning.lab guard STATE_DIR PID` is the guard process (started by Lab, not by people).
"""

from __future__ import annotations

from tuning.lab.compare import (
    ComparePlan,
    LabRun,
    RunBatch,
    StageFigures,
    WriterResult,
    render_comparison,
    run_comparison,
    write_files,
)
from tuning.lab.config import LabConfig, LabError
from tuning.lab.restore import LabInterrupted, recover
from tuning.lab.volume import Lab

__all__ = [
    "ComparePlan",
    "Lab",
    "LabConfig",
    "LabError",
    "LabInterrupted",
    "LabRun",
    "RunBatch",
    "StageFigures",
    "WriterResult",
    "recover",
    "render_comparison",
    "run_comparison",
    "write_files",
]
