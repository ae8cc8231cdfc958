"""Robust outlier statistics on worked numbers."""

from __future__ import annotations

import pytest

from profiling.outliers import find_outliers, median_absolute_deviation, robust_z_scores


def test_mad_of_worked_numbers() -> None:
    # median 3; |x - 3| = 2, 1, 0, 1, 97 -> median 1
    assert median_absolute_deviation([1, 2, 3, 4, 100]) == 1


def test_robust_z_uses_mad() -> None:
    z = robust_z_scores({"a": 1, "b": 2, "c": 3, "d": 4, "e": 100})
    assert z["c"] == 0
    assert z["e"] == pytest.approx(0.6745 * 97)  # 65.4265
    assert z["a"] == pytest.approx(-0.6745 * 2)


def test_a_slow_child_among_five_is_flagged_with_its_ratio() -> None:
    # All five: median 100; deviations 0, 2, 2, 1, 80 -> MAD 2; z(e) = 0.6745 * -80 / 2 = -26.98.
    # Against the other four alone (fewer than SMALL_SAMPLE values): median 100.5; deviations 0.5, 1.5,
    # 2.5, 0.5 -> MAD 1; z(e) = 0.6745 * -80.5 / 1 = -54.30, the larger, so it is the one reported.
    values = {"a": 100, "b": 102, "c": 98, "d": 101, "e": 20}
    assert robust_z_scores(values)["e"] == pytest.approx(-26.98)
    found = find_outliers(values)
    assert [o.key for o in found] == ["e"]
    assert found[0].z == pytest.approx(-54.29725)
    assert found[0].median == 100
    assert found[0].ratio == pytest.approx(0.2)
    assert found[0].direction == "low"


def test_mean_absolute_deviation_stands_in_when_mad_is_zero() -> None:
    # four equal, one half: MAD 0; MeanAD = 50 / 5 = 10; z = -50 / (1.253314 * 10) = -3.989
    z = robust_z_scores({"a": 100, "b": 100, "c": 100, "d": 100, "e": 50})
    assert z["e"] == pytest.approx(-3.9894, abs=1e-4)
    assert [o.key for o in find_outliers({"a": 100, "b": 100, "c": 100, "d": 100, "e": 50})] == ["e"]


def test_three_equal_and_one_half_is_not_enough_evidence() -> None:
    # MeanAD = 50 / 4 = 12.5; z = -50 / (1.253314 * 12.5) = -3.19, inside 3.5
    values = {"a": 100, "b": 100, "c": 100, "d": 50}
    assert robust_z_scores(values)["d"] == pytest.approx(-3.1915, abs=1e-4)
    assert find_outliers(values) == []


def test_all_equal_means_no_outlier() -> None:
    assert robust_z_scores({"a": 5, "b": 5, "c": 5}) == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert find_outliers({"a": 5, "b": 5, "c": 5}) == []


def test_a_small_difference_is_not_a_bad_apple_however_large_its_z() -> None:
    values = {"a": 100.0, "b": 100.0, "c": 100.0, "d": 100.0, "e": 98.0}
    assert robust_z_scores(values)["e"] == pytest.approx(-3.9894, abs=1e-4)
    assert find_outliers(values) == []  # 2% off the median
    assert [o.key for o in find_outliers(values, min_relative=0.0)] == ["e"]


def test_too_few_values_say_nothing() -> None:
    assert find_outliers({"a": 1, "b": 1000}) == []


def test_low_only_and_order() -> None:
    values = {"a": 100, "b": 101, "c": 99, "d": 100, "e": 10, "f": 400, "g": 100}
    both = find_outliers(values)
    assert [o.key for o in both] == ["f", "e"]  # |z| 202 before 60.7
    assert [o.direction for o in both] == ["high", "low"]
    assert [o.key for o in find_outliers(values, low_only=True)] == ["e"]


def test_with_few_children_the_slow_ones_own_deviation_does_not_hide_it() -> None:
    # A lab run on a loaded machine (tests/e2e/test_slow_child.py): child 2's download went through a
    # 256 KiB/s proxy. All four: median 10.45; deviations 0.89, 0.89, 9.61, 5.38 -> MAD 3.13; z = -2.07,
    # inside 3.5. Against the other three: median 11.33; deviations 0, 1.77, 4.49 -> MAD 1.77; z = -4.00.
    values = {"0": 11.33, "1": 9.56, "2": 0.84, "3": 15.82}
    assert robust_z_scores(values)["2"] == pytest.approx(-2.07, abs=0.01)
    found = find_outliers(values, low_only=True)
    assert [o.key for o in found] == ["2"] and found[0].z == pytest.approx(-4.00, abs=0.01)
