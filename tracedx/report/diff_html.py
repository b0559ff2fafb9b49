"""The HTML report of a :class:`tracedx.analysis.diff.TraceDiff` (``tracedx diff --html``).

One self-contained page, like the diagnosis report (:func:`tracedx.report.html.page`): first
the prediction check (the applied fix, BEFORE's Amdahl estimate against the achieved speedup,
traced and unprofiled, with a figure of the step times), then BEFORE and AFTER side by side
(their verdict cards, a figure of where each one's step goes, the metrics table), then device
time by kind and the ops and kernels that changed, and notes. Every number comes from
:func:`tracedx.report.diff_report.diff_dict` or the two Diagnoses; nothing is computed here
beyond per-step means for display.
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
import polars as pl

from tracedx.analysis.timeline import CAUSES
from tracedx.report.diff_report import (
    TOP,
    _estimate,
    _ratio,
    _step_line,
    _weak,
    _x,
    diff_dict,
    graph_note,
    kind_counts,
    metric_cells,
)
from tracedx.report.figures import _layout, esc, idle_bar, kind_bar, step_marker
from tracedx.report.html import _verdict, e, figure_section, notes_section, page, write_page
from tracedx.report.json import diagnosis_dict
from tracedx.report.text import distinct_names

CSS = """
.sides{display:grid;grid-template-columns:1fr 1fr;gap:14px} .sides>section{margin:0;min-width:0}
.sides .kpi{min-width:100px} .pred td,.pred th{white-space:normal}
.verdict-word{font-weight:700} td.up{color:#a40c3d} td.down{color:#0a6b2e}
.step{font-size:1.1em} .step.regression{color:#a40c3d}
"""

SIDES = ("before", "after")


def diff_figures(td) -> dict[str, go.Figure]:
    """``{"estimate", "sides"}`` -> Figure, in report order (:func:`estimate_figure`,
    :func:`sides_figure`)."""
    return {"estimate": estimate_figure(td), "sides": sides_figure(td)}


def estimate_figure(td) -> go.Figure:
    """Step times (ms, median) of BEFORE, BEFORE's Amdahl estimate after the fix, and AFTER,
    one bar per clock: traced, and unprofiled where both traces carry it. The estimate is drawn
    on the clock it is against (BEFORE's unprofiled step when it has one, else traced). When
    AFTER's batch grew (larger-batch), every bar is per BEFORE's batch of samples: AFTER's step
    divided by the growth, like the estimate."""
    d = diff_dict(td)
    p = d["prediction"]
    k = p.get("batch_scale")
    title = "Estimate against achieved (median step time, ms)"
    rows = ["BEFORE", f"estimate: {esc(d['fix'])}", "AFTER (achieved)"]
    if k:
        title = "Estimate against achieved (ms per BEFORE's batch of samples)"
        rows[2] = f"AFTER (achieved; its step / {k:g})"
    against = d["before"]["estimates_against"]
    fig = go.Figure()
    for clock, before, after, color in (
        ("traced", p["before_step_ms"], p["after_step_ms"], "#6d96b1"),
        ("unprofiled", p["before_unprofiled_ms"], p["after_unprofiled_ms"], "#00498d"),
    ):
        est = p["estimated_step_ms"] if against == clock else None
        if before is None and after is None:
            continue
        if k and after is not None:
            after = after / k
        vals = [before, est, after]
        fig.add_trace(
            go.Bar(
                y=rows,
                x=vals,
                orientation="h",
                name=clock,
                marker_color=color,
                text=["" if v is None else f"{v:.3f} ms" for v in vals],
                textposition="outside",
                hovertemplate=f"{clock}: %{{x:.3f}} ms<extra>%{{y}}</extra>",
            )
        )
    if not fig.data:
        fig.add_annotation(
            text="no step time on either side", x=0.5, y=0.5, xref="paper", yref="paper",
            showarrow=False,
        )  # fmt: skip
    top = max([v for t in fig.data for v in t.x if v is not None] or [1.0])
    fig.update_layout(barmode="group")
    fig.update_yaxes(autorange="reversed")
    unit = "ms per BEFORE's batch" if k else "step time (ms)"
    fig.update_xaxes(title=unit, range=[0, top * 1.2])
    return _layout(fig, title, 300)


def _per_step_idle(diag) -> dict[str, float]:
    """Idle time per cause on the primary GPU, the mean per analysed step (us)."""
    if diag.primary_device is None or diag.idle_causes.height == 0:
        return {}
    n = max(len(diag.steps), 1)
    ic = (
        diag.idle_causes.filter(pl.col("device") == diag.primary_device)
        .group_by("cause")
        .agg(pl.col("idle_us").sum() / n)
    )
    return dict(ic.rows())


def sides_figure(td) -> go.Figure:
    """BEFORE and AFTER as two stacked bars (ms per step, the mean over the analysed steps):
    device time by kind (solid; ``copy`` holds memcpys and memsets too) and GPU idle time by
    cause (hatched), with each side's median step time as a marker. Kernels on concurrent
    streams overlap, so a stack can rise above the step time."""
    d = diff_dict(td)
    fig = go.Figure()
    x = ["BEFORE", "AFTER"]
    kinds = [k for k in d["kind_changes"] if k["before_us"] or k["after_us"]]
    for k in sorted(kinds, key=lambda k: -(k["before_us"] + k["after_us"])):
        name = esc(k["kind"])
        hover = f"{name}: %{{y:.3f}} ms per step<extra>%{{x}}</extra>"
        ys = [k["before_us"] / 1e3, k["after_us"] / 1e3]
        fig.add_trace(kind_bar(x, ys, k["kind"], hover, name))
    idle = [_per_step_idle(td.before), _per_step_idle(td.after)]
    for c in CAUSES:
        ys = [i.get(c, 0.0) / 1e3 for i in idle]
        if any(ys):
            hover = f"idle, {c}: %{{y:.3f}} ms per step<extra>%{{x}}</extra>"
            fig.add_trace(idle_bar(x, ys, c, hover))
    p = d["prediction"]
    ys = [p["before_step_ms"], p["after_step_ms"]]
    hover = "step time %{y:.3f} ms<extra>%{x}</extra>"
    fig.add_trace(step_marker(x, ys, "step time (median)", hover, 60))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="ms per step")
    return _layout(fig, "Where the time goes, BEFORE and AFTER", 460)


def _prediction(d: dict) -> str:
    p = d["prediction"]
    src = "given with --fix" if d["fix_source"] == "given" else "inferred from the two traces"
    ev = "".join(
        f"<li><code>{e(c['fix'])}</code>{e(_weak(c))}: {e(c['evidence'])}</li>"
        for c in d["candidates"][:3]
    )
    f = p["finding"]
    est = _x(p["estimated_speedup"])
    if f:
        est = f"{_estimate(p, f).replace(' -> ', ' → ')} (f = {f['fraction']:.0%})"
        if not f["recommended"]:
            est += " [not recommended: &lt; 5%]"
    ach = []
    for clock, a, b0, b1 in (
        ("traced", "achieved_speedup_traced", "before_step_ms", "after_step_ms"),
        (
            "unprofiled",
            "achieved_speedup_unprofiled",
            "before_unprofiled_ms",
            "after_unprofiled_ms",
        ),
    ):
        if p[a] is not None:
            ach.append(f"{_x(p[a])} {clock} ({p[b0]:.3f} → {p[b1]:.3f} ms)")
    ratios = [
        f"{_ratio(p[k])} {clock}"
        for clock, k in (
            ("traced", "estimate_over_achieved_traced"),
            ("unprofiled", "estimate_over_achieved_unprofiled"),
        )
        if p[k] is not None
    ]
    rows = [
        ("estimate (BEFORE's Amdahl)", est),
        ("achieved", e("; ".join(ach)) or "n/a"),
        ("estimate / achieved", e(", ".join(ratios)) or "n/a"),
        ("verdict", f"<span class='verdict-word'>{e(p['verdict'])}</span>"),
        ("why", e(p["explanation"])),
    ]
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return (
        "<section id='prediction' class='card'><h2>The fix and what it achieved</h2>"
        f"<p class='verdict'>Applied fix: <b><code>{e(d['fix'])}</code></b> ({e(src)})</p>"
        f"<ul class='evidence'>{ev}</ul><table class='pred'>{table}</table></section>"
    )


def _metrics_table(d: dict) -> str:
    rows = []
    for m in d["metrics"]:
        if m["before"] in (None, 0) and m["after"] in (None, 0):
            continue
        c = m["change"]
        cls = "" if not c else (" class='up'" if c > 0 else " class='down'")
        unit, b_s, a_s, chg = metric_cells(m)
        rows.append(
            f"<tr><td>{e(m['metric'])} <span class='dim'>({e(unit)})</span></td>"
            f"<td class='n'>{e(b_s)}</td>"
            f"<td class='n'>{e(a_s)}</td>"
            f"<td class='n'{cls}>{e(chg)}</td></tr>"
        )
    for k, v in d["verdicts"].items():
        rows.append(
            f"<tr><td>{e(k)}</td><td>{e(v['before'] or 'n/a')}</td>"
            f"<td>{e(v['after'] or 'n/a')}</td><td></td></tr>"
        )
    return (
        "<section id='metrics'><h2>Side by side</h2><div class='scroll'><table>"
        "<thead><tr><th>metric</th><th>BEFORE</th><th>AFTER</th><th>change</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div></section>"
    )


def _changes(d: dict) -> str:
    ops = [o for o in d["op_changes"] if abs(o["change_us"]) > 0][:TOP]
    kc = [k for k in d["kernel_changes"] if k["status"] != "changed"]
    kinds = [k for k in d["kind_changes"] if k["before_count"] or k["after_count"]]
    out = ["<section id='changes'><h2>What changed (per step)</h2>"]
    if kinds:  # as in the text report
        rows = "".join(
            f"<tr><td>{e(k['kind'])}</td><td class='n'>{k['before_us'] / 1e3:.3f}</td>"
            f"<td class='n'>{k['after_us'] / 1e3:.3f}</td><td class='n'>{k['change_us'] / 1e3:+.3f}</td>"
            f"<td>{e(kind_counts(k).replace(' -> ', ' → '))}</td></tr>"
            for k in kinds
        )
        out.append(
            "<h3>Device time by kind</h3><p class='dim'>Kind copy holds memcpys and memsets too."
            "</p><div class='scroll'><table id='kind-changes'><thead><tr><th>kind</th>"
            "<th>BEFORE ms</th><th>AFTER ms</th><th>change ms</th><th>GPU ops</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div>"
        )
    if ops:
        rows = "".join(
            f"<tr><td><code title='{e(o['name'])}'>{e(name)}</code></td>"
            f"<td class='n'>{o['before_us'] / 1e3:.3f}</td><td class='n'>{o['after_us'] / 1e3:.3f}</td>"
            f"<td class='n'>{o['change_us'] / 1e3:+.3f}</td></tr>"
            for o, name in zip(ops, distinct_names([o["name"] for o in ops], 60), strict=True)
        )
        note = graph_note(d)
        out.append(
            "<h3>Ops whose device time changed most</h3>"
            + (f"<p class='dim'>{e(note)}.</p>" if note else "")
            + "<div class='scroll'><table id='op-changes'>"
            "<thead><tr><th>op</th><th>BEFORE ms</th><th>AFTER ms</th><th>change ms</th></tr>"
            f"</thead><tbody>{rows}</tbody></table></div>"
        )
    if kc:
        rows = "".join(
            f"<tr><td><code title='{e(k['example'] if 'example' in k else k['kernel'])}'>"
            f"{e(name)}</code></td><td>{e(k['kind'])}</td>"
            f"<td>{e(k['status'])}</td><td class='n'>{k['before_count']:.0f} → "
            f"{k['after_count']:.0f}</td><td class='n'>"
            f"{(k['after_us'] if k['status'] == 'appeared' else k['before_us']) / 1e3:.3f}</td></tr>"
            for k, name in zip(
                kc[:TOP], distinct_names([k["kernel"] for k in kc[:TOP]], 60), strict=True
            )
        )
        out.append(
            "<h3>Kernels that appeared or vanished</h3><div class='scroll'><table id='kernel-changes'>"
            "<thead><tr><th>kernel (normalised)</th><th>kind</th><th>status</th><th>count</th>"
            f"<th>device ms</th></tr></thead><tbody>{rows}</tbody></table></div>"
        )
        if len(kc) > TOP:
            out.append(
                f"<p class='dim'>... {len(kc) - TOP} more (see <code>--format json</code>)</p>"
            )
    if not (ops or kc):
        out.append("<p>No op's device time changed and no kernel appeared or vanished.</p>")
    out.append("</section>")
    return "".join(out)


def render_diff_html(td) -> str:
    """The diff report as one HTML document (plotly.js inlined; a few MB)."""
    d = diff_dict(td)
    b, a = d["before"], d["after"]
    dev = b["device_name"] or "unknown device"
    if a["device_name"] and a["device_name"] != b["device_name"]:
        dev += f" → {a['device_name']}"
    header = (
        "<header><h1>tracedx diff</h1>"
        f"<p class='path'>BEFORE <code>{e(b['path'])}</code></p>"
        f"<p class='path'>AFTER <code>{e(a['path'])}</code></p>"
        f"<p class='meta'>{e(dev)} · {len(b['steps'])} → {len(a['steps'])} steps</p>"
        f"<p class='step{' regression' if d['step_change']['regression'] else ''}'>"
        f"<b>{e(_step_line(d))}</b></p></header>"
    )
    sides = "".join(
        _verdict(diagnosis_dict(diag), key=f"{tag}-verdict", title=tag.upper())
        for tag, diag in zip(SIDES, (td.before, td.after), strict=True)
    )
    body = [
        header,
        _prediction(d),
        figure_section(
            "estimate",
            "Estimate against achieved",
            "BEFORE's median step, the step BEFORE's Amdahl estimate predicts after the fix "
            "(on the clock the estimate is against), and AFTER's median step.",
            estimate_figure(td),
        ),
        f"<div class='sides'>{sides}</div>",
        figure_section(
            "sides",
            "Where the time goes, BEFORE and AFTER",
            "Per step (means over the analysed steps): GPU device time by kind (copy holds "
            "memcpys and memsets too) and "
            "GPU idle time by cause (hatched); the black line is the median step time. Kernels "
            "on concurrent streams overlap, so a stack can rise above the step time.",
            sides_figure(td),
        ),
        _metrics_table(d),
        _changes(d),
    ]
    body.append(notes_section(d["notes"]))
    return page(f"tracedx diff · {Path(b['path']).name} → {Path(a['path']).name}", body, CSS)


def write_diff_html(td, path: str | Path) -> Path:
    """Write :func:`render_diff_html` to ``path`` (UTF-8) and return the path."""
    return write_page(render_diff_html(td), path)


__all__ = ["estimate_figure", "render_diff_html", "sides_figure", "write_diff_html"]
