"""`python -m pipeline.cli ...`: the same commands as the `iobatch` console script (the local executor
starts every child's job and sidecar this way)."""

from __future__ import annotations

from pipeline.cli import main

if __name__ == "__main__":
    main()
