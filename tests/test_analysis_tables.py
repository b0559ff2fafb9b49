"""The numpy paths of the per-op tables against hand-computed values and polars' own sums."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

import tracedx
from tests.conftest import SAMPLES
from tests.tracebuilder import T0, TraceBuilder
from tracedx.analysis.intervals import gaps, gaps_in, is_in, ps_to_us, sum_us, sum_us_of, to_ps
from tracedx.analysis.ops import (
    launching_op_stats,
    op_arrays,
    op_column_of,
    op_rows,
    top_level_ops,
)

GEMM = "ampere_sgemm_128x64_nn"
GEMM_TF32 = "sm80_xmma_gemm_tf32f32_tf32f32_f32_nn_n_tilesize128x128x16"
EW = "void at::native::vectorized_elementwise_kernel<4>"


def test_sums_are_sum_us_floats():
    """Half a picosecond rounds to even, NaN and infinities count 0; sums are divided into
    microseconds, the correctly rounded quotient (which a polars group_by of several groups,
    multiplying by the reciprocal, can miss by the last bit)."""
    us = [1.25, 2.5, 0.0000005, 0.0000015, float("nan"), float("inf"), 0.895]
    assert to_ps(us).tolist() == [1_250_000, 2_500_000, 0, 2, 0, 0, 895_000]
    whole = pl.DataFrame({"x": us}).select(sum_us("x")).item()
    assert sum_us_of(us) == whole == 4.645002
    assert (
        ps_to_us(np.array([895_000, 7_424_000, 78_415_000])).tolist()
        == [
            0.895,
            7.424,
            78.415,
        ]
    )  # the quotients (895_000 * 1e-6 gives 0.8949999999999999, 78_415_000 * 1e-6 78.41499999999999)
    assert sum_us_of([]) == 0.0


def _trace(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 200)
    # op 1: one GEMM and one elementwise kernel (a tie: the first kind by name wins)
    e1 = b.op("aten::a", T0 + 1, 10)
    for ts, name, grid in ((T0 + 20, EW, [4, 2, 1]), (T0 + 30, GEMM, [3, 1, 1])):
        b.kernel(ts, 5.125, b.launch(T0 + 2, 1, ext=e1), name, ext=e1, grid=grid)
    # op 2: two GEMMs (one tf32) and one elementwise kernel
    e2 = b.op("aten::b", T0 + 12, 10)
    for ts, name in ((T0 + 40, GEMM), (T0 + 50, GEMM_TF32), (T0 + 60, EW)):
        b.kernel(ts, 2.5, b.launch(T0 + 13, 1, ext=e2), name, ext=e2)
    # op 3: a host-to-device copy only
    e3 = b.op("aten::copy_", T0 + 24, 10)
    b.memcpy(T0 + 70, 7.25, b.launch(T0 + 25, 2, "cudaMemcpyAsync", ext=e3), 4096, ext=e3)
    return tracedx.load(b.write(tmp_path / "t.json"))


def test_launching_op_stats_by_hand(tmp_path):
    t = _trace(tmp_path)
    s = launching_op_stats(t, [1])
    names = dict(t.ops.select("op_id", "name").rows())
    assert [names[i] for i in s["op_id"]] == ["aten::a", "aten::b", "aten::copy_"]
    assert s.select(pl.exclude("op_id")).rows() == [
        (10.25, 2, 8, False, "elementwise", 0.0),
        (7.5, 3, 1024, True, "gemm", 0.0),
        (7.25, 0, None, None, None, 7.25),
    ]
    assert launching_op_stats(t, [1]) is s  # once per set of tables and steps


def test_top_level_ops_by_hand(tmp_path):
    t = _trace(tmp_path)
    top = top_level_ops(t, [1]).sort("name")
    assert top.select("name", "device_time_us", "kernels", "launches", "launch_us").rows() == [
        ("aten::a", 10.25, 2, 2, 2.0),
        ("aten::b", 7.5, 3, 3, 3.0),
        ("aten::copy_", 7.25, 0, 1, 2.0),
    ]
    assert top_level_ops(t, [2]).height == 0


def test_op_lookups(tmp_path):
    t = _trace(tmp_path)
    o = op_arrays(t)
    ids = t.ops["op_id"].to_list()
    got = op_column_of(o, "top_op_id", np.array([float(ids[1]), np.nan, 1e9]))
    assert got[0] == t.ops["top_op_id"][1] and math.isnan(got[1]) and math.isnan(got[2])
    # the ids are the row numbers: looked up by value; else (a table of other ids) searched
    assert bool(o["ids_are_rows"]) and len(ids) == 3
    queries = np.array([2.0, np.nan, -1.0, 1.5, 3.0, 0.0])
    assert op_rows(o, queries).tolist() == [2, -1, -1, -1, -1, 0]
    other = {**o, "op_id": o["op_id"][::-1] * 10, "ids_are_rows": np.array(False)}
    assert op_rows(other, np.array([20.0, 10.0, 15.0, np.nan])).tolist() == [0, 1, -1, -1]
    assert is_in(np.array([1.0, np.nan, 3.0]), np.array([3, 1])).tolist() == [True, False, True]
    assert is_in(np.array([1, 2]), np.array([np.nan, 2.0])).tolist() == [False, True]


def test_gaps_in_windows():
    # covered [1, 2), [4, 6), [7, 8); windows [0, 5), [5, 9), [6, 7), [8, 8) and [9, 12)
    ms, me = np.array([1.0, 4.0, 7.0]), np.array([2.0, 6.0, 8.0])
    a, b = np.array([0.0, 5.0, 6.0, 8.0, 9.0]), np.array([5.0, 9.0, 7.0, 8.0, 12.0])
    win, gs, ge = gaps_in(ms, me, a, b)
    assert list(zip(win.tolist(), gs.tolist(), ge.tolist(), strict=True)) == [
        (0, 0.0, 1.0),
        (0, 2.0, 4.0),
        (1, 6.0, 7.0),
        (1, 8.0, 9.0),
        (2, 6.0, 7.0),
        (4, 9.0, 12.0),
    ]
    assert [x.tolist() for x in gaps(ms, me, 0.0, 5.0)] == [[0.0, 2.0], [1.0, 4.0]]
    win, gs, ge = gaps_in(np.empty(0), np.empty(0), a, b)  # nothing covered: whole windows
    assert win.tolist() == [0, 1, 2, 4] and gs.tolist() == [0.0, 5.0, 6.0, 9.0]


def test_op_costs_of_distinct_rows_match_the_joined_ones():
    """``distinct=True`` (one model call per row, no join) gives the default path's table,
    with and without a concrete inputs column."""
    from tracedx.analysis.intensity import add_op_costs

    ops = pl.DataFrame(
        {
            "name": ["aten::mm", "aten::mm", "aten::relu", "aten::view", "aten::add"],
            "input_shapes": [[[64, 32], [32, 16]], [[8, 8], [8, 8]], [[128]], [[4, 4], []], None],
            "input_dtypes": [
                ["float", "float"],
                ["c10::BFloat16"] * 2,
                ["float"],
                ["float", ""],
                None,
            ],
            "concrete_inputs": [["", ""], ["", ""], [""], ["", "[16]"], None],
        }
    )
    for df in (ops, ops.drop("concrete_inputs")):
        joined, distinct = add_op_costs(df), add_op_costs(df, distinct=True)
        assert joined.equals(distinct) and joined.schema == distinct.schema
    assert add_op_costs(ops, distinct=True)["flops"].to_list()[:2] == [2 * 64 * 32 * 16, 2 * 8**3]


def _signatures_by_lists(t, steps) -> pl.DataFrame:
    """op_signatures as grouped on the list columns themselves (the reference)."""
    from tracedx.analysis.ops import launching_op_stats

    sig = ["name", "input_shapes", "input_dtypes", "concrete_inputs"]
    ids = launching_op_stats(t, steps)["op_id"].drop_nulls().implode()
    return (
        t.ops.filter(pl.col("op_id").is_in(ids))
        .group_by(sig, maintain_order=True)
        .agg(pl.col("op_id").sort())
    )


def test_op_signatures_group_one_value_spelled_two_ways(tmp_path):
    """Two ops whose shapes are written differently (spaces) are one signature; other shapes
    or another name are another, in the order of their first op."""
    from tracedx.analysis.ops import op_signatures

    b = TraceBuilder()
    b.step(1, T0, 200)
    for i, (name, dims) in enumerate(
        (("aten::mm", [[2, 3], [3, 4]]), ("aten::mm", [[2, 3], [3, 5]]),
         ("aten::mm", [[2, 3], [3, 4]]), ("aten::bmm", [[2, 3], [3, 4]]))
    ):  # fmt: skip
        e = b.op(name, T0 + 1 + 20 * i, 10, input_dims=dims, input_type=["float", "float"])
        b.kernel(T0 + 10 + 20 * i, 5, b.launch(T0 + 2 + 20 * i, 1, ext=e), GEMM, ext=e)
    text = b.dumps()
    assert text.count('"Input Dims": [[2, 3], [3, 4]]') == 3
    p = tmp_path / "t.json"
    p.write_text(text.replace('"Input Dims": [[2, 3], [3, 4]]', '"Input Dims":[[2,3],[3,4]]', 1))
    t = tracedx.load(p)
    got = op_signatures(t, [1])
    assert got.columns == ["name", "input_shapes", "input_dtypes", "concrete_inputs", "op_id"]
    assert got.select("name", "input_shapes", pl.col("op_id").list.len()).rows() == [
        ("aten::mm", [[2, 3], [3, 4]], 2),
        ("aten::mm", [[2, 3], [3, 5]], 1),
        ("aten::bmm", [[2, 3], [3, 4]], 1),
    ]
    assert got.equals(_signatures_by_lists(t, [1]))


def test_op_signatures_on_the_code_equal_those_on_the_lists():
    from tracedx.analysis.ops import op_signatures

    for name in ("resnet_train-bf16-cl", "decode-eager", "gpt2_train-eager"):
        t = tracedx.load(SAMPLES / f"{name}.json.gz")
        steps = t.steps["step"].to_list()
        got = op_signatures(t, steps)
        assert got.height > 5
        assert got.with_columns(pl.col("op_id").list.sort()).equals(_signatures_by_lists(t, steps))


def test_top_level_ops_of_equal_times_are_ordered_by_name(tmp_path):
    """Ties (equal host and device time) come by name: the order of a group_by varied from run
    to run, and with it the diagnose JSON of the odd-case traces with host-only ops."""
    b = TraceBuilder()
    b.step(1, T0, 200)
    names = [f"aten::op{c}" for c in "fbdaec"]
    for i, name in enumerate(names):
        b.op(name, T0 + 1 + 20 * i, 10)
    t = tracedx.load(b.write(tmp_path / "t.json"))
    for _ in range(5):
        assert top_level_ops(t, [1])["name"].to_list() == sorted(names)


def test_a_grid_of_int64_max_blocks_is_kept_exactly(tmp_path):
    """A grid of 2**63 - 1 blocks (a hostile trace): the op stats and the op groups keep it;
    through float64 it rounded to 2**63, out of Int64 (an internal error)."""
    from tracedx.analysis.ops import op_groups

    b = TraceBuilder()
    b.step(1, T0, 200)
    e = b.op("aten::mm", T0 + 1, 10, input_dims=[[2, 3], [3, 4]], input_type=["float", "float"])
    b.kernel(T0 + 10, 5, b.launch(T0 + 2, 1, ext=e), GEMM, ext=e, grid=[2**63 - 1, 1, 1])
    e = b.op("aten::mm", T0 + 21, 10, input_dims=[[2, 3], [3, 4]], input_type=["float", "float"])
    b.kernel(T0 + 30, 5, b.launch(T0 + 22, 1, ext=e), GEMM, ext=e, grid=[7, 1, 1])
    b.op("aten::empty", T0 + 41, 10)  # no kernel: a null grid
    t = tracedx.load(b.write(tmp_path / "t.json"))
    assert launching_op_stats(t, [1])["max_grid_blocks"].to_list() == [2**63 - 1, 7]
    g = op_groups(t, [1])
    assert g.filter(pl.col("name") == "aten::mm")["max_grid_blocks"].to_list() == [2**63 - 1]
