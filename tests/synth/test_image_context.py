"""The job image's build context is only what the image holds: its asset hash (a new image push) does not move for
README, docs/ or bench/ edits, and does for a change to the code the image runs. Build outputs of a tree that ran
`make setup` stay out of it."""

from __future__ import annotations

import shutil
from pathlib import Path

import aws_cdk as cdk
import pytest

from infra.pipeline_stack import REPO_ROOT, job_image_asset

SKIP = shutil.ignore_patterns(".git", ".venv", ".tools", "node_modules", "cdk.out", ".iobatch", "*_cache",
                              ".hypothesis", "__pycache__")


def asset_hash(tree: Path) -> str:
    stack = cdk.Stack(cdk.App(), "ImageContext")
    return job_image_asset(stack, "Image", directory=tree).asset_hash


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(REPO_ROOT, copy, ignore=SKIP)
    return copy


def test_docs_and_bench_edits_leave_the_image_alone(tree: Path) -> None:
    before = asset_hash(tree)
    (tree / "README.md").write_text("edited\n")
    (tree / "BENCHMARKS.md").write_text("edited\n")
    (tree / "docs").mkdir(exist_ok=True)
    (tree / "docs" / "new.md").write_text("new page\n")
    (tree / "bench" / "new_bench.py").write_text("# a new benchmark\n")
    (tree / "tests" / "unit" / "test_new.py").write_text("# a new test\n")
    assert asset_hash(tree) == before


def test_build_outputs_of_a_set_up_tree_stay_out(tree: Path) -> None:
    before = asset_hash(tree)
    (tree / "profiling" / "bpf" / "iobatch.bpf.o").write_bytes(b"host build")
    (tree / "profiling" / "interpose" / "libiobatch_interpose.so").write_bytes(b"host build")
    (tree / "profiling" / "__pycache__").mkdir(exist_ok=True)
    (tree / "profiling" / "__pycache__" / "metrics.cpython-311.pyc").write_bytes(b"cache")
    assert asset_hash(tree) == before


@pytest.mark.parametrize("changed", ["pipeline/job.py", "profiling/bpf/vmlinux.h", "containers/job/Dockerfile",
                                     "requirements.lock", "contracts/case-study.contract"])
def test_a_change_to_what_the_image_holds_makes_a_new_image(tree: Path, changed: str) -> None:
    before = asset_hash(tree)
    with (tree / changed).open("a") as handle:
        handle.write("\n")
    assert asset_hash(tree) != before
