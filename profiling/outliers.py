"""Bad apples: children or instances whose stage throughput stands out from the rest (pure).

Nominally identical machines differ a lot in practice (spreads of 30:1 between EC2 instances of one
type have been measured), so a report has to point at the one child or instance that holds a batch
back. The mean and standard deviation are pulled towards the very value we look for, so the test is
the modified z-score of Iglewicz and Hoaglin, built on the median and the median absolute deviation
(MAD):

    z = 0.6745 * (x - median) / MAD

0.6745 is the 0.75 quantile of the standard normal, which makes z comparable to a standard score
for normal data. |z| > 3.5 is their recommended cut-off. When more than half of the values are equal
the MAD is 0; then the mean absolute deviation stands in (z = (x - median) / (1.253314 * MeanAD),
1.253314 = sqrt(pi / 2) makes it consistent with the standard deviation for normal data).

With few values the outlier's own deviation widens the scale it is judged by: among four children, one 12x
slower than the others (whose throughputs spread by about 30 % on a loaded machine) scored z = -2.1 and went
unflagged. So with fewer than SMALL_SAMPLE values each value is also judged against the others alone (their
median and MAD, when the others are not all equal), and the larger |z| counts; with many values the two agree.

A value must also differ from the median by a minimum share (default 50%: a slow child's stage takes
at least twice the median's time): when the rest agree to within a fraction of a percent, a robust
z-score calls a 2% difference an outlier, which nobody needs to look at; and the children that start a
batch run while the S3 server and the page cache warm up, measured at 0.55-0.6 of the median throughput
in the demo, are not what a reader should chase either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from profiling.metrics import median

MAD_SCALE = 0.6745
MEAN_AD_SCALE = 1.253314
DEFAULT_THRESHOLD = 3.5
DEFAULT_MIN_RELATIVE = 0.5
MIN_SAMPLES = 3
SMALL_SAMPLE = 20  # below it, each value is also scored against the others alone


@dataclass(frozen=True)
class Outlier:
    """One value that stands out: `key` names the child or instance."""

    key: str
    value: float
    median: float
    z: float

    @property
    def direction(self) -> str:
        """'low' or 'high' against the median."""
        return "low" if self.value < self.median else "high"

    @property
    def ratio(self) -> float | None:
        """value / median, or None when the median is 0."""
        return self.value / self.median if self.median else None


def median_absolute_deviation(values: list[float]) -> float:
    """The median of the absolute deviations from the median."""
    center = median(values)
    return median([abs(v - center) for v in values])


def robust_z_scores(values: Mapping[str, float]) -> dict[str, float]:
    """Modified z-score of every value (see the module docstring); all 0.0 when every value is equal."""
    if not values:
        return {}
    numbers = list(values.values())
    center = median(numbers)
    mad = median_absolute_deviation(numbers)
    if mad > 0:
        return {k: MAD_SCALE * (v - center) / mad for k, v in values.items()}
    mean_ad = sum(abs(v - center) for v in numbers) / len(numbers)
    if mean_ad > 0:
        return {k: (v - center) / (MEAN_AD_SCALE * mean_ad) for k, v in values.items()}
    return dict.fromkeys(values, 0.0)


def _z_against_the_others(values: Mapping[str, float], key: str) -> float | None:
    """The modified z-score of values[key] on the median and MAD of the other values; None when the others
    are all equal (no scale to judge by: the usual score stands)."""
    others = [v for k, v in values.items() if k != key]
    mad = median_absolute_deviation(others)
    return MAD_SCALE * (values[key] - median(others)) / mad if mad > 0 else None


def find_outliers(
    values: Mapping[str, float],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    min_relative: float = DEFAULT_MIN_RELATIVE,
    min_samples: int = MIN_SAMPLES,
    low_only: bool = False,
) -> list[Outlier]:
    """Values with |robust z| above `threshold` that also differ from the median by `min_relative`.

    Fewer than `min_samples` values say nothing about what is normal: the result is then empty.
    `low_only` keeps only values below the median (a slow child, when the values are throughputs).
    Sorted from the most extreme.
    """
    if len(values) < min_samples:
        return []
    center = median(list(values.values()))
    found: list[Outlier] = []
    for key, z in robust_z_scores(values).items():
        value = values[key]
        if len(values) < SMALL_SAMPLE:
            alone = _z_against_the_others(values, key)
            z = alone if alone is not None and abs(alone) > abs(z) else z
        if abs(z) <= threshold:
            continue
        if abs(value - center) < min_relative * abs(center):
            continue
        if low_only and value >= center:
            continue
        found.append(Outlier(key=key, value=value, median=center, z=z))
    return sorted(found, key=lambda o: -abs(o.z))


def find_slow(
    values: Mapping[str, float],
    spans: Mapping[str, tuple[float, float]] | None = None,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    min_relative: float = DEFAULT_MIN_RELATIVE,
) -> list[Outlier]:
    """The slow outliers of `values` (throughputs: find_outliers with low_only) that are also slower, by
    `min_relative`, than the median of their contemporaries: the keys whose (start, end) span in `spans`
    overlaps theirs. A child that ran beside a slow one shares its server and cores, and one that ran while
    everything warmed up shares that with the rest of its wave; neither is slow of its own. A key with no
    span, or no contemporaries, is judged against all the values only.
    """
    found = []
    for o in find_outliers(values, threshold=threshold, min_relative=min_relative, low_only=True):
        span = (spans or {}).get(o.key)
        beside = [values[k] for k, (start, end) in (spans or {}).items()
                  if span is not None and k != o.key and k in values and start < span[1] and end > span[0]]
        if beside and o.value > (1 - min_relative) * median(beside):
            continue
        found.append(o)
    return found
