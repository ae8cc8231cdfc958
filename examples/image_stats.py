"""Per-image statistics: an example of your own process command (README, "Your own processing").

    iobatch demo --process-command 'python examples/image_stats.py {input} {output}'

It reads every image in INPUT and writes OUTPUT/stats.npy, a NumPy structured array with one row per image:
its S3 key, width, height, and per-channel mean and standard deviation of its pixels in [0, 1]. The job
uploads that file under the child's output prefix and lists it in `_SUCCESS`.

It follows the contract of a process command: exit 0 when done, 65 when an image does not decode (bad input:
not retried), anything else is a bug. It announces two sub-stages to the profiler, `stats` and `write`,
which appear as `process/stats` and `process/write` in the table, the EMF and the report; run by hand (no
profiler), they are just blocks of code.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from profiling.protocol import substage

EXIT_BAD_INPUT = 65
EXIT_USAGE = 64
ROW = np.dtype([("key", "U1024"), ("width", "i4"), ("height", "i4"), ("mean", "f4", (3,)), ("std", "f4", (3,))])


def source_keys(input_dir: Path) -> dict[str, str]:
    """File name -> S3 key, from the list the job hands over (IOBATCH_PROCESS_IMAGES); by hand, the file names."""
    listing = os.environ.get("IOBATCH_PROCESS_IMAGES")
    if not listing:
        return {p.name: p.name for p in input_dir.iterdir()}
    with open(listing, encoding="utf-8") as lines:
        return {row["file"]: row["key"] for row in map(json.loads, lines)}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("error: usage: image_stats.py INPUT_DIR OUTPUT_DIR", file=sys.stderr)
        return EXIT_USAGE
    input_dir, output_dir = Path(argv[1]), Path(argv[2])
    keys = source_keys(input_dir)
    rows = []
    with substage("stats") as stage:
        for name in sorted(keys):
            try:
                with Image.open(input_dir / name) as image:
                    pixels = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
            except (UnidentifiedImageError, OSError) as exc:
                print(f"error: image {keys[name]} does not decode ({type(exc).__name__}): fix or remove it",
                      file=sys.stderr)
                return EXIT_BAD_INPUT
            rows.append((keys[name], pixels.shape[1], pixels.shape[0], pixels.mean(axis=(0, 1)),
                         pixels.std(axis=(0, 1))))
        stage.items = len(rows)
    table = np.array(rows, dtype=ROW)
    with substage("write") as stage:
        np.save(output_dir / "stats.npy", table, allow_pickle=False)
        stage.items = len(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
