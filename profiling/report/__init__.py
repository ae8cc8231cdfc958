"""The HTML report of a run, from a local run directory or from CloudWatch Logs.

    sources    what a report reads (a run directory through profiling.runfiles, or CloudWatch Logs) as ReportData
    badapples  the children and instances whose throughput holds a stage back
    figures    the per-stage plots (one small function per kind, in a table) and the timelines
    html       the page, and writing it

Metric names, units, labels, scales and aggregations come from profiling.metrics.METRICS only.
"""

from profiling.report.badapples import BadApple, find_bad_apples
from profiling.report.figures import PLOTTERS, STAGE_PLOTS, downsample, stage_figures, timeline_figure
from profiling.report.html import advice_as_data, render_html, write_report, write_report_from_cloudwatch
from profiling.report.sources import (
    DamagedInputError,
    Entry,
    ReportData,
    ReportInputError,
    load_cloudwatch,
    load_run_dir,
    parse_since,
    profiles_from_emf_lines,
)

__all__ = [
    "PLOTTERS",
    "STAGE_PLOTS",
    "BadApple",
    "DamagedInputError",
    "Entry",
    "ReportData",
    "ReportInputError",
    "advice_as_data",
    "downsample",
    "find_bad_apples",
    "load_cloudwatch",
    "load_run_dir",
    "parse_since",
    "profiles_from_emf_lines",
    "render_html",
    "stage_figures",
    "timeline_figure",
    "write_report",
    "write_report_from_cloudwatch",
]
