"""Plotly figures of a Diagnosis: roofline, step timeline, where the time goes, fix estimates.

Each public function takes a :class:`~tracedx.analysis.diagnosis.Diagnosis` and returns a
``plotly.graph_objects.Figure`` (render it in Jupyter, or call ``.to_dict()``). The numbers come
from the Diagnosis and its Trace; this module only selects, groups for display and draws.

Units on every axis: time in milliseconds (ms), arithmetic intensity in FLOP/byte, achieved
rate in FLOP/s (SI tick labels: 1T = 1e12 FLOP/s; hovers give TFLOP/s). Strings from the trace are HTML-escaped before plotly sees them
(plotly renders a subset of HTML in text), so a kernel name is always shown literally.
"""

from __future__ import annotations

import html
import math
import numbers
import textwrap
from typing import Any

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from tracedx.analysis.kernels import KINDS, kind_expr
from tracedx.analysis.timeline import CAUSES, sync_calls
from tracedx.devices import PEAK_KEYS
from tracedx.report.text import estimate_label, short_name, speedup_label

__all__ = [
    "all_figures",
    "breakdown_figure",
    "fixes_figure",
    "roofline_figure",
    "timeline_figure",
]

# One palette for every figure (and the Perfetto annotations). Kernel kinds are solid fills
# on a lightness ladder (CIE L* 22..94, at least 5 apart), so a greyscale print still orders
# them; idle causes are hatched, each with its own pattern, so in greyscale a cause is told by
# its hatch; host rows of the timeline have their own hues. Every pair of the 20 colours is at
# least 15 apart in CIELAB (Delta E 1976, tests/test_html.py checks all of this).
KIND_COLORS = {
    "communication": "#063d1d",  # L* 22
    "gemm": "#00498d",  # L* 31
    "convolution": "#00656e",  # L* 39
    "attention": "#7d55af",  # L* 44
    "elementwise": "#cc532c",  # L* 51
    "reduction": "#579b43",  # L* 58
    "memcpy": "#c0966c",  # L* 65
    "normalization": "#f392c7",  # L* 72
    "copy": "#d8c36f",  # L* 79
    "other": "#d4d4d4",  # L* 85
    "memset": "#c5f6ff",  # L* 94
}
CAUSE_COLORS = {
    "kernel wait": "#78daeb",  # L* 82
    "host sync": "#bf1d4b",  # L* 42
    "dataloader": "#7e8bdb",  # L* 60
    "kernel launch": "#f0e35f",  # L* 89
    "host work": "#79512e",  # L* 38
    "python": "#8bb955",  # L* 70
}
CAUSE_PATTERNS = {
    "kernel wait": ".",
    "host sync": "x",
    "dataloader": "\\",
    "kernel launch": "/",
    "host work": "-",
    "python": "|",
}
"""Plotly bar pattern shapes, one per idle cause (the cause's hatch in every figure)."""
HOST_COLORS = {
    "host op": "#6d96b1",  # L* 60
    "launch / runtime call": "#9cbdb7",  # L* 74
    "blocking sync": "#73205b",  # L* 28
}
ROOF_DASHES = ("solid", "dot", "dash", "dashdot", "longdash", "longdashdot")
"""Compute roofs are dark grey lines told apart by dash (highest peak solid) and their label."""
HOVER_NAME_CHARS = 600
"""Longest name shown in a hover label (characters); longer names end with an ellipsis."""
MAX_BARS_PER_ROW = 5000
# Host threads (and GPU streams) drawn in the step timeline: the busiest ones.
MAX_THREAD_ROWS = 32
"""Timeline rows keep at most this many events (the longest ones) to keep the page light."""
TERA = 1e12
"""FLOP/s per TFLOP/s (the roofline's y axis is in FLOP/s)."""
LABELLED_OPS = 8
"""At most this many ops (the largest by device time) carry a label on the roofline; a label
that would touch another is left off (every op keeps its hover)."""
FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}


# ---------------------------------------------------------------------------------------------
# small presentation helpers
# ---------------------------------------------------------------------------------------------


def esc(s: Any) -> str:
    """Escape ``&``, ``<``, ``>`` for plotly text, which renders a subset of HTML tags and
    decodes ``&lt;``/``&gt;``/``&amp;`` (not ``&quot;``: quotes stay as they are, harmless
    outside tags)."""
    return html.escape("" if s is None else str(s), quote=False)


def hover_name(name: Any, width: int = 100) -> str:
    """The full name for a hover label: escaped, wrapped at spaces to ``width`` characters."""
    s = "" if name is None else str(name)
    if len(s) > HOVER_NAME_CHARS:
        s = s[: HOVER_NAME_CHARS - 1] + "…"
    lines = textwrap.wrap(s, width, break_on_hyphens=False, drop_whitespace=False) or [""]
    return "<br>".join(esc(x) for x in lines)


