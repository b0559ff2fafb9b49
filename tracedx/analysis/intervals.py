"""Interval arithmetic on sorted numpy arrays: unions and overlaps (all times in us).

Busy time is a union, never a sum: kernels on several streams overlap.
"""

from __future__ import annotations

import numpy as np
import polars as pl

PS_PER_US = 1_000_000


def sum_us(col: str | pl.Expr) -> pl.Expr:
    """Polars expression: the sum of a column of microseconds, the same whatever the row order
    or the number of threads (a float sum in polars is not: its partial sums per thread depend
    on ``POLARS_MAX_THREADS``). Each value is rounded to whole picoseconds and summed as
    Int64, exactly (up to 106 days in all); the result is Float64 microseconds. Nulls, NaN and
    infinities count as 0 (a time column holds none: such events are left out when read).
    """
    return sum_ps(col).cast(pl.Float64) / PS_PER_US


def sum_ps(col: str | pl.Expr) -> pl.Expr:
    """Polars expression: the exact sum of a column of microseconds as Int64 picoseconds
    (:func:`sum_us` before its division; partial sums that are summed again stay exact)."""
    e = pl.col(col) if isinstance(col, str) else col
    return (e * PS_PER_US).round().cast(pl.Int64, strict=False).fill_null(0).sum()


def to_ps(us) -> np.ndarray:
    """An array of microseconds as int64 picoseconds, rounded as :func:`sum_ps` rounds them
    (half to even; NaN, infinities and values past int64 become 0)."""
    ps = np.round(np.asarray(us, dtype=np.float64) * PS_PER_US)
    return np.where(np.isfinite(ps) & (np.abs(ps) < 2.0**63), ps, 0.0).astype(np.int64)


def ps_to_us(ps: np.ndarray) -> np.ndarray:
    """Sums of int64 picoseconds as Float64 microseconds: the correctly rounded quotient, as
    :func:`sum_us_of` gives for one sum. (A polars ``group_by`` of several groups multiplies by
    the reciprocal instead, which can differ in the last bit; of one group, it divides.)"""
    return np.asarray(ps).astype(np.float64) / PS_PER_US


def grouped_ps_to_us(ps: np.ndarray, groups: int | None = None) -> np.ndarray:
    """Sums of int64 picoseconds as the Float64 microseconds a polars
    ``group_by(...).agg(sum_us(...))`` of ``groups`` groups (default: one per sum) gives: of
    one group the quotient (:func:`ps_to_us`), of several the product by the reciprocal of
    10^6 (polars 2.1 divides a column of more than one row by a scalar so;
    tests/test_numpy_paths.py checks 1 to 400 groups of random sums against polars)."""
    us = np.asarray(ps).astype(np.float64)
    one = (len(us) if groups is None else groups) == 1
    return us / PS_PER_US if one else us * (1.0 / PS_PER_US)


def column_by_scalar(values: np.ndarray, d: float) -> np.ndarray:
    """``values / d`` as a polars expression ``pl.col(c) / d`` gives it for a column of
    ``values`` (float64, or integers cast to it): of one row the quotient, of several the
    product by the reciprocal of ``d`` (polars 2.1; tests/test_numpy_paths.py checks it)."""
    v = np.asarray(values).astype(np.float64)
    return v / d if len(v) == 1 else v * (1.0 / d)


def sum_us_of(us) -> float:
    """:func:`sum_us` of a whole column, in numpy: the same float (a single sum is divided)."""
    return float(to_ps(us).sum()) / PS_PER_US


def mask_of(s: pl.Series) -> np.ndarray:
    """A Boolean Series as a numpy bool array, null as False. (``fill_null`` on a Series is a
    polars query, 0.15 ms whatever its length: only a Series with nulls pays it, and one of up
    to 10,000 rows is read as Python objects instead, None as False.)"""
    if not s.null_count():
        return s.to_numpy()
    if len(s) <= 10_000:
        return s.to_numpy().astype(bool)
    return s.fill_null(False).to_numpy()


