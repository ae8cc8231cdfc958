"""Bad apples: the children or instances whose stage throughput stands out from the rest. Pure.

In: {key: value} (each child's or instance's figure) and, for `find_slow`, each key's (start, end) span. Out: the
Outliers, most extreme first, each with its modified z-score (Iglewicz and Hoaglin: on the median and the MAD, which
the outlier itself hardly moves). A value stands out when |z| exceeds the threshold (among fewer than SMALL_SAMPLE
values, the larger of its z and its z against the others alone) or, among so few, lies SMALL_SAMPLE_RATIO off the
others' median; and only when it is also min_relative off the median. `find_slow` keeps the slow ones that are also
min_relative slower than their contemporaries. Fewer than min_samples values flag nothing. Cost: O(n log n + k x
CONTEMPORARY_SAMPLE) for k outliers. Why each rule, with the runs that set it: docs/report.md, the bad apples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from profiling.metrics import median

# z = MAD_SCALE x (x - median) / MAD (Iglewicz and Hoaglin): 0.6745 is the standard normal's 0.75 quantile, which
# makes z comparable to a standard score for normal data.
MAD_SCALE = 0.6745
# When more than half the values are equal the MAD is 0 and the mean absolute deviation stands in:
# z = (x - median) / (MEAN_AD_SCALE x MeanAD), sqrt(pi / 2) making it consistent with the standard deviation.
MEAN_AD_SCALE = 1.253314
DEFAULT_THRESHOLD = 3.5  # Iglewicz and Hoaglin's recommended cut-off for |z|
DEFAULT_MIN_RELATIVE = 0.5  # a slow child's stage takes at least twice the median's time
MIN_SAMPLES = 3
SMALL_SAMPLE = 20  # below it, each value is also scored against the others alone
SMALL_SAMPLE_RATIO = 3.0  # below SMALL_SAMPLE values, this far from the others' median stands out
CONTEMPORARY_SAMPLE = 4096  # the contemporaries whose median a slow child is held against, at most


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


def median_absolute_deviation(values: Sequence[float]) -> float:
    """The median of the absolute deviations from the median."""
    numbers = np.asarray(values, dtype=np.float64)
    return float(np.median(np.abs(numbers - np.median(numbers))))


def robust_z_scores(values: Mapping[str, float]) -> dict[str, float]:
    """Modified z-score of every value (on the MAD, or the mean absolute deviation when the MAD is 0); all 0.0 when
    every value is equal."""
    if not values:
        return {}
    numbers = np.fromiter(values.values(), dtype=np.float64, count=len(values))
    center = float(np.median(numbers))
    deviations = np.abs(numbers - center)
    mad = float(np.median(deviations))
    if mad > 0:
        scores = MAD_SCALE * (numbers - center) / mad
    elif (mean_ad := float(deviations.mean())) > 0:
        scores = (numbers - center) / (MEAN_AD_SCALE * mean_ad)
    else:
        scores = np.zeros(len(numbers))
    return dict(zip(values, scores.tolist(), strict=True))


def _against_the_others(values: Mapping[str, float], key: str) -> tuple[float | None, float]:
    """The modified z-score of values[key] on the median and MAD of the other values (None when the others
    are all equal: no scale to judge by), and the others' median."""
    others = [v for k, v in values.items() if k != key]
    center = median(others)
    mad = median_absolute_deviation(others)
    return (MAD_SCALE * (values[key] - center) / mad if mad > 0 else None), center


def _far_from(value: float, center: float) -> bool:
    """SMALL_SAMPLE_RATIO times below or above `center` (both positive)."""
    return center > 0 and value >= 0 and (value * SMALL_SAMPLE_RATIO <= center or value >= center * SMALL_SAMPLE_RATIO)


def find_outliers(
    values: Mapping[str, float],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    min_relative: float = DEFAULT_MIN_RELATIVE,
    min_samples: int = MIN_SAMPLES,
    low_only: bool = False,
) -> list[Outlier]:
    """Values with |robust z| above `threshold` (or, among fewer than SMALL_SAMPLE, SMALL_SAMPLE_RATIO times
    off the others' median) that also differ from the median by `min_relative`.

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
        if low_only and value >= center:
            continue
        if abs(value - center) < min_relative * abs(center):
            continue
        far = False
        if len(values) < SMALL_SAMPLE:
            alone, others = _against_the_others(values, key)
            z = alone if alone is not None and abs(alone) > abs(z) else z
            far = _far_from(value, others)
        if abs(z) <= threshold and not far:
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
    span, or no contemporaries, is judged against all the values only. When more than CONTEMPORARY_SAMPLE
    spans overlap, the median is that of an evenly spaced sample of them (by start time): an approximation.
    """
    slow = find_outliers(values, threshold=threshold, min_relative=min_relative, low_only=True)
    timed = [k for k in values if k in (spans or {})]
    if not slow or not timed or spans is None:
        return slow
    starts = np.array([spans[k][0] for k in timed], dtype=np.float64)
    ends = np.array([spans[k][1] for k in timed], dtype=np.float64)
    rates = np.array([values[k] for k in timed], dtype=np.float64)
    order = np.argsort(starts, kind="stable")
    starts, ends, rates = starts[order], ends[order], rates[order]
    position = {timed[int(i)]: n for n, i in enumerate(order)}
    longest = float((ends - starts).max())
    found = []
    for o in slow:
        span = spans.get(o.key)
        if span is None:
            found.append(o)
            continue
        # A span overlaps [a, b) when it starts before b and ends after a; it ends at most `longest` after it
        # starts, so it started after a - longest: one slice of the spans sorted by start holds them all.
        lo = int(np.searchsorted(starts, span[0] - longest, side="right"))
        hi = int(np.searchsorted(starts, span[1], side="left"))
        picked = np.arange(lo, hi)
        if picked.size > CONTEMPORARY_SAMPLE:
            picked = np.unique(np.linspace(lo, hi - 1, CONTEMPORARY_SAMPLE).astype(np.int64))
        picked = picked[(ends[picked] > span[0]) & (picked != position[o.key])]
        if picked.size and o.value > (1 - min_relative) * float(np.median(rates[picked])):
            continue
        found.append(o)
    return found
