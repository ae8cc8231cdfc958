"""The README's screenshots of the report (docs/report-*.png), made from real runs by one command:

    python -m tests.support.screenshots [OUT_DIR]      # default docs/; needs chromium

It runs two demos of 8 children (16 images of ~25 MiB: a clean run and one with `--slow-child 3`) in a
temporary directory with `iobatch demo`, writes their comparison with `iobatch report --compare`, and saves one
PNG per section with headless Chromium (tests/support/browser.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.support.browser import chromium, opened

REPO = Path(__file__).resolve().parents[2]
SHAPE = ("--images", "16", "--image-mib", "25", "--images-per-child", "2", "--workers", "2")
# PNG name -> the section it shows (a CSS selector), in the report of the slow run or the comparison.
REPORT_SHOTS = {
    "report-summary": "#summary",
    "report-overview": "#overview",
    "report-stage": "section.stage",
    "report-timeline": "div.timeline",
    "report-recommendation": "#advice",
}
COMPARE_SHOTS = {"report-comparison": "#compare-overview"}


def _iobatch(*args: str, env: dict[str, str]) -> None:
    print("iobatch", " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL)


def main(argv: Sequence[str]) -> int:
    out = Path(argv[0]) if argv else REPO / "docs"
    if chromium() is None:
        print("chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 69
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory(prefix="iobatch-shots-") as tmp:
        clean, slow, compare = Path(tmp) / "clean", Path(tmp) / "slow", Path(tmp) / "compare.html"
        _iobatch("demo", *SHAPE, "--run-dir", str(clean), "--no-progress", env=env)
        _iobatch("demo", *SHAPE, "--slow-child", "3", "--run-dir", str(slow), "--no-progress", env=env)
        _iobatch("report", "--compare", str(clean), str(slow), "--out", str(compare), env=env)
        for page, shots in ((slow / "report.html", REPORT_SHOTS), (compare, COMPARE_SHOTS)):
            with opened(page) as tab:
                for name, selector in shots.items():
                    print(tab.screenshot(out / f"{name}.png", selector), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