def fmt_shapes(shapes: Any) -> str:
    """``[[8, 16], []]`` -> ``"[8, 16], []"`` (input shapes as the profiler recorded them)."""
    if shapes is None:
        return ""
    try:
        return ", ".join("[" + ", ".join(str(d) for d in (s or [])) + "]" for s in shapes)
    except TypeError:
        return str(shapes)


def num(x: Any, fmt: str = ".3g", missing: str = "n/a") -> str:
    """Format a number; None and non-finite values become ``missing``."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return missing
    return format(x, fmt)


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"},
        height=height,
        font=FONT,
        template="plotly_white",
        margin={"l": 70, "r": 30, "t": 60, "b": 40},
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0},
        hoverlabel={"align": "left"},
    )
    return fig


def _empty(title: str, message: str, height: int = 300) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=esc(message), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, title, height)


def _primary_windows(diag) -> pl.DataFrame:
    w = diag.windows
    if diag.primary_device is not None:
        return w.filter(pl.col("device") == diag.primary_device)
    return w.filter(pl.col("device").is_null())


def representative_step(diag) -> int | None:
    """The analysed step whose step time is closest to the median (the step the timeline shows)."""
    w = _primary_windows(diag).drop_nulls("step_time_us")
    if w.height == 0:
        return diag.steps[0] if diag.steps else None
    med = float(w["step_time_us"].median())
    return int(w.with_columns(d=(pl.col("step_time_us") - med).abs()).sort("d", "step")["step"][0])


# ---------------------------------------------------------------------------------------------
# roofline
# ---------------------------------------------------------------------------------------------


def roof_groups(spec) -> list[tuple[list[str], float, float]]:
    """The device's compute roofs as ``(dtypes, ridge FLOP/byte, peak TFLOP/s)``, highest peak
    first; dtypes whose peaks agree within 0.5% (bf16 and fp16 on most parts) share one roof,
    drawn and labelled once (``bf16 = fp16``)."""
    if spec is None or not spec.bandwidth_gbs:
        return []
    groups: list[tuple[list[str], float, float]] = []
    for k in PEAK_KEYS:
        ridge = spec.ridge_point(k) if k in spec.peak_tflops else None
        if not ridge:
            continue
        peak = spec.peak_tflops[k]
        for g in groups:
            if abs(g[2] - peak) <= 0.005 * max(g[2], peak):
                g[0].append(k)
                break
        else:
            groups.append(([k], ridge, peak))
    return sorted(groups, key=lambda g: -g[2])


def roofline_figure(diag) -> go.Figure:
    """Log-log roofline: compute roofs per dtype (one roof for dtypes with the same peak) and
    the bandwidth roof of the device, the ridge points, and each modelled op group at
    (intensity FLOP/byte, achieved FLOP/s), sized by its device time and coloured by its kernel
    kind. The largest ops (at most :data:`LABELLED_OPS`) carry a label where one fits without
    touching another (:func:`place_labels`); every op has its hover. Without a device spec the
    roofs are not drawn. Axes: FLOP/byte (x) and FLOP/s (y), both log."""
    title = "Roofline: each modelled op against the device's ceilings"
    t = diag.op_table
    spec = diag.device
    need = {"intensity", "achieved_tflops"}
    pts = (
        t.filter(
            pl.col("intensity").is_not_null()
            & (pl.col("intensity") > 0)
            & pl.col("achieved_tflops").is_not_null()
            & (pl.col("achieved_tflops") > 0)
        )
        if need <= set(t.columns)
        else t.head(0)
    )
    if pts.height == 0 and spec is None:
        return _empty(title, "no op has a FLOP/byte model and no device spec is known", 300)
    fig = go.Figure()
    xs = pts["intensity"].to_list() if pts.height else []
    ys = pts["achieved_tflops"].to_list() if pts.height else []
    roofs = roof_groups(spec)
    x_lo = min([*xs, *(r for _, r, _ in roofs), 1.0]) / 4
    x_hi = max([*xs, *(r for _, r, _ in roofs), 10.0]) * 8
    y_all = [*ys, *(p for _, _, p in roofs)]
    y_lo = min([*y_all, 1.0]) / 4 * TERA
    y_hi = max([*y_all, 1.0]) * 3 * TERA
    axes = (_lg(x_lo, x_hi), _lg(y_lo, y_hi))
    taken: list[Box] = []
    if roofs:
        bw = spec.bandwidth_gbs
        top_ridge = max(r for _, r, _ in roofs)
        fig.add_trace(
            go.Scatter(
                x=[x_lo, top_ridge],
                y=[x_lo * bw * 1e9, top_ridge * bw * 1e9],
                mode="lines",
                line={"color": "#222", "width": 2},
                name=f"memory {bw:,.0f} GB/s",
                hovertemplate=f"bandwidth roof: {bw:,.0f} GB/s<extra></extra>",
            )
        )
        for i, (keys, ridge, peak) in enumerate(roofs):
            label = " = ".join(keys)
            dash = ROOF_DASHES[i % len(ROOF_DASHES)]
            fig.add_trace(
                go.Scatter(
                    x=[ridge, x_hi],
                    y=[peak * TERA, peak * TERA],
                    mode="lines",
                    line={"color": "#555", "width": 2, "dash": dash},
                    name=f"{label} {peak:,.0f} TFLOP/s",
                    hovertemplate=f"{label} roof: {peak:,.1f} TFLOP/s<extra></extra>",
                )
            )
            fig.add_trace(
                go.Scatter(
                    x=[ridge],
                    y=[peak * TERA],
                    mode="markers",
                    marker={"symbol": "diamond", "size": 9, "color": "#555"},
                    showlegend=False,
                    hovertemplate=f"ridge point {label}: {ridge:,.1f} FLOP/byte<extra></extra>",
                )
            )
        keys, ridge, peak = next((g for g in roofs if "bf16" in g[0]), roofs[0])
        text = f"ridge {' = '.join(keys)}: {ridge:,.0f} FLOP/B"
        fig.add_annotation(
            x=math.log10(ridge),
            y=math.log10(peak * TERA),
            text=text,
            showarrow=True,
            arrowhead=2,
            ax=40,
            ay=40,
            font={"size": 10},
        )
        taken.append(_label_box((ridge, peak * TERA), (40, 40), text, axes))
        fig.add_annotation(
            text=esc(f"{spec.name}; {spec.source}")[:160],
            x=0,
            y=1.0,
            xref="paper",
            yref="paper",
            xanchor="left",
            yanchor="bottom",
            showarrow=False,
            font={"size": 10, "color": "#666"},
        )
    else:
        fig.add_annotation(
            text="no device spec known: roofs not drawn "
            "(pass --device, or --peak-tflops and --bandwidth-gbs)",
            x=0.5,
            y=1.0,
            xref="paper",
            yref="paper",
            yanchor="bottom",
            showarrow=False,
            font={"color": "#b00"},
        )
    if pts.height:
        _roofline_points(fig, pts, axes, taken)
    else:
        fig.add_annotation(
            text="no op has a FLOP/byte model",
            x=0.5,
            y=0.5,
            xref="paper",
            yref="paper",
            showarrow=False,
        )
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP/byte)", range=axes[0], dtick=1)
    vals, ticks = _si_decades(y_lo, y_hi)
    fig.update_yaxes(
        type="log", title="achieved FLOP/s", range=axes[1], tickvals=vals, ticktext=ticks
    )
    return _layout(fig, title, ROOFLINE_HEIGHT)


def _lg(lo: float, hi: float) -> list[float]:
    return [math.log10(lo), math.log10(hi)]


def _si_decades(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Tick values at each power of ten in [lo, hi] with SI labels (1M, 10G, 100T, 1P)."""
    vals, text = [], []
    for p in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        prefix = "kMGTPE"[p // 3 - 1] if 3 <= p < 21 else ""
        vals.append(10.0**p)
        text.append(f"{10 ** (p % 3)}{prefix}" if prefix else f"{10.0**p:g}")
    return vals, text


# --- roofline labels that do not collide ----------------------------------------------------

ROOFLINE_HEIGHT = 520
PLOT_WIDTHS_PX = (640, 1300)
"""The plot-area widths (px) labels are placed for: a label clears every other at any width
in this range (the report's figure is responsive; 1,400 px windows give about 1,130)."""
PLOT_HEIGHT_PX = 360
"""The plot area's height (px) in a :data:`ROOFLINE_HEIGHT` figure (title, axes and legend off)."""
LABEL_CHAR_PX = 6.2
LABEL_HEIGHT_PX = 15
"""Estimated size of a 10 px label: width per character and height (system-ui font)."""

Box = tuple[float, float, float, float, float, float]
"""A label's box on the plot, in px: (x0 and x1 at the narrowest plot, x0 and x1 at the widest,
y0, y1); the plot's height is fixed, so y does not depend on the width."""


def _px(point: tuple[float, float], axes, width: float) -> tuple[float, float]:
    (x0, x1), (y0, y1) = axes
    px = (math.log10(point[0]) - x0) / (x1 - x0) * width
    py = (1 - (math.log10(point[1]) - y0) / (y1 - y0)) * PLOT_HEIGHT_PX
    return px, py


def _label_box(point, offset: tuple[float, float], text: str, axes) -> Box:
    w = LABEL_CHAR_PX * len(text) + 4
    xs = []
    for width in PLOT_WIDTHS_PX:
        px, py = _px(point, axes, width)
        cx = px + offset[0]
        xs += [cx - w / 2, cx + w / 2]
    cy = py + offset[1]
    return (*xs, cy - LABEL_HEIGHT_PX / 2, cy + LABEL_HEIGHT_PX / 2)


def _marker_box(point, r: float, axes) -> Box:
    """The square around a marker of radius ``r`` px, as a :data:`Box`."""
    xs = []
    for width in PLOT_WIDTHS_PX:
        px, py = _px(point, axes, width)
        xs += [px - r, px + r]
    return (*xs, py - r, py + r)


def _clear(a: Box, b: Box) -> bool:
    """Whether two boxes are apart at every plot width in :data:`PLOT_WIDTHS_PX`: apart in y, or
    apart in x on the same side at the narrowest and the widest (x moves linearly with the width,
    so the gap holds in between)."""
    if a[5] <= b[4] or b[5] <= a[4]:
        return True
    left = a[1] <= b[0] and a[3] <= b[2]
    right = b[1] <= a[0] and b[3] <= a[2]
    return left or right


def _inside(b: Box) -> bool:
    return (
        b[0] >= 0 and b[2] >= 0 and b[1] <= PLOT_WIDTHS_PX[0] and b[3] <= PLOT_WIDTHS_PX[1]
        and b[4] >= 0 and b[5] <= PLOT_HEIGHT_PX
    )  # fmt: skip


def place_labels(
    points: list[tuple[tuple[float, float], float, str]], axes, taken: list[Box] | None = None
) -> list[tuple[float, float] | None]:
    """Greedy label placement for roofline points, in the order given (largest op first).

    ``points``: ((x, y) in data units, marker radius px, label text); ``axes``: the log10 axis
    ranges. Each label tries eight positions around its marker, then the same farther out,
    and takes the first that lies inside the plot and clears every label placed before it and
    every box in ``taken`` (other labels, markers: :func:`_clear`); a label with no such
    position is left off (the point keeps its hover). Returns per point the label's (dx, dy) offset in px, or None."""
    taken = list(taken or [])
    out: list[tuple[float, float] | None] = []
    for point, r, text in points:
        w = LABEL_CHAR_PX * len(text) + 4
        chosen = None
        for far in (1.0, 2.2):
            dx, dy = (r + w / 2 + 4) * far, (r + LABEL_HEIGHT_PX / 2 + 3) * far
            for off in ((0, -dy), (0, dy), (dx, 0), (-dx, 0),
                        (dx, -dy), (-dx, -dy), (dx, dy), (-dx, dy)):  # fmt: skip
                box = _label_box(point, off, text, axes)
                if _inside(box) and all(_clear(box, t) for t in taken):
                    chosen = off
                    taken.append(box)
                    break
            if chosen:
                break
        out.append(chosen)
    return out


def _marker_px(device_us: float, t_max: float) -> float:
    """A roofline marker's diameter (px): 6 to 40, its area growing with the op's device time."""
    return 6 + 34 * math.sqrt(max(device_us, 0) / t_max)


def _roofline_points(fig: go.Figure, pts: pl.DataFrame, axes, taken: list[Box]) -> None:
    cols = [pl.col(c) for c in ("kernel_kind", "family") if c in pts.columns]
    pts = pts.with_columns(_kind=pl.coalesce([*cols, pl.lit("other")]))
    t_max = float(pts["device_time_us"].max() or 1.0) or 1.0
    present = set(pts["_kind"].to_list())
    for k in [k for k in KINDS if k in present] + sorted(present - set(KINDS)):
        rows = pts.filter(pl.col("_kind") == k).to_dicts()
        fig.add_trace(
            go.Scatter(
                x=[r["intensity"] for r in rows],
                y=[r["achieved_tflops"] * TERA for r in rows],
                mode="markers",
                name=esc(k),
                marker={
                    "size": [_marker_px(r["device_time_us"], t_max) for r in rows],
                    "color": KIND_COLORS.get(k, KIND_COLORS["other"]),
                    "opacity": 0.8,
                    "line": {"width": 1, "color": "#222"},
                },
                hovertext=[_op_hover(r) for r in rows],
                hoverinfo="text",
            )
        )
    # one label per op name (its largest group: same-named groups differ only by shapes, which
    # their hovers give), for the LABELLED_OPS largest names
    top = (
        pts.sort("device_time_us", descending=True)
        .unique("name", keep="first", maintain_order=True)
        .head(LABELLED_OPS)
        .to_dicts()
    )
    texts = [short_name(r["name"], 28) for r in top]
    # labels keep off every marker too (the 200 largest: the rest are small)
    markers = [
        _marker_box(
            (r["intensity"], r["achieved_tflops"] * TERA),
            _marker_px(r["device_time_us"], t_max) / 2,
            axes,
        )
        for r in pts.sort("device_time_us", descending=True).head(200).iter_rows(named=True)
    ]
    offsets = place_labels(
        [
            (
                (r["intensity"], r["achieved_tflops"] * TERA),
                _marker_px(r["device_time_us"], t_max) / 2,
                s,
            )
            for r, s in zip(top, texts, strict=True)
        ],
        axes,
        taken + markers,
    )
    for r, s, off in zip(top, texts, offsets, strict=True):
        if off is None:
            continue
        fig.add_annotation(
            x=math.log10(r["intensity"]),
            y=math.log10(r["achieved_tflops"] * TERA),
            text=esc(s),
            ax=off[0],
            ay=off[1],
            showarrow=True,
            arrowwidth=1,
            arrowcolor="#888",
            arrowhead=0,
            standoff=_marker_px(r["device_time_us"], t_max) / 2,
            font={"size": 10, "color": "#222"},
            bgcolor="rgba(255,255,255,0.7)",
            name="op label",
        )


def _op_hover(r: dict) -> str:
    return "<br>".join(
        [
            f"<b>{hover_name(r['name'])}</b>",
            f"shapes: {esc(fmt_shapes(r.get('input_shapes')))[:300]}",
            f"dtypes: {esc(', '.join(str(x) for x in (r.get('input_dtypes') or [])))[:200]}",
            f"calls: {r.get('count')}, device time {num(r['device_time_us'] / 1e3, '.3f')} ms",
            f"intensity {num(r.get('intensity'))} FLOP/B, {num(r.get('achieved_tflops'))} TFLOP/s",
            f"of its roofline bound: {num(r.get('bound_fraction'), '.0%')}"
            f" (regime: {esc(r.get('regime') or 'n/a')})",
        ]
    )


# ---------------------------------------------------------------------------------------------
# step timeline
# ---------------------------------------------------------------------------------------------


def timeline_figure(diag, step: int | None = None) -> go.Figure:
    """One step on one time axis (ms from the step start): per host thread its top-level ops,
    launch calls and blocking syncs; per GPU stream its kernels (coloured by kind), copies and
    memsets; and the GPU's idle gaps, coloured by cause and the largest shaded across all rows.

    ``step`` defaults to the step whose step time is closest to the median. Raises ValueError
    for a step that was not analysed (the message lists those that were), TypeError for a
    ``step`` that is not an integer (an int or a numpy integer)."""
    tr = diag.trace
    if step is None:
        step = representative_step(diag)
        if step is None:
            return _empty("Step timeline", "no step to draw")
    elif isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"step: a step number (int), not {type(step).__name__} {step!r}")
    else:
        step = int(step)  # a numpy integer: the title and the filter as for an int
    title = f"Step timeline: step {step}" + (" (whole trace)" if tr.steps_synthetic else "")
    w = _primary_windows(diag).filter(pl.col("step") == step)
    if w.height == 0:
        done = sorted(diag.steps)
        if not done:
            has = "no steps"
        elif done == list(range(done[0], done[-1] + 1)):
            has = f"steps {done[0]}..{done[-1]}"
        else:  # steps=[4, 6]: 4..6 would name step 5 too
            has = "steps " + ", ".join(map(str, done[:8])) + (", ..." if len(done) > 8 else "")
        raise ValueError(f"step {step} was not analysed: the diagnosis has {has}")
    win = w.row(0, named=True)
    starts = [v for v in (win["cpu_start_us"], win["gpu_start_us"]) if v is not None]
    ends = [v for v in (win["cpu_end_us"], win["gpu_end_us"]) if v is not None]
    t0, t1 = min(starts), max(ends)

    def rel(df: pl.DataFrame) -> pl.DataFrame:
        return df.with_columns(
            s_ms=(pl.col("start_us") - t0) / 1e3, d_ms=pl.col("duration_us") / 1e3
        )

    fig = go.Figure()
    rows: list[str] = []
    ops = tr.ops.filter((pl.col("step") == step) & pl.col("parent_id").is_null())
    la = tr.launches.filter(pl.col("step") == step)
    sy = sync_calls(tr).filter(pl.col("step") == step)
    # Each table is split by thread once (linear), and only the MAX_THREAD_ROWS threads with
    # the most host time are drawn: a trace of 50,000 host threads cannot be 150,000 rows.
    parts = {
        label: df.partition_by("tid", as_dict=True) if df.height else {}
        for label, df in (
            ("ops", ops),
            ("launches", la.filter(pl.col("api_kind") != "sync")),
            ("syncs", sy),
        )
    }
    busy: dict = {}
    for df in (ops, la):
        if df.height:
            for tid, us in df.group_by("tid").agg(pl.col("duration_us").sum()).rows():
                busy[tid] = busy.get(tid, 0.0) + (us or 0.0)
    tids = sorted(busy, key=lambda t: (-busy[t], str(t)))
    hidden = len(tids) - MAX_THREAD_ROWS
    tids = sorted(tids[:MAX_THREAD_ROWS], key=str)
    for tid in tids:
        for label, legend in (
            ("ops", "host op"),
            ("launches", "launch / runtime call"),
            ("syncs", "blocking sync"),
        ):
            df = parts[label].get((tid,))
            if df is not None and df.height:
                row = f"CPU {tid} {label}"
                rows.append(row)
                _bars(fig, rel(df), row, legend, HOST_COLORS[legend])
    if hidden > 0:
        title += f" ({MAX_THREAD_ROWS} busiest host threads of {hidden + MAX_THREAD_ROWS} drawn)"
    gpu = tr.gpu_activity().filter(pl.col("step") == step)
    if diag.primary_device is not None:
        gpu = gpu.filter(pl.col("device") == diag.primary_device)
    gpu = gpu.with_columns(
        _kind=pl.when(pl.col("kind") == "kernel").then(kind_expr("name")).otherwise("kind")
    )
    by_stream = gpu.filter(pl.col("stream").is_not_null()).partition_by("stream", as_dict=True)
    for (stream,) in sorted(by_stream)[:MAX_THREAD_ROWS]:
        row = f"GPU {diag.primary_device} stream {stream}"
        rows.append(row)
        g = rel(by_stream[(stream,)])
        for (k,), gk in sorted(g.partition_by("_kind", as_dict=True).items()):
            _bars(fig, gk, row, k, _kind_color(k))
    gaps = diag.gaps.filter(pl.col("step") == step)
    if diag.primary_device is not None:
        gaps = gaps.filter(pl.col("device") == diag.primary_device)
    if gaps.height:
        row = "GPU idle"
        rows.append(row)
        g = rel(gaps).with_columns(name=pl.col("cause"))
        for c in [c for c in CAUSES if c in set(g["cause"].to_list())]:
            _bars(
                fig, g.filter(pl.col("cause") == c), row, f"idle: {c}", CAUSE_COLORS[c],
                CAUSE_PATTERNS[c],
            )  # fmt: skip
        _shade_gaps(fig, g, t1 - t0)
    for x, label, where in (
        (win["cpu_end_us"], "CPU window end", "top left"),
        (win["gpu_end_us"], "GPU window end", "bottom left"),
    ):
        if x is not None:
            fig.add_vline(
                x=(x - t0) / 1e3,
                line={"dash": "dash", "color": "#999", "width": 1},
                annotation_text=label,
                annotation_position=where,
                annotation_font_size=10,
            )
    fig.update_layout(barmode="overlay", bargap=0.25)
    fig.update_yaxes(categoryorder="array", categoryarray=rows[::-1], title=None)
    fig.update_xaxes(
        title=f"time from the step start (ms); step {win['step_time_us'] / 1e3:.3f} ms"
    )
    return _layout(fig, title, max(320, 90 + 34 * len(rows)))


