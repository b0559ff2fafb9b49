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

import re

import numpy as np
import polars as pl

from tracedx.analysis import CAUSES  # noqa: F401  (re-exported: the reports and the job read it here)
from tracedx.analysis.intervals import (
    gaps_in,
    grouped_ps_to_us,
    ints_of,
    is_in,
    mask_of,
    overlap,
    owned_union,
    sum_us,
    to_ps,
    union,
)
from tracedx.analysis.ops import op_arrays, op_column_of
from tracedx.trace import Trace

DATALOADER_RE = r"enumerate\(DataLoader\)|DataLoader"
OPTIMIZER_RE = r"^Optimizer\.(step|zero_grad)#"


def dataloader_windows(trace: Trace) -> pl.DataFrame:
    """The host annotations of DataLoader ``__next__`` calls (the annotations table's rows).
    Computed once per annotations table."""

    def build() -> pl.DataFrame:
        a = trace.annotations
        if a.height > _FEW_NAMES:
            return a.filter(
                (pl.col("category") == "user_annotation")
                & pl.col("name").str.contains(DATALOADER_RE)
            )
        user = mask_of(a["category"] == "user_annotation")
        return a[_matching(a["name"], DATALOADER_RE, user)]

    return trace.memo("dataloader_windows", (trace.annotations,), build)


def optimizer_windows(trace: Trace) -> pl.DataFrame:
    """The host annotations of the optimizer's ``Optimizer.step#...`` and
    ``Optimizer.zero_grad#...`` calls (the annotations table's rows). Computed once per
    annotations table."""

    def build() -> pl.DataFrame:
        a = trace.annotations
        if a.height > _FEW_NAMES:
            return a.filter(pl.col("name").str.contains(OPTIMIZER_RE))
        return a[_matching(a["name"], OPTIMIZER_RE, np.ones(a.height, dtype=bool))]

    return trace.memo("optimizer_windows", (trace.annotations,), build)


def _matching(names: pl.Series, rx: str, among: np.ndarray) -> np.ndarray:
    """The rows (int64) of ``among`` whose name (not null) ``rx`` matches: a few names in
    Python (the patterns are plain text, anchors and alternatives, which Python's re matches
    as polars' regex engine does; a polars string query costs 0.15 ms even on 40 rows)."""
    search = re.compile(rx).search
    rows = np.flatnonzero(among)
    got = names[rows].to_list()
    return rows[np.array([n is not None and search(n) is not None for n in got], dtype=bool)]


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
    # The masks over the launches and the few memcpys in numpy, from Series comparisons (a
    # null is no match, as the filter's null is no row): the filter, the with_columns and the
    # memcpys' select this took were 1 ms of fixed cost at 10 MB.
    m = trace.memcpys
    corr = m["correlation"].cast(pl.Float64).to_numpy()  # NaN: null
    page = (_eq(m["src_memory"], "Pageable") | _eq(m["dst_memory"], "Pageable")) & ~np.isnan(corr)
    small = _eq(m["direction"], "DtoH") & (ints_of(m["bytes"], 0) < 2**20)
    # the copies from or to pageable memory (with a launch to match), and which of them are
    # small device-to-host ones (a synchronous read of a value)
    small_dtoh = corr[page & small].astype(np.int64)
    big = corr[page & ~np.isin(corr, small_dtoh)].astype(np.int64)
    la = trace.launches
    is_sync = _eq(la["api_kind"], "sync")
    copies = np.flatnonzero(_eq(la["api_kind"], "memcpy"))
    sync_copy = np.zeros(la.height, dtype=bool)
    pageable = np.zeros(la.height, dtype=bool)
    if len(copies):
        la_corr = la["correlation"].cast(pl.Float64).to_numpy()[copies]
        names = la["name"][copies]
        if len(copies) <= _FEW_NAMES:
            # (a null name is neither: ~contains is null, no row unless its copy is small)
            not_async = np.array([n is not None and "Async" not in n for n in names.to_list()])
        else:
            not_async = _eq(names.str.contains("Async", literal=True), False)
        sync_copy[copies] = not_async | is_in(la_corr, small_dtoh)
        pageable[copies] = is_in(la_corr, big)
    rows = np.flatnonzero(is_sync | sync_copy | pageable)
    reason = np.where(is_sync[rows], 0, np.where(sync_copy[rows], 1, 2))
    return pl.DataFrame([*la[rows].get_columns(), pl.Series("blocking_reason", _REASONS)[reason]])


