"""The numpy paths of the diagnosis against polars' own results: group_by sums as floats, and
the kernel name rules run in Python."""

from __future__ import annotations

import numpy as np
import polars as pl

import tracedx
from tests.conftest import SAMPLES
from tests.tracebuilder import T0, TraceBuilder
from tracedx.analysis.intervals import grouped_ps_to_us, sum_us, to_ps


def test_grouped_ps_to_us_is_the_group_by_float():
    """grouped_ps_to_us gives the floats of polars' group_by(...).agg(sum_us(...)): the
    quotient for one group, the product by the reciprocal for several (they differ in the last
    bit on about 30% of random sums)."""
    rng = np.random.default_rng(7)
    for groups in (1, 2, 3, 17, 400):
        us = rng.random(groups * 3) * 1e5
        df = pl.DataFrame({"g": np.repeat(np.arange(groups), 3), "us": us})
        want = df.group_by("g", maintain_order=True).agg(x=sum_us("us"))["x"].to_numpy()
        ps = to_ps(us).reshape(groups, 3).sum(axis=1)
        assert grouped_ps_to_us(ps).tolist() == want.tolist()
        # the same sums read at other rows (a step with no rows: 0)
        assert grouped_ps_to_us(np.append(ps[:1], 0), groups)[0] == want[0]


def test_kernel_name_kinds_match_the_polars_rules(tmp_path):
    """The Python rules for ASCII names give kind_expr's and is_tf32_expr's values on every
    sample trace's kernel names; a non-ASCII name takes the polars rules."""
    from tracedx.analysis.kernels import is_tf32_expr, kernel_name_kinds, kind_expr

    def polars_kinds(t):
        names = t.kernels.select(pl.col("name").unique())
        return names.with_columns(kind=kind_expr("name"), tf32=is_tf32_expr("name")).sort("name")

    paths = sorted(SAMPLES.glob("*.json.gz"))
    assert paths
    seen = 0
    for p in paths:
        t = tracedx.load(p)
        got = kernel_name_kinds(t).sort("name")
        assert got.equals(polars_kinds(t)), p.name
        seen += got.height
    assert seen > 100
    b = TraceBuilder()
    b.step(1, T0, 200)
    e = b.op("aten::a", T0 + 1, 10)
    for i, name in enumerate(("Ä_gemm_kernel", "ncclDevKernel_AllReduce", "sum_tf32")):
        b.kernel(T0 + 20 + 10 * i, 2.0, b.launch(T0 + 2 + i, 1, ext=e), name, ext=e)
    t = tracedx.load(b.write(tmp_path / "u.json"))
    got = kernel_name_kinds(t).sort("name")
    assert got.equals(polars_kinds(t))
    assert dict(zip(got["name"], got["kind"], strict=True))["Ä_gemm_kernel"] == "gemm"