def _hatch(shape: str) -> dict:
    """A plotly bar pattern: ``shape`` drawn in near-black over the bar's colour, so the hatch
    reads on light and dark fills alike."""
    if not shape:
        return {"shape": ""}
    return {"shape": shape, "fgcolor": "#111", "fgopacity": 0.55, "size": 7, "solidity": 0.3}


def _kind_color(kind: str) -> str:
    return KIND_COLORS.get(kind, KIND_COLORS["other"])


def kind_bar(x: list, y: list, kind: str, hover: str, name: str | None = None) -> go.Bar:
    """One stacked bar trace of device time of a kernel ``kind`` (or memcpy, memset), in its
    palette colour; ``name`` (the legend's, default ``kind``) and ``hover`` as drawn."""
    return go.Bar(
        x=x, y=y, name=kind if name is None else name, marker_color=_kind_color(kind),
        hovertemplate=hover,
    )  # fmt: skip


def idle_bar(x: list, y: list, cause: str, hover: str) -> go.Bar:
    """One stacked bar trace of GPU idle time of a ``cause``: its colour, hatched with its
    pattern (the causes read apart in greyscale too), named ``idle: cause``."""
    return go.Bar(
        x=x, y=y, name=f"idle: {cause}", hovertemplate=hover,
        marker={"color": CAUSE_COLORS[cause], "pattern": _hatch(CAUSE_PATTERNS[cause])},
    )  # fmt: skip


