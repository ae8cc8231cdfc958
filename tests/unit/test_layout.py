"""The shape of the code (README "Layout"): file sizes, the one-way imports, no import circle.

Read from the source with `ast`, imports inside functions included, so a lazy import cannot hide a wrong
direction or a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "profiling", "tuning", "infra")
MAX_LINES = 450
# What infra may import from the project's Python packages: the job's interface, the metric list, host tuning
# and the volume model, where the host's qualification is, and the two limits that size the log driver's buffer (an
# EMF event's bytes, a child's sub-stages). Everything else it knows comes through these.
INFRA_MAY_IMPORT = ("pipeline.interface", "profiling.metrics", "tuning.host", "tuning.ebs", "tuning.instances",
                    "profiling.emf", "profiling.protocol", "profiling.qualification")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[str]:
    """Project modules `name` imports (a `from package import module` names the module)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


GRAPH = {name: set(_imports(name, path)) for name, path in MODULES.items()}


def test_no_file_is_longer_than_the_limit() -> None:
    sizes = {name: path.read_text(encoding="utf-8").count("\n") for name, path in MODULES.items()}
    assert len(sizes) > 40
    too_long = {str(MODULES[name].relative_to(ROOT)): lines for name, lines in sizes.items() if lines > MAX_LINES}
    assert not too_long, f"split these by concern (at most {MAX_LINES} lines): {too_long}"


def test_profiling_and_tuning_know_nothing_of_pipeline_or_infra() -> None:
    wrong = {(name, target) for name, targets in GRAPH.items() if name.split(".")[0] in ("profiling", "tuning")
             for target in targets if target.split(".")[0] in ("pipeline", "infra")}
    assert not wrong


def test_infra_imports_only_the_agreed_modules() -> None:
    wrong = {(name, target) for name, targets in GRAPH.items() if name.split(".")[0] == "infra"
             for target in targets if target.split(".")[0] != "infra" and target not in INFRA_MAY_IMPORT}
    assert not wrong
    assert not GRAPH["tuning.instances"]  # a leaf: the stack and the advisor share it


def test_the_interface_is_a_leaf_and_aws_code_never_imports_the_local_runner() -> None:
    assert not GRAPH["pipeline.interface"]
    aws_side = [name for name in GRAPH if name == "pipeline.submit" or name.startswith("pipeline.submit.")]
    assert aws_side
    assert not {(name, t) for name in aws_side for t in GRAPH[name] if t.startswith("pipeline.local")}


def test_there_is_no_import_circle() -> None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(GRAPH[name]):
            if state.get(target) == 1:
                circles.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_tests_share_helpers_only_through_tests_support() -> None:
    """A helper two test files need lives in tests/support/, not in one of them (importing a test module runs
    its fixtures' imports and makes its tests collect twice under another name)."""
    tiers = ("unit", "functional", "synth", "e2e", "faults")
    wrong = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            wrong += [f"{path.relative_to(ROOT)}: {name}" for name in names
                      if name.split(".")[:2] in [["tests", tier] for tier in tiers]]
    assert wrong == []