def launch_queue_waits(trace: Trace) -> pl.DataFrame:
    """Launch calls held by a full launch queue, with the time they were held (us).

    A kernel launch (or an asynchronous copy or memset) returns at once while the GPU's queue of
    launched work has room; when the CPU runs far enough ahead of the GPU that the queue is
    full, the call blocks until a slot frees (CUDA C++ Programming Guide, "Asynchronous
    Concurrent Execution": launches return before the work completes, and the host may block
    when it cannot queue more). That time is the GPU holding the host back, not host work.
    A call counts as held when it took over :data:`QUEUE_HELD_FACTOR` times the median
    duration of the calls of its name in the trace, and its GPU work still waited in the queue
    after the call returned, longer than the call was held (a full queue: the work ahead of it
    takes longer than one slot took to free); ``held_us`` is its duration beyond that median.
    A call slow for another reason (a first launch loading its module) finds its work started
    soon after it returns. Host syncs and synchronous or pageable copies are :func:`sync_calls`', not here.
    Columns: ``step``, ``held_us``. Computed once per set of tables.
    """
    tables = (trace.launches, trace.kernels, trace.memcpys, trace.memsets)
    return trace.memo("launch_queue_waits", tables, lambda: _launch_queue_waits(trace))


QUEUE_HELD_FACTOR = 2.0
"""A launch call over this many times its name's median duration, its work queued, was held
by a full launch queue (the held calls of a GPU-saturated ViT-B/16 fp32 training step took 5
to 120 times the median of their name; unsaturated steps' calls rarely exceed 2x)."""


def _launch_queue_waits(trace: Trace) -> pl.DataFrame:
    la = trace.launches
    kind = la["api_kind"]
    queued = mask_of(kind == "kernel") | mask_of(kind == "memset") | mask_of(kind == "memcpy")
    queued &= ~is_in(la["correlation"].cast(pl.Float64).to_numpy(), _sync_correlations(trace))
    rows = np.flatnonzero(queued)
    empty = pl.DataFrame(schema={"step": pl.Int64, "held_us": pl.Float64})
    if not len(rows):
        return empty
    calls = la[rows].select("name", "step", "correlation", "duration_us", "end_us")
    typical = calls.group_by("name").agg(typical_us=pl.col("duration_us").median())
    gpu = (
        pl.concat(
            [
                t.select("correlation", "start_us")
                for t in (trace.kernels, trace.memcpys, trace.memsets)
                if t.height
            ]
        )
        .group_by("correlation")
        .agg(gpu_start_us=pl.col("start_us").min())
    )
    held = (
        calls.join(typical, on="name")
        .join(gpu, on="correlation")
        .with_columns(held_us=pl.col("duration_us") - pl.col("typical_us"))
        .filter(
            (pl.col("duration_us") > QUEUE_HELD_FACTOR * pl.col("typical_us"))
            & (pl.col("gpu_start_us") - pl.col("end_us") > pl.col("held_us"))
        )
    )
    return held.select("step", "held_us")


def _sync_correlations(trace: Trace) -> np.ndarray:
    """Correlation ids of the host syncs and blocking copies (:func:`sync_calls`)."""
    return sync_calls(trace)["correlation"].cast(pl.Float64).to_numpy()


_FEW_NAMES = 2000
"""Up to this many strings are tested in Python (a polars string query costs 0.1 ms even on
20 rows)."""


def _eq(s: pl.Series, value) -> np.ndarray:
    """``s == value`` as a numpy bool array, null as False (``eq_missing`` is a polars query)."""
    return mask_of(s == value)


