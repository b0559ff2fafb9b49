"""Per-op tables: CPU time against device time, and op groups for the roofline.

An op's device time is the sum of the durations of the GPU events its launches produced
(kernels, memcpys, memsets), attributed by correlation id through the launch call to the
innermost cpu_op that issued it (see :mod:`tracedx.trace.link`).
"""

from __future__ import annotations

import polars as pl

from tracedx.analysis import HOST_DEVICE_COPY
from tracedx.analysis.intervals import PS_PER_US, sum_ps, sum_us
from tracedx.analysis.kernels import is_tf32_expr, kind_expr
from tracedx.trace import Trace


def launching_op_stats(trace: Trace, steps: list[int] | None) -> pl.DataFrame:
    """One row per op that launched GPU work: op_id, device_time_us, kernels, max_grid_blocks,
    tf32, kernel_kind, host_device_copy_us.

    ``tf32`` is True when any of its GEMM kernels ran on TF32 tensor cores (kernel name).
    ``host_device_copy_us`` is the device time of its host-to-device and device-to-host
    memcpys (PCIe or NVLink-C2C, not device memory).
    """
    gpu = trace.gpu_activity().filter(pl.col("op_id").is_not_null())
    k = trace.kernels.filter(pl.col("op_id").is_not_null())
    hd = trace.memcpys.filter(
        pl.col("op_id").is_not_null() & pl.col("direction").is_in(["HtoD", "DtoH"])
    )
    if steps is not None:
        gpu = gpu.filter(pl.col("step").is_in(steps))
        k = k.filter(pl.col("step").is_in(steps))
        hd = hd.filter(pl.col("step").is_in(steps))
    dev = gpu.group_by("op_id").agg(
        device_time_us=sum_us("duration_us"),
        kernels=(pl.col("kind") == "kernel").sum(),
    )
    hd = hd.group_by("op_id").agg(host_device_copy_us=sum_us("duration_us"))
    # name rules (regexes) once per distinct kernel name, not once per kernel
    by_name = k.select(pl.col("name").unique()).with_columns(
        tf32=is_tf32_expr("name"), kkind=kind_expr("name")
    )
    k = k.select("op_id", "name", "grid_x", "grid_y", "grid_z").join(by_name, on="name", how="left")
    kk = (
        k.with_columns(
            blocks=pl.col("grid_x").fill_null(1)
            * pl.col("grid_y").fill_null(1)
            * pl.col("grid_z").fill_null(1),
        )
        .group_by("op_id")
        .agg(max_grid_blocks=pl.col("blocks").max(), tf32=pl.col("tf32").any())
    )
    # the op's most common kernel kind (ties: the first by name); a group_by mode() is 20x slower
    kind = (
        k.group_by("op_id", "kkind")
        .len()
        .sort("op_id", "len", "kkind", descending=[False, True, False], nulls_last=True)
        .group_by("op_id", maintain_order=True)
        .agg(kernel_kind=pl.col("kkind").first())
    )
    return (
        dev.join(kk, on="op_id", how="left")
        .join(kind, on="op_id", how="left")
        .join(hd, on="op_id", how="left")
        .with_columns(pl.col("host_device_copy_us").fill_null(0.0))
    )


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
    stats = launching_op_stats(trace, steps).sort("op_id")
    # Two levels, so that the nested key columns are hashed once per launching op: first by
    # the full call signature (what the FLOP model reads) in op order, then the few
    # signatures by (name, shapes, dtypes). Times are summed as exact integer picoseconds.
    sig = ["name", "input_shapes", "input_dtypes", "concrete_inputs"]
    ops = trace.ops.select("op_id", *sig).filter(pl.col("op_id").is_in(stats["op_id"].implode()))
    per_sig = ops.group_by(sig, maintain_order=True).agg("op_id").with_row_index("__sig")
    of_op = per_sig.select("__sig", "op_id").explode("op_id")
    g4 = (
        stats.join(of_op, on="op_id", how="inner", maintain_order="left")
        .group_by("__sig", maintain_order=True)
        .agg(
            pl.len().alias("count"),
            sum_ps("device_time_us").alias("device_ps"),
            pl.col("kernels").sum(),
            pl.col("max_grid_blocks").max(),
            pl.col("tf32").any(),
            pl.col("kernel_kind").first(),
            sum_ps("host_device_copy_us").alias("copy_ps"),
        )
        .join(per_sig.drop("op_id"), on="__sig", how="left", maintain_order="left")
    )
    try:
        from tracedx.analysis.intensity import add_op_costs
    except ImportError:  # pragma: no cover - models not installed
        add_op_costs = None
    if add_op_costs is not None and g4.height:
        # one op's cost per signature; a signature's totals are count x that
        g4 = add_op_costs(g4).with_columns(
            flops=pl.col("flops") * pl.col("count"), bytes=pl.col("bytes") * pl.col("count")
        )
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
    for c, how in (
        ("flops", "sum"),
        ("bytes", "sum"),
        ("compute_dtype", "first"),
        ("family", "first"),
        ("tensor_core", "first"),
    ):
        if c in g4.columns:
            aggs.append(getattr(pl.col(c), how)())
    g = g4.group_by(key, maintain_order=True).agg(aggs)
    transfer = (pl.col("host_device_copy_us") > 0) & (
        pl.col("host_device_copy_us") >= 0.5 * pl.col("device_time_us")
    )
    g = g.with_columns(
        kernel_kind=pl.when(transfer).then(pl.lit(HOST_DEVICE_COPY)).otherwise("kernel_kind")
    )
    if "family" in g.columns:
        g = g.with_columns(
            pl.when(~transfer).then(pl.col(c)).alias(c)
            for c in ("flops", "bytes", "compute_dtype", "family", "tensor_core")
            if c in g.columns
        )
    if "flops" in g.columns:
        # a sum over nulls is 0 in polars: keep unmodelled groups null
        g = g.with_columns(
            flops=pl.when(pl.col("family").is_not_null()).then("flops"),
            bytes=pl.when(pl.col("family").is_not_null()).then("bytes"),
        )
    return (
        g.with_columns(
            math_mode=pl.when(pl.col("tf32")).then(pl.lit("tf32")),
        )
        .drop("tf32")
        .sort("device_time_us", descending=True, maintain_order=True)
    )