def step_marker(x: list, y: list, name: str, hover: str, size: int, symbol: str = "line-ew"):
    """A black horizontal line over each stacked bar at ``y`` (a step time, ms)."""
    return go.Scatter(
        x=x, y=y, mode="markers", name=name, hovertemplate=hover,
        marker={"symbol": symbol, "size": size, "line": {"width": 3, "color": "#000"}},
    )  # fmt: skip


def _bars(
    fig: go.Figure, df: pl.DataFrame, row: str, legend: str, color: str, pattern: str = ""
) -> None:
    """Horizontal bars (base = start ms, length = duration ms) for one row and one legend item;
    ``pattern`` a plotly hatch shape (idle causes)."""
    if df.height == 0:
        return
    if df.height > MAX_BARS_PER_ROW:
        df = df.sort("duration_us", descending=True).head(MAX_BARS_PER_ROW)
    names = df["name"].to_list()
    s = df["s_ms"].to_list()
    d = df["d_ms"].to_list()
    shown = legend not in {tr.name for tr in fig.data}  # rows are capped: a few hundred traces
    fig.add_trace(
        go.Bar(
            orientation="h",
            y=[row] * df.height,
            x=d,
            base=s,
            name=esc(legend),
            legendgroup=esc(legend),
            showlegend=shown,
            marker={"color": color, "line": {"width": 0}, "pattern": _hatch(pattern)},
            hovertext=[
                f"{hover_name(n)}<br>start {a:.3f} ms, {b * 1e3:.1f} us"
                for n, a, b in zip(names, s, d, strict=True)
            ],
            hoverinfo="text",
        )
    )


