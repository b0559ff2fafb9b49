"""Communication against compute on one rank: per-step overlap and exposed communication.

Definitions (HolisticTraceAnalysis's comm/compute overlap; TraceLens ``exposed_comm``;
``docs/multirank.md``), per analysed step k of one device:

- ``Comp``: the merged intervals of the rank's compute: every non-communication kernel on the
  device (memcpy and memset excluded), whatever step launched it (a kernel of the step before
  still hides communication). ``compute_us`` = |Comp_k|, the merged compute kernels launched
  in step k.
- ``Comm_k``: the merged intervals of the communication kernels launched in step k;
  ``comm_us`` = |Comm_k|.
- ``comm_overlap_us`` = |Comm_k ∩ Comp|, ``exposed_comm_us`` = |Comm_k ∖ Comp| =
  ``comm_us - comm_overlap_us``. The overlap ratio HTA reports is ``comm_overlap_us / comm_us``.

A trace without GPU activity (a CPU job on gloo) uses host intervals instead: ``Comm_k`` is the
host-side collectives (``gloo:*``, on the worker threads) of step k and ``Comp`` the top-level
cpu ops that are not communication (``c10d::*``, ``record_param_comms``, waits).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracedx.analysis.intervals import gaps, overlap, union
from tracedx.trace import Trace
from tracedx.trace.collectives import is_comm_kernel

# top-level host ops that are communication or waiting for it, not compute
HOST_COMM_OP_RE = (
    r"^(c10d::|c10d_functional::|_c10d_functional::|record_param_comms|nccl:|gloo:)|wait"
)

COLUMNS = ("compute_us", "comm_us", "comm_overlap_us", "exposed_comm_us")


def _arr(df: pl.DataFrame, c: str) -> np.ndarray:
    return df[c].to_numpy().astype(float) if df.height else np.empty(0)


def compute_rows(trace: Trace, device: int | None) -> pl.DataFrame:
    """The rank's compute intervals (``step``, ``start_us``, ``end_us``), unmerged.

    ``device`` None: the host compute of a trace without GPU activity (see the module doc).
    """
    if device is None:
        return trace.ops.filter(
            pl.col("parent_id").is_null() & ~pl.col("name").str.contains(HOST_COMM_OP_RE)
        ).select("step", "start_us", "end_us")
    k = trace.kernels
    return k.filter((pl.col("device") == device) & ~is_comm_kernel(k)).select(
        "step", "start_us", "end_us"
    )


def comm_rows(trace: Trace, device: int | None) -> pl.DataFrame:
    """``Trace.collectives`` of ``device`` (None: the host-side collectives)."""
    c = trace.collectives
    if device is None:
        return c.filter(pl.col("host_side"))
    return c.filter(~pl.col("host_side") & (pl.col("device") == device))


def compute_union(trace: Trace, device: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Comp: the merged compute intervals of the rank (sorted, disjoint)."""
    rows = compute_rows(trace, device)
    return union(_arr(rows, "start_us"), _arr(rows, "end_us"))


def comm_compute_by_step(trace: Trace, steps: list[int], device: int | None) -> pl.DataFrame:
    """One row per step of ``steps``: ``step`` and :data:`COLUMNS` (us), as the module doc says."""
    comp = compute_rows(trace, device)
    comm = comm_rows(trace, device)
    cs, ce = union(_arr(comp, "start_us"), _arr(comp, "end_us"))
    # one pass each to split the rows by step, not a filter over all rows per step
    comp_by = comp.partition_by("step", as_dict=True)
    comm_by = comm.partition_by("step", as_dict=True)
    empty = comp.clear()
    out = []
    for k in steps:
        ck = comp_by.get((k,), empty)
        ks, ke = union(_arr(ck, "start_us"), _arr(ck, "end_us"))
        mk = comm_by.get((k,), empty)
        ms, me = union(_arr(mk, "start_us"), _arr(mk, "end_us"))
        comm_us = float((me - ms).sum())
        ov = float(overlap(cs, ce, ms, me).sum())
        out.append((k, float((ke - ks).sum()), comm_us, ov, max(comm_us - ov, 0.0)))
    return pl.DataFrame(
        out,
        schema={"step": pl.Int64, **{c: pl.Float64 for c in COLUMNS}},
        orient="row",
    )


def free_segments(
    starts: np.ndarray,
    ends: np.ndarray,
    comp: tuple[np.ndarray, np.ndarray],
    max_segments: int = 16,
) -> tuple[list[list[dict[str, float]]], list[float]]:
    """For each interval [starts_i, ends_i]: the parts not covered by ``comp`` (a merged union),
    as ``{"start_us", "end_us"}`` offsets from ``starts_i``, in time order; beyond
    ``max_segments`` the rest are merged into the last (it then spans covered time too).

    Returns ``(segments, free_total_us)``: the second is each interval's true uncovered time
    (us), which the merged last segment overstates; readers pro-rate inside it.
    """
    cs, ce = comp
    out, total = [], []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        gs, ge = gaps(cs, ce, a, b)
        total.append(float((ge - gs).sum()) if len(gs) else 0.0)
        if len(gs) > max_segments:
            gs, ge = gs[:max_segments], np.append(ge[: max_segments - 1], ge[-1])
        out.append(
            [
                {"start_us": float(s - a), "end_us": float(e - a)}
                for s, e in zip(gs.tolist(), ge.tolist(), strict=True)
            ]
        )
    return out, total