def top_level_ops(trace: Trace, steps: list[int] | None) -> pl.DataFrame:
    """CPU against device time per top-level op name (ops with no enclosing cpu_op).

    Columns: name, count, host_time_us (sum of the top-level ops' durations), device_time_us
    (GPU time of everything launched under them), kernels, launches, launch_us (time in launch
    calls), host_us_per_kernel (host time / kernels: the per-kernel launch cost seen from Python).
    """
    ops = trace.ops.select("op_id", "parent_id", "name", "duration_us", "step")
    if steps is not None:
        ops = ops.filter(pl.col("step").is_in(steps))
    if ops.height == 0:
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
    top = ops.filter(pl.col("parent_id").is_null()).select("op_id", "name", "duration_us")
    # only the GPU events and launches under these top-level ops (not the whole trace's)
    tops = top["op_id"].implode()
    gpu = trace.gpu_activity().filter(pl.col("top_op_id").is_in(tops))
    dev = (
        gpu.group_by("top_op_id")
        .agg(device_time_us=sum_us("duration_us"), kernels=(pl.col("kind") == "kernel").sum())
        .rename({"top_op_id": "op_id"})
    )
    under = trace.ops.select("op_id", "top_op_id").filter(pl.col("top_op_id").is_in(tops))
    la = (
        trace.launches.select("op_id", "duration_us")
        .join(under, on="op_id")
        .group_by("top_op_id")
        .agg(launches=pl.len(), launch_us=sum_us("duration_us"))
        .rename({"top_op_id": "op_id"})
    )
    t = top.join(dev, on="op_id", how="left").join(la, on="op_id", how="left")
    return (
        t.group_by("name")
        .agg(
            count=pl.len(),
            host_time_us=sum_us("duration_us"),
            device_time_us=sum_us("device_time_us"),
            kernels=pl.col("kernels").fill_null(0).sum(),
            launches=pl.col("launches").fill_null(0).sum(),
            launch_us=sum_us("launch_us"),
        )
        .with_columns(
            host_us_per_kernel=pl.when(pl.col("kernels") > 0).then(
                pl.col("host_time_us") / pl.col("kernels")
            )
        )
        .sort(pl.max_horizontal("host_time_us", "device_time_us"), descending=True)
    )
