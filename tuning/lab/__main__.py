"""`python -m tuning.lab guard STATE_DIR PID`: the guard process the lab starts (tuning.lab.restore.guard)."""

from __future__ import annotations

import sys
from pathlib import Path

from tuning.lab.restore import guard

if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "guard":
        sys.exit(guard(Path(sys.argv[2]), int(sys.argv[3])))
    print("usage: python -m tuning.lab guard STATE_DIR PID", file=sys.stderr)
    sys.exit(64)
