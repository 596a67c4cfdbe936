"""Order statistics without sorting, for Numba kernels: the k-th smallest value of a slice
(quickselect, in place) and an exact median that copies at most a handful of values.

:func:`median_of` returns exactly ``np.median``'s value for finite input: counting passes narrow
a value bracket around the middle ranks (no copy, no reordering of the input), and only the few
values left in the bracket are selected. The optics detector's Theil-Sen fits take three medians
per fit at every bucket close; the cooling and straggler detectors take each group's median with
it too.
"""

from __future__ import annotations

import math

import numpy as np

from foreshock.numba_config import jit

MEDIAN_BRACKET = 8
"""Counting passes narrow a value bracket around the middle ranks until it holds this few values;
only those are then selected (:func:`median_of`)."""
MEDIAN_PASSES = 16  # counting passes before selecting whatever the bracket holds
MEDIAN_FIRST_SPREAD = 0.15  # the first two pivots: mean -/+ this many standard deviations


@jit
def bucket_by_group(groups: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The elements by group, in one counting sort: those of group ``g`` are
    ``members[start[g]:start[g + 1]]``, in index order; an element whose group is outside
    ``0..n_groups - 1`` (-1: not taken) is in none. Returns ``start``, ``members`` and the largest
    group's size (the workspace a median over one group needs)."""
    start = np.zeros(n_groups + 1, np.int64)
    for k in range(len(groups)):
        if 0 <= groups[k] < n_groups:
            start[groups[k] + 1] += 1
    largest = 0
    for g in range(n_groups):
        largest = max(largest, start[g + 1])
        start[g + 1] += start[g]
    fill = start[:n_groups].copy()
    members = np.empty(start[n_groups], np.int64)
    for k in range(len(groups)):
        if 0 <= groups[k] < n_groups:
            members[fill[groups[k]]] = k
            fill[groups[k]] += 1
    return start, members, largest


@jit
def select_kth(a: np.ndarray, lo: int, hi: int, k: int) -> float:
    """The ``k``-th smallest value of ``a[lo:hi + 1]`` (Hoare's quickselect, median-of-three
    pivot), reordering that slice in place. ``a`` must hold no NaN."""
    while hi > lo:
        mid = (lo + hi) >> 1
        if a[mid] < a[lo]:
            a[lo], a[mid] = a[mid], a[lo]
        if a[hi] < a[mid]:
            a[hi], a[mid] = a[mid], a[hi]
            if a[mid] < a[lo]:
                a[lo], a[mid] = a[mid], a[lo]
        pivot = a[mid]  # a[lo] <= pivot <= a[hi]: both scans stop inside the slice
        i = lo
        j = hi
        while i <= j:
            while a[i] < pivot:
                i += 1
            while pivot < a[j]:
                j -= 1
            if i <= j:
                a[i], a[j] = a[j], a[i]
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            return a[k]  # a[j + 1:i] all equal the pivot
    return a[k]  # type: ignore[no-any-return]


@jit
def _range_and_nans(a: np.ndarray, n: int) -> tuple[float, float, int]:
    """(min, max, NaN count) of ``a[:n]``; four independent chains, so the loop runs at the
    processor's width rather than at the latency of one compare-and-select chain."""
    lo0 = lo1 = lo2 = lo3 = np.inf
    hi0 = hi1 = hi2 = hi3 = -np.inf
    nans = 0
    i = 0
    while i + 4 <= n:
        v0, v1, v2, v3 = a[i], a[i + 1], a[i + 2], a[i + 3]
        lo0 = v0 if v0 < lo0 else lo0
        lo1 = v1 if v1 < lo1 else lo1
        lo2 = v2 if v2 < lo2 else lo2
        lo3 = v3 if v3 < lo3 else lo3
        hi0 = v0 if v0 > hi0 else hi0
        hi1 = v1 if v1 > hi1 else hi1
        hi2 = v2 if v2 > hi2 else hi2
        hi3 = v3 if v3 > hi3 else hi3
        nans += (v0 != v0) + (v1 != v1) + (v2 != v2) + (v3 != v3)
        i += 4
    while i < n:
        v = a[i]
        lo0 = v if v < lo0 else lo0
        hi0 = v if v > hi0 else hi0
        nans += v != v
        i += 1
    return min(min(lo0, lo1), min(lo2, lo3)), max(max(hi0, hi1), max(hi2, hi3)), nans


@jit
def _sums(a: np.ndarray, n: int) -> tuple[float, float]:
    """(sum, sum of squares) of ``a[:n]`` (NaN or inf in ``a`` makes the second non-finite)."""
    total = 0.0
    squares = 0.0
    for i in range(n):
        total += a[i]
        squares += a[i] * a[i]
    return total, squares


@jit
def _count_below(a: np.ndarray, n: int, p: float, q: float) -> tuple[int, int, int, int]:
    """How many of ``a[:n]`` are < p, <= p, < q, <= q (branch-free: the loop vectorises)."""
    lt_p = 0
    le_p = 0
    lt_q = 0
    le_q = 0
    for i in range(n):
        v = a[i]
        lt_p += v < p
        le_p += v <= p
        lt_q += v < q
        le_q += v <= q
    return lt_p, le_p, lt_q, le_q


@jit
def _middle_at(a: np.ndarray, n: int, p: float, lt: int, le: int, k1: int, k2: int) -> float:
    """The median when the pivot ``p`` lies among the middle ranks ``k1 <= k2``
    (``lt = #(a < p) <= k2`` and ``le = #(a <= p) > k1``): each middle value is ``p`` itself or
    its nearest neighbour below or above."""
    if lt <= k1:
        v1 = p
    else:
        v1 = -np.inf
        for i in range(n):
            v = a[i]
            w = v if v < p else -np.inf
            v1 = w if w > v1 else v1
    if k2 < le:
        v2 = p
    else:
        v2 = np.inf
        for i in range(n):
            v = a[i]
            w = v if v > p else np.inf
            v2 = w if w < v2 else v2
    return v2 if k1 == k2 else (v1 + v2) / 2


@jit
def _bracket_range(a: np.ndarray, n: int, lo: float, hi: float) -> tuple[float, float]:
    """(smallest, largest) value of ``a[:n]`` in ``[lo, hi]``."""
    v_min = np.inf
    v_max = -np.inf
    for i in range(n):
        v = a[i]
        inside = (v >= lo) & (v <= hi)
        v_min = v if inside & (v < v_min) else v_min
        v_max = v if inside & (v > v_max) else v_max
    return v_min, v_max


@jit
def median_of(a: np.ndarray, n: int, buf: np.ndarray) -> float:
    """``np.median(a[:n])``, exactly, without copying or sorting ``a`` (left as it is);
    ``buf`` is workspace (``n + 1`` values never fall back to ``np.median``; ``MEDIAN_BRACKET + 1``
    usually suffice).

    Quickselect's branches are a coin toss on noisy data; counting is not. A value bracket
    ``[lo, hi]`` that holds the middle ranks is narrowed by counting passes: two pivots are
    compared with every value in one branch-free (vectorised) pass, and an end moves just past
    a pivot with every value it excludes. The first pivots sit a little either side of the
    mean; later ones are interpolated inside the bracket a little below and above the middle
    ranks. An end the first pivots leave open is closed at the mean -/+ one standard deviation
    (no median lies beyond). When a pass excludes nothing (ties: quantised readings), the
    bracket's values are selected as they are if ``buf`` holds them, else the next pivots are
    its own smallest and largest values, so each pass drops at least those. Once the bracket
    holds ``MEDIAN_BRACKET`` values or fewer, they are copied out and selected. The result is a value of ``a`` (or ``(a + b) / 2`` of the two middle ones, as
    NumPy computes it), so it is the number ``np.median`` gives; with a NaN in ``a`` it is
    ``np.median`` itself. About 0.6 µs for 256 values where ``np.median`` takes 3 µs.
    """
    if n <= 0:
        return np.nan
    total, squares = _sums(a, n)
    if abs(squares) < np.inf:  # no NaN, no inf: start unbounded, the first pivots near the mean
        lo, hi = -np.inf, np.inf
        mean = total / n
        sd = math.sqrt(max(squares / n - mean * mean, 0.0))
        # every median lies within one standard deviation of the mean: an end the first pivots
        # leave open is closed there (a little wider for rounding)
        reach = 1.01 * sd + 1e-300
    else:
        lo, hi, nans = _range_and_nans(a, n)
        if nans:
            return np.median(a[:n])  # type: ignore[no-any-return]
        mean = sd = reach = np.nan
    k1 = (n - 1) >> 1  # the middle ranks (equal when n is odd)
    k2 = n >> 1
    c_lo = 0  # values below the bracket
    c_hi = n  # values up to its top
    stalled = False
    for it in range(MEDIAN_PASSES):
        width = c_hi - c_lo
        if width <= MEDIAN_BRACKET or not lo < hi:
            break
        if it == 0 and sd == sd:
            p, q = mean - MEDIAN_FIRST_SPREAD * sd, mean + MEDIAN_FIRST_SPREAD * sd
        elif hi == np.inf and not stalled and lo < mean + reach:
            q = mean + reach
            p = 0.5 * lo + 0.5 * q
        elif lo == -np.inf and not stalled and mean - reach < hi:
            p = mean - reach
            q = 0.5 * p + 0.5 * hi
        elif stalled or not (abs(lo) < np.inf and abs(hi) < np.inf):
            p, q = _bracket_range(a, n, lo, hi)
        else:
            gap = 1.0 + width / 16.0
            p = lo + (hi - lo) * ((k1 - gap - c_lo) / width)
            q = lo + (hi - lo) * ((k2 + 1 + gap - c_lo) / width)
            if not (lo < p < hi and abs(p) < np.inf):
                p = np.nan  # off the bracket (an infinite end): counts against NaN are all 0
            if not (lo < q < hi and abs(q) < np.inf):
                q = np.nan
            if p != p and q != q:
                p, q = _bracket_range(a, n, lo, hi)
        lt_p, le_p, lt_q, le_q = _count_below(a, n, p, q)
        for second in range(2):
            pivot = q if second else p
            lt = lt_q if second else lt_p
            le = le_q if second else le_p
            if pivot != pivot:
                continue
            if le <= k1:  # the middle lies above the pivot: the bracket starts just past it
                lo, c_lo = np.nextafter(pivot, np.inf), le
            elif lt > k2:  # ... below it
                hi, c_hi = np.nextafter(pivot, -np.inf), lt
            else:
                return _middle_at(a, n, pivot, lt, le, k1, k2)
        stalled = c_hi - c_lo == width
        if stalled and c_hi - c_lo < buf.shape[0]:
            break  # ties the pivots fall between: select from the bracket as it is
    if lo == hi:
        return lo  # every value in the bracket is this one
    if c_hi - c_lo >= buf.shape[0]:
        return np.median(a[:n])  # type: ignore[no-any-return]  # too little workspace
    m = 0
    for i in range(n):  # branch-free copy of the bracket's values
        v = a[i]
        buf[m] = v
        m += (v >= lo) & (v <= hi)
    v2 = select_kth(buf, 0, m - 1, k2 - c_lo)
    if k1 == k2:
        return v2
    v1 = buf[0]  # buf[:k2 - c_lo] now holds the bracket's values below v2; k1 is their largest
    for i in range(1, k2 - c_lo):
        v1 = buf[i] if buf[i] > v1 else v1
    return (v1 + v2) / 2
