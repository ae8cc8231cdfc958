"""`python -m tuning.lab guard STATE_DIR PID`: the guard process the lab starts (tuning.lab.restore.guard);
`python -m tuning.lab fusedev ...`: the FUSE device's daemon (tuning.lab.fusedev)."""

from __future__ import annotations

import sys
from pathlib import Path

from tuning.lab.restore import guard

if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "guard":
        sys.exit(guard(Path(sys.argv[2]), int(sys.argv[3])))
    if len(sys.argv) > 1 and sys.argv[1] == "fusedev":
        from tuning.lab.fusedev import main

        sys.exit(main(sys.argv[2:]))
    print("usage: python -m tuning.lab guard STATE_DIR PID | fusedev MOUNT STORE SIZE STATS ...", file=sys.stderr)
    sys.exit(64)
