"""What every report page shares: the HTML shell with plotly.js inline once, figures, and figures for people.

Figures are embedded as their data and layout only; the plotly template they share is written once per page
(`IOBATCH_TEMPLATE`), so a run of 200 children does not carry 60 copies of it.

Numbers are shown with their unit: a field is formatted by its name's suffix (`_bytes`, `_s`, `_mibps`,
`_usd`...), an absent value is "-", never "None".
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline

PLOT_CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True}
# plotly's Python package ships only the full plotly.js bundle (package_data/plotly.min.js, 4.8 MB, every trace
# type). A page whose figures use only the trace types of the basic partial bundle (bar, pie, scatter; npm
# plotly.js-basic-dist-min, 1.2 MB, the same plotly.js version as the Python package's: 4.1.1, MIT, kept here
# with its LICENSE) embeds that one instead. Layout shapes, annotations and subplots are in every bundle.
BASIC_BUNDLE = Path(__file__).with_name("vendor") / "plotly-basic.min.js"
BASIC_TRACES = frozenset({"bar", "pie", "scatter"})
_TRACES = re.compile(r"data-traces='([a-z0-9 ]*)'")
TEMPLATE = "plotly_white"
ABSENT = "-"

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#24364b;color:#fff;padding:16px 28px}
header h1{margin:0;font-size:22px} header p{margin:4px 0 0;opacity:.85;font-size:14px}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:8px 28px;z-index:10;font-size:14px}
nav a{margin-right:16px;color:#24364b;text-decoration:none}
main{padding:8px 28px 40px}
section{background:#fff;border:1px solid #e3e3e3;border-radius:6px;padding:12px 18px;margin:16px 0}
h2{font-size:19px;margin:6px 0 10px} h3{font-size:15px;margin:14px 0 6px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(440px,1fr));gap:10px}
.plot{border:1px solid #eee;border-radius:4px;min-height:320px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid #e0e0e0;padding:4px 8px;text-align:right;vertical-align:top} th{background:#f3f5f8}
td.l,th.l{text-align:left} td.wrap{text-align:left;max-width:460px}
tr.bad td{background:#fde8e8} tr.good td{background:#eaf6ea} tr.pick td{background:#eef4fb;font-weight:600}
.note{color:#555;font-size:13px} .flag{color:#d62728;font-weight:600}
.sev{display:inline-block;border-radius:3px;padding:0 6px;color:#fff;font-size:12px}
.sev-high{background:#c0392b} .sev-medium{background:#e67e22} .sev-low{background:#7f8c8d} .sev-info{background:#3b6fb6}
.better{color:#1a7f37} .worse{color:#c0392b}
pre{background:#f6f6f6;padding:8px;overflow:auto}
pre.cmd{background:#24364b;color:#fff;padding:10px 12px;white-space:pre-wrap;word-break:break-all}
dl.kv{display:grid;grid-template-columns:max-content auto;gap:2px 14px;font-size:14px;margin:6px 0}
dl.kv dt{color:#555} dl.kv dd{margin:0}
details summary{cursor:pointer;font-size:14px;margin:6px 0}
"""


def e(value: Any) -> str:
    """HTML-escaped text."""
    return html.escape(str(value), quote=True)


def _template_json() -> str:
    return _script_json(pio.templates[TEMPLATE].to_plotly_json())


def _script_json(value: Any) -> str:
    """JSON safe inside a <script> element: '</' cannot close it."""
    return str(pio.json.to_json_plotly(value)).replace("</", "<\\/")


def figure_html(fig: go.Figure, div_id: str) -> str:
    """One figure: a div (naming the trace types it draws, for `page`) and the script that draws it with the
    page's shared template."""
    spec = fig.to_plotly_json()
    layout = dict(spec.get("layout", {}))
    layout.pop("template", None)
    height = int(layout.get("height") or 320)
    traces = " ".join(sorted({str(t.get("type") or "scatter") for t in spec.get("data", [])}))
    return (
        f"<div id=\"{e(div_id)}\" class=plotly-graph-div data-traces='{e(traces)}' "
        f"style='height:{height}px;width:100%'></div>"
        f"<script>Plotly.newPlot({json.dumps(div_id)}, {_script_json(spec.get('data', []))}, "
        f"Object.assign({{template: IOBATCH_TEMPLATE}}, {_script_json(layout)}), {json.dumps(PLOT_CONFIG)});"
        "</script>"
    )


def plotly_js(body: str) -> str:
    """The plotly.js bundle a page's figures need: the basic partial bundle when every figure's trace types
    are in it (see BASIC_BUNDLE), else the full one."""
    used = {kind for found in _TRACES.findall(body) for kind in found.split()}
    if used <= BASIC_TRACES and BASIC_BUNDLE.is_file():
        return BASIC_BUNDLE.read_text(encoding="utf-8")
    return str(plotly.offline.get_plotlyjs())


