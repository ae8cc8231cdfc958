"""The per-stage console table, with the columns and formats of metrics.TABLE_METRICS."""

from __future__ import annotations

from collections.abc import Mapping

from rich.table import Table

from profiling.metrics import METRICS_BY_NAME, TABLE_METRICS, StageProfile

_EITHER = ("NetworkSent", "HostNetworkSent")


def render_stage_table(rows: Mapping[str, Mapping[str, float | None]], title: str) -> Table:
    """One row per stage, one column per table metric; rows come from metrics.summarize or
    `profile_row`. A 'children' entry, when present, becomes a column."""
    table = Table(title=title, title_justify="left")
    table.add_column("stage", style="bold")
    with_children = any("children" in row for row in rows.values())
    if with_children:
        table.add_column("children", justify="right")
    # A column no row has a figure for is left out (the network bytes are either the child's or the host's).
    specs = [METRICS_BY_NAME[name] for name in TABLE_METRICS
             if any(row.get(name) is not None for row in rows.values()) or not name.startswith(_EITHER)]
    for spec in specs:  # a figure that is not the child's own says what it is of: "dev queue [device]"
        table.add_column(spec.scoped_label, justify="right")
    for stage, row in rows.items():
        cells = [stage]
        if with_children:
            count = row.get("children")
            cells.append("-" if count is None else f"{count:.0f}")
        cells.extend(spec.display(row.get(spec.name)) for spec in specs)
        table.add_row(*cells)
    return table


def profile_row(profile: StageProfile) -> dict[str, float | None]:
    """One profile as a table row: metric name -> value."""
    return {name: profile.value(METRICS_BY_NAME[name]) for name in TABLE_METRICS}
