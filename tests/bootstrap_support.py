"""Shared by the interval tests: the exact bootstrap by brute force, and the check of a Monte-Carlo
interval against it."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from fractions import Fraction

import pytest

from examples.tau2.eval.metrics import Interval


def brute_force_means(strata: list[list[Fraction]]) -> list[Fraction]:
    """The stratified mean of every resample, sorted: all prod(n_d ** n_d) index tuples, equally likely.

    Every stratum's n_d ** n_d draws are enumerated; across strata, draws with equal sums are combined
    with their multiplicity (the same list, built faster)."""
    sums = [
        Counter(sum((values[i] for i in draw), Fraction(0))
                for draw in itertools.product(range(len(values)), repeat=len(values)))
        for values in strata
    ]
    rows = sum(len(values) for values in strata)
    means: Counter[Fraction] = Counter()
    for combo in itertools.product(*(c.items() for c in sums)):
        means[sum((s for s, _ in combo), Fraction(0)) / rows] += math.prod(m for _, m in combo)
    return [m for m in sorted(means) for _ in range(means[m])]


def inverse_cdf(sorted_means: list[Fraction], p: Fraction) -> Fraction:
    """The smallest resample mean x with P(mean <= x) >= p."""
    return sorted_means[math.ceil(p * len(sorted_means)) - 1]


def check_against_exact(mc: Interval, sorted_means: list[Fraction], confidence: float, resamples: int) -> int:
    """Each Monte-Carlo endpoint must be a p'-quantile of the exact bootstrap distribution for a p' within
    4 standard errors of the intended p, and equal the exact quantile when no atom's cumulative
    probability lies that close to p. Returns how many endpoints were checked for equality."""
    floats = [float(m) for m in sorted_means]
    n = len(floats)
    cdf = sorted({bisect.bisect_right(floats, x + 1e-9) / n for x in floats})
    alpha = (1 - Fraction(str(confidence))) / 2
    equal_checks = 0
    for p, got in ((alpha, mc.low), (1 - alpha, mc.high)):
        delta = 4 * math.sqrt(float(p * (1 - p)) / resamples)
        below = bisect.bisect_left(floats, got - 1e-9) / n
        at_or_below = bisect.bisect_right(floats, got + 1e-9) / n
        assert at_or_below > below, f"{got} is not a value any resample takes"
        assert below <= float(p) + delta and at_or_below >= float(p) - delta, (p, got, below, at_or_below)
        if all(abs(c - float(p)) > delta for c in cdf):
            assert got == pytest.approx(float(inverse_cdf(sorted_means, p)), abs=1e-9)
            equal_checks += 1
    return equal_checks