def _shade_gaps(
    fig: go.Figure, g: pl.DataFrame, span_us: float, most: int = 12, labelled: int = 4
) -> None:
    """Shade the largest idle gaps (>= 1% of the step) across all rows; the ``labelled``
    largest of those (>= 5% of the step) carry their cause as a label."""
    big = g.filter(pl.col("duration_us") >= 0.01 * span_us).sort("duration_us", descending=True)
    for i, r in enumerate(big.head(most).iter_rows(named=True)):
        label = (
            {
                "annotation_text": f"idle: {esc(r['cause'])}",
                "annotation_position": "inside top left",
                "annotation_font_size": 10,
            }
            if i < labelled and r["duration_us"] >= 0.05 * span_us
            else {}
        )
        fig.add_vrect(
            x0=r["s_ms"],
            x1=r["s_ms"] + r["d_ms"],
            fillcolor=CAUSE_COLORS.get(r["cause"], "#ccc"),
            opacity=0.18,
            line_width=0,
            layer="below",
            **label,
        )


# ---------------------------------------------------------------------------------------------
# where the time goes
# ---------------------------------------------------------------------------------------------


def breakdown_figure(diag) -> go.Figure:
    """Per step (primary GPU): device time by kernel kind, memcpy and memset, then idle time by
    cause, stacked (ms), with the step time and GPU busy time as markers; below, kernels per
    step. Kernels on concurrent streams overlap, so their device time can add up to more than
    the busy time (a union)."""
    title = "Where the time goes, per step"
    w = _primary_windows(diag).sort("step")
    if w.height == 0 or diag.primary_device is None:
        return _empty(title, "no GPU activity: nothing to split")
    labels = [str(s) for s in w["step"].to_list()]
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        row_heights=[0.72, 0.28],
        vertical_spacing=0.06,
    )
    gpu = (
        diag.trace.gpu_activity()
        .filter(pl.col("step").is_in(diag.steps) & (pl.col("device") == diag.primary_device))
        .with_columns(
            part=pl.when(pl.col("kind") == "kernel").then(kind_expr("name")).otherwise("kind")
        )
        .group_by("step", "part")
        .agg(ms=pl.col("duration_us").sum() / 1e3)
    )
    parts = [p for p in (*KINDS, "memcpy", "memset") if p in set(gpu["part"].to_list())]
    for p in parts:
        d = dict(gpu.filter(pl.col("part") == p).select("step", "ms").rows())
        ys = [d.get(s, 0.0) for s in w["step"].to_list()]
        hover = f"step %{{x}}<br>{p}: %{{y:.3f}} ms<extra></extra>"
        fig.add_trace(kind_bar(labels, ys, p, hover), row=1, col=1)
    ic = diag.idle_causes.filter(pl.col("device") == diag.primary_device)
    for c in [c for c in CAUSES if c in set(ic["cause"].to_list())]:
        d = dict(ic.filter(pl.col("cause") == c).select("step", "idle_us").rows())
        ys = [d.get(s, 0.0) / 1e3 for s in w["step"].to_list()]
        hover = f"step %{{x}}<br>idle, {c}: %{{y:.3f}} ms<extra></extra>"
        fig.add_trace(idle_bar(labels, ys, c, hover), row=1, col=1)
    for col, name, sym in (
        ("step_time_us", "step time", "line-ew"),
        ("gpu_busy_us", "GPU busy", "line-ew-open"),
    ):
        ys = [None if v is None else v / 1e3 for v in w[col].to_list()]
        hover = f"step %{{x}}<br>{name}: %{{y:.3f}} ms<extra></extra>"
        fig.add_trace(step_marker(labels, ys, name, hover, 28, sym), row=1, col=1)
    fig.add_trace(
        go.Bar(
            x=labels,
            y=w["kernels"].to_list(),
            name="kernels",
            marker_color=HOST_COLORS["host op"],
            showlegend=False,
            hovertemplate="step %{x}<br>%{y} kernels<extra></extra>",
        ),
        row=2,
        col=1,
    )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="ms per step", row=1, col=1)
    fig.update_yaxes(title="kernels", row=2, col=1)
    fig.update_xaxes(type="category", title="step", row=2, col=1)
    return _layout(fig, title, 560)


