"""Linking at its ties: the op that holds a launch, the op tree's order, and the GPU
data-quality counts when events share a start or a launch end. None may depend on the order
of the events in the file."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracedx
from tests.tracebuilder import T0, TraceBuilder
from tracedx.trace.link import thread_order


def _kinds(t) -> dict[str, int]:
    return {w.kind: w.count for w in t.warnings}


@pytest.mark.parametrize("outer_first", [True, False])
def test_launch_without_external_id_goes_to_the_innermost_op(tmp_path, outer_first):
    """Two ops start together, [10, 40) and [10, 20): a launch at 15 without an External id is
    the inner one's, one at 25 the outer one's, whichever the file lists first."""
    b = TraceBuilder(flows=False)
    b.step(1, T0, 100)
    ops = [("outer", 30), ("inner", 10)]
    for name, dur in ops if outer_first else ops[::-1]:
        b.op(name, T0 + 10, dur)
    b.kernel(T0 + 50, 5, b.launch(T0 + 15, 2), "k_inner")
    b.kernel(T0 + 60, 5, b.launch(T0 + 25, 2), "k_outer")
    t = tracedx.load(b.write(tmp_path / "t.json"))
    assert t.kernels.sort("start_us")["op_name"].to_list() == ["inner", "outer"]
    assert t.kernels.sort("start_us")["top_op_name"].to_list() == ["outer", "outer"]
    op = {r["name"]: r for r in t.ops.iter_rows(named=True)}
    assert op["inner"]["parent_id"] == op["outer"]["op_id"] and op["outer"]["parent_id"] is None


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_stream_overlap_at_one_start_does_not_depend_on_the_file_order(tmp_path, order):
    """Three kernels start at 50 on one stream: one of length 0 and two [50, 60). By start, the
    shorter first, only the second [50, 60) starts before an earlier one ended: 1."""
    b = TraceBuilder(flows=False)
    b.step(1, T0, 200)
    gpu = [0.0, 10.0, 10.0]
    for i in order:
        b.kernel(T0 + 50, gpu[i], b.launch(T0 + 10 + i, 1), f"k{i}")
    t = tracedx.load(b.write(tmp_path / "t.json"))
    assert _kinds(t) == {"stream_overlap": 1, "zero_duration": 1}


@pytest.mark.parametrize("a_first", [True, False])
def test_out_of_order_counts_every_launch_returned_before(tmp_path, a_first):
    """Launches A [10, 12) and B [11, 12) return together; C begins at 20. A's kernel ran at
    100, B's at 50, C's at 60: C's ran before A's, launched earlier, so it is out of order (1),
    whichever of A and B comes first in the file (and B is not: A had not returned at 11)."""
    b = TraceBuilder(flows=False)
    b.step(1, T0, 200)
    launches = {"A": (10, 2, 100), "B": (11, 1, 50), "C": (20, 1, 60)}
    for name in ("A", "B", "C") if a_first else ("B", "A", "C"):
        ts, dur, gpu_ts = launches[name]
        b.kernel(T0 + gpu_ts, 10, b.launch(T0 + ts, dur), name)
    t = tracedx.load(b.write(tmp_path / "t.json"))
    assert _kinds(t) == {"gpu_out_of_order": 1}


_IDS = st.sampled_from([None, -1, 0, 3])


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(_IDS, _IDS, st.integers(0, 6), st.integers(0, 3)), min_size=1, max_size=40
    ),
    runs=st.booleans(),
    cut=st.lists(st.integers(0, 40), max_size=3),
)
def test_thread_order_is_the_op_trees_stable_sort(rows, runs, cut):
    """thread_order gives polars' stable sort by (pid, tid, start, -end) with nulls last, and
    the group heads of the filled ids, both on tables in runs of one thread each in order (its
    fast path, with the runs in any order) and on any other."""
    if runs:  # each thread's rows in order, cut into runs, the runs in reverse
        rows = sorted(rows, key=lambda r: (r[0] is None, r[0] or 0, r[1] is None, r[1] or 0))
        rows = [
            r
            for _, g in itertools.groupby(rows, key=lambda r: (r[0], r[1]))
            for r in sorted(g, key=lambda r: (r[2], -r[3]))
        ]
        parts = np.split(np.arange(len(rows)), sorted(set(c % len(rows) for c in cut)))
        rows = [rows[i] for p in reversed(parts) for i in p]
    ops = pl.DataFrame(
        {
            "pid": [r[0] for r in rows],
            "tid": [r[1] for r in rows],
            "start_us": [float(r[2]) for r in rows],
            "end_us": [float(r[2] + r[3]) for r in rows],
        },
        schema={"pid": pl.Int64, "tid": pl.Int64, "start_us": pl.Float64, "end_us": pl.Float64},
    )
    ref = (
        ops.with_row_index("row")
        .sort(
            ["pid", "tid", "start_us", "end_us"],
            descending=[False, False, False, True],
            nulls_last=True,
            maintain_order=True,
        )
        .with_columns(pl.col("pid", "tid").fill_null(-1))
    )
    order, new, start, end = thread_order(ops)
    got = np.arange(len(rows)) if order is None else order
    assert got.tolist() == ref["row"].to_list()
    assert start.tolist() == ref["start_us"].to_list()
    assert end.tolist() == ref["end_us"].to_list()
    heads = ref.select(
        (pl.col("pid") != pl.col("pid").shift(1)) | (pl.col("tid") != pl.col("tid").shift(1))
    ).to_series()
    assert new.tolist() == heads.fill_null(True).to_list()


def test_find_rows_gives_the_first_equal_row_and_nan_matches_nothing():
    from tracedx.trace.link import find_rows

    keys = np.array([7, 3, 7, 5])  # unsorted, 7 twice: its first row, 0
    assert find_rows(keys, np.array([7, 5, 4, 3, 9])).tolist() == [0, 3, -1, 1, -1]
    assert find_rows(keys, np.array([7.0, np.nan])).tolist() == [0, -1]
    valid = np.array([False, True, True, True])  # row 0 left out: 7 is row 2
    assert find_rows(keys, np.array([7]), valid=valid).tolist() == [2]
    assert find_rows(np.array([1.0, np.nan, 2.0]), np.array([2.0, np.nan])).tolist() == [2, -1]
    assert find_rows(np.arange(5), np.array([4, 0, 5])).tolist() == [4, 0, -1]  # sorted: no sort
    assert find_rows(np.array([], np.int64), np.array([1])).tolist() == [-1]


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 1),
            st.integers(0, 2),
            st.sampled_from([0.0, 1.0, 2.0, 5.0, 7.0, 9.0]),
            st.sampled_from([0.0, 1.0, 3.0, 4.0, 8.0, np.inf, np.nan]),
        ),
        min_size=1,
        max_size=60,
    )
)
def test_op_tree_walk_and_vectorised_nesting_agree(rows):
    """_nest takes the stack walk in Python for a few ops and the vectorised paths for more:
    both give the same parent, depth and root, ranges that do not nest, zero-length ones and
    non-finite ends included."""
    from tracedx.trace import link

    rows.sort(key=lambda r: (r[0], r[1], r[2], -(r[2] + r[3])))
    pid = np.array([r[0] for r in rows])
    tid = np.array([r[1] for r in rows])
    start = np.array([r[2] for r in rows])
    end = np.array([r[2] + r[3] for r in rows])
    new = np.r_[True, (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])]
    walk = link._nest_walk(new, start, end)
    vec = link._nest_vector(new, start, end)
    for a, b in zip(walk, vec, strict=True):
        assert a.dtype == b.dtype and a.tolist() == b.tolist()