def page(title: str, subtitle: str, nav: Sequence[tuple[str, str]], body: str) -> str:
    """A whole self-contained document: plotly.js (the smallest bundle that draws its figures) and the
    shared template inline, no network needed."""
    links = "".join(f"<a href='#{e(anchor)}'>{e(text)}</a>" for anchor, text in nav)
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width, initial-scale=1'>"
        f"<title>{e(title)}</title><style>{CSS}</style>"
        f"<script>{plotly_js(body)}</script>"
        f"<script>var IOBATCH_TEMPLATE = {_template_json()};</script></head><body>"
        f"<header><h1>{e(title)}</h1><p>{e(subtitle)}</p></header><nav>{links}</nav>"
        f"<main>{body}</main></body></html>\n"
    )


# ---- numbers for people ------------------------------------------------------------------------------


def human_bytes(value: float | None) -> str:
    """1536 -> '1.5 KiB'; binary units, three significant digits."""
    if value is None or not math.isfinite(value):
        return ABSENT
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.3g} {unit}"
        size /= 1024
    return ABSENT  # pragma: no cover - the loop always returns


def number(value: float | None, digits: int = 3) -> str:
    """A number to `digits` significant digits with thousands separators; '-' when absent."""
    if value is None or not math.isfinite(value):
        return ABSENT
    if abs(value) >= 10 ** digits:
        return f"{value:,.0f}"
    rounded = float(f"{value:.{digits}g}")
    return f"{int(rounded):,}" if rounded == int(rounded) else f"{rounded:,}"


def seconds(value: float | None) -> str:
    return ABSENT if value is None else f"{number(value)} s"


# (suffix, formatter): the first suffix a field name ends with decides how its value is shown.
_BY_SUFFIX: tuple[tuple[str, Any], ...] = (
    ("_bytes", human_bytes),
    ("io_size", human_bytes),
    ("bytes", human_bytes),
    ("_mibps", lambda v: f"{number(v)} MiB/s"),
    ("_gib", lambda v: f"{number(v)} GiB"),
    ("_usd_per_month", lambda v: f"${number(v)}/month"),
    ("_usd_per_hour", lambda v: f"${number(v)}/h"),
    ("monthly_usd", lambda v: f"${number(v)}/month"),
    ("_usd", lambda v: f"${number(v)}"),
    ("_s_per_child", lambda v: f"{number(v)} s per child"),
    ("elapsed_s", seconds),
    ("_s", seconds),
    ("_ms", lambda v: f"{number(v)} ms"),
    ("_h", lambda v: f"{number(v)} h"),
    ("_pct", lambda v: f"{number(v)} %"),
)


def field_value(name: str, value: Any) -> str:
    """A field's value as text with its unit (escaped HTML)."""
    if value is None:
        return ABSENT
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        for suffix, show in _BY_SUFFIX:
            if name.endswith(suffix):
                return e(show(value))
        return e(number(value))
    if isinstance(value, Mapping):
        return key_values(value)
    if isinstance(value, list | tuple):
        if not value:
            return ABSENT
        if all(isinstance(v, Mapping) for v in value):
            return table_of(list(value))
        return "<br>".join(field_value(name, v) for v in value)
    return e(value)


def label_of(name: str) -> str:
    """'steady_download_s' -> 'steady download'; a dotted name (a sysctl) as it is."""
    if "." in name:
        return name
    words = name.split("_")
    for tail in ("s", "bytes", "mibps", "gib", "h", "ms", "pct"):
        if len(words) > 1 and words[-1] == tail:
            words = words[:-1]
            break
    return " ".join(words)


def key_values(fields: Mapping[str, Any], names: Sequence[str] | None = None) -> str:
    """A definition list of fields (absent ones left out), each value with its unit."""
    keys = [k for k in (names or list(fields)) if fields.get(k) is not None]
    if not keys:
        return ABSENT
    rows = "".join(f"<dt>{e(label_of(k))}</dt><dd>{field_value(k, fields[k])}</dd>" for k in keys)
    return f"<dl class=kv>{rows}</dl>"


def table_of(rows: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None) -> str:
    """Rows of fields as a table; the columns are `names` or every key in order of appearance."""
    keys: list[str] = list(names or [])
    if not names:
        for row in rows:
            keys.extend(k for k in row if k not in keys)
    head = "".join(f"<th class=l>{e(label_of(k))}</th>" for k in keys)
    body = "".join(
        "<tr>" + "".join(f"<td class=l>{field_value(k, row.get(k))}</td>" for k in keys) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"