_REASONS = ["synchronize", "synchronous copy", "pageable memcpy"]
""":func:`sync_calls`' ``blocking_reason`` of each index (the first that applies)."""


def _strictly_increasing(v: np.ndarray) -> bool:
    """Whether ``v`` is sorted with no two values equal (nor NaN): then any sort of it,
    stable or not, keeps its order."""
    return bool((v[1:] > v[:-1]).all()) and not np.isnan(v[:1]).any()


def _arr(df: pl.DataFrame, c: str) -> np.ndarray:
    return df[c].to_numpy().astype(float) if df.height else np.empty(0)


def _with_nulls_at(s: pl.Series, null: np.ndarray) -> pl.Series:
    """``s`` with its values at ``null`` (bool array) made null."""
    return s.scatter(np.flatnonzero(null), None) if null.any() else s


def step_windows(trace: Trace) -> pl.DataFrame:
    """Per (step, device): CPU and GPU windows, step time, busy, idle, counts.

    Columns: step, device, cpu_start_us, cpu_end_us, cpu_time_us, gpu_start_us, gpu_end_us,
    gpu_window_us, window_start_us, window_end_us, overlap_prev_us (what the previous step
    already counted of this step's longer window), step_time_us, gpu_busy_us (the union of the
    GPU events the step launched: it can run past the window, and sums over steps to the busy
    time of the analysed steps), idle_us (the device idle inside the window, whichever step's
    events cover the rest: what the idle causes split), idle_fraction, kernels, memcpys,
    memsets, memcpy_us, memcpy_bytes, sync_us (host blocked in sync calls and blocking copies,
    pageable memcpys included: :func:`sync_calls`). A trace without GPU activity gets device null
    and null GPU columns (never "100 % idle").

    The few rows (steps x devices) are worked out in numpy over the GPU events' arrays: each
    polars call costs a fixed 0.1-0.3 ms whatever its rows, and the 30 of them this took were
    a quarter of a 10 MB trace's diagnosis. The floats are the ones polars gave: sums of times
    as exact picoseconds (:func:`~tracedx.analysis.intervals.sum_us`), converted as a
    ``group_by`` converts them (:func:`~tracedx.analysis.intervals.grouped_ps_to_us`).
    """
    steps = trace.steps
    if not _strictly_increasing(_arr(steps, "start_us")):
        steps = steps.sort("start_us")  # (strictly increasing starts: in that order already)
    step_no = steps["step"].to_numpy()
    cpu_start = _arr(steps, "start_us")
    cpu_end = _arr(steps, "end_us")
    gpu = trace.gpu_activity()
    ev = {
        "step": gpu["step"].cast(pl.Float64).to_numpy(),  # NaN: no step
        "start": _arr(gpu, "start_us"),
        "end": _arr(gpu, "end_us"),
        "duration": _arr(gpu, "duration_us"),
        "kernel": mask_of(gpu["kind"] == "kernel"),
        "memcpy": mask_of(gpu["kind"] == "memcpy"),
        "memset": mask_of(gpu["kind"] == "memset"),
    }
    devices = trace.devices
    parts = []
    for dev in devices or [None]:
        if dev is None:
            mine = np.zeros(gpu.height, dtype=bool)
        elif _all_on_one_device(gpu, len(devices)):
            mine = np.ones(gpu.height, dtype=bool)
        else:
            mine = mask_of(gpu["device"] == dev)
        parts.append(
            _device_windows(step_no, cpu_start, cpu_end, {k: v[mine] for k, v in ev.items()}, dev)
        )
    cols = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
    # the device as its integer (a float64 device number past 2**53 would not round-trip)
    device_id = np.concatenate(
        [
            np.full(len(p["step"]), 0 if d is None else d, dtype=np.int64)
            for p, d in zip(parts, devices or [None], strict=True)
        ]
    )
    has_gpu = trace.has_gpu_activity
    step_time = cols["window_end_us"] - cols["window_start_us"]
    idle = np.where(cols["_idle_us"] < 0.0, 0.0, cols["_idle_us"]) if has_gpu else None
    cols["step_time_us"] = step_time
    if not has_gpu:
        cols["gpu_busy_us"] = np.full(len(step_time), np.nan)
        cols["idle_us"] = np.full(len(step_time), np.nan)
        cols["idle_fraction"] = np.full(len(step_time), np.nan)
    else:
        cols["idle_us"] = idle
        pos = step_time > 0
        frac = np.full(len(step_time), np.nan)
        frac[pos] = idle[pos] / step_time[pos]
        cols["idle_fraction"] = frac
    cols["memcpy_bytes"], cols["sync_us"] = _copy_bytes_and_syncs(
        trace, cols["step"], cols["device"]
    )
    # by device, then step (a null device last)
    dev_key = np.where(np.isnan(cols["device"]), np.inf, cols["device"])
    order = np.lexsort((cols["step"], dev_key))
    return pl.DataFrame(
        [
            pl.Series(c, cols[c][order], dtype=dtype, nan_to_null=dtype == pl.Float64)
            if c != "device"
            else _with_nulls_at(pl.Series(c, device_id[order]), np.isnan(cols[c][order]))
            for c, dtype in _WINDOW_COLUMNS.items()
        ]
    )