def ints_of(s: pl.Series, null: int) -> np.ndarray:
    """An integer Series as an int64 numpy array, nulls as ``null`` (as ``fill_null`` gives,
    without its polars query when there are none)."""
    return (s.fill_null(null) if s.null_count() else s).to_numpy().astype(np.int64, copy=False)


def is_in(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` is one of ``ids`` (integer ids; either may be floats with
    NaN for null, which is in nothing; a float value is truncated to an integer first): ids
    within a range of ``_TABLE_MAX`` (steps, most id sets) are looked up in a table of that
    range, with no NaN mask or copy of ``values`` (``np.isin`` cost 15-30 us on a few
    thousand values, called 60 times by a diagnosis); others by ``np.isin`` on integers,
    which looks ids up in a table (linear time) rather than sorting."""
    ids = np.asarray(ids)
    if ids.dtype.kind == "f":
        ids = ids[~np.isnan(ids)]
    ids = ids.astype(np.int64, copy=False)
    values = np.asarray(values)
    if len(ids) == 0 or len(values) == 0:
        return np.zeros(len(values), dtype=bool)
    lo, hi = int(ids.min()), int(ids.max())
    if hi - lo >= _TABLE_MAX:
        if values.dtype.kind != "f":
            return np.isin(values, ids)
        out = np.zeros(len(values), dtype=bool)
        known = ~np.isnan(values)
        out[known] = np.isin(values[known].astype(np.int64), ids)
        return out
    table = np.zeros(hi - lo + 1, dtype=bool)
    table[ids - lo] = True
    # the values that can truncate into [lo, hi] (NaN compares false: in none)
    near = (values > lo - 1) & (values < hi + 1)
    at = values[near].astype(np.int64) - lo
    hit = (at >= 0) & (at <= hi - lo)
    found = np.zeros(len(at), dtype=bool)
    found[hit] = table[at[hit]]
    out = np.zeros(len(values), dtype=bool)
    out[near] = found
    return out


_TABLE_MAX = 1 << 16
"""The widest range of ids :func:`is_in` looks up in a table of its own (64 KiB)."""


def rows_in_steps(table: pl.DataFrame, steps) -> np.ndarray:
    """Whether each row of ``table`` (shape (rows,), bool) has its ``step`` among ``steps`` (a
    null step is in none): a mask over the table's arrays, where a polars filter would cost
    a fixed 0.1-0.3 ms per call on a small trace."""
    return is_in(table["step"].cast(pl.Float64).to_numpy(), np.asarray(steps))


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals [start, end) into disjoint sorted intervals.

    Shapes: two float arrays of length n; returns two arrays of length m <= n.
    """
    if len(starts) == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(starts, kind="stable")
    s = np.asarray(starts, dtype=float)[order]
    e = np.asarray(ends, dtype=float)[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    m_start = s[idx]
    last = np.append(idx[1:] - 1, len(s) - 1)
    m_end = run_end[last]
    return m_start, m_end


def overlap(m_start: np.ndarray, m_end: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Length of [a_i, b_i) covered by the disjoint sorted intervals (m_start, m_end).

    Vectorised with prefix sums and binary search; a and b are arrays of window bounds.
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if len(m_start) == 0 or len(a) == 0:
        return np.zeros(len(a))
    lengths = m_end - m_start
    prefix = np.concatenate([[0.0], np.cumsum(lengths)])

    # covered length of (-inf, t) = full intervals ending before t + partial
    def covered_before(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(m_start, t, side="right")  # intervals starting before t
        full = prefix[k]
        # the k-1 th interval may extend past t
        j = np.maximum(k - 1, 0)
        excess = np.where(k > 0, np.maximum(m_end[j] - t, 0.0), 0.0)
        return full - excess

    return np.maximum(covered_before(b) - covered_before(a), 0.0)


def inside(m_start: np.ndarray, m_end: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Whether each time of ``t`` lies in one of the disjoint sorted intervals
    [m_start, m_end) (:func:`union`'s output): a bool array of t's length (NaN lies in none)."""
    if len(m_start) == 0 or len(t) == 0:
        return np.zeros(len(t), dtype=bool)
    j = np.searchsorted(m_start, t, side="right") - 1
    return (j >= 0) & (t < m_end[np.maximum(j, 0)])


def gaps(
    m_start: np.ndarray, m_end: np.ndarray, a: float, b: float
) -> tuple[np.ndarray, np.ndarray]:
    """The uncovered sub-intervals of [a, b) given disjoint sorted intervals."""
    _, g_start, g_end = gaps_in(m_start, m_end, np.array([a]), np.array([b]))
    return g_start, g_end


def gaps_in(
    m_start: np.ndarray, m_end: np.ndarray, a: np.ndarray, b: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The uncovered sub-intervals of each window [a_i, b_i) given disjoint sorted intervals
    (m_start, m_end): (window index i, gap start, gap end), window by window, each window's
    gaps in time order. One pass over all windows: a loop calling numpy per window cost 0.1 s
    over the 862 steps of a 1 GB trace."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(m_start) == 0:
        keep = b > a
        return np.flatnonzero(keep), a[keep], b[keep]
    lo = np.searchsorted(m_end, a, side="right")  # the first interval ending after a
    hi = np.searchsorted(m_start, b, side="left")  # past the last starting before b
    # window i's candidates k = 0..hi-lo: from a or the end of interval lo+k-1, to the start
    # of interval lo+k or b, clipped to the window (in place, to keep the temporaries few)
    per = np.maximum(hi - lo, 0) + 1
    win = np.repeat(np.arange(len(a)), per)
    at = np.arange(len(win))  # becomes lo + k
    at += np.repeat(lo - (np.cumsum(per) - per), per)
    top = len(m_start) - 1
    g_start = m_end[np.clip(at - 1, 0, top)]
    g_end = m_start[np.minimum(at, top)]
    wa, wb = a[win], b[win]
    np.clip(g_start, wa, wb, out=g_start)
    np.clip(g_end, wa, wb, out=g_end)
    first = at == lo[win]
    g_start[first] = wa[first]
    last = at == (lo + per - 1)[win]
    g_end[last] = wb[last]
    del wa, wb, first, last, at
    keep = g_end > g_start
    return win[keep], g_start[keep], g_end[keep]


def owned_union(starts: np.ndarray, ends: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    """Busy time of each of ``n`` owners, every covered instant counted once.

    Interval i belongs to owner ``owner[i]`` (0 <= owner < n). Owner k gets the length of the
    union of its intervals less what the intervals of owners 0..k-1 already cover, so the result
    adds up to the length of the union of all intervals (the earlier owner keeps an instant two
    owners' intervals share). Shapes: three arrays of length m; returns n floats.
    Cost: the intervals are sorted by owner once; each owner's union is merged into the running
    union at its tail only (the running intervals that end before the owner's first start
    cannot change), kept in one preallocated buffer, so time-ordered owners cost O(m log m) in
    all (any order gives the same answer, more slowly).
    """
    out = np.zeros(n)
    owner = np.asarray(owner)
    if len(owner) == 0 or n == 0:
        return out
    st = np.asarray(starts, dtype=float)
    en = np.asarray(ends, dtype=float)
    order = np.argsort(owner, kind="stable")
    st, en, ow = st[order], en[order], owner[order]
    bounds = np.searchsorted(ow, np.arange(n + 1), side="left")
    # the running union: acc_s[:size], acc_e[:size], disjoint and sorted
    acc_s, acc_e = np.empty(len(st)), np.empty(len(st))
    size = 0
    for k in range(n):
        lo, hi = bounds[k], bounds[k + 1]
        if lo == hi:
            continue
        us, ue = union(st[lo:hi], en[lo:hi])
        cut = int(np.searchsorted(acc_e[:size], us[0], side="right"))
        ts, te = acc_s[cut:size], acc_e[cut:size]
        shared = float(overlap(ts, te, us, ue).sum())
        out[k] = float((ue - us).sum()) - shared
        ms, me = union(np.concatenate([ts, us]), np.concatenate([te, ue]))
        acc_s[cut : cut + len(ms)] = ms
        acc_e[cut : cut + len(me)] = me
        size = cut + len(ms)
    return out
