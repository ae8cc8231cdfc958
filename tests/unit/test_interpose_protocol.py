"""What the LD_PRELOAD library (its C source, the owner) and its reader agree on: the record and generation
file names, the variables, the call order and the timer's poll period against the boundary's wait."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from profiling.probes import interpose
from profiling.probes.callstats import CALLS

SOURCE = Path(__file__).resolve().parents[2] / "profiling" / "interpose" / "iobatch_interpose.c"


def test_the_readers_constants_are_the_librarys() -> None:
    text = SOURCE.read_text()
    (poll_ms,) = re.findall(r"^#define FLUSH_POLL_MS (\d+)$", text, re.M)
    assert int(poll_ms) == interpose.FLUSH_POLL_MS
    # A boundary waits for several of the library's polls: a record is late only when a process cannot run.
    assert interpose.FLUSH_WAIT_S >= 5 * interpose.FLUSH_POLL_MS / 1000
    assert set(re.findall(r'getenv\("(\w+)"\)', text)) >= {interpose.ENV_DIR, interpose.ENV_INTERVAL_MS}
    (generation,) = re.findall(r'"%s/(\w+)", dir\)', text)
    assert generation == interpose.GENERATION_NAME
    (record,) = re.findall(r'"%s/(calls-[^"]*\.jsonl)"', text)
    assert record == "calls-%d-%llu.jsonl"
    assert fnmatch.fnmatchcase(record.replace("%llu", "%d") % (4242, 1234567890123), interpose.RECORD_GLOB)
    (order,) = re.findall(r"enum \{ (C_\w+(?:, C_\w+)*), NCALL \};", text)
    assert [name.removeprefix("C_").lower() for name in order.split(", ")] == list(CALLS)
