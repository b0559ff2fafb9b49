"""Per-step timeline metrics: windows, busy time, idle gaps and their causes.

Definitions:

- CPU window: the ``ProfilerStep#N`` host annotation.
- GPU window (per device): from the first GPU event launched in step N to the first GPU event
  launched in step N+1 (for the last step, to the end of its last GPU event).
- step time = max(CPU window, GPU window) in steady state (the CPU runs ahead of the GPU): it reproduces the
  unprofiled step time within a few percent for GPU-bound steps. Per device, the steps'
  intervals are all GPU windows when the GPU windows add up to more than the CPU windows (the
  GPU binds and lags the CPU), else all CPU windows; one choice for all steps (a step with no GPU
  work keeps its CPU window, started no earlier than the previous interval ended).
- The steps' intervals tile the device timeline from the first step's start to the last
  step's end: each runs from its own start to the next step's start (the step marker's host
  time between two ``ProfilerStep`` ranges is the earlier step's). Idle gaps are taken over
  these intervals.
- GPU busy of a step = the union of the kernel, memcpy and memset intervals *launched in that
  step* (``cuda_sync`` events and annotations are never busy time), an instant shared with an
  earlier step's events counted in the earlier step only. One owner for every kernel's time: a
  kernel is never split at a window edge, it is the launching step's (a host-bound step's
  kernels run late in its CPU window and past its end: ``elementwise-compile``'s one 126 us
  kernel per step is 126 us of busy time in every step, not 71 to 116). The steps' busy times
  add up to the union of all GPU events launched in the analysed steps.
- idle = the step interval's time that no GPU event of the device covers (what the idle causes
  split); idle fraction = idle / step time. Over the analysed steps, step time - busy adds up to
  the idle time (when no GPU event from outside the analysed steps runs inside them); per step
  they differ by the GPU work that ran across the interval's edges (a step's kernel running on
  into the next interval is busy time of its own step and covers time of the next).

Idle gaps are the uncovered stretches of the GPU window. Each gets one cause:
``kernel wait`` (the next GPU event was already launched before the gap began: a GPU-side
gap between queued work, HolisticTraceAnalysis's "kernel wait"), else the host was late
("host wait" in HTA) and we say why: ``host sync`` (a synchronizing call returned inside the
gap: the queue had drained), ``dataloader`` (inside ``enumerate(DataLoader)#...__next__``),
``kernel launch`` (inside ops that launch GPU work: dispatch + launch overhead),
``host work`` (inside ops that launch nothing, or inside the ops passed as
``host_work_ops``: one op whose host time is work, not launch cost), ``python`` (outside any op).
Gaps are taken over the step's interval, so the idle time by cause adds up to the step's
idle time.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracedx.analysis import CAUSES  # noqa: F401  (re-exported: the reports and the job read it here)
from tracedx.analysis.intervals import gaps_in, overlap, owned_union, sum_us, union
from tracedx.analysis.ops import is_in, op_arrays, op_column_of
from tracedx.trace import Trace

DATALOADER_RE = r"enumerate\(DataLoader\)|DataLoader"
OPTIMIZER_RE = r"^Optimizer\.(step|zero_grad)#"


def dataloader_windows(trace: Trace) -> pl.DataFrame:
    """The host annotations of DataLoader ``__next__`` calls (the annotations table's rows).
    Computed once per annotations table."""
    return trace.memo(
        "dataloader_windows",
        (trace.annotations,),
        lambda: trace.annotations.filter(
            (pl.col("category") == "user_annotation") & pl.col("name").str.contains(DATALOADER_RE)
        ),
    )


def optimizer_windows(trace: Trace) -> pl.DataFrame:
    """The host annotations of the optimizer's ``Optimizer.step#...`` and
    ``Optimizer.zero_grad#...`` calls (the annotations table's rows). Computed once per
    annotations table."""
    return trace.memo(
        "optimizer_windows",
        (trace.annotations,),
        lambda: trace.annotations.filter(pl.col("name").str.contains(OPTIMIZER_RE)),
    )


def gpu_tree_tops(trace: Trace) -> pl.Series:
    """``op_id`` of the top-level ops under which a GPU launch was issued (an op "launches"
    when it or a descendant made a runtime launch call). Computed once per set of tables."""

    def build() -> pl.Series:
        launching = trace.launches["op_id"].cast(pl.Float64).to_numpy()
        tops = op_column_of(
            op_arrays(trace), "top_op_id", np.unique(launching[~np.isnan(launching)])
        )
        known = np.unique(tops[~np.isnan(tops)]).astype(np.int64).tolist()
        # sorted, a null (a launching op with no top-level op) first
        return pl.Series("top_op_id", [None] * bool(np.isnan(tops).any()) + known, pl.Int64)

    return trace.memo("gpu_tree_tops", (trace.launches, trace.ops), build)


def sync_calls(trace: Trace) -> pl.DataFrame:
    """Host calls that block the CPU until the GPU catches up (host syncs), with a reason.

    ``blocking_reason`` is ``synchronize`` (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
    ``cudaEventSynchronize`` and driver/HIP spellings), ``synchronous copy`` (``cudaMemcpy``, or a
    device-to-host copy into pageable memory under 1 MiB: ``.item()``, ``.cpu()``, ``print(t)``
    wait for the GPU to produce the value) or ``pageable memcpy`` (a larger copy from or to
    pageable memory, which blocks the host for the whole copy: CUDA Runtime API docs,
    "API synchronization behavior").
    Columns: the launches table's, plus ``blocking_reason``. Computed once per set of tables.
    """
    return trace.memo("sync_calls", (trace.launches, trace.memcpys), lambda: _sync_calls(trace))


def _sync_calls(trace: Trace) -> pl.DataFrame:
    # the copies from or to pageable memory (with a launch to match), and which of them are
    # small device-to-host ones (a synchronous read of a value); the few memcpys in numpy
    m = trace.memcpys.select(
        "correlation",
        page=(
            (pl.col("src_memory") == "Pageable") | (pl.col("dst_memory") == "Pageable")
        ).fill_null(False)
        & pl.col("correlation").is_not_null(),
        small=((pl.col("direction") == "DtoH") & (pl.col("bytes").fill_null(0) < 2**20)).fill_null(
            False
        ),
    )
    corr, page, small = (m[c].to_numpy() for c in ("correlation", "page", "small"))
    small_dtoh = corr[page & small].astype(np.int64)
    big = corr[page & ~np.isin(corr, small_dtoh)].astype(np.int64)
    is_sync = pl.col("api_kind") == "sync"
    is_copy = pl.col("api_kind") == "memcpy"
    sync_copy = is_copy & (
        ~pl.col("name").str.contains("Async", literal=True)
        | pl.col("correlation").is_in(_ids(small_dtoh))
    )
    pageable = is_copy & pl.col("correlation").is_in(_ids(big))
    return trace.launches.filter(is_sync | sync_copy | pageable).with_columns(
        blocking_reason=pl.when(is_sync)
        .then(pl.lit("synchronize"))
        .when(sync_copy)
        .then(pl.lit("synchronous copy"))
        .otherwise(pl.lit("pageable memcpy"))
    )


def _ids(ids: np.ndarray) -> pl.Series:
    """An int64 array as the imploded Series ``is_in`` takes."""
    return pl.Series(ids, dtype=pl.Int64).implode()


def _arr(df: pl.DataFrame, c: str) -> np.ndarray:
    return df[c].to_numpy().astype(float) if df.height else np.empty(0)


def step_windows(trace: Trace) -> pl.DataFrame:
    """Per (step, device): CPU and GPU windows, step time, busy, idle, counts.

    Columns: step, device, cpu_start_us, cpu_end_us, cpu_time_us, gpu_start_us, gpu_end_us,
    gpu_window_us, window_start_us, window_end_us, overlap_prev_us (what the previous step
    already counted of this step's longer window), step_time_us, gpu_busy_us (the union of the
    GPU events the step launched: it can run past the window, and sums over steps to the busy
    time of the analysed steps), idle_us (the device idle inside the window, whichever step's
    events cover the rest: what the idle causes split), idle_fraction, kernels, memcpys, memsets, memcpy_us, memcpy_bytes, sync_us (host blocked in sync calls and blocking copies,
    pageable memcpys included: :func:`sync_calls`). A trace without GPU activity gets device null
    and null GPU columns (never "100 % idle").
    """
    steps = trace.steps.sort("start_us")
    # the columns read below: each filter then copies these, not every column
    gpu = trace.gpu_activity().select("device", "step", "kind", "start_us", "end_us", "duration_us")
    rows = [
        _device_windows(
            steps, _on_device(gpu, dev, len(trace.devices)) if dev is not None else gpu.clear(), dev
        )
        for dev in trace.devices or [None]
    ]
    out = _step_metrics(pl.concat(rows, how="vertical_relaxed"), trace.has_gpu_activity)
    return (
        _with_copy_bytes_and_syncs(out, trace)
        .select(list(_WINDOW_COLUMNS))
        .sort("device", "step", nulls_last=True)
    )


_WINDOW_COLUMNS = (
    "step",
    "device",
    "cpu_start_us",
    "cpu_end_us",
    "cpu_time_us",
    "gpu_start_us",
    "gpu_end_us",
    "gpu_window_us",
    "window_start_us",
    "window_end_us",
    "overlap_prev_us",
    "step_time_us",
    "gpu_busy_us",
    "idle_us",
    "idle_fraction",
    "kernels",
    "memcpys",
    "memsets",
    "memcpy_us",
    "memcpy_bytes",
    "sync_us",
)


def _device_windows(steps: pl.DataFrame, g: pl.DataFrame, dev: int | None) -> pl.DataFrame:
    """One device's steps (``g``: its GPU events): the CPU and GPU windows, the tiled windows
    (``window_start_us``, ``window_end_us``), busy and idle time (``_idle_us``, unclipped)."""
    s = _chosen_windows(_gpu_windows(steps, g, dev))
    starts, ends = _tile(s)
    s = s.with_columns(
        window_start_us=pl.Series(starts, dtype=pl.Float64),
        window_end_us=pl.Series(ends, dtype=pl.Float64),
    )
    busy = _busy_per_step(g, s["step"].to_list(), starts, ends)
    # The device's idle time inside each window (what the idle causes split): the window
    # less the part any GPU event covers, whichever step launched it.
    ms, me = union(_arr(g, "start_us"), _arr(g, "end_us"))
    idle = (ends - starts) - overlap(ms, me, starts, ends) if s.height else np.empty(0)
    return s.with_columns(
        gpu_busy_us=pl.Series(busy).cast(pl.Float64),
        _idle_us=pl.Series(idle, dtype=pl.Float64),
        # how much of the step's own (CPU or GPU) window the previous step already counted
        overlap_prev_us=(pl.col("window_start_us") - pl.col("chosen_start_us")).clip(
            lower_bound=0.0
        ),
    ).drop("gpu_longer", "chosen_start_us", "chosen_end_us")


def _gpu_windows(steps: pl.DataFrame, g: pl.DataFrame, dev: int | None) -> pl.DataFrame:
    """Per step, in CPU start order: its CPU window, its GPU events' counts, and its GPU
    window, from its first GPU event to the next step's first (its own last end for the last)."""
    first = (
        g.filter(pl.col("step").is_not_null())
        .group_by("step")
        .agg(
            gpu_start_us=pl.col("start_us").min(),
            last_end_us=pl.col("end_us").max(),
            kernels=(pl.col("kind") == "kernel").sum(),
            memcpys=(pl.col("kind") == "memcpy").sum(),
            memsets=(pl.col("kind") == "memset").sum(),
            memcpy_us=sum_us(pl.when(pl.col("kind") == "memcpy").then(pl.col("duration_us"))),
        )
    )
    s = (
        steps.select(
            "step",
            pl.col("start_us").alias("cpu_start_us"),
            pl.col("end_us").alias("cpu_end_us"),
        )
        .join(first, on="step", how="left")
        .sort("cpu_start_us")
    )
    # the GPU window ends where the next step with GPU work starts its first event
    later = pl.col("gpu_start_us").shift(-1).fill_null(strategy="backward")
    return s.with_columns(
        gpu_end_us=pl.when(pl.col("gpu_start_us").is_null())
        .then(None)
        .when(later.is_not_null() & (later > pl.col("gpu_start_us")))
        .then(later)
        .otherwise(pl.col("last_end_us")),
        device=pl.lit(dev, pl.Int64),
    )


def _chosen_windows(s: pl.DataFrame) -> pl.DataFrame:
    """The steps' intervals: all GPU windows or all CPU windows (``chosen_start_us``,
    ``chosen_end_us``), and where each starts once no step overlaps the one before
    (``window_start_us``)."""
    return (
        s.with_columns(
            cpu_time_us=pl.col("cpu_end_us") - pl.col("cpu_start_us"),
            gpu_window_us=pl.col("gpu_end_us") - pl.col("gpu_start_us"),
        )
        .with_columns(
            # The steps' intervals: GPU windows when, over the analysed steps, the GPU
            # windows are the longer (the GPU binds and lags the CPU), else CPU windows
            # One choice for all steps, so the intervals tile the timeline;
            # choosing per step mixes windows that are offset in time.
            gpu_longer=pl.col("gpu_window_us").is_not_null()
            & (pl.col("gpu_window_us").sum() > pl.col("cpu_time_us").sum()),
        )
        .with_columns(
            chosen_start_us=pl.when("gpu_longer").then("gpu_start_us").otherwise("cpu_start_us"),
            chosen_end_us=pl.when("gpu_longer").then("gpu_end_us").otherwise("cpu_end_us"),
        )
        # Steps never overlap (a CPU window kept for a step with no GPU work could lie inside
        # the previous step's GPU window): a step starts no earlier than the previous ended.
        .with_columns(
            window_start_us=pl.max_horizontal(
                "chosen_start_us",
                pl.col("chosen_end_us").cum_max().shift(1).fill_null(float("-inf")),
            ).cum_max(),
        )
    )


def _tile(s: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the windows that tile the device timeline: each step ends where the
    next begins (a gap between two ProfilerStep ranges, the step marker's own host time, is the
    earlier step's); the last ends at its own end."""
    starts = s["window_start_us"].to_numpy().astype(float)
    if s.height:
        ends = np.append(starts[1:], float(s["chosen_end_us"][-1]))
        ends[-1] = max(ends[-1], starts[-1])
    else:
        ends = starts
    return starts, ends


def _on_device(gpu: pl.DataFrame, dev: int, devices: int) -> pl.DataFrame:
    """The rows of ``gpu`` (GPU activity) on device ``dev``: all of them when ``dev`` is the
    trace's one device and no row lacks one (no filter: a copy of every column of every GPU
    event, 10 ms at 1 GB)."""
    if devices == 1 and gpu["device"].null_count() == 0:
        return gpu
    return gpu.filter(pl.col("device") == dev)


def _busy_per_step(
    g: pl.DataFrame, steps: list[int], starts: np.ndarray, ends: np.ndarray
) -> np.ndarray:
    """GPU busy of each of ``steps`` (windows ``starts`` to ``ends``): the union of the GPU
    events it launched (kernels, memcpys, memsets), an instant shared with an earlier step's
    events counted there only. An event with no launch record (launched before the trace,
    correlation lost) is the step whose interval holds its start."""
    # each event's step as its index in ``steps`` (a sorted look-up: a dict per event took
    # 16 ms at 1 GB)
    keys = np.asarray(steps, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    own = g.filter(pl.col("step").is_in(steps))  # (a null step is in none)
    owner = order[np.searchsorted(keys[order], own["step"].to_numpy())]
    st_, en_ = _arr(own, "start_us"), _arr(own, "end_us")
    orphans = g.filter(pl.col("step").is_null())
    if orphans.height and len(steps):
        o_start = _arr(orphans, "start_us")
        k = np.searchsorted(starts, o_start, side="right") - 1
        keep = (k >= 0) & (o_start < ends[-1])
        st_ = np.concatenate([st_, o_start[keep]])
        en_ = np.concatenate([en_, _arr(orphans, "end_us")[keep]])
        owner = np.concatenate([owner, k[keep]])
    return owned_union(st_, en_, owner, len(steps))


def _step_metrics(out: pl.DataFrame, has_gpu: bool) -> pl.DataFrame:
    """Step time, idle time and fraction from the windows; counts of a step without GPU events
    0; the GPU columns null for a trace without GPU activity."""
    return (
        out.with_columns(
            step_time_us=pl.col("window_end_us") - pl.col("window_start_us"),
        )
        .with_columns(
            gpu_busy_us=pl.col("gpu_busy_us") if has_gpu else pl.lit(None, pl.Float64),
            kernels=pl.col("kernels").fill_null(0),
            memcpys=pl.col("memcpys").fill_null(0),
            memsets=pl.col("memsets").fill_null(0),
            memcpy_us=pl.col("memcpy_us").fill_null(0.0),
        )
        .with_columns(
            idle_us=pl.col("_idle_us").clip(lower_bound=0.0)
            if has_gpu
            else pl.lit(None, pl.Float64),
        )
        .drop("_idle_us")
        .with_columns(
            idle_fraction=pl.when(pl.col("step_time_us") > 0).then(
                pl.col("idle_us") / pl.col("step_time_us")
            ),
        )
    )


def _with_copy_bytes_and_syncs(out: pl.DataFrame, trace: Trace) -> pl.DataFrame:
    """``memcpy_bytes`` per (step, device) and ``sync_us`` per step (0 where none)."""
    mem_bytes = (
        trace.memcpys.filter(pl.col("step").is_not_null())
        .group_by("step", "device")
        .agg(memcpy_bytes=pl.col("bytes").sum())
    )
    syncs = (
        sync_calls(trace)
        .filter(pl.col("step").is_not_null())
        .group_by("step")
        .agg(sync_us=sum_us("duration_us"))
    )
    return (
        out.join(mem_bytes, on=["step", "device"], how="left")
        .join(syncs, on="step", how="left")
        .with_columns(
            memcpy_bytes=pl.col("memcpy_bytes").fill_null(0),
            sync_us=pl.col("sync_us").fill_null(0.0),
        )
    )


def idle_gaps(
    trace: Trace, windows: pl.DataFrame, host_work_ops: pl.Series | None = None
) -> pl.DataFrame:
    """Every idle gap inside each step's GPU window, with its cause.

    ``host_work_ops``: op ids of top-level ops whose host time counts as ``host work`` although
    they launch GPU work (the diagnosis passes the one op that holds most of the step's host
    time at 100 us or more per kernel, such as cuDNN planning inside attention).

    Columns: step, device, start_us, end_us, duration_us, cause, next_launch_start_us.
    """
    gpu = trace.gpu_activity().select("device", "start_us", "end_us", "launch_start_us")
    schema = {
        "step": pl.Int64,
        "device": pl.Int64,
        "start_us": pl.Float64,
        "end_us": pl.Float64,
        "duration_us": pl.Float64,
        "cause": pl.Utf8,
        "next_launch_start_us": pl.Float64,
    }
    if gpu.height == 0:
        return pl.DataFrame(schema=schema)
    # host activity classes, as disjoint unions
    syncs = sync_calls(trace)
    dl = dataloader_windows(trace)
    # the top-level ops, on the side of the ops that launch GPU work or of those that do not
    o = op_arrays(trace)
    is_top = o["is_top"]
    top_id = o["op_id"][is_top]
    in_gpu_tree = is_in(top_id, gpu_tree_tops(trace).to_numpy())
    if host_work_ops is not None and host_work_ops.len():
        in_gpu_tree &= ~is_in(top_id, host_work_ops.to_numpy())
    top_start, top_end = o["start_us"][is_top], o["end_us"][is_top]
    u_sync_end = np.sort(_arr(syncs, "end_us"))
    u_dl = union(_arr(dl, "start_us"), _arr(dl, "end_us"))
    u_gop = union(top_start[in_gpu_tree], top_end[in_gpu_tree])
    u_cop = union(top_start[~in_gpu_tree], top_end[~in_gpu_tree])
    w_dev = windows["device"].to_numpy()
    w_step = windows["step"].to_numpy()
    w_start = windows["window_start_us"].to_numpy()
    w_end = windows["window_end_us"].to_numpy()
    out = []
    for dev in trace.devices:
        g = _on_device(gpu, dev, len(trace.devices)).sort("start_us")
        m_start, m_end = union(_arr(g, "start_us"), _arr(g, "end_us"))
        starts = g["start_us"].to_numpy()
        launch = g["launch_start_us"].cast(pl.Float64).to_numpy()  # NaN: no launch
        mine = w_dev == dev
        win, gs, ge = gaps_in(m_start, m_end, w_start[mine], w_end[mine])
        if len(gs) == 0:
            continue
        # the GPU event that ends each gap, and when it was launched
        k = np.searchsorted(starts, ge, side="left")
        nl = np.where(k < len(starts), launch[np.minimum(k, len(starts) - 1)], np.nan)
        out.append((w_step[mine][win], np.full(len(gs), dev), gs, ge, nl))
    if not out:
        return pl.DataFrame(schema=schema)
    step_col, dev_col, a, b, nl = (np.concatenate(c) for c in zip(*out, strict=True))
    dur = b - a
    # a sync returned inside the gap (or just before it: the queue drained as it returned)
    i0 = np.searchsorted(u_sync_end, a - 5.0, side="left")
    i1 = np.searchsorted(u_sync_end, b, side="right")
    had_sync = i1 > i0
    ov_dl = overlap(*u_dl, a, b)
    ov_gop = overlap(*u_gop, a, b)
    ov_cop = overlap(*u_cop, a, b)
    ov_py = np.maximum(dur - ov_gop - ov_cop - ov_dl, 0.0)
    shares = np.stack([ov_dl, ov_gop, ov_cop, ov_py])
    # the cause as its index in _GAP_CAUSES (a Series of strings is built once, by index)
    cause = np.argmax(shares, axis=0)
    cause = np.where(had_sync, 4, cause)
    queued = ~np.isnan(nl) & (nl <= a)
    cause = np.where(queued, 5, cause)
    return pl.DataFrame(
        {
            "step": step_col,
            "device": dev_col,
            "start_us": a,
            "end_us": b,
            "duration_us": dur,
            "cause": pl.Series(_GAP_CAUSES)[cause],
            "next_launch_start_us": pl.Series(
                np.where(np.isfinite(nl), nl, np.nan), nan_to_null=True
            ),
        },
        schema=schema,
    )


_GAP_CAUSES = ["dataloader", "kernel launch", "host work", "python", "host sync", "kernel wait"]
"""The causes :func:`idle_gaps` names, in the order of its index (the largest share of the
first four, else a sync, else queued work)."""


def idle_by_cause(gaps: pl.DataFrame) -> pl.DataFrame:
    """Idle time per (step, device, cause): ``idle_us`` and the number of ``gaps``."""
    return (
        gaps.group_by("step", "device", "cause")
        .agg(idle_us=sum_us("duration_us"), gaps=pl.len())
        .sort("step", "device", "cause")
    )
