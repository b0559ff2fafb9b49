"""Interval arithmetic on sorted numpy arrays: unions and overlaps (all times in us).

Busy time is a union, never a sum: kernels on several streams overlap.
"""

from __future__ import annotations

import numpy as np


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


def gaps(
    m_start: np.ndarray, m_end: np.ndarray, a: float, b: float
) -> tuple[np.ndarray, np.ndarray]:
    """The uncovered sub-intervals of [a, b) given disjoint sorted intervals."""
    lo = np.searchsorted(m_end, a, side="right")
    hi = np.searchsorted(m_start, b, side="left")
    s = np.clip(m_start[lo:hi], a, b)
    e = np.clip(m_end[lo:hi], a, b)
    g_start = np.concatenate([[a], e])
    g_end = np.concatenate([s, [b]])
    keep = g_end > g_start
    return g_start[keep], g_end[keep]
