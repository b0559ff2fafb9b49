"""Per-op tables: CPU time against device time, and op groups for the roofline.

An op's device time is the sum of the durations of the GPU events its launches produced
(kernels, memcpys, memsets), attributed by correlation id through the launch call to the
innermost cpu_op that issued it (see :mod:`tracedx.trace.link`).

The tables are small (one row per launching op, per signature, per top-level op), and each
eager polars call has a fixed cost whatever its rows, so the per-op sums are taken in numpy
over the op table's arrays (:func:`op_arrays`), exactly: times as int64 picoseconds, the
floats polars' ``sum_us`` gives (:mod:`tracedx.analysis.intervals`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracedx.analysis import HOST_DEVICE_COPY
from tracedx.analysis.intervals import (
    PS_PER_US,
    grouped_ps_to_us,
    ints_of,
    is_in,
    mask_of,
    ps_to_us,
    rows_in_steps,
    sum_us,
    to_ps,
)
from tracedx.analysis.kernels import (
    KIND_CODES,
    kernel_kind_codes,
    kernel_name_codes,
    kernel_name_kinds,
)
from tracedx.trace import Trace
from tracedx.trace.link import find_rows

KINDS_SORTED = list(KIND_CODES)


def launching_op_stats(trace: Trace, steps: list[int] | None) -> pl.DataFrame:
    """One row per op that launched GPU work, in ``op_id`` order: op_id, device_time_us,
    kernels, max_grid_blocks, tf32, kernel_kind, host_device_copy_us.

    ``tf32`` is True when any of its GEMM kernels ran on TF32 tensor cores (kernel name).
    ``kernel_kind`` is the kind most of its kernels have (ties: the first kind by name).
    ``max_grid_blocks``, ``tf32`` and ``kernel_kind`` are null for an op that launched no
    kernel. ``host_device_copy_us`` is the device time of its host-to-device and
    device-to-host memcpys (PCIe or NVLink-C2C, not device memory). Times are summed as
    exact integer picoseconds (:func:`~tracedx.analysis.intervals.sum_us`). Computed once
    per set of tables and steps.
    """
    return trace.memo(
        f"launching_op_stats {steps}", _launch_tables(trace), lambda: _launching(trace, steps)
    )


def _launch_tables(trace: Trace) -> tuple:
    """The tables :func:`launching_op_stats` is computed from (its memo's key)."""
    return (trace.ops, trace.kernels, trace.memcpys, trace.memsets)


def _launching_blocks(trace: Trace, steps: list[int] | None) -> np.ndarray:
    """:func:`launching_op_stats`' ``max_grid_blocks`` as int64, its least value for null."""
    stats = launching_op_stats(trace, steps)
    return trace.memo(
        f"launching_op_blocks {steps}",
        _launch_tables(trace),
        lambda: stats["max_grid_blocks"].fill_null(_NO_BLOCKS).to_numpy(),
    )


def _launching(trace: Trace, steps: list[int] | None) -> pl.DataFrame:
    # the rows in numpy masks over the tables' arrays (a lazy filter per table cost 1-2 ms of
    # fixed overhead at 10 MB; at 1 GB the copies are the same)
    def launched(t: pl.DataFrame) -> np.ndarray:
        # (is_not_null is a polars query: a column without nulls needs none)
        ids = t["op_id"]
        keep = (
            np.ones(len(ids), dtype=bool)
            if not ids.null_count()
            else ~np.isnan(ids.cast(pl.Float64).to_numpy())
        )
        if steps is not None:
            keep &= rows_in_steps(t, steps)
        return keep

    gpu = trace.gpu_activity()
    on = launched(gpu)
    gpu_op = gpu["op_id"].to_numpy()[on].astype(np.int64)
    gpu_is_kernel = mask_of(gpu["kind"] == "kernel")[on]
    gpu_us = gpu["duration_us"].to_numpy()[on]
    names = kernel_name_kinds(trace)
    kt = trace.kernels
    on = launched(kt)
    k_op = kt["op_id"].to_numpy()[on].astype(np.int64)
    k_blocks = (
        ints_of(kt["grid_x"], 1)[on] * ints_of(kt["grid_y"], 1)[on] * ints_of(kt["grid_z"], 1)[on]
    )
    codes = kernel_name_codes(trace)[on]
    # the kind as its position in KINDS_SORTED (counted in numpy)
    k_kind = kernel_kind_codes(trace)[codes]
    k_tf32 = names["tf32"].to_numpy()[codes]
    m = trace.memcpys
    on = launched(m) & (mask_of(m["direction"] == "HtoD") | mask_of(m["direction"] == "DtoH"))
    hd_op = m["op_id"].to_numpy()[on].astype(np.int64)
    hd_us = m["duration_us"].to_numpy()[on]
    op_ids, of_gpu = _groups(gpu_op)
    kernels = _group_sums(of_gpu, len(op_ids), gpu_is_kernel.astype(np.int64))
    # the kernel columns of each op (ops that launched only copies or memsets have none)
    k_ops, of_k = _groups(k_op)
    at = np.searchsorted(op_ids, k_ops)
    has_k = np.zeros(len(op_ids), dtype=bool)
    has_k[at] = True
    blocks = np.zeros(len(op_ids), dtype=np.int64)
    np.maximum.at(blocks, at[of_k], k_blocks)
    tf32 = np.zeros(len(op_ids), dtype=bool)
    np.logical_or.at(tf32, at[of_k], k_tf32)
    kind = np.full(len(op_ids), None, dtype=object)
    kind[at] = np.array(KINDS_SORTED, dtype=object)[_most_common(of_k, len(k_ops), k_kind)]
    hd_ops, of_hd = _groups(hd_op)
    copy_ps = np.zeros(len(op_ids), dtype=np.int64)
    copy_ps[np.searchsorted(op_ids, hd_ops)] = _group_sums(of_hd, len(hd_ops), to_ps(hd_us))
    device_ps = _group_sums(of_gpu, len(op_ids), to_ps(gpu_us))
    # (kept for op_groups, which would read them back from the Series through a fill_null)
    no_blocks = np.where(has_k, blocks, _NO_BLOCKS)
    trace.memo(f"launching_op_blocks {steps}", _launch_tables(trace), lambda: no_blocks)
    return pl.DataFrame(
        {
            "op_id": pl.Series(op_ids, dtype=pl.Int64),
            "device_time_us": pl.Series(ps_to_us(device_ps)),
            "kernels": pl.Series(kernels, dtype=pl.UInt32),
            # (not through float64: a grid of 2**63 - 1 blocks rounds up out of Int64)
            "max_grid_blocks": pl.Series(blocks, dtype=pl.Int64).set(pl.Series(~has_k), None),
            "tf32": _null_where_not(has_k, tf32).cast(pl.Boolean),
            "kernel_kind": pl.Series(kind.tolist(), dtype=pl.Utf8),
            "host_device_copy_us": pl.Series(ps_to_us(copy_ps)),
        }
    )


def _null_where_not(keep: np.ndarray, values: np.ndarray) -> pl.Series:
    """``values`` (numbers or bools, exact as float64) as a Float64 Series, null where not
    ``keep`` (cast it back)."""
    return pl.Series(np.where(keep, values.astype(np.float64), np.nan), nan_to_null=True)


def _sums_by(
    o: dict[str, np.ndarray], op_ids: np.ndarray, of: np.ndarray, *values: np.ndarray
) -> list[np.ndarray]:
    """Per op of ``op_ids`` (distinct ids of the op table of :func:`op_arrays` ``o``), the
    exact sums of each int64 array of ``values`` over the rows whose ``of`` is that op (rows
    with another ``of``, or NaN, count nowhere). The ops are found by their rows
    (:func:`op_rows`), one table of positions per op row: no search among ``op_ids``."""
    position = np.full(len(o["op_id"]), -1, dtype=np.int64)
    found = op_rows(o, op_ids)
    position[found[found >= 0]] = np.flatnonzero(found >= 0)  # an id not in the table: nowhere
    rows = op_rows(o, of)
    at = np.where(rows >= 0, position[rows], -1)
    hit = at >= 0
    sums = []
    for v in values:
        out = np.zeros(len(op_ids), dtype=np.int64)
        np.add.at(out, at[hit], v[hit])
        sums.append(out)
    return sums


def op_arrays(trace: Trace) -> dict[str, np.ndarray]:
    """The op table's columns as numpy arrays, for analyses that only count and sum:
    ``op_id`` (int64), ``parent_id``, ``top_op_id`` and ``step`` (floats, NaN where null),
    ``start_us``, ``end_us``, ``duration_us`` (us) and ``is_top`` (bool: no parent); shape
    (ops,) each; and ``ids_are_rows`` (a bool of shape ()): whether each op's id is its row
    number, as :mod:`tracedx.trace.link` numbers them. Computed once per op table."""

    def build() -> dict[str, np.ndarray]:
        o = trace.ops
        ids = o["op_id"].to_numpy()
        return {
            "ids_are_rows": np.array(np.array_equal(ids, np.arange(len(ids)))),
            "op_id": ids,
            "top_op_id": o["top_op_id"].cast(pl.Float64).to_numpy(),
            "step": o["step"].cast(pl.Float64).to_numpy(),
            "start_us": o["start_us"].to_numpy(),
            "end_us": o["end_us"].to_numpy(),
            "duration_us": o["duration_us"].to_numpy(),
            "parent_id": o["parent_id"].cast(pl.Float64).to_numpy(),
            "is_top": o["parent_id"].is_null().to_numpy(),
        }

    return trace.memo("op_arrays", (trace.ops,), build)


def ops_in_steps(trace: Trace, steps: list[int] | None) -> np.ndarray:
    """Whether each op of the op table has its ``step`` in ``steps`` (all of them for None; a
    null step is in none), as a numpy bool array. Computed once per op table and steps."""

    def build() -> np.ndarray:
        if steps is None:
            return np.ones(trace.ops.height, dtype=bool)
        if trace.ops.height <= _NUMPY_OPS:
            # (in numpy over op_arrays' steps, NaN for null: a select with is_in cost 0.2 ms)
            return is_in(op_arrays(trace)["step"], np.asarray(steps, dtype=np.int64))
        in_steps = pl.col("step").is_in(steps).fill_null(False)
        return trace.ops.select(in_steps).to_series().to_numpy()

    return trace.memo(f"ops_in_steps {steps}", (trace.ops,), build)


_NUMPY_OPS = 200_000
"""Up to this many ops, :func:`ops_in_steps` looks the steps up in numpy (past it polars' is_in,
on every core, is the faster: 3.5 ms against 7 ms on 3 million ops)."""


def op_column_of(o: dict[str, np.ndarray], column: str, op_ids: np.ndarray) -> np.ndarray:
    """``column`` of :func:`op_arrays` ``o`` (``top_op_id``, ``step``, ``duration_us``, ...)
    for each of ``op_ids`` (floats, NaN: no op): floats, NaN for no op or an id the op table
    does not hold."""
    rows = op_rows(o, op_ids)
    out = np.full(len(op_ids), np.nan)
    out[rows >= 0] = o[column][rows[rows >= 0]]
    return out


def op_rows(o: dict[str, np.ndarray], op_ids: np.ndarray) -> np.ndarray:
    """The row of each of ``op_ids`` (floats, NaN: no op) in the op table of :func:`op_arrays`
    ``o``, -1 for no op or an id it does not hold. When the ids are the row numbers this is
    the id itself: a binary search of 1.5 million ids among 3 million ops took 20 ms, asked
    five times by a 1 GB trace's diagnosis."""
    if not o["ids_are_rows"]:
        return find_rows(o["op_id"], op_ids)
    q = np.asarray(op_ids)
    rows = np.full(len(q), -1, dtype=np.int64)
    held = (q >= 0) & (q < len(o["op_id"]))  # (NaN is neither)
    rows[held] = q[held]
    rows[held & (rows != q)] = -1  # (a fractional id is no op's)
    return rows


def _groups(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct keys, sorted; each row's position among them)."""
    return np.unique(keys, return_inverse=True)


def _group_sums(of: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Per group (``of``: each row's group, ``n`` groups) the exact sum of int64 ``values``."""
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, of, values)
    return out


def _most_common(of: np.ndarray, n: int, labels: np.ndarray) -> np.ndarray:
    """Per group (``of``: each row's group, ``n`` groups, every one with rows) the label
    (an int >= 0) most of its rows have; ties: the smallest label."""
    if len(labels) == 0:
        return np.empty(0, dtype=np.int64)
    m = int(labels.max()) + 1
    pairs, count = np.unique(of * m + labels, return_counts=True)
    group, label = pairs // m, pairs % m
    # by group, then the largest count, then the smallest label: each group's first row wins
    order = np.lexsort((label, -count, group))
    first = order[np.unique(group[order], return_index=True)[1]]
    out = np.empty(n, dtype=np.int64)
    out[group[first]] = label[first]
    return out


def op_groups(trace: Trace, steps: list[int] | None) -> pl.DataFrame:
    """Launching ops grouped by (name, input shapes, input dtypes), totals over the steps.

    Columns: name, input_shapes, input_dtypes, concrete_inputs, count, device_time_us,
    kernels, max_grid_blocks, math_mode ("tf32" or null), kernel_kind, host_device_copy_us,
    and when the FLOP models are available: flops, bytes, compute_dtype, family, tensor_core
    (totals for flops/bytes). A group whose device time is mostly host-device copies has
    kernel_kind "host-device copy" and no FLOP/byte model: its bytes cross PCIe, so the device
    memory roofline does not bound it (the copies line of the report does).
    """
    # in op order, so that a group's "first" values are its first op's (group_by's row
    # order is not fixed)
    stats = launching_op_stats(trace, steps)
    # Two levels, so that the nested key columns are hashed once per launching op: first by
    # the full call signature (what the FLOP model reads) in op order, then the few
    # signatures by (name, shapes, dtypes). Times are summed as exact integer picoseconds.
    per_sig = op_signatures(trace, steps)
    totals = _signature_arrays(stats, per_sig, _launching_blocks(trace, steps))
    try:
        from tracedx.analysis.intensity import add_op_costs, cost_lists
    except ImportError:  # pragma: no cover - models not installed
        add_op_costs = None
    if add_op_costs is not None and 0 < len(totals["sigs"]) <= _FEW_SIGNATURES:
        few = _few_op_groups(per_sig, totals, cost_lists)
        if few is not None:
            return few
    g4 = _signature_frame(per_sig, totals)
    if add_op_costs is not None and g4.height:
        # one op's cost per signature; a signature's totals are count x that (summed below)
        g4 = add_op_costs(g4, distinct=True)
    key = ["name", "input_shapes", "input_dtypes"]
    aggs = [
        pl.col("count").sum(),
        (pl.col("device_ps").sum().cast(pl.Float64) / PS_PER_US).alias("device_time_us"),
        pl.col("kernels").sum(),
        pl.col("max_grid_blocks").max(),
        pl.col("tf32").any().alias("tf32"),
        pl.col("kernel_kind").first(),
        pl.col("concrete_inputs").first(),
        (pl.col("copy_ps").sum().cast(pl.Float64) / PS_PER_US).alias("host_device_copy_us"),
    ]
    if "flops" in g4.columns:
        aggs += [(pl.col(c) * pl.col("count")).sum().alias(c) for c in ("flops", "bytes")]
        aggs += [pl.col(c).first() for c in ("compute_dtype", "family", "tensor_core")]
    g = g4.group_by(key, maintain_order=True).agg(aggs)
    transfer = (pl.col("host_device_copy_us") > 0) & (
        pl.col("host_device_copy_us") >= 0.5 * pl.col("device_time_us")
    )
    fixes = [
        pl.when(transfer)
        .then(pl.lit(HOST_DEVICE_COPY))
        .otherwise("kernel_kind")
        .alias("kernel_kind"),
        pl.when(pl.col("tf32")).then(pl.lit("tf32")).alias("math_mode"),
    ]
    if "family" in g.columns:
        # a copy group has no model; a sum over nulls is 0 in polars: keep unmodelled
        # groups' flops and bytes null
        modelled = ~transfer & pl.col("family").is_not_null()
        fixes += [pl.when(modelled).then(c).alias(c) for c in ("flops", "bytes")]
        fixes += [
            pl.when(~transfer).then(c).alias(c) for c in ("compute_dtype", "family", "tensor_core")
        ]
    # the columns in place, math_mode last, tf32 dropped: one select
    fixed = {e.meta.output_name(): e for e in fixes}
    cols = [fixed.pop(c, pl.col(c)) for c in g.columns if c != "tf32"]
    return g.select(*cols, *fixed.values()).sort(
        "device_time_us", descending=True, maintain_order=True
    )


def op_signatures(trace: Trace, steps: list[int] | None) -> pl.DataFrame:
    """The ops of :func:`launching_op_stats` grouped by call signature (what the FLOP models
    read): ``name``, ``input_shapes``, ``input_dtypes``, ``concrete_inputs`` and ``op_id``
    (the list of its ops), in the order of each signature's first row in the op table.
    Computed once per set of tables and steps (the op groups and the batch model read it).

    Grouped on (``name``, ``shape_code``): the op table's integer code of the three list
    columns (equal exactly when they are: ``TableBuilder._op_shapes`` in
    :mod:`tracedx.trace.tables`), the lists gathered for each signature's first op only; the
    groups and their order are those of a group_by on the lists. That group_by hashed the
    nested columns of every launching op: 178 ms on the 1 GB benchmark trace (13 ms now; best
    of 5 after the load, one process) and the diagnosis' highest memory on the 107 MB one
    (``diagnose --format json`` peaks 7 MB lower: its wait4 maximum resident set, 3 runs
    each)."""

    def build() -> pl.DataFrame:
        stats = launching_op_stats(trace, steps)
        # the launching ops' rows as a mask from their rows, not an is_in filter that hashes
        # every op id (30 of the 40 ms this took at 1 GB)
        rows = op_rows(op_arrays(trace), stats["op_id"].to_numpy())
        launching = np.zeros(trace.ops.height, dtype=bool)
        launching[rows[rows >= 0]] = True
        rows = np.flatnonzero(launching)  # in op table order
        ops = trace.ops
        g = (
            ops[["op_id", "name", "shape_code"]][rows]
            .hstack([pl.Series("row", rows)])
            .group_by("name", "shape_code", maintain_order=True)
            .agg("op_id", pl.col("row").first())
        )
        lists = ops[["input_shapes", "input_dtypes", "concrete_inputs"]][g["row"]]
        return pl.DataFrame([g["name"], *lists.get_columns(), g["op_id"]])

    tables = (trace.ops, trace.kernels, trace.memcpys, trace.memsets)
    return trace.memo(f"op_signatures {steps}", tables, build)


def signature_of(per_sig: pl.DataFrame, op_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which of ``op_ids`` (NaN: none) are ops of :func:`op_signatures` ``per_sig``, and the
    signature (row of ``per_sig``) of each of those."""
    sig_ops = per_sig["op_id"]
    sig_of = np.repeat(np.arange(per_sig.height), sig_ops.list.len().to_numpy())
    rows = find_rows(sig_ops.explode().to_numpy(), op_ids)
    hit = rows >= 0
    return hit, sig_of[rows[hit]]


def _signature_arrays(stats: pl.DataFrame, per_sig: pl.DataFrame, blocks: np.ndarray) -> dict:
    """The launching ops' totals per call signature, in the order of each signature's first
    op (``stats`` is :func:`launching_op_stats`, in op order; ``per_sig`` is
    :func:`op_signatures`; ``blocks``: its ``max_grid_blocks`` as int64, the least value for
    null): ``sigs`` (the signatures' rows of ``per_sig``), ``count``,
    ``device_ps`` and ``copy_ps`` (exact picoseconds), ``kernels`` (int64 arrays),
    ``max_grid_blocks`` (int64, its least value for none: an op without kernels), ``tf32``
    (any; bool) and ``kernel_kind`` (its first op's: a Series)."""
    hit, of = signature_of(per_sig, stats["op_id"].to_numpy())
    rows = np.flatnonzero(hit)  # the stats rows of ops in the op table
    # signatures in the order of their first op
    first = np.full(per_sig.height, len(stats), dtype=np.int64)
    np.minimum.at(first, of, rows)
    sigs = np.argsort(first, kind="stable")[: len(np.unique(of))]
    rank = np.empty(per_sig.height, dtype=np.int64)
    rank[sigs] = np.arange(len(sigs))
    n = len(sigs)
    g = rank[of]

    def total(col: np.ndarray) -> np.ndarray:
        return _group_sums(g, n, col[rows])

    # (in int64, null as its least value: 2**63 - 1 blocks would round out of it as float64)
    op_blocks = blocks
    blocks = np.full(n, _NO_BLOCKS, dtype=np.int64)
    np.maximum.at(blocks, g, op_blocks[rows])
    tf32 = np.zeros(n, dtype=bool)
    # (a null tf32, an op without kernels, counts as False, as polars' any() skips it)
    np.logical_or.at(tf32, g, np.asarray(stats["tf32"].to_numpy(), dtype=bool)[rows])
    return {
        "sigs": sigs,
        "count": np.bincount(g, minlength=n),
        "device_ps": total(to_ps(stats["device_time_us"].to_numpy())),
        "kernels": total(stats["kernels"].to_numpy().astype(np.int64)),
        "max_grid_blocks": blocks,
        "tf32": tf32,
        "kernel_kind": stats["kernel_kind"][first[sigs]],
        "copy_ps": total(to_ps(stats["host_device_copy_us"].to_numpy())),
    }


_NO_BLOCKS = np.iinfo(np.int64).min


def _signature_frame(per_sig: pl.DataFrame, t: dict) -> pl.DataFrame:
    """:func:`_signature_arrays` ``t`` as a frame: ``per_sig``'s columns (one row per
    signature, less its ops) and ``count``, ``device_ps``, ``kernels``, ``max_grid_blocks``
    (null for none), ``tf32``, ``kernel_kind``, ``copy_ps``."""
    blocks = t["max_grid_blocks"]
    return pl.DataFrame(
        [
            *per_sig.drop("op_id")[t["sigs"]].get_columns(),
            pl.Series("count", t["count"], dtype=pl.UInt32),
            pl.Series("device_ps", t["device_ps"]),
            pl.Series("kernels", t["kernels"], pl.UInt32),
            pl.Series("max_grid_blocks", blocks).set(pl.Series(blocks == _NO_BLOCKS), None),
            pl.Series("tf32", t["tf32"], dtype=pl.Boolean),
            t["kernel_kind"],
            pl.Series("copy_ps", t["copy_ps"]),
        ]
    )


_FEW_SIGNATURES = 5_000
"""Up to this many signatures, :func:`op_groups` groups them in Python (:func:`_few_op_groups`)."""


def _frozen(v):
    """A list value (of lists, of scalars, or null) as a hashable tuple that is equal exactly
    when the lists are."""
    if v is None:
        return None
    return tuple(tuple(x) if isinstance(x, list) else x for x in v)


def _few_op_groups(per_sig: pl.DataFrame, t: dict, cost_lists) -> pl.DataFrame | None:
    """:func:`op_groups` of the signatures :func:`_signature_arrays` ``t``, grouped in Python
    and numpy (the group_by, select and sort of the polars path cost 1 ms on 100 signatures),
    or None when a group has more than two signatures or a cost is -0.0 (then a polars sum of
    floats may add in another order, or give 0.0: the polars path runs)."""
    sigs = t["sigs"]
    n = len(sigs)
    cols = {c: per_sig[c].to_list() for c in ("name", "input_shapes", "input_dtypes")}
    concrete = per_sig["concrete_inputs"].to_list()
    names = [cols["name"][i] for i in sigs]
    shapes = [cols["input_shapes"][i] for i in sigs]
    dtypes = [cols["input_dtypes"][i] for i in sigs]
    costs = cost_lists(zip(names, shapes, dtypes, [concrete[i] for i in sigs], strict=True))
    # the groups by (name, shapes, dtypes) in the order of their first signature
    index: dict = {}
    grp = np.fromiter(
        (
            index.setdefault((a, _frozen(b), _frozen(c)), len(index))
            for a, b, c in zip(names, shapes, dtypes, strict=True)
        ),
        dtype=np.int64,
        count=n,
    )
    m = len(index)
    first = np.full(m, n, dtype=np.int64)
    np.minimum.at(first, grp, np.arange(n))
    if np.bincount(grp, minlength=m).max() > 2:  # (a group of three or more)
        return None
    second = np.full(m, -1, dtype=np.int64)
    later = np.flatnonzero(np.arange(n) != first[grp])
    second[grp[later]] = later
    count = t["count"].astype(np.float64)
    work = {}
    for c in ("flops", "bytes"):
        # a signature's cost times its ops, summed over the group's one or two (nulls skipped)
        v = pl.Series(costs[c], dtype=pl.Float64).to_numpy() * count
        if ((v == 0) & np.signbit(v)).any():
            return None
        v = np.where(np.isnan(v), 0.0, v)
        work[c] = v[first] + np.where(second >= 0, v[np.maximum(second, 0)], 0.0)

    def sums(col: np.ndarray) -> np.ndarray:
        return _group_sums(grp, m, col)

    device_us = grouped_ps_to_us(sums(t["device_ps"]), m)
    copy_us = grouped_ps_to_us(sums(t["copy_ps"]), m)
    blocks = np.full(m, _NO_BLOCKS, dtype=np.int64)
    np.maximum.at(blocks, grp, t["max_grid_blocks"])
    tf32 = np.zeros(m, dtype=bool)
    np.logical_or.at(tf32, grp, t["tf32"])
    transfer = (copy_us > 0) & (copy_us >= 0.5 * device_us)
    order = np.argsort(-device_us, kind="stable")
    at = first[order]
    rows = sigs[at]
    kind = t["kernel_kind"].to_list()
    family = costs["family"]
    out = {
        "name": per_sig["name"][rows],
        "input_shapes": per_sig["input_shapes"][rows],
        "input_dtypes": per_sig["input_dtypes"][rows],
        "count": pl.Series("count", sums(t["count"])[order], dtype=pl.UInt32),
        "device_time_us": pl.Series("device_time_us", device_us[order]),
        "kernels": pl.Series("kernels", sums(t["kernels"])[order], dtype=pl.UInt32),
        "max_grid_blocks": pl.Series(
            "max_grid_blocks",
            [None if b == _NO_BLOCKS else int(b) for b in blocks[order]],
            dtype=pl.Int64,
        ),
        "kernel_kind": pl.Series(
            "kernel_kind",
            [HOST_DEVICE_COPY if transfer[g] else kind[f] for g, f in zip(order, at, strict=True)],
            dtype=pl.Utf8,
        ),
        "concrete_inputs": per_sig["concrete_inputs"][rows],
        "host_device_copy_us": pl.Series("host_device_copy_us", copy_us[order]),
    }
    # a copy group has no model; an unmodelled group's flops and bytes are null
    for c in ("flops", "bytes"):
        modelled = [
            not transfer[g] and family[f] is not None for g, f in zip(order, at, strict=True)
        ]
        out[c] = pl.Series(
            c,
            [float(v) if ok else None for v, ok in zip(work[c][order], modelled, strict=True)],
            dtype=pl.Float64,
        )
    for c, dtype in (("compute_dtype", pl.Utf8), ("family", pl.Utf8), ("tensor_core", pl.Boolean)):
        out[c] = pl.Series(
            c,
            [None if transfer[g] else costs[c][f] for g, f in zip(order, at, strict=True)],
            dtype=dtype,
        )
    out["math_mode"] = pl.Series("math_mode", ["tf32" if x else None for x in tf32[order]], pl.Utf8)
    return pl.DataFrame(list(out.values()))


def top_level_ops(trace: Trace, steps: list[int] | None) -> pl.DataFrame:
    """CPU against device time per top-level op name (ops with no enclosing cpu_op).

    Columns: name, count, host_time_us (sum of the top-level ops' durations), device_time_us
    (GPU time of everything launched under them), kernels, launches, launch_us (time in launch
    calls), host_us_per_kernel (host time / kernels: the per-kernel launch cost seen from Python).
    """
    o = op_arrays(trace)
    in_steps = ops_in_steps(trace, steps)
    if not in_steps.any():
        return pl.DataFrame(
            schema={
                "name": pl.Utf8,
                "count": pl.UInt32,
                "host_time_us": pl.Float64,
                "device_time_us": pl.Float64,
                "kernels": pl.UInt32,
                "launches": pl.UInt32,
                "launch_us": pl.Float64,
                "host_us_per_kernel": pl.Float64,
            }
        )
    chosen = in_steps & o["is_top"]
    names = trace.ops["name"].filter(pl.Series(chosen)) if chosen.sum() <= _FEW_TOPS else None
    few = names is not None and not names.null_count()
    top = None if few else trace.ops[["op_id", "name", "duration_us"]].filter(pl.Series(chosen))
    tops = o["op_id"][chosen]
    gpu = trace.gpu_activity()
    device_ps, kernels = _sums_by(
        o,
        tops,
        gpu["top_op_id"].cast(pl.Float64).to_numpy(),
        to_ps(gpu["duration_us"].to_numpy()),
        (gpu["kind"] == "kernel").to_numpy().astype(np.int64),
    )
    la = trace.launches
    la_top = op_column_of(o, "top_op_id", la["op_id"].cast(pl.Float64).to_numpy())
    launches, launch_ps = _sums_by(
        o, tops, la_top, np.ones(len(la_top), dtype=np.int64), to_ps(la["duration_us"].to_numpy())
    )
    if few:
        return _few_top_level_ops(
            names, o["duration_us"][chosen], device_ps, kernels, launches, launch_ps
        )
    t = pl.DataFrame(
        [
            *top.get_columns(),
            pl.Series("device_time_us", ps_to_us(device_ps)),
            pl.Series("kernels", kernels, dtype=pl.UInt32),
            pl.Series("launches", launches, dtype=pl.UInt32),
            pl.Series("launch_us", ps_to_us(launch_ps)),
        ]
    )
    return (
        t.group_by("name")
        .agg(
            count=pl.len(),
            host_time_us=sum_us("duration_us"),
            device_time_us=sum_us("device_time_us"),
            kernels=pl.col("kernels").sum(),
            launches=pl.col("launches").sum(),
            launch_us=sum_us("launch_us"),
        )
        .with_columns(
            host_us_per_kernel=pl.when(pl.col("kernels") > 0).then(
                pl.col("host_time_us") / pl.col("kernels")
            )
        )
        # (name breaks ties: the group_by's order varies from run to run)
        .sort(pl.max_horizontal("host_time_us", "device_time_us"), "name", descending=[True, False])
    )


_FEW_TOPS = 20_000
"""Up to this many top-level ops, :func:`top_level_ops` groups them by name in Python."""


def _few_top_level_ops(
    names: pl.Series,
    duration_us: np.ndarray,
    device_ps: np.ndarray,
    kernels: np.ndarray,
    launches: np.ndarray,
    launch_ps: np.ndarray,
) -> pl.DataFrame:
    """:func:`top_level_ops` of the top-level ops ``names`` (none null) with their per-op
    sums, grouped in numpy: the same rows and floats as its group_by, with_columns and sort
    (1 ms of fixed cost at 10 MB). Each op's group is its name's rank among the sorted
    distinct names (an Enum cast: Python orders str by code point, as polars orders UTF-8
    bytes)."""
    cats = sorted(names.unique().to_list())
    grp = names.cast(pl.Enum(cats)).to_physical().to_numpy().astype(np.int64)
    m = len(cats)

    def us(ps: np.ndarray) -> np.ndarray:
        # (a column of microseconds summed as sum_us sums it: each value to picoseconds)
        return grouped_ps_to_us(_group_sums(grp, m, ps), m)

    host = us(to_ps(duration_us))
    device = us(to_ps(ps_to_us(device_ps)))
    launch = us(to_ps(ps_to_us(launch_ps)))
    k = _group_sums(grp, m, kernels.astype(np.int64))
    # by the larger of host and device time (descending), then name
    order = np.lexsort((np.arange(m), -np.maximum(host, device)))
    has_k = k[order] > 0
    per_kernel = np.full(m, np.nan)
    per_kernel[has_k] = host[order][has_k] / k[order][has_k]
    return pl.DataFrame(
        [
            pl.Series("name", cats, dtype=pl.Utf8)[order],
            pl.Series("count", np.bincount(grp, minlength=m)[order], dtype=pl.UInt32),
            pl.Series("host_time_us", host[order]),
            pl.Series("device_time_us", device[order]),
            pl.Series("kernels", k[order], dtype=pl.UInt32),
            pl.Series("launches", _group_sums(grp, m, launches.astype(np.int64))[order], pl.UInt32),
            pl.Series("launch_us", launch[order]),
            pl.Series("host_us_per_kernel", per_kernel, nan_to_null=True),
        ]
    )
