"""The console table of stage profiles: each column in its display format."""

from __future__ import annotations

from profiling.table import profile_row, render_stage_table
from tests.support.profiles import full_profile


def test_table_renders_each_column_with_its_display_format() -> None:
    from rich.console import Console

    row = profile_row(full_profile())
    assert row["WriteBytes"] == 40_960_000 and row["DeviceWriteLatency"] == 3.5
    console = Console(width=250, record=True)
    console.print(render_stage_table({"download": row, "upload": {"children": 2.0}}, "run"))
    text = console.export_text()
    assert "39.06" in text  # 40,960,000 B as MiB with two decimals
    assert "10,000" in text and "3.50" in text and "run" in text
    assert "children" in text


def test_every_column_heading_says_its_unit() -> None:
    from rich.console import Console

    from profiling.metrics import METRICS, TABLE_METRICS

    for spec in METRICS:  # the table and the report head their columns with the label
        assert spec.display_unit in spec.label, (spec.name, spec.label)
    console = Console(width=250, record=True)
    console.print(render_stage_table({"download": profile_row(full_profile())}, "run"))
    heading = console.export_text().splitlines()[2]
    assert len(TABLE_METRICS) == 15
    for label in ("duration s", "read MiB", "written MiB", "write µs/call", "MiB/s moved", "dev ms/write",
                  "dev queue", "peak dirty MiB", "io stall ms"):
        assert label in heading, heading


def test_the_table_follows_the_terminal_and_never_cuts_a_number() -> None:
    from rich.console import Console

    rows = {stage: profile_row(full_profile(stage=stage, net_received_bytes=400 * 2**20)) for stage in
            ("download", "process", "upload", "process/features")}
    for width in (80, 100, 120, 150, 200, 245, 246, 300):
        console = Console(width=width, record=True)
        console.print(render_stage_table(rows, "run", width))
        text = console.export_text()
        lines = [line.rstrip() for line in text.splitlines()]
        assert max(len(line) for line in lines) <= width, (width, text)
        assert "…" not in text and "10,000" in text and "39.06" in text and "400" in text, (width, text)
        transposed = any(line.startswith("┃ metric") for line in lines)
        assert transposed == (width < 246), (width, text)  # side by side, every heading whole: 246 columns
        assert "[device]" in text and "[host]" in text  # plain text, not rich markup
