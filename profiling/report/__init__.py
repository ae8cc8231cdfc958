"""The HTML report of a run, from a local run directory or from CloudWatch Logs.

    sources    what a report reads (a run directory through profiling.runfiles, or CloudWatch Logs: the last
               DURATION or a range, parse_run_side) as ReportData
    cloudwatch the EMF documents of a log group's window, read in parallel slices and given out in time order:
               the one reader of `iobatch report` and `iobatch advise`
    rundir     a local run directory read as ReportData (a large run's files in worker processes, merged in order)
    badapples  the children and instances whose throughput holds a stage back
    figures    the per-stage plots (one small function per kind, in a table) and the timelines
    advice     the recommendation section, from the advisor's Advice.to_dict(), and the demo's last lines
    summary    the section the report opens with: time per stage and what bounds it, the top finding, the
               bad apples, the files with the most time in calls
    page       the HTML shell, figures with one shared template, numbers with their units
    html       the report of one run, and writing it
    compare    two runs side by side, per stage, and writing that

Metric names, units, labels, scales and aggregations come from profiling.metrics.METRICS only.
"""

from profiling.report.advice import advice_as_data, findings_of
from profiling.report.badapples import BadApple, find_bad_apples
from profiling.report.cloudwatch import (
    LogWindow,
    cloudwatch_profiles,
    load_cloudwatch,
    load_cloudwatch_range,
    no_documents,
)
from profiling.report.compare import render_comparison, write_comparison
from profiling.report.figures import PLOTTERS, STAGE_PLOTS, downsample, stage_figures, timeline_figure
from profiling.report.html import render_html, write_report, write_report_from_cloudwatch
from profiling.report.rundir import load_run_dir
from profiling.report.sources import (
    CloudWatchRange,
    DamagedInputError,
    Entry,
    ReportData,
    ReportInputError,
    check_log_group,
    parse_run_side,
    parse_since,
    profiles_from_emf_lines,
)

__all__ = [
    "PLOTTERS",
    "STAGE_PLOTS",
    "BadApple",
    "CloudWatchRange",
    "DamagedInputError",
    "Entry",
    "LogWindow",
    "ReportData",
    "ReportInputError",
    "advice_as_data",
    "check_log_group",
    "cloudwatch_profiles",
    "downsample",
    "find_bad_apples",
    "findings_of",
    "load_cloudwatch",
    "load_cloudwatch_range",
    "load_run_dir",
    "no_documents",
    "parse_run_side",
    "parse_since",
    "profiles_from_emf_lines",
    "render_comparison",
    "render_html",
    "stage_figures",
    "timeline_figure",
    "write_comparison",
    "write_report",
    "write_report_from_cloudwatch",
]
