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
