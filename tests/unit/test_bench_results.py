"""Benchmarks as data (bench/results.py): a run's result is recorded with its date, command and machine, and
BENCHMARKS.md's current figures are rendered from the results, the hand-written part of the page kept."""

from __future__ import annotations

from pathlib import Path

from bench import results


def test_a_recorded_result_renders_newest_first_with_its_history(tmp_path: Path) -> None:
    results.record("stage_boundaries", "Stage boundaries", "python -m bench.stage_boundaries", 0, 12.3,
                   "| a | b |\n|---|---|\n| 1 | 2 |\n", folder=tmp_path)
    older, = results.load(tmp_path)
    newer = results.Result(**{**older.__dict__, "date": "2099-01-01T00:00:00Z", "output": "| a | b |\n| 3 | 4 |"})
    text = results.render([older, newer], ["Stage boundaries", "Not run"])
    assert "### Stage boundaries" in text and "### Not run" not in text
    assert "| 3 | 4 |" in text and "| 1 | 2 |" not in text  # the newest run's output is the current figure
    assert text.count("| `python -m bench.stage_boundaries` |") == 2  # every run is a history row
    assert f"{older.machine['cores']} cores" in text


def test_rendering_replaces_only_the_generated_part() -> None:
    page = "# Benchmarks\n\nIntro.\n\n## Old section\n\nKept.\n"
    first = results.rendered_page(page, results.BEGIN + "\none\n" + results.END + "\n")
    assert first.startswith("# Benchmarks\n\nIntro.\n\n" + results.BEGIN) and "## Old section\n\nKept." in first
    second = results.rendered_page(first, results.BEGIN + "\ntwo\n" + results.END + "\n")
    assert "two" in second and "one" not in second and second.count(results.BEGIN) == 1
    assert second.endswith("## Old section\n\nKept.\n")
