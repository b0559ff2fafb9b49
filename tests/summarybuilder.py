"""Build per-rank summaries by hand for the cross-rank tests (docs/multirank.md's shapes).

Every figure of a summary is given explicitly, so a test can compute the job's numbers by hand.
``summary()`` returns a :class:`tracedx.job.summary.RankSummary`.
"""

from __future__ import annotations

import polars as pl

from tracedx.job.summary import COLL_COLUMNS, KERNEL_COLUMNS, OPSIG_COLUMNS, RankSummary

IDLE = (
    "idle_kernel_wait_us",
    "idle_host_sync_us",
    "idle_dataloader_us",
    "idle_kernel_launch_us",
    "idle_host_work_us",
    "idle_python_us",
)


def coll(
    step: int,
    start: float,
    dur: float,
    *,
    ctype: str = "all_reduce",
    pg: str = "0",
    desc: str = "default_pg",
    ranks: str = "[0, 1]",
    n: int = 2,
    seq: int | None = None,
    comms_id: str | None = None,
    ordinal: int = 0,
    nbytes: int = 100_000_000,
    free: list[tuple[float, float]] | None = None,
    dtype: str = "Float",
) -> dict:
    """One communication kernel row; ``free`` defaults to the whole kernel (no compute under it)."""
    segs = [(0.0, dur)] if free is None else free
    return {
        "step": step,
        "stream": 20,
        "kernel_name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        "coll_type": ctype,
        "collective_name": ctype.replace("_", ""),
        "pg_name": pg,
        "pg_desc": desc,
        "pg_ranks": ranks,
        "group_size": n,
        "seq": seq,
        "comms_id": comms_id,
        "ordinal": ordinal,
        "start_us": float(start),
        "end_us": float(start + dur),
        "duration_us": float(dur),
        "dtype": dtype,
        "in_nelems": nbytes // 4,
        "out_nelems": nbytes // 4,
        "msg_bytes": nbytes,
        "free_us": [{"start_us": float(a), "end_us": float(b)} for a, b in segs],
    }


def step(
    k: int,
    *,
    start: float = 0.0,
    time: float,
    compute: float,
    comm: float = 0.0,
    overlap: float = 0.0,
    busy: float | None = None,
    **idle: float,
) -> dict:
    """One steps-table row; ``exposed_comm_us = comm - overlap``; idle causes by short name
    (``host_work=...``); ``idle_us`` = their sum unless ``busy`` says otherwise."""
    row = {
        "step": k,
        "window_start_us": float(start),
        "window_end_us": float(start + time),
        "step_time_us": float(time),
        "cpu_time_us": float(time),
        "compute_us": float(compute),
        "comm_us": float(comm),
        "comm_overlap_us": float(overlap),
        "exposed_comm_us": float(comm - overlap),
        "kernels": 10,
    }
    for c in IDLE:
        row[c] = float(idle.get(c[5:-3], 0.0))
    tot = sum(row[c] for c in IDLE)
    row["idle_us"] = float(time - busy) if busy is not None else tot
    row["gpu_busy_us"] = float(busy) if busy is not None else float(time - tot)
    return row


def summary(
    rank: int,
    steps: list[dict],
    colls: list[dict],
    *,
    kernels: list[dict] | None = None,
    opsig: list[dict] | None = None,
    **meta,
) -> RankSummary:
    m = {
        "schema": "tracedx.rank-summary/1",
        "rank": rank,
        "rank_source": "distributedInfo",
        "world_size": meta.pop("world_size", None),
        "hostname": meta.pop("hostname", None),
        "device_name": meta.pop("device_name", "NVIDIA H200"),
        "base_time_ns": meta.pop("base_time_ns", 0),
        "steps": [s["step"] for s in steps],
        "steps_synthetic": False,
        "single_rank": meta.pop(
            "single_rank", {"regime": None, "bottleneck": None, "findings": []}
        ),
        "notes": [],
        **meta,
    }
    st = pl.DataFrame(steps) if steps else pl.DataFrame()
    cl = pl.DataFrame([{k: c.get(k) for k in COLL_COLUMNS} for c in colls], schema=COLL_COLUMNS)
    kn = pl.DataFrame(kernels or [], schema=KERNEL_COLUMNS)
    op = pl.DataFrame(opsig or [], schema=OPSIG_COLUMNS)
    return RankSummary(m, st, cl, kn, op)
