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
        got = _kahan_means(v, first, n, lambda: {"a": df["a"], "b": df["b"]})
        assert got.tolist() == want.to_list()
