"""The docs cannot drift from the code: docs/reference/ is what `make docs` writes from each agreement's owner, and
the hand-written pages name only paths, commands, flags, context keys and variables that exist."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

import pipeline.cli  # noqa: F401  (imported at collection, as its commands' help is read: see tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
HAND_WRITTEN = sorted({*ROOT.glob("*.md"), *(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.parts)})


def _docsref() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docsref", ROOT / "scripts" / "docsref.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DOCSREF = _docsref()


def test_the_reference_pages_are_what_make_docs_writes() -> None:
    assert DOCSREF.stale() == [], "docs/reference is stale: run `make docs`"


@pytest.mark.parametrize("page", HAND_WRITTEN, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_names_only_what_exists(page: Path) -> None:
    assert DOCSREF.drift(page.read_text(encoding="utf-8")) == []


def test_a_renamed_flag_key_variable_or_module_is_caught() -> None:
    variable = "IOBATCH_" + "NO_SUCH_ONE"  # not written whole: the scan of the tests would find it
    text = (f"run `iobatch profile --intervals 2 -- dd`, deploy with -c volumeTipe=st1, set {variable}, read "
            "`tuning/nosuch.py` and `tuning/ebs.Volume`; `iobatch run --process-command 'tool --in {input}'`; "
            "`make tests` then `make test`")
    assert DOCSREF.drift(text) == ["context key volumeTipe does not exist", "iobatch profile --intervals: no such flag",
                                   "make tests: no such target", "path tuning/nosuch.py does not exist",
                                   f"variable {variable} is not read anywhere"]


def test_every_context_key_is_in_the_deploy_table() -> None:
    """The deploy docs say what each key does (hand-written), checked against the stack's list both ways."""
    import re

    text = "\n".join(p.read_text(encoding="utf-8") for p in HAND_WRITTEN)
    in_tables = {k for row in re.findall(r"^\| `([A-Za-z][A-Za-z0-9]*)`(?: / `([A-Za-z][A-Za-z0-9]*)`)? \|", text, re.M)
                 for k in row if k}
    keys = set(DOCSREF.context_keys())
    assert keys - in_tables == set(), "context keys no deploy table documents"


def test_the_readme_is_read_in_ten_minutes_and_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.count("\n") <= 200
    assert "make demo" in readme and "make test" in readme
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert {p for p in pages if f"]({p})" not in readme} == set(), "docs pages the README does not link"


def test_the_architecture_page_states_the_import_rules_the_layout_test_enforces() -> None:
    import ast

    tree = ast.parse((ROOT / "tests" / "unit" / "test_layout.py").read_text(encoding="utf-8"))  # its constants
    rules = {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body
             if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
             and n.targets[0].id in ("INFRA_MAY_IMPORT", "MAX_LINES")}
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert {m for m in rules["INFRA_MAY_IMPORT"] if f"`{m}`" not in page} == set()
    assert f"{rules['MAX_LINES']} lines" in page


def test_the_cost_tables_metric_count_is_the_metric_lists() -> None:
    import re

    from profiling.metrics import METRICS, STAGES

    text = (ROOT / "docs" / "aws.md").read_text(encoding="utf-8")
    (count, stages, total), = re.findall(r"up to (\d+) metrics .*? x (\d+) stages = (\d+) per pipeline", text)
    assert (int(count), int(stages), int(total)) == (len(METRICS), len(STAGES), len(METRICS) * len(STAGES))


def test_the_readmes_exit_code_table_has_the_owners_codes() -> None:
    """README's table is hand-written (its meanings are longer than the owner's comments): its codes are exactly
    pipeline/interface.py's EXIT_* codes, which docs/reference/exit-codes.md is written from, and only 75 is retried."""
    import re

    from pipeline import interface

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("| code | meaning | Batch retries? |\n|---|---|---|\n", 1)[1].split("\n\n", 1)[0]
    rows = [re.fullmatch(r"\| (\d+) \| (.+) \| (yes|no|-) \|", line) for line in table.splitlines()]
    assert rows and all(rows), table
    owned = {value for name, value in vars(interface).items() if name.startswith("EXIT_") and isinstance(value, int)}
    codes = {int(row[1]): row[3] for row in rows if row}
    assert set(codes) == owned
    assert {code for code, retried in codes.items() if retried == "yes"} == {interface.EXIT_RETRYABLE}