# ---------------------------------------------------------------------------------------------
# fix estimates
# ---------------------------------------------------------------------------------------------


def fixes_figure(diag) -> go.Figure:
    """One pair of bars per finding: the step the estimates are against (the unprofiled median
    when the trace carries one, else the traced median) and the Amdahl estimate of the step
    time after the fix (ms), best fix on top; fixes worth less than 5% are drawn pale. For
    larger-batch the bar is the time per today's batch of samples (its step holds more)."""
    title = "What each fix is worth (Amdahl estimate of the step time, ms)"
    found = diag.findings
    if not found or diag.model is None:
        return _empty(title, "no findings: nothing to estimate", 220)
    found = sorted(found, key=lambda f: -f.estimated_speedup)
    cur = diag.model.reference_step_us / 1e3
    which = "unprofiled" if diag.model.unprofiled_step_us else "traced"
    ids = [esc(f.fix) for f in found]
    hover = [
        "<br>".join(
            [
                f"<b>{esc(f.title)}</b>",
                f"f = {f.fraction:.0%} of the step, s = "
                + ("∞" if math.isinf(f.local_speedup) else f"{f.local_speedup:.2f}x"),
                f"1/((1-f)+f/s) = {speedup_label(f.to_dict())} -> {estimate_label(f.to_dict())}",
                hover_name(f.derivation, 90),
            ]
        )
        for f in found
    ]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            y=ids,
            x=[cur] * len(found),
            orientation="h",
            name="current step",
            marker_color="#bbbbbb",
            hovertemplate=f"current step, median {which} %{{x:.3f}} ms<extra></extra>",
        )
    )
    fig.add_trace(
        go.Bar(
            y=ids,
            x=[f.estimated_step_ms for f in found],
            orientation="h",
            name="estimated after the fix",
            marker={
                "color": ["#2ca02c" if f.recommended else "#c7e9c0" for f in found],
            },
            text=[f"{f.estimated_speedup:.2f}x" for f in found],
            textposition="outside",
            hovertext=hover,
            hoverinfo="text",
        )
    )
    fig.update_layout(barmode="group")
    fig.update_yaxes(autorange="reversed")
    unit = "step time (ms)"
    if any(f.batch_factor for f in found):
        unit += "; larger-batch: ms per today's batch of samples"
    fig.update_xaxes(title=unit, range=[0, cur * 1.15])
    return _layout(fig, title, max(260, 120 + 56 * len(found)))


def all_figures(diag, step: int | None = None) -> dict[str, go.Figure]:
    """``{"roofline", "timeline", "breakdown", "fixes"}`` -> Figure, in report order; the
    timeline of ``step`` (:func:`timeline_figure`)."""
    return {
        "roofline": roofline_figure(diag),
        "timeline": timeline_figure(diag, step),
        "breakdown": breakdown_figure(diag),
        "fixes": fixes_figure(diag),
    }
