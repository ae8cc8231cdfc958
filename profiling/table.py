"""The per-stage console table, with the columns and formats of metrics.TABLE_METRICS.

It follows the terminal: a stage a row when the console is at least WIDE_COLUMNS wide and every column fits
whole (its heading on one line, its longest figure), else transposed (a metric a row, a stage a column), which
fits 100 columns for the pipeline's stages: neither a heading nor a number is ever cut. Headings are plain text, so
the scope tags `[device]` and `[host]` are shown, not read as markup.
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.table import Table
from rich.text import Text

from profiling.metrics import METRICS_BY_NAME, TABLE_METRICS, MetricSpec, StageProfile

_EITHER = ("NetworkSent", "HostNetworkSent", "NetworkReceived", "HostNetworkReceived")
# Below this many columns the table is always transposed: 16 columns of figures do not fit side by side.
WIDE_COLUMNS = 150


def _specs(rows: Mapping[str, Mapping[str, float | None]]) -> list[MetricSpec]:
    # A column no row has a figure for is left out (the network bytes are either the child's or the host's).
    return [METRICS_BY_NAME[name] for name in TABLE_METRICS
            if any(row.get(name) is not None for row in rows.values()) or not name.startswith(_EITHER)]


def _children(row: Mapping[str, float | None]) -> str:
    count = row.get("children")
    return "-" if count is None else f"{count:.0f}"


def render_stage_table(rows: Mapping[str, Mapping[str, float | None]], title: str,
                       width: int | None = None) -> Table:
    """The table of `rows` (stage -> metric name -> value, from metrics.summarize or `profile_row`; a
    'children' entry, when present, is shown too) for a console `width` columns wide (None: wide)."""
    specs = _specs(rows)
    with_children = any("children" in row for row in rows.values())
    columns: list[tuple[Text, list[str]]] = [(Text("stage"), list(rows))]
    if with_children:
        columns.append((Text("children"), [_children(row) for row in rows.values()]))
    # A figure that is not the child's own says what it is of: "dev queue [device]".
    columns.extend((Text(spec.scoped_label), [spec.display(row.get(spec.name)) for row in rows.values()])
                   for spec in specs)
    # Side by side only when every column fits its heading on one line and its longest figure (rich's own
    # shrinking cuts headings, and numbers too, when it has to squeeze 16 columns).
    needed = 1 + sum(3 + max([len(head.plain)] + [len(c) for c in cells]) for head, cells in columns)
    if width is not None and (width < WIDE_COLUMNS or width < needed):
        return _transposed(rows, title, specs, with_children)
    table = Table(title=title, title_justify="left")
    for n, (head, _) in enumerate(columns):
        table.add_column(head, justify="left" if n == 0 else "right", style="bold" if n == 0 else None, no_wrap=True)
    for i in range(len(rows)):
        table.add_row(*(cells[i] for _, cells in columns))
    return table


def _transposed(rows: Mapping[str, Mapping[str, float | None]], title: str, specs: list[MetricSpec],
                with_children: bool) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(Text("metric"), style="bold")
    lines: list[tuple[str, list[str]]] = []
    if with_children:
        lines.append(("children", [_children(row) for row in rows.values()]))
    lines.extend((spec.scoped_label, [spec.display(row.get(spec.name)) for row in rows.values()]) for spec in specs)
    for i, stage in enumerate(rows):
        table.add_column(Text(stage), justify="right", no_wrap=True,
                         min_width=max((len(cells[i]) for _, cells in lines), default=1))
    for label, cells in lines:
        table.add_row(Text(label), *cells)
    return table


def profile_row(profile: StageProfile) -> dict[str, float | None]:
    """One profile as a table row: metric name -> value."""
    return {name: profile.value(METRICS_BY_NAME[name]) for name in TABLE_METRICS}