_WINDOW_COLUMNS = {
    "step": pl.Int64,
    "device": pl.Int64,
    "cpu_start_us": pl.Float64,
    "cpu_end_us": pl.Float64,
    "cpu_time_us": pl.Float64,
    "gpu_start_us": pl.Float64,
    "gpu_end_us": pl.Float64,
    "gpu_window_us": pl.Float64,
    "window_start_us": pl.Float64,
    "window_end_us": pl.Float64,
    "overlap_prev_us": pl.Float64,
    "step_time_us": pl.Float64,
    "gpu_busy_us": pl.Float64,
    "idle_us": pl.Float64,
    "idle_fraction": pl.Float64,
    "kernels": pl.UInt32,
    "memcpys": pl.UInt32,
    "memsets": pl.UInt32,
    "memcpy_us": pl.Float64,
    "memcpy_bytes": pl.Int64,
    "sync_us": pl.Float64,
}


def _device_windows(
    step_no: np.ndarray,
    cpu_start: np.ndarray,
    cpu_end: np.ndarray,
    g: dict[str, np.ndarray],
    dev: int | None,
) -> dict[str, np.ndarray]:
    """One device's steps (``step_no``, CPU windows ``cpu_start`` to ``cpu_end``, in CPU start
    order; ``g``: its GPU events' arrays, a NaN step for none): per step, the CPU and GPU
    windows, the tiled windows (``window_start_us``, ``window_end_us``), the counts, busy and
    idle time (``_idle_us``, unclipped); NaN where the column is null."""
    n = len(step_no)
    # the GPU events by launching step: first start, last end, counts, memcpy time
    has_step = ~np.isnan(g["step"])
    keys, of = np.unique(g["step"][has_step], return_inverse=True)
    first = np.full(len(keys), np.inf)
    np.minimum.at(first, of, g["start"][has_step])
    last_end = np.full(len(keys), -np.inf)
    np.maximum.at(last_end, of, g["end"][has_step])
    counts = {
        kind: np.bincount(of[g[kind][has_step]], minlength=len(keys))
        for kind in ("kernel", "memcpy", "memset")
    }
    memcpy_ps = np.zeros(len(keys), dtype=np.int64)
    is_copy = g["memcpy"][has_step]
    np.add.at(memcpy_ps, of[is_copy], to_ps(g["duration"][has_step][is_copy]))
    memcpy_us = grouped_ps_to_us(memcpy_ps)
    # each step's group (-1: no GPU event launched in it)
    at = np.searchsorted(keys, step_no) if len(keys) else np.zeros(n, dtype=np.int64)
    at = np.minimum(at, max(len(keys) - 1, 0))
    found = (keys[at] == step_no) if len(keys) else np.zeros(n, dtype=bool)

    def per_step(v: np.ndarray, missing: float) -> np.ndarray:
        out = np.full(n, missing)
        out[found] = v[at[found]]
        return out

    gpu_start = per_step(first, np.nan)
    # the GPU window ends where the next step with GPU work starts its first event (its own
    # last end for the last such step, or where that next start is not later)
    with_gpu = np.flatnonzero(found)
    nxt = np.searchsorted(with_gpu, np.arange(n), side="right")
    later = np.full(n, np.nan)
    has_later = nxt < len(with_gpu)
    later[has_later] = gpu_start[with_gpu[nxt[has_later]]]
    use_later = has_later & (later > gpu_start)
    gpu_end = np.where(found, np.where(use_later, later, per_step(last_end, np.nan)), np.nan)
    cpu_time = cpu_end - cpu_start
    gpu_window = gpu_end - gpu_start
    # The steps' intervals: GPU windows when, over the steps, the GPU windows are the longer
    # (the GPU binds and lags the CPU), else CPU windows. One choice for all steps, so the
    # intervals tile the timeline; choosing per step mixes windows that are offset in time.
    # (The sums are polars', in its order of additions.)
    gpu_sum = pl.Series(gpu_window, dtype=pl.Float64, nan_to_null=True).sum() or 0.0
    cpu_sum = pl.Series(cpu_time, dtype=pl.Float64).sum() or 0.0
    gpu_longer = ~np.isnan(gpu_window) & (gpu_sum > cpu_sum)
    chosen_start = np.where(gpu_longer, gpu_start, cpu_start)
    chosen_end = np.where(gpu_longer, gpu_end, cpu_end)
    # Steps never overlap (a CPU window kept for a step with no GPU work could lie inside
    # the previous step's GPU window): a step starts no earlier than the previous ended.
    ended = np.concatenate([[-np.inf], np.maximum.accumulate(chosen_end)[:-1]])[:n]
    starts = np.maximum.accumulate(np.maximum(chosen_start, ended)) if n else np.empty(0)
    # each window ends where the next begins (a gap between two ProfilerStep ranges, the step
    # marker's own host time, is the earlier step's); the last at its own end
    ends = starts.copy()
    if n:
        ends[:-1] = starts[1:]
        ends[-1] = max(float(chosen_end[-1]), starts[-1])
    busy = _busy_per_step(g, step_no, starts, ends)
    # The device's idle time inside each window (what the idle causes split): the window
    # less the part any GPU event covers, whichever step launched it.
    ms, me = union(g["start"], g["end"])
    idle = (ends - starts) - overlap(ms, me, starts, ends) if n else np.empty(0)
    # how much of the step's own (CPU or GPU) window the previous step already counted
    prev = starts - chosen_start
    return {
        "step": step_no,
        "device": np.full(n, np.nan if dev is None else float(dev)),
        "cpu_start_us": cpu_start,
        "cpu_end_us": cpu_end,
        "cpu_time_us": cpu_time,
        "gpu_start_us": gpu_start,
        "gpu_end_us": gpu_end,
        "gpu_window_us": gpu_window,
        "window_start_us": starts,
        "window_end_us": ends,
        "overlap_prev_us": np.where(prev < 0.0, 0.0, prev),
        "gpu_busy_us": busy.astype(np.float64),
        "_idle_us": idle,
        "kernels": per_step(counts["kernel"], 0).astype(np.int64),
        "memcpys": per_step(counts["memcpy"], 0).astype(np.int64),
        "memsets": per_step(counts["memset"], 0).astype(np.int64),
        "memcpy_us": per_step(memcpy_us, 0.0),
    }