def test_kahan_means_are_the_group_by_means():
    """diagnosis._kahan_means gives the floats of polars' group_by(...).agg(mean) over
    consecutive groups of 1 to 256 values (a compensated sum over n: a plain or pairwise sum
    differs in the last bit on most of them), and polars' own past 256."""
    from tracedx.analysis.diagnosis import _kahan_means

    rng = np.random.default_rng(11)
    for lengths in ([1], [2, 3], [5, 1, 40, 7], list(range(1, 30)), [256, 3, 100], [300, 2]):
        n = np.array(lengths)
        v = rng.random(n.sum()) * 10.0 ** rng.integers(0, 6, n.sum())
        v[rng.random(len(v)) < 0.3] = 0.0
        first = np.append(0, np.cumsum(n)[:-1])
        g = np.repeat(np.arange(len(n)), n)
        df = pl.DataFrame({"a": g // 2, "b": g, "v": v})
        want = df.group_by("a", "b", maintain_order=True).agg(pl.col("v").mean())["v"]
        got = _kahan_means(v, first, n, lambda df=df: {"a": df["a"], "b": df["b"]})
        assert got.tolist() == want.to_list()


def test_kahan_means_with_infinities_are_the_group_by_means():
    """diagnosis._kahan_means with inf, -inf and NaN among the values gives polars' means (a
    compensated sum over an inf is NaN: those take polars' path)."""
    from tracedx.analysis.diagnosis import _kahan_means

    rng = np.random.default_rng(12)
    for lengths in ([1], [2, 3], [5, 1, 40, 7], [256, 3, 100]):
        for bad in (np.inf, -np.inf, np.nan):
            n = np.array(lengths)
            v = rng.random(n.sum()) * 100.0
            v[rng.random(len(v)) < 0.1] = bad
            first = np.append(0, np.cumsum(n)[:-1])
            g = np.repeat(np.arange(len(n)), n)
            df = pl.DataFrame({"b": g, "v": v})
            want = df.group_by("b", maintain_order=True).agg(pl.col("v").mean())["v"]
            got = _kahan_means(v, first, n, lambda df=df: {"b": df["b"]})
            assert np.array_equal(got, want.to_numpy(), equal_nan=True), (lengths, bad)


def test_group_sums_are_the_group_by_sums():
    """diagnosis._group_sums gives polars' group_by(key).agg(sum) per key on random values
    with inf, -inf, NaN and nulls among them, for groups of 255, 256 and 257 rows (past 256:
    polars' own path) and small ones."""
    from tracedx.analysis.diagnosis import _group_sums

    rng = np.random.default_rng(13)
    specials = [np.inf, -np.inf, np.nan, None]
    for sizes in ([1], [3, 7], [255], [256], [257], [255, 256, 2], [40, 257]):
        for p_bad, bad in (
            [(0.0, [])] + [(p, [x]) for p in (0.02, 0.2) for x in specials] + [(0.2, specials)]
        ):
            keys = [k for i, m in enumerate(sizes) for k in [f"k{i}"] * m]
            rng.shuffle(keys)
            values: list = (rng.random(len(keys)) * 10.0 ** rng.integers(0, 6, len(keys))).tolist()
            for i in np.flatnonzero(rng.random(len(keys)) < p_bad):
                values[i] = bad[int(rng.integers(0, len(bad)))]
            df = pl.DataFrame({"k": keys, "v": values}, schema={"k": pl.Utf8, "v": pl.Float64})
            want = dict(df.group_by("k").agg(pl.col("v").sum()).rows())
            got = _group_sums(keys, values)
            assert got.keys() == want.keys()
            for k, x in want.items():
                assert got[k] == x or (np.isnan(got[k]) and np.isnan(x)), (sizes, p_bad, k)


def _random_memcpys(rng, n):
    dirs = np.array(["HtoD", "DtoH", "DtoD", None], dtype=object)
    mems = np.array(["Pageable", "Pinned", "Device", None], dtype=object)
    return pl.DataFrame(
        {
            "step": rng.integers(0, 4, n),
            "device": pl.Series(rng.integers(0, 3, n)).set(pl.Series(rng.random(n) < 0.1), None),
            "direction": dirs[rng.integers(0, 4, n)].tolist(),
            "src_memory": mems[rng.integers(0, 4, n)].tolist(),
            "dst_memory": mems[rng.integers(0, 4, n)].tolist(),
            "bytes": rng.integers(0, 2**30, n),
            "duration_us": rng.random(n) * 10.0 ** rng.integers(-2, 4, n),
        },
        schema_overrides={"direction": pl.Utf8, "src_memory": pl.Utf8, "dst_memory": pl.Utf8},
    )


def test_memcpy_table_is_the_polars_table():
    """diagnosis._memcpy_table's bandwidths and order (worked out in Python on the groups) are
    those of polars' with_columns and sort of the group_by, for one group and for many."""
    from types import SimpleNamespace

    from tracedx.analysis.diagnosis import _host_memory, _memcpy_table

    rng = np.random.default_rng(3)
    for n in (1, 2, 5, 40, 300):
        m = _random_memcpys(rng, n)
        host_mem = _host_memory()  # (the grouping is shared: the Python bandwidths are tested)
        want = (
            m.filter(pl.col("step").is_in([1, 2, 3]))
            .group_by("device", "direction", host_memory=host_mem)
            .agg(count=pl.len(), bytes=pl.col("bytes").sum(), device_time_us=sum_us("duration_us"))
            .with_columns(
                achieved_gbs=pl.when(pl.col("device_time_us") > 0).then(
                    pl.col("bytes") / pl.col("device_time_us") / 1e3
                )
            )
            .sort(
                "device_time_us", "device", "direction", "host_memory",
                descending=[True, False, False, False], nulls_last=True,
            )
        )  # fmt: skip
        got = _memcpy_table(SimpleNamespace(memcpys=m), [1, 2, 3])
        assert got.to_dict(as_series=False) == want.to_dict(as_series=False)


def test_device_summaries_are_the_polars_aggregations():
    """diagnosis._device_summaries (numpy over the windows' rows) gives polars' median, min
    and max of each column per device, nulls left out (a median of two rows included)."""
    from tracedx.analysis.diagnosis import _SUMMARY_COLUMNS, _device_summaries, _stats

    rng = np.random.default_rng(5)
    for n in (1, 2, 3, 4, 9, 30):
        cols = {c: rng.random(n) * 10.0 ** rng.integers(0, 7) for c in _SUMMARY_COLUMNS}
        w = pl.DataFrame({"device": rng.integers(0, 2, n), **cols}).with_columns(
            pl.when(pl.Series(rng.random(n) < 0.2)).then(None).otherwise(pl.col("gpu_busy_us"))
            .alias("gpu_busy_us"),
            pl.col("kernels").cast(pl.UInt32),
        )  # fmt: skip
        w = w.vstack(w.head(1).with_columns(device=pl.lit(None, pl.Int64)))
        got = _device_summaries(w)
        for dev in w["device"].unique(maintain_order=True).to_list():
            d = w.filter(pl.col("device").is_null() if dev is None else pl.col("device") == dev)
            for c in _SUMMARY_COLUMNS:
                s = d[c]
                assert got[str(dev)][c] == _stats((s.median(), s.min(), s.max())), (n, dev, c)


def test_column_by_scalar_is_the_polars_division():
    """column_by_scalar gives pl.col(c) / d's floats: the quotient of one row, the product by
    the reciprocal of several (integer columns cast first)."""
    from tracedx.analysis.intervals import column_by_scalar

    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 9, 40):
        for _ in range(50):
            x = rng.random(n) * 10.0 ** rng.integers(0, 9)
            c = rng.integers(0, 10**6, n).astype(np.uint32)
            d = float(rng.random() * 1e4 + 0.5)
            df = pl.DataFrame({"x": x, "c": pl.Series(c, dtype=pl.UInt32)})
            got = df.select(x=pl.col("x") / d, c=pl.col("c") / 7)
            assert got["x"].to_numpy().tolist() == column_by_scalar(x, d).tolist()
            assert got["c"].to_numpy().tolist() == column_by_scalar(c, 7).tolist()


def test_is_in_matches_np_isin_on_integers():
    """is_in's table look-up answers as np.isin on the int64 values (floats truncated, NaN in
    nothing), for ids in a small range and in a wide one."""
    from tracedx.analysis.intervals import is_in

    rng = np.random.default_rng(4)
    for _ in range(500):
        n = int(rng.integers(0, 60))
        v = rng.integers(-5, 40, n) + rng.choice([0.0, 0.25, 0.5, -0.5], n)
        v[rng.random(n) < 0.2] = np.nan
        ids = rng.integers(-3, 40, int(rng.integers(0, 12))).astype(np.float64)
        if len(ids):
            ids[rng.random(len(ids)) < 0.2] = np.nan
        if rng.random() < 0.3:
            ids = np.append(ids, 10**9)  # past the table's range
        known = ~np.isnan(v)
        want = np.zeros(n, dtype=bool)
        want[known] = np.isin(v[known].astype(np.int64), ids[~np.isnan(ids)].astype(np.int64))
        assert is_in(v, ids).tolist() == want.tolist()
        iv = np.nan_to_num(v, nan=3).astype(np.int64)
        assert is_in(iv, ids).tolist() == np.isin(iv, ids[~np.isnan(ids)].astype(np.int64)).tolist()


def test_small_table_paths_match_the_polars_paths(monkeypatch):
    """Each analysis that groups a few rows in Python or numpy (op groups, top-level ops, idle
    time by cause, sync calls, annotation windows, steps per op), each loader step with a
    small-table path (lanes, API kinds, value counts, stream rows, ids, steps) and the
    diagnosis (its Kahan sums) gives what its polars path gives, on every sample trace."""
    import json

    import tracedx.trace as trace_mod
    from tracedx.analysis import diagnosis, ops, timeline
    from tracedx.trace import link
    from tracedx.trace import tables as tables_mod

    def tables(path):
        t = tracedx.load(path)
        steps = sorted(t.steps["step"].to_list())
        w = timeline.step_windows(t)
        gaps = timeline.idle_gaps(t, w)
        loaded = {
            k: getattr(t, k)
            for k in (
                "kernels", "memcpys", "memsets", "syncs", "launches", "ops", "annotations",
                "steps", "python_frames", "memory", "comm_args",
            )
        }  # fmt: skip
        report = json.dumps(diagnosis.diagnose(t).to_dict(), sort_keys=True, default=str)
        return {
            **loaded,
            "warnings": pl.DataFrame({"w": [repr(x) for x in t.warnings]}, schema={"w": pl.Utf8}),
            "diagnosis": pl.DataFrame({"json": [report]}),
            "op_groups": ops.op_groups(t, steps),
            "op_groups some": ops.op_groups(t, steps[1:3]),
            "top_level_ops": ops.top_level_ops(t, steps),
            "idle_by_cause": timeline.idle_by_cause(gaps),
            "sync_calls": timeline.sync_calls(t),
            "dataloader": timeline.dataloader_windows(t),
            "optimizer": timeline.optimizer_windows(t),
            "ops_in_steps": pl.Series(ops.ops_in_steps(t, steps[1:])).to_frame(),
        }

    paths = sorted(SAMPLES.glob("*.json.gz"))
    fast = {p.name: tables(p) for p in paths}
    for name, value in (
        ("ops._FEW_SIGNATURES", 0),
        ("ops._FEW_TOPS", -1),
        ("ops._NUMPY_OPS", -1),
        ("timeline._NUMPY_GAPS", 0),
        ("timeline._FEW_NAMES", -1),
        ("diagnosis._KAHAN_MAX", -1),
        ("link._NUMPY_ROWS", -1),
        ("tables._FEW", -1),
        ("trace._FEW_LAUNCHES", -1),
        ("trace._SHORT_RANGE", 0),
        ("trace._ONE_KEY_MAX", 0),
    ):
        module, attr = name.split(".")
        modules = {"ops": ops, "timeline": timeline, "diagnosis": diagnosis, "link": link}
        modules.update(tables=tables_mod, trace=trace_mod)
        monkeypatch.setattr(modules[module], attr, value)

    def steps_by_polars(annotations, warnings):
        marked = annotations.filter(
            (pl.col("category") == "user_annotation")
            & pl.col("name").str.starts_with("ProfilerStep#")
        )
        return link._extract_steps_polars(marked, warnings)

    monkeypatch.setattr(trace_mod, "extract_steps", steps_by_polars)
    for p in paths:
        slow = tables(p)
        for k, df in fast[p.name].items():
            assert df.schema == slow[k].schema, (p.name, k)
            assert df.equals(slow[k]), (p.name, k)


def test_few_op_groups_sums_two_signatures_as_polars():
    """A group of two signatures sums their costs times counts as polars' group_by does, and
    a group of three takes the polars path (None)."""
    from tracedx.analysis.ops import _few_op_groups

    per_sig = pl.DataFrame(
        {
            "name": ["aten::mm"] * 3 + ["aten::add"],
            "input_shapes": [[[2, 3], [3, 4]], [[2, 3], [3, 4]], [[2, 3], [3, 4]], [[5]]],
            "input_dtypes": [["float", "float"]] * 3 + [["float"]],
            "concrete_inputs": [["", ""], ["", "1"], ["", "2"], [""]],
            "op_id": [[0], [1], [2], [3]],
        }
    )
    flops = [1e16, 3.0, 7.0, None]

    def costs(keys):
        n = len(list(keys))
        return {
            "flops": flops[:n],
            "bytes": [1.0] * n,
            "compute_dtype": ["fp32"] * n,
            "family": ["gemm"] * n,
            "tensor_core": [True] * n,
        }

    def totals(sigs):
        n = len(sigs)
        return {
            "sigs": np.array(sigs),
            "count": np.array([3, 5, 2, 1][:n]),
            "device_ps": np.arange(1, n + 1) * 10**6,
            "kernels": np.ones(n, dtype=np.int64),
            "max_grid_blocks": np.full(n, 4),
            "tf32": np.zeros(n, dtype=bool),
            "kernel_kind": pl.Series("kernel_kind", ["gemm"] * n),
            "copy_ps": np.zeros(n, dtype=np.int64),
        }

    two = per_sig[[0, 1]]
    got = _few_op_groups(two, totals([0, 1]), costs)
    assert got["flops"].to_list() == [1e16 * 3 + 3.0 * 5]
    assert got["count"].to_list() == [8]
    assert _few_op_groups(per_sig, totals([0, 1, 2, 3]), costs) is None
