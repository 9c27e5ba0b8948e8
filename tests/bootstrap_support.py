"""Shared by the interval tests: the exact bootstrap by brute force and by multiset enumeration (the
reference `eval/metrics`' Monte-Carlo intervals are held to), and the check of an interval against it."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
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


EXACT_LIMIT = 2_000_000
"""Most resampled multisets `exact_bootstrap_distribution` enumerates in one stratum."""


def exact_bootstrap_distribution(strata: Sequence[Sequence[Fraction]]) -> dict[Fraction, Fraction]:
    """The exact bootstrap distribution of the stratified mean: value -> probability.

    Enumerates, per stratum of n values, every multiset of n draws with its multinomial probability
    (n! / prod(counts!) / n^n), then combines strata; feasible for up to about 10 values a stratum.
    """
    dist: dict[Fraction, Fraction] = {Fraction(0): Fraction(1)}
    rows = 0
    for values in strata:
        n = len(values)
        if n == 0:
            continue
        if math.comb(2 * n - 1, n) > EXACT_LIMIT:
            raise ValueError(f"a stratum of {n} values has too many resamples to enumerate")
        sums: dict[Fraction, Fraction] = defaultdict(Fraction)
        for draw in itertools.combinations_with_replacement(range(n), n):
            counts = Counter(draw)
            ways = math.factorial(n)
            for c in counts.values():
                ways //= math.factorial(c)
            sums[sum((Fraction(values[i]) * c for i, c in counts.items()), Fraction(0))] += Fraction(
                ways, n**n)
        combined: dict[Fraction, Fraction] = defaultdict(Fraction)
        for (s1, p1), (s2, p2) in itertools.product(dist.items(), sums.items()):
            combined[s1 + s2] += p1 * p2
        dist = dict(combined)
        rows += n
    if rows == 0:
        raise ValueError("no values to resample")
    return dict(sorted((s / rows, p) for s, p in dist.items()))


def distribution_quantile(dist: dict[Fraction, Fraction], p: Fraction) -> Fraction:
    """The smallest value whose cumulative probability is >= p (the inverse CDF)."""
    cumulative = Fraction(0)
    for value, prob in sorted(dist.items()):
        cumulative += prob
        if cumulative >= p:
            return value
    return max(dist)
