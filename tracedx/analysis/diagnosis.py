"""``diagnose(trace) -> Diagnosis``: where the time goes, what binds it, what each fix is worth.

Pipeline (one direction): trace tables -> step windows and idle gaps (:mod:`.timeline`) ->
kernel kinds (:mod:`.kernels`) and op groups on the roofline (:mod:`.ops`, ``roofline``) ->
a step model and the regime -> findings (:mod:`.findings`). Reports only render this object.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from tracedx.analysis import findings as fx
from tracedx.analysis.comm import comm_compute_by_step
from tracedx.analysis.intervals import (
    grouped_ps_to_us,
    inside,
    ints_of,
    is_in,
    mask_of,
    overlap,
    ps_to_us,
    rows_in_steps,
    sum_us,
    to_ps,
    union,
)
from tracedx.analysis.kernels import gpu_breakdown, kernel_name_codes, kernel_name_kinds
from tracedx.analysis.ops import (
    op_arrays,
    op_column_of,
    op_groups,
    ops_in_steps,
    top_level_ops,
)
from tracedx.analysis.timeline import (
    dataloader_windows,
    gpu_tree_tops,
    idle_by_cause,
    idle_gaps,
    launch_queue_waits,
    optimizer_windows,
    step_windows,
    sync_calls,
)
from tracedx.console import plural
from tracedx.errors import TraceError
from tracedx.results import Presentable
from tracedx.trace import Trace
from tracedx.trace.source import collector_paused

SCHEMA = "tracedx.diagnosis/1"
FUSABLE_KINDS = ("elementwise", "reduction", "normalization")
NO_GPU_CAUSES = (
    "the profiler ran without ProfilerActivity.CUDA; CUPTI is missing or not permitted "
    "(containers need CAP_SYS_ADMIN or NVreg_RestrictProfilingToAdminUsers=0); or the trace was "
    "read before the profiler flushed it"
)


def _incomplete_steps(trace: Trace) -> list[int]:
    """The last ProfilerStep numbers beyond the complete steps ``tracedx capture`` recorded
    (its metadata's ``active_steps_recorded``): a step the script ended inside."""
    cap = trace.metadata.get("tracedx")
    done = cap.get("active_steps_recorded") if isinstance(cap, dict) else None
    if not isinstance(done, int) or isinstance(done, bool) or done < 0:
        return []
    nums = sorted(trace.steps["step"].to_list())
    return nums[done:] if len(nums) > done else []


def _captured_without_gpu(trace: Trace) -> bool:
    """Whether ``tracedx capture`` wrote this trace on a machine with no CUDA GPU (its
    metadata's ``cuda_available``; older captures: a ``gpu_name`` of null)."""
    cap = trace.metadata.get("tracedx")
    if not isinstance(cap, dict):
        return False
    if "cuda_available" in cap:
        return cap["cuda_available"] is False
    return "gpu_name" in cap and cap["gpu_name"] is None


@dataclass(repr=False, eq=False)
class Diagnosis(Presentable):
    """The result of :func:`diagnose`. Tables are polars DataFrames; times are us unless named _ms.

    Attributes:
        trace: the analysed Trace.
        steps: analysed step numbers.
        device: the DeviceSpec used for peaks (None when unknown), ``device_notes`` how it was chosen.
        primary_device: the GPU index the verdict is about (the busiest one).
        windows: per (step, device) windows and metrics (see ``timeline.step_windows``).
        gaps: every idle gap with its cause; ``idle_causes``: idle per (step, device, cause).
        summary: per device, medians/min/max of the step metrics (dict).
        kernel_kinds: device time by kernel kind; ``memcpy``: copies by direction and memory.
        op_table: op groups with FLOPs, bytes, intensity and roofline placement.
        top_ops: CPU against device time per top-level op.
        regime, bottleneck, evidence: the verdict and the numbers that decided it.
        findings: fixes in the order a person would apply them (``findings.order_findings``).
        notes: things the user must know (no steps, profiler overhead, unknown device, ...).
        comm_by_step: per analysed step, compute and communication of the primary device
            (:func:`tracedx.analysis.comm.comm_compute_by_step`); None when the trace has no
            communication kernel. Computed once: the rank summary reads it too.
    """

    trace: Trace
    steps: list[int]
    device: Any
    device_notes: list[str]
    primary_device: int | None
    windows: pl.DataFrame
    gaps: pl.DataFrame
    idle_causes: pl.DataFrame
    summary: dict[str, Any]
    kernel_kinds: pl.DataFrame
    memcpy: pl.DataFrame
    op_table: pl.DataFrame
    top_ops: pl.DataFrame
    largest_gaps: pl.DataFrame
    sync_sites: pl.DataFrame
    regime: str | None
    bottleneck: str | None
    evidence: list[str]
    findings: list[fx.Finding]
    model: fx.StepModel | None
    notes: list[str] = field(default_factory=list)
    decode: dict[str, Any] | None = None
    comm_by_step: pl.DataFrame | None = None

    _present = {
        "repr": "tracedx.report.card:diagnosis_repr",
        "card": "tracedx.report.card:diagnosis_card",
        "text": "tracedx.report.text:render_text",
        "md": "tracedx.report.markdown:render_markdown",
        "html": "tracedx.report.html:render_html",
        "json": "tracedx.report.json:render_json",
        "figures": "tracedx.report.figures:all_figures",
    }

    @property
    def step_time(self) -> dict[str, Any]:
        """The step time that counts, for gates such as ``tracedx diagnose --max-step-ms``:
        ``{"ms": float | None, "basis": "unprofiled" | "traced" | None}``: the median step
        timed without the profiler by ``tracedx capture --time-unprofiled`` when the trace has
        it (the profiler slows the host), else the median traced step of the primary device."""
        u = self.summary.get("unprofiled_step_ms") or {}
        if u.get("median") and not u.get("implausible"):
            return {"ms": float(u["median"]), "basis": "unprofiled"}
        devs = self.summary.get("devices") or {}
        d = devs.get(str(self.primary_device)) or next(iter(devs.values()), {})
        med = (d.get("step_time_us") or {}).get("median")
        return {"ms": None, "basis": None} if med is None else {"ms": med / 1e3, "basis": "traced"}

    def to_dict(self) -> dict[str, Any]:
        """The JSON contract ``tracedx.diagnosis/1`` (see README). Non-finite numbers become null."""
        from tracedx.report.json import diagnosis_dict

        return diagnosis_dict(self)

    def figures(self, step: int | None = None) -> dict[str, Any]:
        """Plotly figures (roofline, timeline, breakdown, fixes) for notebooks; each also
        displays as HTML where a viewer does not run plotly's own output (a static notebook).
        ``step``: the analysed step the timeline draws (default: the one closest to the median
        step time). Raises ValueError for a step that was not analysed, TypeError for one
        that is not an integer."""
        from tracedx.results import _figures

        return _figures(self._render("figures", step=step))


StepsSpec = str | int | range | Collection[int] | None
"""What ``steps`` takes: ``"N..M"`` (inclusive; ``"N.."``, ``"..M"``, ``"N"``), a step number
(an ``int`` or a numpy integer), a ``range`` or a collection of step numbers (a list, tuple,
set, numpy array or polars Series); None for every step."""


def _is_step_number(v: object) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_steps(spec: StepsSpec) -> str | tuple[int, ...] | None:
    """``spec`` checked without a trace: a string's syntax, or the step numbers of an integer,
    a range or a collection (Python ints, sorted, each once). Returns the string as given, or
    the numbers.

    Raises TypeError for any other type (a float, a bool, a dict, a collection holding a
    non-integer) and TraceError for a malformed or reversed string or an empty collection."""
    if spec is None or isinstance(spec, str):
        if spec is not None:
            _steps_bounds(spec)
        return spec
    if _is_step_number(spec):
        vals = [spec]
    elif isinstance(spec, Collection) and not isinstance(spec, (bytes, bytearray, Mapping)):
        vals = list(spec)
    else:
        raise TypeError(
            f"steps: expected 'N..M', a step number, a range or a list of step numbers, not "
            f"{type(spec).__name__}"
        )
    for v in vals:
        if not _is_step_number(v):
            raise TypeError(f"steps: step numbers are integers, not {type(v).__name__} {v!r}")
    if not vals:
        raise TraceError("steps: the collection of step numbers is empty")
    return tuple(sorted({int(v) for v in vals}))


def _steps_bounds(spec: str) -> tuple[float, float]:
    """``"N..M"`` -> (N, M) with open ends as infinities. Raises TraceError when malformed or
    reversed."""
    m = re.fullmatch(r"\s*(\d+)?\s*(\.\.)?\s*(\d+)?\s*", spec)
    if not m or (m.group(1) is None and m.group(3) is None):
        raise TraceError(f"steps {spec!r}: expected N..M, N.. , ..M or N")
    lo = int(m.group(1)) if m.group(1) else -math.inf
    hi = int(m.group(3)) if m.group(3) else (math.inf if m.group(2) else lo)
    if hi < lo:
        raise TraceError(f"steps {spec}: the range is reversed (write {int(hi)}..{int(lo)})")
    return lo, hi


def parse_steps(spec: StepsSpec, available: list[int]) -> list[int]:
    """``spec`` (see :data:`StepsSpec`) -> the listed steps present in the trace (``available``,
    sorted). A string keeps the steps inside its range; numbers must all be in the trace.

    Raises TypeError for a spec of another type (:func:`check_steps`), TraceError for a
    malformed string, a string that matches no step, or a number the trace does not have.
    """
    spec = check_steps(spec)
    if spec is None:
        return available
    has = f"the trace has steps {available[0]}..{available[-1]}" if available else "no steps"
    if isinstance(spec, tuple):
        missing = sorted(set(spec) - set(available))
        if missing:
            listed = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
            raise TraceError(f"steps: no step {listed}; {has}")
        return list(spec)
    lo, hi = _steps_bounds(spec)
    chosen = [s for s in available if lo <= s <= hi]
    if not chosen:
        raise TraceError(f"steps {spec}: no such steps; {has}")
    return chosen


def _stats(median_min_max: tuple) -> dict[str, float | None]:
    """A column's median, min and max as floats (None for a column of nulls only)."""
    if median_min_max[0] is None:
        return {"median": None, "min": None, "max": None}
    return dict(zip(("median", "min", "max"), map(float, median_min_max), strict=True))


_MEMCPY_SCHEMA = {
    "device": pl.Int64,
    "direction": pl.Utf8,
    "host_memory": pl.Utf8,
    "count": pl.UInt32,
    "bytes": pl.Int64,
    "device_time_us": pl.Float64,
    "achieved_gbs": pl.Float64,
}


def _host_memory() -> pl.Expr:
    """A copy's host memory: its source's for host to device, its destination's for device to
    host (``Pageable``, ``Pinned``), ``Device`` otherwise."""
    return (
        pl.when(pl.col("direction") == "HtoD")
        .then(pl.col("src_memory"))
        .when(pl.col("direction") == "DtoH")
        .then(pl.col("dst_memory"))
        .otherwise(pl.lit("Device"))
    )


def _memcpy_table(trace: Trace, steps: list[int]) -> pl.DataFrame:
    """The analysed steps' copies by device, direction and host memory (``Pageable``,
    ``Pinned``; ``Device`` for device-to-device): count, bytes, device time and bandwidth,
    by device time (descending), then the keys. One polars group_by; the few groups' bandwidth
    and order in Python (a filter, with_columns and sort cost 0.1-0.3 ms each)."""
    m = trace.memcpys
    on = rows_in_steps(m, steps) if m.height else np.zeros(0, dtype=bool)
    if not on.any():
        return pl.DataFrame(schema=_MEMCPY_SCHEMA)
    m = m if on.all() else m.filter(pl.Series(on))
    g = m.group_by("device", "direction", host_memory=_host_memory()).agg(
        count=pl.len(), bytes=pl.col("bytes").sum(), device_time_us=sum_us("duration_us")
    )
    cols = {c: g[c].to_list() for c in ("device", "direction", "host_memory", "count", "bytes")}
    us = g["device_time_us"].to_list()
    # bytes / us / 1e3 as polars works it out on the column: the Int64 bytes as floats, and
    # the division by 1e3 of a column of several rows a product by its reciprocal (see
    # intervals.grouped_ps_to_us)
    cols["device_time_us"] = us
    k = 1.0 / 1e3
    cols["achieved_gbs"] = [
        (float(b) / t / 1e3 if g.height == 1 else float(b) / t * k) if t > 0 else None
        for b, t in zip(cols["bytes"], us, strict=True)
    ]

    # by the time, descending, then the keys (nulls last): the keys break ties (the
    # group_by's order varies)
    def last(x):
        return (x is None, x if x is not None else 0)

    order = sorted(
        range(g.height),
        key=lambda i: (
            -us[i],
            last(cols["device"][i]),
            last(cols["direction"][i]),
            last(cols["host_memory"][i]),
        ),
    )
    return pl.DataFrame({c: [v[i] for i in order] for c, v in cols.items()}, schema=_MEMCPY_SCHEMA)


def sync_call_sites(trace: Trace, steps: list[int]) -> pl.DataFrame:
    """Every blocking host call in ``steps``, one row each: the columns of
    :func:`~tracedx.analysis.timeline.sync_calls` (``pid``, ``tid``, ``start_us``, ``end_us``,
    ``duration_us``, ``name`` the runtime call, ``blocking_reason``, ``step``, ...) plus ``op``
    (its top-level op, else its op, else ``"(no op)"``) and ``site`` (null without Python stacks).

    The site is the innermost user frame holding the call (``file(line): function``; PyTorch
    records Python frames per function, so the line is the function's line, or where it stood
    when profiling began) and the Python call it made (e.g. ``<built-in method item ...>``).
    """
    sc = sync_calls(trace)
    sc = _rows_where(sc, rows_in_steps(sc, steps))
    if sc.height == 0:
        return sc.with_columns(op=pl.lit(None, pl.Utf8), site=pl.lit(None, pl.Utf8))
    ops = trace.ops.select("op_id", "top_op_id", pl.col("name").alias("op"))
    tops = trace.ops.select(pl.col("op_id").alias("top_op_id"), pl.col("name").alias("top_op"))
    sc = sc.join(ops, on="op_id", how="left").join(tops, on="top_op_id", how="left")
    sites = [None] * sc.height
    pf = trace.python_frames
    if pf.height:
        user = pf.filter(
            ~pl.col("name").str.starts_with("<")
            & ~pl.col("name").str.contains(
                r"site-packages|dist-packages|/torch/|\\torch\\|/lib/python|<frozen|"
                r"^(torch|click|tracedx|runpy|typing|threading|contextlib|functools|importlib)[/\\.(]"
            )
        )
        for i, (tid, t) in enumerate(
            zip(sc["tid"].to_list(), sc["start_us"].to_list(), strict=True)
        ):
            hit = user.filter(
                (pl.col("tid") == tid) & (pl.col("start_us") <= t) & (pl.col("end_us") >= t)
            )
            if hit.height:
                site = hit.sort("start_us")["name"][-1]
                # the Python call made from that frame (e.g. <built-in method item of Tensor object>)
                inner = pf.filter(
                    (pl.col("tid") == tid) & (pl.col("start_us") <= t) & (pl.col("end_us") >= t)
                ).sort("start_us")
                if inner.height and inner["name"][-1] != site:
                    call = re.sub(r" at 0x[0-9a-fA-F]+", "", inner["name"][-1])
                    site += f" -> {call}"
                sites[i] = site
    return sc.with_columns(
        site=pl.Series(sites, dtype=pl.Utf8),
        op=pl.coalesce(pl.col("top_op"), pl.col("op"), pl.lit("(no op)")),
    ).drop("top_op")


def _sync_sites(trace: Trace, steps: list[int]) -> pl.DataFrame:
    """Blocking host calls grouped by the site, the op that issued them and the runtime call
    (:func:`sync_call_sites`): ``site``, ``op``, ``call``, ``count``, ``blocked_us``."""
    schema = {
        "site": pl.Utf8,
        "op": pl.Utf8,
        "call": pl.Utf8,
        "count": pl.UInt32,
        "blocked_us": pl.Float64,
    }
    sc = sync_call_sites(trace, steps)
    if sc.height == 0:
        return pl.DataFrame(schema=schema)
    return (
        # first-seen order, then a stable sort: ties keep it (the report is the same each run)
        sc.group_by("site", "op", pl.col("name").alias("call"), maintain_order=True)
        .agg(count=pl.len(), blocked_us=sum_us("duration_us"))
        .sort("blocked_us", descending=True, maintain_order=True)
        .select(list(schema))
    )


def fusable_runs(trace: Trace, steps: list[int], device: int) -> pl.DataFrame:
    """Runs of >= 2 back-to-back fusable kernels on one stream, one row per run: ``step``,
    ``stream``, ``run``, ``n`` (kernels), ``start_us``, ``end_us`` (first start, last end),
    ``total`` (summed kernel us), ``longest`` (us), ``host`` (mean host us per kernel of the
    launching top-level ops, 0 where none), ``linked`` (any kernel has a top-level op),
    ``names`` (the kernel names in order). See :func:`_fusable_chains` for the rules.
    """
    schema = {
        "step": pl.Int64, "stream": pl.Int64, "run": pl.UInt32, "n": pl.UInt32,
        "start_us": pl.Float64, "end_us": pl.Float64, "total": pl.Float64,
        "longest": pl.Float64, "host": pl.Float64, "linked": pl.Boolean,
        "names": pl.List(pl.Utf8),
    }  # fmt: skip
    r = _fusable_run_arrays(trace, steps, device)
    if r is None:
        return pl.DataFrame(schema=schema)
    kt = trace.kernels
    rows = r["rows"]
    first = r["first"]
    # the kernels' names in run order, gathered into one list per run
    names = kt["name"].gather(rows)
    per_run = (
        pl.DataFrame({"g": r["group"], "name": names})
        .group_by("g", maintain_order=True)
        .agg("name")["name"]
    )
    return pl.DataFrame(
        {
            "step": pl.Series(kt["step"].gather(rows[first]), dtype=pl.Int64),
            "stream": kt["stream"].gather(rows[first]),
            "run": pl.Series(r["run"], dtype=pl.UInt32),
            "n": pl.Series(r["n"], dtype=pl.UInt32),
            "start_us": r["start_us"],
            "end_us": r["end_us"],
            "total": r["total"],
            "longest": r["longest"],
            "host": r["host"],
            "linked": r["linked"],
            "names": per_run,
        },
        schema=schema,
    )


def _launched_in_optimizer(trace: Trace) -> np.ndarray:
    """Whether each kernel's launch lies in an ``Optimizer.step#``/``zero_grad#`` annotation
    (:func:`~tracedx.analysis.timeline.optimizer_windows`): the optimizer is not part of the
    module ``torch.compile(model)`` compiles, so its kernels stay as they are (AdamW's
    ``_foreach_*`` chains: 25% of the chains' device time in gpt2_train-eager, 45 to 57% in
    the llama, BERT and ViT training steps; the compiled twins' chains are those). A kernel
    with no launch record (replayed from a CUDA graph, unlinked) is not in one, and neither is
    a step without the annotations (a custom optimizer): their optimizer kernels still count
    as fusable."""
    ann = optimizer_windows(trace)
    if not ann.height:
        return np.zeros(trace.kernels.height, dtype=bool)
    s, e = union(ann["start_us"].to_numpy(), ann["end_us"].to_numpy())
    return inside(s, e, trace.kernels["launch_start_us"].cast(pl.Float64).to_numpy())


def _fusable_run_arrays(trace: Trace, steps: list[int], device: int) -> dict | None:
    """The runs of :func:`fusable_runs` as numpy arrays (one entry per run, but ``rows``:
    the kernels' rows of ``trace.kernels`` in run order, ``group``: each one's run, ``first``:
    each run's first kernel among them), or None when there is no run. Worked out on the
    kernels' arrays: the polars filter, sort and group_by this took cost 2.5 ms at 10 MB."""
    names = kernel_name_kinds(trace)
    kt = trace.kernels
    if device is None or kt.height == 0:
        return None
    on = rows_in_steps(kt, steps) & mask_of(kt["device"] == device)
    if not on.any():
        return None
    # whether each kernel is fusable, by its name (looked up through kernel_name_codes)
    fusable = np.array(
        [
            kind in FUSABLE_KINDS and not name.startswith("triton_")
            for name, kind in zip(names["name"], names["kind"], strict=True)
        ],
        dtype=bool,
    )
    rows = np.flatnonzero(on)
    # (a kernel with no stream recorded is on the null stream: one stream of its own)
    step = kt["step"].to_numpy()[rows]
    stream = ints_of(kt["stream"], -1 << 62)[rows]
    start = kt["start_us"].to_numpy()[rows]
    # by step, stream and start time (np.lexsort is stable: kernels of one stream that start
    # together keep the table's order; polars' multi-column sort gave no such order)
    order = np.lexsort((start, stream, step))
    rows, step, stream, start = rows[order], step[order], stream[order], start[order]
    host = _host_per_kernel(trace, kt["top_op_id"].cast(pl.Float64).to_numpy()[rows])
    # the host syncs each kernel's launch came after: a sync between two kernels ends a chain
    sc = sync_calls(trace)
    sync_ends = np.sort(
        sc["end_us"].to_numpy()[(sc["blocking_reason"] != "pageable memcpy").to_numpy()]
    )
    launch = kt["launch_start_us"].cast(pl.Float64).to_numpy()[rows]
    seg = np.searchsorted(sync_ends, np.where(np.isnan(launch), -np.inf, launch))
    fus = fusable[kernel_name_codes(trace)[rows]]
    # torch.compile(model) does not fuse the optimizer: its kernels end a chain, as a kernel
    # that is not fusable does (dropped, they would join the kernels either side of them)
    fus &= ~_launched_in_optimizer(trace)[rows]
    run, count = _runs(step, stream, fus, seg)
    # only the fusable runs of two kernels or more
    keep = fus & (np.bincount(count)[count] >= 2)
    if not keep.any():
        return None
    rows, run, count = rows[keep], run[keep], count[keep]
    new = np.ones(len(count), dtype=bool)
    new[1:] = count[1:] != count[:-1]
    first = np.flatnonzero(new)  # each run's first kernel (a run's kernels are together)
    n = np.diff(np.append(first, len(count)))
    dur = kt["duration_us"].to_numpy()[rows]
    h = host[keep]
    linked = ~np.isnan(h)
    return {
        "rows": rows,
        "group": np.cumsum(new) - 1,
        "first": first,
        "run": run[first],
        "n": n,
        "start_us": np.minimum.reduceat(start[keep], first),
        "end_us": np.maximum.reduceat(kt["end_us"].to_numpy()[rows], first),
        # summed as exact picoseconds, converted as a group_by of the runs converts them
        "total": grouped_ps_to_us(np.add.reduceat(to_ps(dur), first)),
        "longest": np.maximum.reduceat(dur, first),
        "host": _kahan_means(
            np.where(linked, h, 0.0),
            first,
            n,
            lambda: {
                "step": kt["step"].gather(rows),
                "stream": kt["stream"].gather(rows),
                "run": pl.Series(run, dtype=pl.UInt32),
            },
        ),
        "linked": np.logical_or.reduceat(linked, first),
    }


_KAHAN_MAX = 256
"""Groups of up to this many values are summed in Python/numpy as polars sums them (Kahan)."""


def _kahan_means(
    v: np.ndarray, first: np.ndarray, n: np.ndarray, keys: Callable[[], dict]
) -> np.ndarray:
    """Per group of consecutive values (``first``: each group's first index, ``n``: its
    length) the mean a polars ``group_by`` gives: a compensated (Kahan) sum in row order
    over n (tests/test_numpy_paths.py checks it against polars), one pass per position in
    the groups, over the groups that long. Groups of over 256 values (where polars sums
    otherwise) are left to polars: a group_by of the columns ``keys()`` and ``v``, as are
    values whose compensated sums are not all finite (an inf gives NaN there, inf in polars)."""

    def by_polars() -> np.ndarray:
        df = pl.DataFrame({**keys(), "v": v})
        by = [c for c in df.columns if c != "v"]
        return df.group_by(by, maintain_order=True).agg(pl.col("v").mean())["v"].to_numpy()

    if len(n) and n.max() > _KAHAN_MAX:
        return by_polars()
    s = np.zeros(len(first))
    c = np.zeros(len(first))
    by_len = np.argsort(-n, kind="stable")  # the groups longest first
    sorted_n = n[by_len]
    with np.errstate(invalid="ignore", over="ignore"):  # an inf: NaN, then polars' path
        for j in range(int(n.max()) if len(n) else 0):
            g = by_len[: int(np.searchsorted(-sorted_n, -j, side="left"))]
            y = v[first[g] + j] - c[g]
            t = s[g] + y
            c[g] = (t - s[g]) - y
            s[g] = t
    return s / n if np.isfinite(s).all() else by_polars()


def _host_per_kernel(trace: Trace, top: np.ndarray) -> np.ndarray:
    """Per kernel (``top``: its top-level op's id, NaN for none) that op's host time over the
    kernels it launched in all the trace; NaN for a kernel with no top-level op, or one the op
    table does not hold."""
    all_tops = trace.kernels["top_op_id"].cast(pl.Float64).to_numpy()
    tops, n_kernels = np.unique(all_tops[is_in(all_tops, top)], return_counts=True)
    at = np.searchsorted(tops, top)
    known = at < len(tops)
    known[known] = tops[at[known]] == top[known]
    h = op_column_of(op_arrays(trace), "duration_us", top)
    known &= ~np.isnan(h)
    host = np.full(len(top), np.nan)
    host[known] = h[known] / n_kernels[at[known]]
    return host


def _runs(
    step: np.ndarray, stream: np.ndarray, fus: np.ndarray, seg: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The runs of kernels sorted by (step, stream, start): a run starts at each stream's
    first kernel of a step and wherever ``fus`` or ``seg`` changes. Returns each kernel's run
    number, from 1 in each (step, stream), and its run's index over all kernels."""
    new_run = np.ones(len(step), dtype=bool)
    new_run[1:] = (
        (step[1:] != step[:-1])
        | (stream[1:] != stream[:-1])
        | (fus[1:] != fus[:-1])
        | (seg[1:] != seg[:-1])
    )
    first = np.ones(len(step), dtype=bool)
    first[1:] = (step[1:] != step[:-1]) | (stream[1:] != stream[:-1])
    count = np.cumsum(new_run)
    return count - np.maximum.accumulate(np.where(first, count - 1, 0)), count


def _fusable_chains(
    trace: Trace, steps: list[int], device: int, cap_per_kernel_us: float | None = None
) -> tuple[float, float, float, int, float | None]:
    """Runs of >= 2 back-to-back fusable kernels on one stream (:func:`fusable_runs`): (chain
    us, saved us, kernels removed, chains, host us of the removed kernels).

    Totals over the analysed steps. Saved = sum - max per chain. Triton kernels are already fused.
    A host sync between two kernels breaks the chain (torch.compile breaks its graph at
    ``.item()``), so kernels launched after different numbers of syncs never share a chain.
    A kernel's host cost is its top-level op's host time over the kernels that op launched (its
    own ops', not the step's average: one op re-planning cuDNN must not make every add costly);
    a kernel with no top-level op (graph-replayed, unlinked) costs nothing to remove. A chain
    removes (n - 1) kernels at its kernels' mean cost, at most ``cap_per_kernel_us`` (the
    step's mean host time per kernel: an op's time can also hold allocations, waits and other
    work that fusion does not remove). The host total is None when no chain kernel has a
    top-level op.
    """
    r = _fusable_run_arrays(trace, steps, device)
    if r is None:
        return 0.0, 0.0, 0.0, 0, None
    host, n, total = r["host"], r["n"], r["total"]
    if cap_per_kernel_us is not None:
        host = np.minimum(host, cap_per_kernel_us)
    # (sums as polars sums the runs' columns)
    return (
        _float_sum(total),
        _float_sum(total - r["longest"]),
        float((n - 1).sum()),
        len(n),
        _float_sum(host * (n - 1).astype(np.float64)) if r["linked"].any() else None,
    )


_KEPT_NO_GPU = "AccumulateGrad"


def compile_region_host(trace: Trace, steps: list[int]) -> tuple[float, float, float]:
    """Host time that ``torch.compile(model)`` traces away, per analysed step (us, us, events).

    Returns (Python inside the model, host time of ops that launch nothing inside the model
    plus the autograd engine's own time in the backward nodes that launch GPU work, their
    recorded host events). "Inside the model" is the step's CPU window less the optimizer's annotations
    (``Optimizer.step#``, ``Optimizer.zero_grad#``: the optimizer is not part of the compiled
    module) and the DataLoader's ``__next__`` windows. Python is the part of it covered by no
    top-level op on any thread (module calls, and the autograd engine between its nodes); the
    ops that launch nothing are top-level ops with no GPU work (views, splits, the autograd
    nodes of views) but ``AccumulateGrad``, which writes ``.grad`` outside the compiled graph.
    A backward node's own time is its duration less its child ops' (the engine's work per
    node). Dynamo/Inductor replace these with one compiled forward and one compiled backward
    call. Checked on gpt2_train-compile: of 3.20 ms per step of ops that launch nothing eager,
    the 1.22 ms left are AccumulateGrad, the optimizer's and Dynamo's cache lookup; the own time
    of the backward nodes but AccumulateGrad falls from 2.24 ms (317 nodes) to 0.10 ms (2); in
    all, what this returns as traced away falls from 3.86 ms per step to 0.15 ms.
    Not modelled: Dynamo's guard checks on each call (``TorchDynamo Cache Lookup``: 0.38 ms per
    step traced on gpt2_decode-compile, as much as the view ops it replaced; 0.05 ms on
    gpt2_train-compile).
    """
    st_on = rows_in_steps(trace.steps, steps)
    n = max(int(st_on.sum()), 1)
    if not st_on.any():
        return 0.0, 0.0, 0.0
    ann = optimizer_windows(trace)
    dl = dataloader_windows(trace)
    xs = np.concatenate(
        [ann["start_us"].to_numpy(), dl["start_us"].to_numpy() if dl.height else []]
    )
    xe = np.concatenate([ann["end_us"].to_numpy(), dl["end_us"].to_numpy() if dl.height else []])
    out_s, out_e = union(xs, xe)

    o = op_arrays(trace)
    in_steps = ops_in_steps(trace, steps)
    # the analysed steps' top-level ops: their arrays, and their names read in one polars
    # call (a filter and select of the op table cost 0.5 ms at 10 MB)
    on = in_steps & o["is_top"]
    top_id, top_us = o["op_id"][on], o["duration_us"][on]
    top_start, top_end = o["start_us"][on], o["end_us"][on]
    name = pl.DataFrame({"name": trace.ops["name"].filter(pl.Series(on))}).select(
        # (an op with no name is neither counted nor a node)
        kept=pl.col("name").str.contains(_KEPT_NO_GPU, literal=True).fill_null(True),
        node=pl.col("name").str.starts_with("autograd::engine::evaluate_function").fill_null(False),
    )
    kept = name["kept"].to_numpy()
    launches = is_in(top_id, gpu_tree_tops(trace).to_numpy())
    none = ~launches & ~kept & ~inside(out_s, out_e, top_start)
    no_gpu_us = _float_sum(top_us[none]) / n
    events = int(is_in(o["top_op_id"][in_steps], top_id[none]).sum()) / n
    # the autograd engine's own time in the backward nodes that launch GPU work (a node's
    # duration less its child ops'): the compiled backward is one node
    nodes = name["node"].to_numpy() & launches & ~kept
    if nodes.any():
        in_nodes = is_in(o["parent_id"][in_steps], top_id[nodes])
        kids = _float_sum(o["duration_us"][in_steps][in_nodes])
        no_gpu_us += max(_float_sum(top_us[nodes]) - kids, 0.0) / n
        events += int(nodes.sum()) / n
    # Python: the CPU windows less the top-level ops and the windows outside the model
    cs, ce = union(np.concatenate([top_start, out_s]), np.concatenate([top_end, out_e]))
    a, b = trace.steps["start_us"].to_numpy()[st_on], trace.steps["end_us"].to_numpy()[st_on]
    python = float(((b - a) - overlap(cs, ce, a, b)).sum())
    return python / n, float(no_gpu_us), float(events)


# An op faster than this multiple of its roofline bound is not explained by the L2 cache
# (which serves a few times the device memory bandwidth): the inputs of the figure are wrong.
IMPOSSIBLE_ROOF_FRACTION = 10.0


def diagnose(
    trace: Trace,
    *,
    device: str | None = None,
    peak_tflops: float | None = None,
    bandwidth_gbs: float | None = None,
    calibration: str | None = None,
    steps: StepsSpec = None,
) -> Diagnosis:
    """Diagnose a loaded trace.

    Args:
        trace: from :func:`tracedx.load`.
        device: GPU name whose datasheet peaks to use instead of the trace's (``--device``).
        peak_tflops, bandwidth_gbs: explicit ceilings (TFLOP/s, GB/s) overriding everything.
        calibration: a ``tracedx calibrate`` JSON file (measured ceilings beat datasheets).
        steps: the ProfilerStep numbers to analyse: ``"N..M"`` (inclusive; ``"N.."``,
            ``"..M"``, ``"N"``), a step number, a ``range`` or a list of step numbers
            (:data:`StepsSpec`); None for all.

    Returns:
        Diagnosis. Raises TraceError (exit 2 in the CLI) for a bad ``steps`` spec or device,
        TypeError for a ``steps`` of another type.
    """
    # Python's cyclic collector off inside (trace.source.collector_paused): the diagnosis
    # makes tens of thousands of small objects (rows, lists, tuples), none of them in cycles,
    # and the collections they set off scan every object of the process: 3-7 ms of a 25 ms
    # diagnosis of the 10 MB benchmark trace
    with collector_paused():
        return _diagnose(
            trace,
            device=device,
            peak_tflops=peak_tflops,
            bandwidth_gbs=bandwidth_gbs,
            calibration=calibration,
            steps=steps,
        )


def _diagnose(
    trace: Trace,
    *,
    device: str | None,
    peak_tflops: float | None,
    bandwidth_gbs: float | None,
    calibration: str | None,
    steps: StepsSpec,
) -> Diagnosis:
    """:func:`diagnose`."""
    from tracedx.devices import resolve_device

    spec, dev_notes = resolve_device(
        trace.device_name,
        device=device,
        peak_tflops=peak_tflops,
        bandwidth_gbs=bandwidth_gbs,
        calibration=calibration,
    )
    notes: list[str] = []
    if trace.metadata.get("device_mismatch") is not None and device is None:
        notes.append(
            f"deviceProperties lists no entry with id {trace.metadata['device_mismatch']}, the "
            "GPU the kernels ran on: its peaks are unknown (give --device; device= in Python)"
        )
    chosen = _analysed_steps(trace, steps, notes)
    n = len(chosen)
    # the step windows, then the idle gaps in them and their causes
    w = step_windows(trace)
    w = _rows_where(w, rows_in_steps(w, chosen))
    top = top_level_ops(trace, chosen)
    host_op = _host_work_op(top, w, n_steps=n)
    gaps = idle_gaps(trace, w, _top_op_ids(trace, host_op["name"]) if host_op else None)
    causes = idle_by_cause(gaps)
    summary: dict[str, Any] = {"steps": n, "devices": _device_summaries(w)}
    primary, dev_notes = _primary_device(trace, w, dev_notes, notes)
    # what the primary device's time is spent on: kernel kinds, copies, ops on the roofline
    kinds = gpu_breakdown(trace, chosen, primary, n)
    peer_note = _peer_wait_note(trace, kinds, n)
    if peer_note:
        notes.append(peer_note)
    memcpy = _memcpy_table(trace, chosen)
    ops_tbl = _place_on_roofline(op_groups(trace, chosen), spec)
    notes += _roofline_notes(ops_tbl, spec)
    sites = _sync_sites(trace, chosen)
    # the primary device's typical step, the verdict on it, and the fixes it backs
    if primary is None:
        wp, largest, model = w, gaps.head(0), None
    else:
        wp = _rows_where(w, mask_of(w["device"] == primary))
        largest = _rows_where(gaps, mask_of(gaps["device"] == primary))
        largest = largest.sort("duration_us", descending=True).head(5)
        on = causes["device"] == primary
        # (no filter when every row is the primary's: the step model reads arrays only)
        mine = causes if on.all() and not on.null_count() else causes.filter(on)
        model = _step_model(trace, chosen, wp, mine, n)
    regime, bottleneck, evidence = _verdict(
        trace, wp, kinds, memcpy, ops_tbl, model, primary, host_op=host_op
    )
    comm_by_step = (
        comm_compute_by_step(trace, chosen, primary)
        if (kinds["kind"] == "communication").any()
        else None
    )
    found = (
        _findings(
            trace, chosen, model, kinds, memcpy, ops_tbl, spec, primary, wp, sites, n, comm_by_step
        )
        if model
        else []
    )
    unprof, implausible = unprofiled_timing(
        trace, float(w["step_time_us"].median()) if w.height else None
    )
    found = _estimates_basis(trace, model, found, unprof, implausible, notes)
    peaks = spec.peak_tflops if spec is not None else {}
    if (
        bottleneck == "fp32 math"
        and peaks.get("tf32")
        and peaks.get("fp32")
        and not any(f.fix == "tf32" for f in found)
    ):
        notes.append(_no_tf32_estimate(model is not None and model.graph_replays >= 1))
    if unprof is not None:
        summary["unprofiled_step_ms"] = (
            {**unprof, "implausible": implausible} if implausible else unprof
        )
    decode = decode_ceiling_info(ops_tbl, spec, model, n)
    if decode:
        evidence.append(_decode_evidence(decode))
    return Diagnosis(
        trace=trace,
        steps=chosen,
        device=spec,
        device_notes=dev_notes,
        primary_device=primary,
        windows=w,
        gaps=gaps,
        idle_causes=causes,
        summary=summary,
        kernel_kinds=kinds,
        memcpy=memcpy,
        op_table=ops_tbl,
        top_ops=top,
        largest_gaps=largest,
        sync_sites=sites,
        regime=regime,
        bottleneck=bottleneck,
        evidence=evidence,
        findings=found,
        model=model,
        notes=notes,
        decode=decode,
        comm_by_step=comm_by_step,
    )


def _rows_where(df: pl.DataFrame, on: np.ndarray) -> pl.DataFrame:
    """The rows of ``df`` where ``on`` (a numpy bool array) holds: ``df`` itself when that is
    every row (no polars filter: 0.1-0.3 ms each, whatever its rows)."""
    return df if on.all() else df.filter(pl.Series(on, dtype=pl.Boolean))


def _analysed_steps(trace: Trace, spec: StepsSpec, notes: list[str]) -> list[int]:
    """The step numbers to analyse: ``spec`` (:func:`parse_steps`), less a step the script
    ended inside when no range was asked for. Appends the notes on that choice to ``notes``.

    Raises TraceError when the trace holds no step (no events) or ``spec`` is bad."""
    if trace.steps.height == 0:
        left_out = "; ".join(
            w.message for w in trace.warnings if w.kind in ("invalid_duration", "outlier_timestamp")
        )
        why = f": {left_out}" if left_out else ""
        raise TraceError(f"{trace.path}: the trace holds no events to analyse{why}")
    chosen = parse_steps(spec, sorted(trace.steps["step"].to_list()))
    partial = _incomplete_steps(trace)
    if partial and not trace.steps_synthetic:
        kept = [s for s in chosen if s not in partial]
        # the steps after the recorded ones: the last of the trace, one in the usual case
        which = (
            f"step {partial[0]} is"
            if len(partial) == 1
            else f"steps {partial[0]}..{partial[-1]} ({len(partial)}) are"
        )
        if kept and spec is None:
            chosen = kept
            notes.append(
                f"{which} incomplete (the script ended or was stopped inside it; tracedx "
                f"capture recorded {plural(len(trace.steps) - len(partial), 'complete step')}): "
                "left out"
            )
        elif any(s in partial for s in chosen):
            notes.append(
                f"{which} incomplete (the script ended or was stopped inside it): "
                + (
                    "its numbers are not a whole step's"
                    if len(partial) == 1
                    else "their numbers are not whole steps'"
                )
            )
    if trace.steps_synthetic:
        notes.append(
            "no ProfilerStep markers: the whole trace is analysed as one step "
            "(capture with a profiler schedule, or `tracedx capture`, for per-step numbers)"
        )
    elif len(chosen) == 1:
        notes.append("a single ProfilerStep: no median over steps")
    return chosen


_SUMMARY_COLUMNS = (
    "step_time_us",
    "cpu_time_us",
    "gpu_busy_us",
    "idle_fraction",
    "kernels",
    "memcpys",
    "memsets",
    "memcpy_us",
    "memcpy_bytes",
    "sync_us",
)


def _device_summaries(w: pl.DataFrame) -> dict[str, Any]:
    """Per device (its index as a string, ``"None"`` without GPU activity): the median, min
    and max over the step windows ``w`` of each of :data:`_SUMMARY_COLUMNS`, as polars gives
    them (nulls left out; :func:`_median`), worked out on the few rows in Python and numpy
    (the polars filter and select of 30 aggregations cost 0.4-0.8 ms)."""
    devices = w["device"].to_list()
    cols = {c: w[c].to_numpy().astype(np.float64) for c in _SUMMARY_COLUMNS}  # null: NaN
    out = {}
    for dev in dict.fromkeys(devices):  # (in order of appearance)
        mine = np.array([d == dev for d in devices], dtype=bool)
        per = {}
        for c in _SUMMARY_COLUMNS:
            v = cols[c][mine]
            v = np.sort(v[~np.isnan(v)])
            per[c] = _stats((_median(v), v[0], v[-1]) if len(v) else (None,))
        out[str(dev)] = per
    return out


def _median(v: np.ndarray) -> float:
    """Polars' median of the sorted values ``v`` (at least one): the middle one, or of two
    middle ones ``lo + (hi - lo) * 0.5`` (its linear interpolation; numpy's mean of the two
    differs in the last bit on a fifth of random pairs)."""
    n = len(v)
    if n % 2:
        return float(v[n // 2])
    lo, hi = float(v[n // 2 - 1]), float(v[n // 2])
    return lo + (hi - lo) * 0.5


def _primary_device(
    trace: Trace, w: pl.DataFrame, dev_notes: list[str], notes: list[str]
) -> tuple[int | None, list[str]]:
    """The GPU the verdict is about (the busiest over the step windows ``w``; None without GPU
    activity) and the device notes, less an unknown device's on a machine with no GPU.
    Appends to ``notes`` why there is no GPU activity, or that the trace has several GPUs."""
    if trace.has_gpu_activity:
        # the most busy time over the windows (sum_us per device), ties: the lowest index
        busy = _per_step_sums_us(w["device"].to_numpy(), w["gpu_busy_us"].to_numpy())
        primary = min(busy, key=lambda d: (-busy[d], d))
        if len(trace.devices) > 1:
            notes.append(
                f"{len(trace.devices)} GPUs in this trace: numbers are per device; the verdict is for "
                f"GPU {primary}, the busiest"
            )
        return primary, dev_notes
    if _captured_without_gpu(trace):
        notes.append(
            "no GPU activity: the machine that captured this trace had no CUDA GPU (tracedx "
            "capture saw torch.cuda.is_available() False), so only CPU activity was profiled. "
            "GPU metrics are n/a"
        )
        # no GPU, so no device whose peaks are unknown
        dev_notes = [x for x in dev_notes if not x.startswith("unknown device")]
    elif trace.metadata.get("repairs"):
        notes.append(
            "no GPU activity in what could be salvaged of this broken trace: the GPU events were "
            "probably in the lost part. GPU metrics are n/a"
        )
    else:
        notes.append(
            "no GPU activity in this trace (no kernel, memcpy or memset events): GPU metrics are n/a. "
            f"Usual causes: {NO_GPU_CAUSES}"
        )
    return None, dev_notes


def _roofline_notes(ops_tbl: pl.DataFrame, spec) -> list[str]:
    """A note when op groups ran faster than their roofline bound: data still in the L2 cache
    (up to :data:`IMPOSSIBLE_ROOF_FRACTION` times the bound), else corrupt inputs."""
    if "bound_fraction" not in ops_tbl.columns or not ops_tbl.height:
        return []
    over = [r for r in _table_rows(ops_tbl) if _gt(r["bound_fraction"], 1.05)]
    if not over:
        return []
    worst = min(over, key=lambda r: _desc_key(r["bound_fraction"]))  # (the first of ties)
    per_call = (worst.get("bytes") or 0.0) / max(worst.get("count") or 1, 1) / 1e6
    if worst["bound_fraction"] > IMPOSSIBLE_ROOF_FRACTION:
        return [
            f"{len(over)} op group(s) ran faster than the roofline allows, the farthest "
            f"({worst['name']}) at {worst['bound_fraction']:,.0f}x its bound: no cache "
            "explains that much; its kernel durations or its FLOP and byte counts (input "
            "shapes) are corrupt, and its roofline numbers are not to be trusted"
        ]
    peaks = spec.source if spec else "none"
    if worst.get("regime") == "compute":
        # its roof is the compute peak: no cache raises that
        return [
            f"{len(over)} op group(s) ran faster than the roofline allows (the farthest: "
            f"{worst['name']} at {worst['bound_fraction']:.0%} of its bound, compute-bound at "
            f"{worst['intensity']:.0f} FLOP/B): its roof is the compute peak, which no cache "
            f"raises, so the peaks used ({peaks}) are below this GPU's: check --device (device= in Python), "
            "or measure them with `tracedx calibrate`"
        ]
    return [
        f"{len(over)} op group(s) ran faster than the roofline allows (the farthest: {worst['name']} at "
        f"{worst['bound_fraction']:.0%} of its bound, {per_call:.1f} MB per call): data "
        "still in the L2 cache from the kernel before (tens of MB on current GPUs) is read "
        "faster than device memory allows; when an op's data per call is well over the "
        f"L2 size, the peaks used ({peaks}) are below this "
        "GPU's: check --device (device= in Python), or measure them with `tracedx calibrate`"
    ]


def _estimates_basis(
    trace: Trace,
    model: fx.StepModel | None,
    found: list[fx.Finding],
    unprof: dict[str, Any] | None,
    implausible: str | None,
    notes: list[str],
) -> list[fx.Finding]:
    """The findings the trace backs (none on a truncated trace or with inconsistent
    timestamps). Appends to ``notes`` what the estimates are against: the unprofiled step
    (``unprof``, :func:`unprofiled_timing`) or the traced one, and why."""
    if implausible:
        notes.append(
            f"the unprofiled timing cannot be right ({implausible}: a profiler only slows a "
            f"step); estimates and --max-step-ms use the traced step time instead"
        )
    if trace.truncated:
        # the steps may have lost launches or kernels (see _verdict): no estimate is backed
        notes.append(
            "no fix estimates: this truncated trace's GPU timeline is incomplete (see the verdict)"
        )
        return []
    if trace.inconsistent_timestamps and found:
        notes.append("no fix estimates: the trace's timestamps are inconsistent (see the verdict)")
        return []
    if model is not None and model.launch_held_us:
        notes.append(
            f"the GPU holds the host back: launch calls waited {_ms(model.launch_held_us)} per "
            "step (median) for room in a full launch queue, time taken out of the host side "
            "(a launch call over twice its name's median whose GPU work then waited longer than "
            "the call was held)"
        )
    if model is None and isinstance(unprof, dict) and unprof.get("median") and not implausible:
        notes.append(
            f"the step also took {unprof['median']:.3f} ms unprofiled (timed by tracedx "
            "capture); with no GPU activity there is no step model and no fix estimate"
        )
    elif model is not None and model.unprofiled_step_us:
        notes.append(
            f"the step took {model.step_us / 1e3:.3f} ms profiled and {model.unprofiled_step_us / 1e3:.3f} ms "
            f"unprofiled (timed by tracedx capture): estimates are against the unprofiled step, "
            f"with {model.tax_us:.1f} us of profiler cost per host event taken out"
            + (_tax_assumed_note(model) if model.tax_assumed else _tax_caveat(model))
        )
    elif not implausible:
        world = (trace.distributed_info or {}).get("world_size")
        how = (
            # capture refuses --time-unprofiled under torchrun
            "a plain torchrun run with the script's own step timer times the step unprofiled"
            if isinstance(world, int) and world > 1
            else "`tracedx capture --time-unprofiled` also times the step unprofiled"
        )
        notes.append(
            f"the profiler slows the host ({fx.PROFILER_SLOWDOWN}): estimates are against "
            f"the traced step time; {how}"
        )
    return found


def _decode_evidence(decode: dict[str, Any]) -> str:
    """The verdict's line on a decode-shaped step (:func:`decode_ceiling_info`)."""
    return (
        f"decode-shaped step (batch-1 matmuls): reads {decode['weight_bytes_per_token'] / 1e9:.3f} GB of "
        f"weights + {decode['kv_bytes_per_token'] / 1e9:.4f} GB of KV cache per token; at "
        f"{decode['bandwidth_gbs']:.0f} GB/s the ceiling is {decode['ceiling_step_ms']:.3f} ms per token "
        f"({decode['ceiling_tokens_per_s']:.0f} tokens/s); this step reaches "
        f"{decode['achieved_fraction']:.1%} of it"
    )


def _place_on_roofline(ops_tbl: pl.DataFrame, spec) -> pl.DataFrame:
    if "flops" not in ops_tbl.columns:
        return ops_tbl
    try:
        from tracedx.analysis.roofline import place_on_roofline
    except ImportError:  # pragma: no cover
        return ops_tbl
    return place_on_roofline(ops_tbl, spec)


def _float_sum(us: np.ndarray) -> float:
    """Polars' sum of a Float64 column (its order of additions, not numpy's: the same float
    as ``df[col].sum()`` on those rows)."""
    return float(pl.Series(us, dtype=pl.Float64).sum())


def _table_rows(tbl: pl.DataFrame) -> list[dict[str, Any]]:
    """The rows of a small table (the op groups: a few hundred at most) as dicts of Python
    values, which the verdict, the notes and the findings filter and sort in Python (each
    polars filter and sort cost 0.1-0.3 ms; the rows 0.3-0.5 ms for the 10 MB benchmark
    trace's 102 groups)."""
    cols = {c: tbl[c].to_list() for c in tbl.columns}
    return [dict(zip(cols, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]


def _gt(x: float | None, y: float) -> bool:
    """Whether polars keeps a row by ``col > y``: never for null, always for NaN (polars
    orders NaN above every number)."""
    return x is not None and (x > y or math.isnan(x))


def _desc_key(x: float | None) -> tuple:
    """A sort key that puts a float column as polars sorts it descending: nulls first, NaN
    next, then the numbers from the largest (a stable sort: ties keep their order)."""
    if x is None:
        return (0, 0.0)
    return (1, 0.0) if math.isnan(x) else (2, -x)


def _group_sums(keys: list, values: list[float | None]) -> dict:
    """Per key, the sum of its values as a polars ``group_by(key).agg(col.sum())`` gives it:
    a compensated (Kahan) sum in row order, nulls left out (groups of up to 256 rows; polars
    itself for larger ones, and where a sum is not finite: an inf gives NaN there, inf in
    polars)."""

    def by_polars() -> dict:
        df = pl.DataFrame({"k": keys, "v": values}, schema={"k": pl.Utf8, "v": pl.Float64})
        return dict(df.group_by("k").agg(pl.col("v").sum()).rows())

    by: dict = {}
    for k, v in zip(keys, values, strict=True):
        by.setdefault(k, []).append(v)
    if any(len(v) > _KAHAN_MAX for v in by.values()):
        return by_polars()
    out = {}
    for k, vals in by.items():
        s = c = 0.0
        for x in vals:
            if x is None:
                continue
            y = x - c
            t = s + y
            c = (t - s) - y
            s = t
        if not math.isfinite(s):
            return by_polars()
        out[k] = s
    return out


def _per_step_sums_us(step: np.ndarray, us: np.ndarray) -> dict[int, float]:
    """Step number (or any integer key) -> :func:`~tracedx.analysis.intervals.sum_us` of its
    rows' ``us`` (the floats a ``group_by("step")`` gives)."""
    keys, of = np.unique(step, return_inverse=True)
    ps = np.zeros(len(keys), dtype=np.int64)
    np.add.at(ps, of, to_ps(us))
    return dict(zip(keys.tolist(), ps_to_us(ps).tolist(), strict=True))


LAUNCH_HELD_MIN_SHARE = 0.05
"""Launch calls held by a full queue (:func:`~tracedx.analysis.timeline.launch_queue_waits`)
are taken out of the host time when they add up to at least this share of the median step
(the share under which a fix is not worth it): below it they are a few slow calls."""

TAX_ASSUMED_US = 3.6
"""The profiler's cost per host event assumed where it cannot be solved (the GPU side is longer
than the host's or held the host back: traced and unprofiled steps are both the GPU's), raised
where needed to bring the host side within the unprofiled step: the median of the costs solved
on the H200 sample traces with an unprofiled timing and no CUDA graph (38 traces, 0.6 to 14.6
us; README, "Estimates against measurements")."""

_TAX_ASSUMED_NOTE = (
    " (assumed, not solved: the GPU side is longer than the host's, or held the host back in "
    "launches, so the traced and unprofiled steps are both the GPU's and do not tell the "
    "profiler's cost; the median solved "
    "on tracedx's H200 sample traces, 0.6 to 14.6 us over 42 of them, so estimates of fixes "
    "that speed up the GPU past the host are uncertain)"
)


def _tax_assumed_note(model: fx.StepModel) -> str:
    """The note's words for an assumed cost per host event, and why it is above
    :data:`TAX_ASSUMED_US` where it was raised to keep the host within the unprofiled step."""
    if model.tax_us <= TAX_ASSUMED_US + 1e-9:
        return _TAX_ASSUMED_NOTE
    return (
        _TAX_ASSUMED_NOTE[:-1] + f"; raised from {TAX_ASSUMED_US} us so that the host side, "
        f"{_ms(model.host_us)} traced, fits in the unprofiled step)"
    )


# A step with this many of the program's own host syncs or more is a loop of syncs (an
# .item() per iteration): see StepModel.sync_serial.
SERIAL_SYNCS_PER_STEP = 2


def _step_model(
    trace: Trace, steps: list[int], w: pl.DataFrame, causes: pl.DataFrame, n: int
) -> fx.StepModel:
    """The typical step of the primary device as a :class:`~tracedx.analysis.findings.StepModel`.

    Per-step means over the analysed steps (us). Host events are the cpu_ops and runtime calls
    whose start falls in the step; the profiler's cost per host event is solved from the
    unprofiled step time when the trace carries one (``tracedx capture --time-unprofiled``),
    or assumed (:data:`TAX_ASSUMED_US`) where the GPU side binds the traced step.
    """
    o = op_arrays(trace)
    in_steps = ops_in_steps(trace, steps)

    def per_step_median(step: np.ndarray, us: np.ndarray) -> float:
        # median over the analysed steps of the per-step sums, a step with no row counting 0
        got = _per_step_sums_us(step, us)
        return float(np.median([got.get(s, 0.0) for s in steps])) if steps else 0.0

    cause, c_step, c_idle = (causes[c].to_numpy() for c in ("cause", "step", "idle_us"))
    idle = {
        c: per_step_median(c_step[cause == c], c_idle[cause == c])
        for c in np.unique(cause).tolist()
    }
    # the analysed steps' syncs and launch calls as numpy arrays (masks, not polars filters:
    # each of those costs a fixed 0.1-0.3 ms)
    sc = sync_calls(trace)
    sc_step = sc["step"].cast(pl.Float64).to_numpy()
    mine = is_in(sc_step, np.asarray(steps))
    sc_step, sc_us = sc_step[mine], sc["duration_us"].to_numpy()[mine]
    sc_op = sc["op_id"].cast(pl.Float64).to_numpy()[mine]  # NaN: no op
    pageable = mask_of(sc["blocking_reason"] == "pageable memcpy")[mine]
    sync_us = per_step_median(sc_step[~pageable], sc_us[~pageable])
    sync_count = int((~pageable).sum()) / n
    # a sync issued by an op that also made a pageable copy (x.to(device) from pageable memory
    # synchronizes the stream) belongs to that copy: pinned memory + non_blocking removes it
    own = ~pageable & ~is_in(sc_op, sc_op[pageable])
    own_sync_us = per_step_median(sc_step[own], sc_us[own])
    own_sync_count = int(own.sum()) / n
    # host time of the top-level ops that issued those syncs (e.g. aten::item): a graph cannot
    # capture them, so they stay on the host
    sync_tops = op_column_of(o, "top_op_id", sc_op[~pageable])
    sync_ops_host = (
        _float_sum(o["duration_us"][in_steps][is_in(o["op_id"][in_steps], sync_tops)]) / n
    )
    page_us = per_step_median(sc_step[pageable], sc_us[pageable])
    held = launch_queue_waits(trace)
    held_step = held["step"].cast(pl.Float64).to_numpy()
    mine = is_in(held_step, np.asarray(steps))
    held_us = per_step_median(held_step[mine], held["held_us"].to_numpy()[mine])
    step_us = float(w["step_time_us"].median())
    if held_us < LAUNCH_HELD_MIN_SHARE * step_us:
        held_us = 0.0  # a few slow calls, not a step held back by its GPU
    # DataLoader __next__ windows inside the analysed steps
    dl = dataloader_windows(trace)
    if dl.height:
        dl = dl.sort("start_us").join_asof(
            trace.steps.select("step", "start_us").sort("start_us"), on="start_us"
        )
        dl = dl.filter(pl.col("step").is_in(steps))
    dl_s, dl_e = union(dl["start_us"].to_numpy(), dl["end_us"].to_numpy())
    dl_us = float(sum(e - s for s, e in zip(dl_s, dl_e, strict=True))) / n

    # the analysed steps' ops: whether their top-level op launches GPU work (an op without a
    # top-level op is on neither side), and whether they start in a DataLoader window
    top = o["top_op_id"][in_steps]
    in_gpu_tree = is_in(top, gpu_tree_tops(trace).to_numpy())
    linked = ~np.isnan(top)
    gpu_side, no_gpu_side = linked & in_gpu_tree, linked & ~in_gpu_tree
    is_top = o["is_top"][in_steps]
    op_us = o["duration_us"][in_steps]
    ops_dl = inside(dl_s, dl_e, o["start_us"][in_steps])
    host_no_gpu = _float_sum(op_us[is_top & no_gpu_side & ~ops_dl]) / n + dl_us
    la = trace.launches
    la_mine = rows_in_steps(la, steps)
    la_n = int(la_mine.sum())
    la_dl = inside(dl_s, dl_e, la["start_us"].to_numpy()[la_mine])
    host_events = (len(op_us) + la_n) / n
    dl_events = (int(ops_dl.sum()) + int(la_dl.sum())) / n
    no_gpu_events = int((no_gpu_side | ops_dl).sum()) / n + float(la_dl.sum()) / n
    graphs = int(mask_of(la["api_kind"] == "graph")[la_mine].sum()) / n
    kernels = float(w["kernels"].mean() or 0.0)
    cpu = float(w["cpu_time_us"].median() or 0.0)
    gpu_top_host = _float_sum(op_us[is_top & gpu_side & ~ops_dl]) / n
    gpu_tree_events = (
        int((gpu_side & ~ops_dl).sum()) / n
        + int((~np.isnan(la["op_id"].cast(pl.Float64).to_numpy()[la_mine])).sum()) / n
    )
    # host time per kernel: launching threads can overlap (autograd), so never more than H / K;
    # the launches held by a full queue are inside the launching ops, and are not host work
    h_total = max(cpu - sync_us - page_us - held_us, 0.0)
    per_k = min(max(gpu_top_host - held_us, 0.0), h_total) / kernels if kernels else None
    model = fx.StepModel(
        step_us=step_us,
        mean_step_us=float(w["step_time_us"].mean()),
        busy_us=float(w["gpu_busy_us"].median() or 0.0),
        cpu_us=cpu,
        sync_us=sync_us,
        pageable_block_us=page_us,
        launch_held_us=held_us,
        idle_us=idle,
        kernels=kernels,
        host_no_gpu_us=host_no_gpu,
        dataloader_us=dl_us,
        graph_replays=graphs,
        per_kernel_host_us=per_k,
        host_events=host_events,
        dataloader_events=dl_events,
        no_gpu_events=no_gpu_events,
        events_per_kernel=gpu_tree_events / kernels if kernels else 0.0,
        sync_calls=sync_count,
        sync_ops_host_us=sync_ops_host,
        own_sync_us=own_sync_us,
        own_sync_calls=own_sync_count,
    )
    model.dataloader_multiprocess = bool(
        dl.height and dl["name"].str.contains("MultiProcessingDataLoaderIter", literal=True).any()
    )
    unprof, bad = unprofiled_timing(trace, model.step_us)
    if unprof is not None and bad is None and not trace.steps_synthetic:
        t_u = float(unprof["median"]) * 1e3
        model.unprofiled_step_us = t_u
        serial = own_sync_count >= SERIAL_SYNCS_PER_STEP and model.gpu_us > 0
        if host_events > 0 and serial and not held_us:
            # host and GPU serialised by the syncs: t_u = (H - tax x events) + G
            model.sync_serial = True
            h_eff = min(max(t_u - model.gpu_us, 0.0), model.host_us)
            model.tax_us = (model.host_us - h_eff) / host_events
        elif host_events > 0 and (held_us or model.host_us < model.gpu_us):
            # the GPU held the host back, or its side alone is the traced step: the traced and
            # unprofiled steps are both the GPU's and say nothing of the profiler's cost, which
            # is assumed, but at least what brings the host side within the unprofiled step
            # (add_loop-cudagraph: 0.788 ms of traced host time in a 0.436 ms unprofiled step)
            least = max(model.host_us - t_u, 0.0) / host_events
            model.tax_us = min(max(TAX_ASSUMED_US, least), model.host_us / host_events)
            model.tax_assumed = True
        elif host_events > 0:
            # cost per host event that makes the host side match the unprofiled step
            model.tax_us = min(max(model.step_us - t_u, 0.0), model.host_us) / host_events
    return model


def _ms(us: float) -> str:
    return f"{us / 1e3:.3f} ms"


TAX_USUAL_MAX_US = 14.6
"""The top of the profiler's cost per host event solved from the host-bound H200 sample traces
with an unprofiled timing (1.3 to 14.6 us; README, "Estimates against measurements")."""


def _tax_caveat(model: fx.StepModel) -> str:
    """Where the cost per host event solved from the unprofiled timing is beyond the usual
    range, what that says: with CUDA graph replays the profiler's cost grows with the kernels
    inside each replay (0.6 to 1.0 us of host time per kernel profiled, 0.2 to 0.3 unprofiled,
    on an H200: README, "Estimates against measurements"), which one cost per event stands in for; without them, few
    host events carry the whole difference."""
    if model.tax_us <= TAX_USUAL_MAX_US:
        return ""
    why = (
        "; with CUDA graph replays the profiler's cost grows with the kernels inside each "
        "replay, about 0.4 to 0.7 us of host time per kernel on an H200, not with the "
        f"{model.host_events:.0f} host events per step"
        if model.graph_replays
        else "; few host events carry the whole difference, so the host-side estimates are uncertain"
    )
    return (
        f" ({model.tax_us:.0f} us per event is above the 1.3 to 14.6 us solved on host-bound "
        f"H200 traces{why})"
    )


UNPROFILED_MAX_RATIO = 2.0
UNPROFILED_MAX_SPREAD = 10.0
"""An unprofiled median step over 2x the traced median, or timed steps whose max/min is over
10x, cannot be the traced step (the profiler only slows a step: on the sample traces the
unprofiled step is at most 1.18x the traced one, and the timed steps spread at most 1.7x)."""


def unprofiled_timing(trace: Trace, traced_step_us: float | None):
    """The ``tracedx capture --time-unprofiled`` timing (``median``, ``min``, ``max``, ``n`` in
    ms) and, when it cannot be right, why (None when it is usable). ``(None, None)`` when the
    trace has none."""
    cap = trace.metadata.get("tracedx")
    u = cap.get("unprofiled_step_ms") if isinstance(cap, dict) else None
    med = u.get("median") if isinstance(u, dict) else None
    if not isinstance(med, (int, float)) or isinstance(med, bool) or not med > 0:
        return None, None
    why = []
    if traced_step_us and med * 1e3 > UNPROFILED_MAX_RATIO * traced_step_us:
        why.append(f"its median is {med * 1e3 / traced_step_us:.1f}x the traced step")
    lo, hi = u.get("min"), u.get("max")
    numbers = isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo > 0
    if numbers and hi / lo > UNPROFILED_MAX_SPREAD:
        why.append(f"its steps spread {hi / lo:.0f}x ({lo:.3f} to {hi:.3f} ms)")
    return u, ("; ".join(why) or None)


HOST_WORK_SHARE = 0.4
HOST_WORK_US_PER_KERNEL = 100.0
"""One top-level op holding over 40% of the step's host time at 100 us or more per kernel is
host work inside that op (e.g. cuDNN re-planning attention), not launch cost: a launch costs
5-20 us of host time (7.9 us back to back on an H200, ``tracedx calibrate``)."""


def _host_work_op(top: pl.DataFrame, w: pl.DataFrame, n_steps: int) -> dict[str, Any] | None:
    """The top-level op (by name) whose host time is host work by the rule above: ``name``,
    ``per_step_us`` (host time per step), ``kernels`` (per step), ``per_kernel_us``,
    ``share`` (of the median step); None when no op qualifies."""
    step = w["step_time_us"].median() if w.height else None
    if not top.height or not step:
        return None
    t = top.sort("host_time_us", descending=True).row(0, named=True)
    n = max(n_steps, 1)
    per_step = t["host_time_us"] / n
    kernels = t["kernels"] / n
    per_k = per_step / max(kernels, 1)
    if per_step > HOST_WORK_SHARE * step and per_k >= HOST_WORK_US_PER_KERNEL:
        return {"name": t["name"], "per_step_us": per_step, "kernels": kernels,
                "per_kernel_us": per_k, "share": per_step / step}  # fmt: skip
    return None


def _top_op_ids(trace: Trace, name: str) -> pl.Series:
    return trace.ops.filter(pl.col("parent_id").is_null() & (pl.col("name") == name))["op_id"]


def _verdict(trace, w, kinds, memcpy, ops_tbl, model, primary, host_op=None):
    """(regime, bottleneck, evidence) of the primary device's step windows ``w``: overhead-bound
    when the GPU idles half the median step or more (:func:`_overhead_verdict`), else what its
    device time is spent on (:func:`_gpu_bound_verdict`); regime and bottleneck None, with the
    reason as the last evidence line, when the trace cannot back a verdict."""
    ev = _repair_evidence(trace)
    if trace.truncated:
        ev.append(
            "no verdict: only the events before the break of this truncated trace were kept, "
            "and Kineto does not write them in time order (host ops, runtime calls and GPU "
            "events come in separate runs), so any step may have lost launches or GPU events; "
            "the GPU busy time, idle causes and kernel counts below are what was kept, not the "
            "step's"
        )
        return None, None, ev
    if trace.inconsistent_timestamps:
        return None, None, [*ev, f"no verdict: {trace.inconsistent_timestamps}"]
    if model is None:
        return None, None, ["no GPU activity: no regime can be named from this trace"]
    idle = w["idle_fraction"].median()
    if idle is None or not math.isfinite(model.step_us):
        return None, None, ["the step windows are undefined (timestamps out of range?): no regime"]
    ev.append(_busy_idle_line(model.step_us, float(w["gpu_busy_us"].median()), float(idle)))
    idle = float(idle)
    if model.graph_replays and trace.kernels.height == 0:
        return (
            None,
            None,
            ["CUDA graph launches but no kernels recorded: the GPU timeline is incomplete"],
        )
    if idle >= 0.5:
        return _overhead_verdict(w, model, host_op, ev)
    return _gpu_bound_verdict(trace, w, kinds, memcpy, ops_tbl, primary, ev)


def _repair_evidence(trace: Trace) -> list[str]:
    """The evidence line of a trace salvaged with --repair (none for a whole trace)."""
    if not trace.metadata.get("repairs"):
        return []
    return [
        "this trace was salvaged with --repair ("
        + "; ".join(trace.metadata["repairs"])
        + "): "
        + (
            "the numbers cover only what was recovered, and the GPU timeline may be incomplete"
            if trace.truncated
            else "the numbers cover the events that could be read"
        )
    ]


BUSY_IDLE_SLACK = 0.04
"""Busy and idle shares of the median step that, as printed, miss 100% by this much or more get a
word on why (on the sample traces: elementwise-compile 63% + 44%, add_loop-cudagraph 64% + 40%,
gpt2_train-eager 68% + 28%; the others within 2 points)."""


def _busy_idle_line(step_us: float, busy_us: float, idle: float) -> str:
    """The median step, its GPU busy time (the work its steps launched) and idle share (the
    window's time no GPU event covers). The two are medians over steps of different things: a
    step's kernels that run on past its window are its busy time and cover the next window's
    idle, so where their shares miss 100% the line says so."""
    line = f"median step {_ms(step_us)}: GPU busy {_ms(busy_us)} ({busy_us / step_us:.0%}), idle {idle:.0%}"
    # the shares as printed (whole percents): what the reader adds up
    if abs(round(100 * busy_us / step_us) + round(100 * idle) - 100) >= 100 * BUSY_IDLE_SLACK:
        line += (
            " (medians of two measures: busy is the GPU work each step launched, which can run "
            "past its window; idle is the window's time that no GPU work covers)"
        )
    return line


def _overhead_verdict(w: pl.DataFrame, model: fx.StepModel, host_op, ev: list[str]):
    """The verdict of a step whose GPU idles half of it or more: overhead-bound, the bottleneck
    the candidate (host synchronization, transfer, launch or host work) that weighs most
    (:func:`_bottleneck_parts`)."""
    parts = _bottleneck_parts(model)
    cand = {b: sum(v for _, v in p) for b, p in parts.items()}
    bott = max(cand, key=cand.get)
    if cand[bott] <= 0:
        return (
            None,
            None,
            [
                *ev,
                "no bottleneck: no cause of the idle time has any evidence (no sync, launch, "
                "copy or host work measured in the idle gaps)",
            ],
        )
    if bott == "kernel launch" and not (w["kernels"].median() or 0):
        return (
            None,
            None,
            [
                *ev,
                "no bottleneck: the median step runs no kernel, so its idle time cannot be "
                "kernel launch cost",
            ],
        )
    ev.append(
        "idle by cause (median per step): "
        + ", ".join(
            f"{k} {_ms(v)}" for k, v in sorted(model.idle_us.items(), key=lambda x: -x[1]) if v > 0
        )
    )
    ev.append(
        f"{fx.kernels_label(float(w['kernels'].median() or 0.0))} per step, host busy {_ms(model.host_us)}, "
        f"host blocked in syncs {_ms(model.sync_us)} and pageable copies {_ms(model.pageable_block_us)}"
        + (
            f", launches held by a full launch queue {_ms(model.launch_held_us)} (the GPU holds "
            "the host back)"
            if model.launch_held_us
            else ""
        )
    )
    # One top-level op holding most of the host time is host work inside that op (e.g.
    # cuDNN re-planning), not per-kernel launch cost: name it (its idle gaps count as
    # host work too: see idle_gaps' host_work_ops).
    if host_op is not None:
        ev.append(
            f"{host_op['name']} holds {_ms(host_op['per_step_us'])} of host time per step "
            f"({host_op['share']:.0%} of the step) for {host_op['kernels']:.0f} kernels "
            f"({host_op['per_kernel_us']:.0f} us per kernel): host work inside one op, not "
            "launch cost"
        )
        if bott == "kernel launch":
            bott = "host work"
    if bott == "kernel launch" and model.per_kernel_host_us:
        ev.append(
            f"{model.per_kernel_host_us:.1f} us of host time in launching ops per kernel "
            f"against {model.busy_us / max(model.kernels, 1):.1f} us of GPU time per kernel"
        )
    ev.append(_bottleneck_line(bott, parts, cand))
    return "overhead-bound", _dataloader_named(bott, parts, host_op), ev


DATALOADER_PARTS = ("GPU idle in dataloader", "the DataLoader's host time")
"""The parts of the ``host work`` weight (:func:`_bottleneck_parts`) that are the DataLoader's."""


def _dataloader_named(bott: str, parts: dict[str, list[tuple[str, float]]], host_op) -> str:
    """``host work (the DataLoader)`` when host work won on its weight and more than half of
    that weight is the DataLoader's (its GPU idle and its host time; the weight and its parts
    are the bottleneck line's), so that the verdict names what the evidence and the first fix
    (dataloader-workers) are about; else ``bott`` as it is. Not when host work was named
    for one op holding the host time (``host_op``): the DataLoader is not why it won."""
    if bott != "host work" or host_op is not None:
        return bott
    total = sum(v for _, v in parts[bott])
    dl = sum(v for k, v in parts[bott] if k in DATALOADER_PARTS)
    return "host work (the DataLoader)" if total > 0 and dl > total / 2 else bott


def _bottleneck_parts(model: fx.StepModel) -> dict[str, list[tuple[str, float]]]:
    """What each overhead bottleneck is weighed by (us per step, medians): the GPU idle time of
    its causes (:mod:`tracedx.analysis.timeline`) and the host time blocked or spent in it."""
    idle = model.idle_us

    def gap(c: str) -> tuple[str, float]:
        return f"GPU idle in {c}", idle.get(c, 0.0)

    return {
        "host synchronization": [gap("host sync"), ("host blocked in syncs", model.sync_us)],
        "host-device transfer": [("host blocked in pageable copies", model.pageable_block_us)],
        "kernel launch": [gap("kernel launch"), gap("python"), gap("kernel wait")],
        "host work": [
            gap("dataloader"),
            gap("host work"),
            ("the DataLoader's host time", model.dataloader_us),
        ],
    }


def _bottleneck_line(
    bott: str, parts: dict[str, list[tuple[str, float]]], total: dict[str, float]
) -> str:
    """The evidence that names the overhead bottleneck: the figures (us) it was weighed by, and
    the other candidates' weights ``total`` (the largest is the bottleneck,
    :func:`_overhead_verdict`), each weight that is a sum of two or more non-zero figures with
    its parts (``host synchronization 2.644 ms (GPU idle in host sync 2.010 ms + host blocked
    in syncs 0.634 ms)``): the same figures as the idle-by-cause and host-blocked lines."""

    def nonzero(b: str) -> list[tuple[str, float]]:
        return [(k, v) for k, v in parts[b] if v > 0]

    def terms(kv: list[tuple[str, float]]) -> str:
        return " + ".join(f"{k} {_ms(v)}" for k, v in kv)

    # host time and the GPU idle beside it overlap in time: their sum is a weight, not a time
    def mixed(kv: list[tuple[str, float]]) -> bool:
        return len({k.startswith("GPU idle") for k, _ in kv}) > 1

    def other(b: str) -> str:
        kv = nonzero(b)
        if len(kv) < 2:
            return f"{b} {_ms(total[b])}"
        return f"{b} {_ms(total[b])} ({'a weight: ' if mixed(kv) else ''}{terms(kv)})"

    mine = nonzero(bott) or parts[bott][:1]
    others = ", ".join(other(b) for b in total if b != bott)
    eq = f" = {_ms(total[bott])}" if len(mine) > 1 else ""
    how = "medians; a weight: the GPU idle and the host time overlap" if mixed(mine) else "medians"
    return f"{bott} weighs most: {terms(mine)}{eq} per step ({how}), against {others}"


def _gpu_bound_verdict(trace, w, kinds, memcpy, ops_tbl, primary, ev: list[str]):
    """The verdict of a step whose GPU is busy most of it, from what its device time is spent
    on: communication or host-device copies holding half of it, else the roofline placement of
    the ops (:func:`_roofline_verdict`) when it covers half of it, else kernel kinds
    (:func:`_kernel_kind_verdict`)."""
    busy = kinds["device_time_us"].sum() or 1.0
    share = dict(
        zip(kinds["kind"].to_list(), (kinds["device_time_us"] / busy).to_list(), strict=True)
    )
    ev.append(
        "device time by kind: " + ", ".join(f"{k} {v:.0%}" for k, v in share.items() if v >= 0.01)
    )
    if share.get("communication", 0) >= 0.5:
        return "bandwidth-bound", "communication", ev
    hd = (
        memcpy.filter(pl.col("direction").is_in(["HtoD", "DtoH"]))["device_time_us"].sum()
        if memcpy.height
        else 0
    )
    if hd / busy >= 0.5:
        ev.append(f"host-device copies take {hd / busy:.0%} of device time")
        return "bandwidth-bound", "host-device transfer", ev
    placed = _roofline_verdict(ops_tbl, ev)
    if placed:
        return (*placed, ev)
    return _kernel_kind_verdict(trace, w, primary, share, hd / busy, busy, ev)


def _roofline_verdict(ops_tbl: pl.DataFrame, ev: list[str]) -> tuple[str, str] | None:
    """(regime, bottleneck) from the op groups on the roofline when their FLOP/byte models
    cover half the op device time or more: compute-bound (tensor-core or fp32 math) when the
    compute-side ops hold at least as much time as the memory-side ones, else bandwidth-bound
    on device memory. None, with the evidence line saying why, when they do not."""
    if "regime" not in ops_tbl.columns or not ops_tbl.height:
        ev.append("no FLOP/byte models for these ops: classified from kernel kinds")
        return None
    # (the op groups' rows in Python: the sums as polars sums the filtered columns)
    mod = [r for r in _table_rows(ops_tbl) if r["regime"] is not None]
    total_dev = float(ops_tbl["device_time_us"].sum()) or 1.0
    cov = _float_sum([r["device_time_us"] for r in mod]) / total_dev
    if cov < 0.5:
        ev.append(
            f"FLOP/byte models cover only {cov:.0%} of device time: classified from kernel kinds"
        )
        return None
    by = _group_sums([r["regime"] for r in mod], [r["device_time_us"] for r in mod])
    comp = by.get("compute", 0.0)
    bw = by.get("bandwidth", 0.0) + by.get("under-filled", 0.0)
    ev.append(
        f"FLOP/byte models cover {cov:.0%} of op device time: compute-side ops {_ms(comp)}, "
        f"memory-side ops {_ms(bw)} in all analysed steps"
    )

    def by_time(rows: list[dict]) -> list[dict]:
        return sorted(rows, key=lambda r: _desc_key(r["device_time_us"]))

    if comp >= bw:
        c = by_time([r for r in mod if r["regime"] == "compute"])
        # tensor_core & (compute_dtype != "fp32" | math_mode == "tf32"), nulls as polars
        # takes them (Kleene logic; a null keeps no row)
        tc = [r for r in c if _tensor_core_math(r)]
        tc_share = _float_sum([r["device_time_us"] for r in tc]) / (comp or 1.0)
        top = c[0]
        ev.append(
            f"top compute op {top['name']} at {_frac(top.get('bound_fraction'))} of its roof "
            f"({_num(top.get('achieved_tflops'))} TFLOP/s)"
        )
        return "compute-bound", ("tensor-core math" if tc_share >= 0.5 else "fp32 math")
    top = by_time([r for r in mod if r["regime"] != "compute"])[0]
    ev.append(
        f"top memory-side op {top['name']} at {_num(top.get('achieved_gbps'))} GB/s "
        f"({_frac(top.get('bound_fraction'))} of its roof)"
    )
    return "bandwidth-bound", "device memory"


def _tensor_core_math(r: dict[str, Any]) -> bool:
    """Whether polars' filter ``tensor_core & ((compute_dtype != "fp32") | (math_mode ==
    "tf32"))`` keeps the op group row ``r`` (three-valued logic: null is neither)."""
    cd, mm = r["compute_dtype"], r.get("math_mode")
    ne = None if cd is None else cd != "fp32"
    tf = None if mm is None else mm == "tf32"
    either = True if (ne or tf) else (None if ne is None or tf is None else False)
    return bool(r["tensor_core"]) and either is True


def _kernel_kind_verdict(trace, w, primary, share, hd_share, busy, ev: list[str]):
    """(regime, bottleneck, evidence) from the kernel kinds' ``share`` of device time: the
    largest of matrix math, device memory, communication and host-device copies (``hd_share``),
    under-filled matrix kernels counted with the memory side."""
    # Matrix kernels with fewer blocks than SMs (skinny GEMMs, GEMV in decode) cannot be
    # bound by the math units: count them with the memory side.
    small = _underfilled_matrix_share(trace, w, primary) / busy
    if small >= 0.05:
        ev.append(
            f"{small:.0%} of device time is in GEMM/conv/attention kernels with fewer blocks than "
            "SMs (skinny or batch-1 shapes: bound by memory and latency, not math)"
        )
    groups = {
        ("compute-bound", "tensor-core math"): sum(
            share.get(k, 0) for k in ("gemm", "convolution", "attention")
        )
        - small,
        ("bandwidth-bound", "device memory"): sum(
            share.get(k, 0) for k in ("elementwise", "reduction", "normalization", "copy")
        )
        - hd_share
        + small,
        ("bandwidth-bound", "communication"): share.get("communication", 0),
        ("bandwidth-bound", "host-device transfer"): hd_share,
    }
    (regime, bott), v = max(groups.items(), key=lambda kv: kv[1])
    if v <= 0:
        return (
            None,
            None,
            [
                *ev,
                "no bottleneck: no kernel name is recognised as a GEMM, convolution, attention, "
                "elementwise, reduction, normalization, copy or communication kernel (custom "
                "extensions or another vendor's kernels?), so no kind holds any device time",
            ],
        )
    if bott == "tensor-core math" and _fp32_simt_share(trace, w, primary) >= 0.5:
        bott = "fp32 math"  # sgemm / SIMT kernels: the matrix units are not used
    ev.append(f"largest share of device time: {bott} ({v:.0%})")
    return regime, bott, ev


def _kernels_with_kind(trace: Trace, w: pl.DataFrame, device: int | None) -> pl.DataFrame:
    """The kernels of ``device`` in the steps of the windows ``w``, with their kind (``kk``,
    :func:`~tracedx.analysis.kernels.kernel_name_kinds`)."""
    names = kernel_name_kinds(trace)
    return trace.kernels.filter(
        pl.col("step").is_in(w["step"].implode()) & (pl.col("device") == device)
    ).with_columns(kk=pl.col("name").replace_strict(names["name"], names["kind"]))


def _fp32_simt_share(trace: Trace, w: pl.DataFrame, device: int | None) -> float:
    """Share of GEMM/conv kernel time in fp32 kernels that do not use tensor cores (by name)."""
    k = _kernels_with_kind(trace, w, device).with_columns(low=pl.col("name").str.to_lowercase())
    mat = k.filter(pl.col("kk").is_in(["gemm", "convolution"]))
    total = float(mat["duration_us"].sum())
    if total <= 0:
        return 0.0
    simt = mat.filter(
        pl.col("low").str.contains(r"sgemm|simt|f32f32_f32f32|fp32_fp32")
        & ~pl.col("low").str.contains("tf32", literal=True)
    )
    return float(simt["duration_us"].sum()) / total


def _tensor_bytes(shape: list[int] | None, dtype: str | None) -> float:
    from tracedx.trace.dtypes import INPUT_TYPE_BYTES

    if not shape or dtype not in INPUT_TYPE_BYTES:
        return 0.0
    # the product as float64, left to right (np.prod's, without its cost on a short list)
    return math.prod(map(float, shape)) * INPUT_TYPE_BYTES[dtype]


def decode_ceiling_info(ops_tbl: pl.DataFrame, spec, model, n: int) -> dict[str, Any] | None:
    """The decode ceiling when the step looks like batch-1 decode (GEMV-shaped matmuls).

    Decode-like: GEMM ops whose activation has at most 8 rows hold >= 50% of GEMM device time.
    Bytes read per token = weights (the largest input of each GEMM) + KV cache (the key and
    value inputs of attention ops), per step; ceiling = bandwidth / bytes per token
    (:func:`tracedx.analysis.roofline.decode_ceiling`). Returns None when the trace is not decode-like or has no shapes/peaks.
    """
    if spec is None or model is None or "family" not in ops_tbl.columns or ops_tbl.height == 0:
        return None
    groups = _table_rows(ops_tbl)
    gem = [r for r in groups if r["family"] == "gemm"]
    if not gem:
        return None
    skinny_us = total_us = weights = 0.0
    for r in gem:
        shapes, dtypes = r["input_shapes"] or [], r["input_dtypes"] or []
        total_us += r["device_time_us"]
        tensors = [(sh, dt) for sh, dt in zip(shapes, dtypes, strict=False) if len(sh) >= 2]
        if len(tensors) < 2:
            continue
        act = min(tensors, key=lambda x: _tensor_bytes(*x))
        rows = float(np.prod(act[0][:-1]))
        if rows <= 8:
            skinny_us += r["device_time_us"]
        weights += max(_tensor_bytes(*x) for x in tensors) * r["count"] / n
    if total_us <= 0 or skinny_us / total_us < 0.5:
        return None
    kv = 0.0
    for r in (r for r in groups if r["family"] == "attention"):
        shapes, dtypes = r["input_shapes"] or [], r["input_dtypes"] or []
        kv += (
            sum(_tensor_bytes(sh, dt) for sh, dt in list(zip(shapes, dtypes, strict=False))[1:3])
            * r["count"]
            / n
        )
    from tracedx.analysis.roofline import decode_ceiling

    tokens_s = decode_ceiling(weights, kv, spec.bandwidth_gbs)
    ceiling_ms = 1e3 / tokens_s
    step_ms = model.reference_step_us / 1e3
    return {
        "weight_bytes_per_token": weights,
        "kv_bytes_per_token": kv,
        "bandwidth_gbs": spec.bandwidth_gbs,
        "ceiling_tokens_per_s": tokens_s,
        "ceiling_step_ms": ceiling_ms,
        "achieved_tokens_per_s": 1e3 / step_ms if step_ms > 0 else None,
        "achieved_fraction": ceiling_ms / step_ms if step_ms > 0 else None,
    }


def _num_sms(trace: Trace, device: int | None) -> int | None:
    for p in trace.metadata.get("device_properties") or []:
        if (
            isinstance(p, dict)
            and p.get("id", 0) == (device or 0)
            and isinstance(p.get("numSms"), int)
        ):
            return p["numSms"]
    return None


def _underfilled_matrix_share(trace: Trace, w: pl.DataFrame, device: int | None) -> float:
    """Device time (us, all analysed steps) of matrix kernels whose grid has fewer blocks than SMs."""
    sms = _num_sms(trace, device)
    if not sms or device is None:
        return 0.0
    k = _kernels_with_kind(trace, w, device).with_columns(
        blocks=pl.col("grid_x").fill_null(1)
        * pl.col("grid_y").fill_null(1)
        * pl.col("grid_z").fill_null(1),
    )
    small = k.filter(
        pl.col("kk").is_in(["gemm", "convolution", "attention"]) & (pl.col("blocks") < sms)
    )
    return float(small["duration_us"].sum())


def _frac(x) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def _no_tf32_estimate(graphs: bool) -> str:
    """Why a step bound by fp32 math has no tf32 finding: its fp32 GEMMs are not an op group
    with shapes (the finding's input); ``graphs``: the step replays CUDA graphs."""
    why = (
        "GEMMs replayed from a CUDA graph have no launching op, so no shapes or FLOPs"
        if graphs
        else "the ops record no input shapes (record_shapes=True), or the fp32 math is in "
        "convolutions or attention, which the tf32 estimate does not cover"
    )
    return (
        f"fp32 math binds, but tf32 is not estimated: no fp32 GEMM op group with shapes ({why}); "
        "TF32 (torch.set_float32_matmul_precision('high')) may still speed it up: re-capture "
        "and `tracedx diff` to measure it"
    )


def _findings(
    trace, steps, m: fx.StepModel, kinds, memcpy, ops_tbl, spec, primary, w, sites, n, comm_by_step
):
    out: list[fx.Finding | None] = []
    idle_fraction = float(w["idle_fraction"].median() or 0.0)
    out.append(fx.cuda_graphs(m))
    site_names: list[str] = []
    for r in sites.iter_rows(named=True):
        label = f"{r['op']} -> {r['call']}" + (f" at {r['site']}" if r["site"] else "")
        label += f" ({r['count']} calls in {n} steps)"
        if label not in site_names:
            site_names.append(label)
    out.append(fx.remove_host_sync(m, site_names))
    out.append(fx.dataloader_workers(m))
    # pinned memory
    # pageable copies that bandwidth-limit the step (small DtoH copies are syncs, not this)
    mc = trace.memcpys
    # (no pageable copy in the trace, the usual case: no polars filter)
    page = (
        mc.filter(
            pl.col("step").is_in(steps)
            & (pl.col("device") == primary)
            & ((pl.col("src_memory") == "Pageable") | (pl.col("dst_memory") == "Pageable"))
            & ((pl.col("direction") == "HtoD") | (pl.col("bytes").fill_null(0) >= 2**20))
        ).rename({"duration_us": "device_time_us"})
        if ((mc["src_memory"] == "Pageable") | (mc["dst_memory"] == "Pageable")).any()
        else None
    )
    if page is not None and page.height:
        pinned = memcpy.filter(pl.col("host_memory") == "Pinned")
        # (copies of no measured duration give no bandwidth)
        if pinned.height and pinned["bytes"].sum() > 2**20 and pinned["device_time_us"].sum() > 0:
            gbs = float(pinned["bytes"].sum() / pinned["device_time_us"].sum() / 1e3)
            src = "pinned copies measured in this trace"
        else:
            major = (trace.device_entry or {}).get("computeMajor", 0)
            major = major if isinstance(major, int) else 0
            gbs, src = (
                (50.0, "assumed: PCIe Gen5 x16, Hopper and later")
                if (major or 0) >= 9
                else (25.0, "assumed: PCIe Gen4 x16")
            )
        out.append(
            fx.pinned_memory(
                m, float(page["device_time_us"].sum()) / n, float(page["bytes"].sum()) / n, gbs, src
            )
        )
    # torch.compile fusion
    chain_us, saved, removed, chains, host = _fusable_chains(
        trace, steps, primary, m.per_kernel_host_us
    )
    # host time inside the model that the compiled graph replaces: Python and no-GPU ops
    # (measured only when there is something to fuse: 1.4 ms at 10 MB, 50 ms at 1 GB)
    if fx.fusion_applies(chains / n, removed / n):
        python_us, no_gpu_us, no_gpu_events = compile_region_host(trace, steps)
        out.append(
            fx.torch_compile(
                m,
                chain_us / n,
                saved / n,
                removed / n,
                chains / n,
                None if host is None else host / n,
                python_us,
                no_gpu_us,
                no_gpu_events,
            )
        )
    # math-mode fixes need peaks and FLOP models
    if spec is not None and "family" in ops_tbl.columns:
        out += _math_findings(
            m, ops_tbl, spec, n, lambda: tuple(x / n for x in autocast_casts(trace, steps))
        )
    comm_us = _kind_time(kinds, "communication")
    if comm_us is not None and comm_by_step is not None:
        exposed = float(comm_by_step["exposed_comm_us"].sum())
        out.append(fx.overlap_communication(m, exposed / n, comm_us / n))
    from tracedx.analysis.batch import batch_model, step_memory

    bm = batch_model(trace, steps, primary, ops_tbl)
    out.append(fx.larger_batch(m, idle_fraction, bm.growth, step_memory(trace, steps, primary)))
    res = [f for f in out if f is not None]
    return fx.order_findings(res)


def _kind_time(kinds: pl.DataFrame, kind: str) -> float | None:
    """The device time of ``kind`` in :func:`~tracedx.analysis.kernels.gpu_breakdown`'s
    ``kinds`` (one row per kind), None without it (read in Python, not filtered in polars)."""
    for k, us in zip(kinds["kind"].to_list(), kinds["device_time_us"].to_list(), strict=True):
        if k == kind:
            return float(us)
    return None


def _peer_wait_note(trace: Trace, kinds: pl.DataFrame, n: int) -> str | None:
    """The note for one rank's trace of a multi-rank job (``distributedInfo.world_size`` > 1,
    or collectives over a group of more than one rank) that communicates."""
    comm_us = _kind_time(kinds, "communication")
    if comm_us is None and trace.comm_args.height == 0:
        return None  # nothing communicates (and Trace.collectives need not be built)
    colls = trace.collectives
    if comm_us is None and colls.height == 0:
        return None
    world = (trace.distributed_info or {}).get("world_size")
    multi = (isinstance(world, int) and world > 1) or bool(
        (colls["group_size"].fill_null(0) > 1).any()
    )
    if not multi:
        return None
    job = (
        f"one rank of a {world}-rank job"
        if isinstance(world, int) and world > 1
        else "one rank of a multi-rank job"
    )
    what = (
        f"its communication kernels ({comm_us / max(n, 1) / 1e3:.3f} ms per step)"
        if comm_us is not None
        else "its collectives"
    )
    return (
        f"this trace is {job}: {what} include waiting for the other ranks to arrive, which only "
        "their traces can split from the transfer itself (diagnose all the ranks' traces together)"
    )


# fp32 -> bf16 cast kernels: read 4 bytes and write 2 per element (and back, for a gradient)
CAST_BYTES_PER_ELEMENT = 6
_CAST_GEMM_WEIGHT = {"aten::linear": (1, 2), "aten::convolution": (1, 2)}
"""Module-level GEMM and convolution ops and their (weight, bias) operand indices."""


def autocast_casts(trace: Trace, steps: list[int]) -> tuple[float, float]:
    """The device bytes and the cast kernels per analysed window that bf16 autocast adds by
    casting fp32 weights: ``(bytes, kernels)``.

    Under ``torch.autocast``, every fp32 weight (and bias) a forward ``aten::linear`` or
    ``aten::convolution`` uses is cast to bf16 on each call (a cast kernel reading 4 and writing
    2 bytes per element; autocast's weight cache lives only inside one autocast region), and its
    bf16 gradient is cast back to fp32 into ``.grad`` in backward (2 read, 4 written): 12 bytes
    per weight element per forward call in a step that runs a backward, 6 in one that does not
    (inference: no gradient; a backward is an ``autograd::engine::evaluate_function`` op in the
    steps) (PyTorch, "Automatic Mixed Precision", CUDA op-specific behaviour: ops that autocast
    to lower precision cast their inputs). Activations are taken to be bf16 already (outputs of
    earlier autocast ops): only the weights' casts are counted. A weight used by several calls
    in one autocast region is cast once (autocast's cache), which the trace cannot tell apart
    (it records no tensor identity): counted per call. On ``mlp_large-bf16`` (3 x 8192^2
    weights, plus the batch's first input) the 7 cast kernels take 0.630 ms per step; this
    gives 2.42 GB, 0.50 ms at 4.8 TB/s.
    """
    # the GEMM ops' inputs, and whether any op of the steps is a backward node (one scan of
    # the names; only the GEMM ops' rows come to Python)
    in_steps = pl.lit(pl.Series(ops_in_steps(trace, steps)))
    names = trace.ops.select(
        cast=in_steps & pl.col("name").is_in(list(_CAST_GEMM_WEIGHT)),
        backward=(
            in_steps & pl.col("name").str.starts_with("autograd::engine::evaluate_function")
        ).any(),
    )
    has_backward = bool(names["backward"][0]) if names.height else False
    rows = trace.ops[["name", "input_shapes", "input_dtypes"]].filter(names["cast"]).rows()
    per_operand = 2 if has_backward else 1  # the forward cast, and the gradient's back
    total, kernels = 0.0, 0
    for name, shapes, dtypes in rows:
        for i in _CAST_GEMM_WEIGHT[name]:
            if not shapes or i >= len(shapes) or not shapes[i]:
                continue
            if not dtypes or i >= len(dtypes) or dtypes[i] != "float":
                continue
            total += per_operand * CAST_BYTES_PER_ELEMENT * float(np.prod(shapes[i]))
            kernels += per_operand
    return total, float(kernels)


_MATH_COLUMNS = (
    "name",
    "input_shapes",
    "count",
    "device_time_us",
    "math_mode",
    "flops",
    "bytes",
    "compute_dtype",
    "family",
)
"""The op table's columns :func:`_math_findings` reads."""


def _math_findings(
    m: fx.StepModel, ops_tbl: pl.DataFrame, spec, n: int, casts: Callable[[], tuple[float, float]]
) -> list[fx.Finding | None]:
    """The faster-math findings (TF32, bf16 autocast, fused attention) of the op groups
    ``ops_tbl``. ``casts()`` gives autocast's weight-cast bytes and cast kernels per
    step (:func:`autocast_casts`), asked for only when the bf16 finding has fp32 ops to move:
    it reads every GEMM op's shapes, 0.23 s of a 1 GB trace's diagnosis whose ops are bf16
    already."""
    out: list[fx.Finding | None] = []
    peaks = spec.peak_tflops
    bw = spec.bandwidth_gbs * 1e3  # bytes/us
    # the op groups as Python rows, once (a few hundred at most; each filter below is a
    # comprehension, not a polars call)
    missing = [c for c in _MATH_COLUMNS if c not in ops_tbl.columns]
    if missing:
        raise pl.exceptions.ColumnNotFoundError(f"the op table has no {missing}")
    rows = _table_rows(ops_tbl)
    mod = [r for r in rows if r["family"] is not None]
    # TF32: fp32 GEMMs that did not run on TF32 tensor cores
    if peaks.get("tf32") and peaks.get("fp32"):
        g = [
            r
            for r in mod
            if r["family"] == "gemm" and r["compute_dtype"] == "fp32" and r["math_mode"] is None
        ]
        if g:
            ratio = peaks["tf32"] / peaks["fp32"]
            t = np.array([r["device_time_us"] for r in g], dtype=float) / n
            by = np.array([r["bytes"] for r in g], dtype=float) / n
            new = [max(ti / ratio, bi / bw) for ti, bi in zip(t, by, strict=True)]
            ev = [
                f"{sum(r['count'] for r in g) / n:.0f} fp32 GEMMs per step ran on fp32 cores ({_ms(t.sum())} per step)",
                f"ceilings: fp32 {peaks['fp32']:.0f}, tf32 {peaks['tf32']:.0f} TFLOP/s ({spec.source})",
            ]
            out.append(
                fx.faster_math(
                    m,
                    "tf32",
                    "Allow TF32 for fp32 matmuls (torch.set_float32_matmul_precision('high'))",
                    float(t.sum()),
                    float(sum(new)),
                    f"each fp32 GEMM op group's time / {ratio:.1f}x (the tf32/fp32 roofline ceiling "
                    "ratio), but never under its bytes / memory bandwidth",
                    ev,
                )
            )
    # bf16 autocast: fp32 / tf32 GEMM, conv and attention
    if peaks.get("bf16"):
        g = [
            r
            for r in mod
            if r["family"] in ("gemm", "conv", "attention") and r["compute_dtype"] == "fp32"
        ]
        if g:
            t, new = 0.0, 0.0
            for r in g:
                cur = peaks.get("tf32") if r["math_mode"] == "tf32" else peaks.get("fp32")
                ti = r["device_time_us"] / n
                if not cur:
                    continue
                t += ti
                new += max(ti * cur / peaks["bf16"], (r["bytes"] or 0) / 2 / n / bw)
            cast, cast_kernels = casts()
            cast_us = cast / bw
            new += cast_us
            ev = [
                f"fp32 GEMM/conv/attention: {_ms(t)} per step; bf16 tensor-core roof {peaks['bf16']:.0f} TFLOP/s"
            ]
            if cast_us > 0:
                ev.append(
                    f"autocast adds weight casts: {cast_kernels:.0f} kernels, "
                    f"{cast / 1e9:.2f} GB per step ({_ms(cast_us)} at {spec.bandwidth_gbs:.0f} GB/s)"
                    + (
                        f", each launched at the step's {m.per_kernel_host_us:.1f} us of host "
                        "time per kernel"
                        if m.per_kernel_host_us
                        else ""
                    )
                )
            out.append(
                fx.faster_math(
                    m,
                    "bf16-autocast",
                    "Run matmuls and convolutions in bf16 (torch.autocast)",
                    t,
                    new,
                    "roofline ceiling ratio to the bf16 tensor-core peak; bytes halve; plus "
                    "autocast's casts of the fp32 weights (read 4 + write 2 bytes per element, "
                    "forward, and the gradient's cast back when the step runs a backward), at "
                    "device bandwidth, each cast a kernel launched from the host",
                    ev,
                    added_kernels=cast_kernels,
                )
            )
    # fused attention: softmax over square score matrices outside SDPA
    att = [r for r in mod if r["family"] == "attention"]
    sm = [
        r
        for r in rows
        if r["name"] is not None and "softmax" in r["name"] and "backward" not in r["name"]
    ]
    if not att and sm:
        # the first inputs of the softmaxes over square-ish score matrices (Tq, Tk >= 256)
        firsts = [(r["input_shapes"] or [None])[0] for r in sm]
        shapes = [
            x
            for x in firsts
            if x is not None and len(x) >= 3 and (x[-1] or 0) >= 256 and (x[-2] or 0) >= 256
        ]
        if shapes:
            tails = {tuple(s[-2:]) for s in shapes}

            # ops on the score matrix: an input ending in (Tq, Tk), or a matmul that produces
            # one ([.., Tq, d] @ [.., d, Tk], the Q K^T product)
            def touches(r):
                shp = r["input_shapes"] or []
                if any(len(x) >= 2 and tuple(x[-2:]) in tails for x in shp):
                    return True
                return (
                    r["family"] == "gemm"
                    and len(shp) >= 2
                    and len(shp[0]) >= 2
                    and len(shp[1]) >= 2
                    and (shp[0][-2], shp[1][-1]) in tails
                )

            chain = [r for r in rows if touches(r)]
            chain_us = sum(r["device_time_us"] for r in chain) / n
            # matmuls producing or consuming scores: FLOPs of the attention proper
            fl = sum((r["flops"] or 0) for r in chain if r["family"] == "gemm") / n
            dt = next((r["compute_dtype"] for r in chain if r["family"] == "gemm"), "bf16")
            peak = peaks.get(dt if dt in ("bf16", "fp16") else "bf16", peaks.get("bf16"))
            if fl > 0 and chain_us > 0:
                new = fl / (fx.FUSED_ATTENTION_EFFICIENCY * peak * 1e6)
                ev = [
                    f"softmax over score matrices {sorted(tails)[0]} materialized in memory; "
                    f"{len(chain)} op groups touch them ({_ms(chain_us)} per step)",
                    f"attention FLOPs {fl / 1e9:.1f} GFLOP per step",
                ]
                out.append(
                    fx.faster_math(
                        m,
                        "fused-attention",
                        "Use F.scaled_dot_product_attention (fused attention)",
                        chain_us,
                        new,
                        f"roofline: FLOPs at {fx.FUSED_ATTENTION_EFFICIENCY:.0%} of the {dt} peak "
                        "(FlashAttention-2 reaches 50-73%), no score matrix in memory",
                        ev,
                    )
                )
    return out
