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