def _busy_per_step(
    g: dict[str, np.ndarray], steps: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> np.ndarray:
    """GPU busy of each of ``steps`` (windows ``starts`` to ``ends``): the union of the GPU
    events it launched (kernels, memcpys, memsets; ``g``'s arrays), an instant shared with an
    earlier step's events counted there only. An event with no launch record (launched before
    the trace, correlation lost) is the step whose interval holds its start."""
    # each event's step as its index in ``steps`` (a sorted look-up: a dict per event took
    # 16 ms at 1 GB)
    keys = np.asarray(steps, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    ev_step = g["step"]
    own = is_in(ev_step, keys)  # (a NaN step is in none)
    owner = order[np.searchsorted(keys[order], ev_step[own].astype(np.int64))]
    st_, en_ = g["start"][own], g["end"][own]
    orphan = np.isnan(ev_step)
    if orphan.any() and len(steps):
        o_start = g["start"][orphan]
        k = np.searchsorted(starts, o_start, side="right") - 1
        keep = (k >= 0) & (o_start < ends[-1])
        st_ = np.concatenate([st_, o_start[keep]])
        en_ = np.concatenate([en_, g["end"][orphan][keep]])
        owner = np.concatenate([owner, k[keep]])
    return owned_union(st_, en_, owner, len(steps))


def _copy_bytes_and_syncs(
    trace: Trace, step: np.ndarray, device: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row (``step``, ``device``: NaN for none) the bytes of its memcpys and the host time
    blocked in sync calls of its step (any device): ``memcpy_bytes`` (int64) and ``sync_us``,
    0 where none. Times as exact picoseconds, converted as a ``group_by("step")`` does."""
    m = trace.memcpys
    m_step = m["step"].cast(pl.Float64).to_numpy()
    m_dev = m["device"].cast(pl.Float64).to_numpy()
    m_bytes = ints_of(m["bytes"], 0)
    copy_bytes = np.zeros(len(step), dtype=np.int64)
    for dev in np.unique(device[~np.isnan(device)]) if m.height else []:
        rows = device == dev
        copy_bytes[rows] = _sums_at(m_step[m_dev == dev], m_bytes[m_dev == dev], step[rows])
    sc = sync_calls(trace)
    s_step = sc["step"].cast(pl.Float64).to_numpy()
    n_groups = len(np.unique(s_step[~np.isnan(s_step)]))
    sync_ps = _sums_at(s_step, to_ps(_arr(sc, "duration_us")), step)
    return copy_bytes, grouped_ps_to_us(sync_ps, n_groups)


def _sums_at(keys: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The int64 sums of ``values`` per key of ``keys`` (floats, NaN: no key, counted
    nowhere), at each key of ``at`` (0 for a key with no rows)."""
    known = ~np.isnan(keys)
    uniq, of = np.unique(keys[known], return_inverse=True)
    sums = np.zeros(len(uniq), dtype=np.int64)
    np.add.at(sums, of, values[known])
    out = np.zeros(len(at), dtype=np.int64)
    if len(uniq):
        pos = np.minimum(np.searchsorted(uniq, at), len(uniq) - 1)
        hit = uniq[pos] == at
        out[hit] = sums[pos[hit]]
    return out


def _all_on_one_device(gpu: pl.DataFrame, devices: int) -> bool:
    """Whether every row of ``gpu`` (GPU activity) is on the trace's one device (of
    ``devices``): then its rows need no filter by device (a copy of every column of every GPU
    event, 10 ms at 1 GB)."""
    return devices == 1 and gpu["device"].null_count() == 0


def _on_device(gpu: pl.DataFrame, dev: int, devices: int) -> pl.DataFrame:
    """The rows of ``gpu`` (GPU activity) on device ``dev`` (all of them, unfiltered, when
    :func:`_all_on_one_device`)."""
    if _all_on_one_device(gpu, devices):
        return gpu
    return gpu.filter(pl.col("device") == dev)


def idle_gaps(
    trace: Trace, windows: pl.DataFrame, host_work_ops: pl.Series | None = None
) -> pl.DataFrame:
    """Every idle gap inside each step's GPU window, with its cause.

    ``host_work_ops``: op ids of top-level ops whose host time counts as ``host work`` although
    they launch GPU work (the diagnosis passes the one op that holds most of the step's host
    time at 100 us or more per kernel, such as cuDNN planning inside attention).

    Columns: step, device, start_us, end_us, duration_us, cause, next_launch_start_us.
    """
    gpu = trace.gpu_activity()[["device", "start_us", "end_us", "launch_start_us"]]
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
    g_dev = gpu["device"].to_numpy()
    g_start, g_end = _arr(gpu, "start_us"), _arr(gpu, "end_us")
    g_launch = gpu["launch_start_us"].cast(pl.Float64).to_numpy()  # NaN: no launch
    for dev in trace.devices:
        on = slice(None) if _all_on_one_device(gpu, len(trace.devices)) else g_dev == dev
        m_start, m_end = union(g_start[on], g_end[on])
        mine = w_dev == dev
        win, gs, ge = gaps_in(m_start, m_end, w_start[mine], w_end[mine])
        if len(gs) == 0:
            continue
        # the GPU event that ends each gap (the first to start at its end), and when it was
        # launched: the events in time order by a numpy argsort
        order = np.argsort(g_start[on], kind="stable")
        starts = g_start[on][order]
        launch = g_launch[on][order]
        k = np.searchsorted(starts, ge, side="left")
        at = np.minimum(k, len(starts) - 1)
        if (
            (k < len(starts) - 1) & (starts[np.minimum(at + 1, len(starts) - 1)] == starts[at])
        ).any():
            # two events start at a gap's end: the one the polars sort puts first, as before
            g = _on_device(gpu, dev, len(trace.devices)).sort("start_us")
            starts = g["start_us"].to_numpy()
            launch = g["launch_start_us"].cast(pl.Float64).to_numpy()
        nl = np.where(k < len(starts), launch[at], np.nan)
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
    if 0 < gaps.height <= _NUMPY_GAPS and not (
        gaps["step"].null_count() or gaps["device"].null_count()
    ):
        # idle_gaps' causes (each a Series comparison, their index among the sorted names):
        # grouped and sorted in numpy, where the polars group_by and sort cost 0.6 ms
        causes = sorted(_GAP_CAUSES)
        code = np.full(gaps.height, -1, dtype=np.int64)
        for i, c in enumerate(causes):
            code[_eq(gaps["cause"], c)] = i
        if (code >= 0).all():
            return _idle_by_cause(gaps, code, causes)
    return (
        gaps.group_by("step", "device", "cause")
        .agg(idle_us=sum_us("duration_us"), gaps=pl.len())
        .sort("step", "device", "cause")
    )


_NUMPY_GAPS = 8_000
"""Up to this many gaps, :func:`idle_by_cause` groups them in numpy (a lexsort of 5,000 gaps
cost what the polars group_by and sort cost; of 100,000, twice)."""


def _idle_by_cause(gaps: pl.DataFrame, code: np.ndarray, causes: list[str]) -> pl.DataFrame:
    """:func:`idle_by_cause` of ``gaps`` (no null step or device; ``code``: each gap's cause
    as its index in ``causes``, sorted): the same rows, sums and floats."""
    step = gaps["step"].to_numpy().astype(np.int64, copy=False)
    device = gaps["device"].to_numpy().astype(np.int64, copy=False)
    order = np.lexsort((code, device, step))
    step, device, code = step[order], device[order], code[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (step[1:] != step[:-1]) | (device[1:] != device[:-1]) | (code[1:] != code[:-1])
    first = np.flatnonzero(new)
    ps = np.add.reduceat(to_ps(gaps["duration_us"].to_numpy())[order], first)
    return pl.DataFrame(
        {
            "step": step[first],
            "device": device[first],
            "cause": pl.Series(causes, dtype=pl.Utf8)[code[first]],
            "idle_us": grouped_ps_to_us(ps),
            "gaps": np.diff(np.append(first, len(order))),
        },
        schema={
            "step": pl.Int64,
            "device": pl.Int64,
            "cause": pl.Utf8,
            "idle_us": pl.Float64,
            "gaps": pl.UInt32,
        },
    )
