"""The EMF library's own limits (aws_embedded_metrics/constants.py), read without importing the library.

Importing any module of aws_embedded_metrics runs its package's __init__, which imports aiohttp for its agent
sink: ~0.18 s that every command would pay at start-up for a few numbers. This module loads the constants file
alone, from where the installed package keeps it, so the library stays the one owner of its limits."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def _constants() -> ModuleType:
    package = importlib.util.find_spec("aws_embedded_metrics")  # found, not imported
    if package is None or not package.submodule_search_locations:
        raise ImportError("aws_embedded_metrics is not installed: run `make setup`")
    path = Path(next(iter(package.submodule_search_locations))) / "constants.py"
    spec = importlib.util.spec_from_file_location("iobatch_emf_constants", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_C = _constants()
MAX_METRICS_PER_EVENT: int = _C.MAX_METRICS_PER_EVENT
MAX_DATAPOINTS_PER_METRIC: int = _C.MAX_DATAPOINTS_PER_METRIC
MAX_DIMENSION_NAME_LENGTH: int = _C.MAX_DIMENSION_NAME_LENGTH
MAX_DIMENSION_VALUE_LENGTH: int = _C.MAX_DIMENSION_VALUE_LENGTH
MAX_NAMESPACE_LENGTH: int = _C.MAX_NAMESPACE_LENGTH
VALID_NAMESPACE_REGEX: str = _C.VALID_NAMESPACE_REGEX
