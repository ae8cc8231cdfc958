"""`make bench`: run every benchmark in turn (each prints its own side-by-side table).

    python -m bench              all of them
    python -m bench NAME ...     some, e.g. `python -m bench download_compare`
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path


def main() -> int:
    here = Path(__file__).parent
    available = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_"))
    chosen = sys.argv[1:] or available
    unknown = [name for name in chosen if name not in available]
    if unknown:
        print(f"error: no benchmark named {', '.join(unknown)}: choose from {', '.join(available)}", file=sys.stderr)
        return 64
    failed = []
    for name in chosen:
        print(f"\n=== bench.{name} ===", flush=True)
        if subprocess.run([sys.executable, "-m", f"bench.{name}"], check=False).returncode != 0:
            failed.append(name)
    if failed:
        print(f"error: {', '.join(failed)} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
