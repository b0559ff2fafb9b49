"""The HTML report of a multi-rank job (:class:`tracedx.job.diagnosis.JobDiagnosis`).

One self-contained page on the diagnosis report's scaffolding (:func:`tracedx.report.html.page`):
the job's verdict (regime, bottleneck, evidence, the straggler with its evidence, the typical
rank's step and the fixes with their Amdahl estimates), a per-rank table, a rank-by-step
heatmap of the exposed wait (the communication time a rank spends waiting for its peers with
no compute under it), each rank's step split into compute, exposed transfer, exposed wait and
GPU idle, the collectives by process group, and notes. Every figure comes from
:func:`tracedx.report.job.job_dict` or the JobDiagnosis' tables (``ranks``, ``steps``); times
are shown in ms.
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from tracedx.report.figures import CAUSE_COLORS, HOST_COLORS, KIND_COLORS, _empty, _layout
from tracedx.report.html import (
    e,
    figure_section,
    notes_section,
    page,
    regime_head,
    write_page,
)
from tracedx.report.job import (
    APART_FIXES,
    RUNS_APART_WARNING,
    collective_groups,
    group_label,
    job_dict,
)
from tracedx.report.text import speedup_label

CSS = """
tr.straggler td{background:#fde8ec}
#ranks th,#collectives th{white-space:normal;min-width:48px;max-width:110px;vertical-align:bottom}
"""

HEATMAP_SCALE = "Cividis"
"""A sequential colour scale whose lightness rises monotonically (readable in greyscale and by
colour-blind readers: Nuñez et al. 2018, PLoS ONE 13(7))."""


def _ms(v, fmt: str = ".3f") -> str:
    return "n/a" if v is None else f"{v / 1e3:{fmt}}"


def _pct(v) -> str:
    return "n/a" if v is None else f"{v:.0%}"


def job_figures(jd) -> dict[str, go.Figure]:
    """``{"wait_heatmap", "ranks"}`` -> Figure, in report order (:func:`wait_heatmap`,
    :func:`ranks_figure`)."""
    return {"wait_heatmap": wait_heatmap(jd), "ranks": ranks_figure(jd)}


def wait_heatmap(jd) -> go.Figure:
    """Ranks (y) by steps (x): each rank's exposed wait in each step (ms; ``exposed_wait_us``
    of :func:`tracedx.job.metrics.rank_step_metrics`), on a light-to-dark scale; the hover adds
    the step time, the wait's share of it and the rank's total wait inside its collectives.
    Cells where waiting cannot be split from transfer (no matched collective) are blank."""
    title = "Exposed wait per rank and step (ms)"
    s = jd.steps
    if s.height == 0 or "exposed_wait_us" not in s.columns:
        return _empty(title, "no per-step figures: no rank has steps")
    ranks = sorted(s["rank"].unique().to_list())
    steps = sorted(s["step"].unique().to_list())
    cell = {(r["rank"], r["step"]): r for r in s.iter_rows(named=True)}
    z, hover = [], []
    for rk in ranks:
        zr, hr = [], []
        for st in steps:
            r = cell.get((rk, st))
            w = None if r is None else r["exposed_wait_us"]
            zr.append(None if w is None else w / 1e3)
            if r is None:
                hr.append(f"rank {rk}, step {st}: not in this rank's trace")
                continue
            share = w / r["step_time_us"] if w is not None and r["step_time_us"] else None
            hr.append(
                f"rank {rk}, step {st}<br>exposed wait {_ms(w)} ms ({_pct(share)} of the step)"
                f"<br>step {_ms(r['step_time_us'])} ms, wait inside collectives "
                f"{_ms(r.get('wait_us'))} ms<br>arrived last {r.get('last_arrivals') or 0} "
                f"of {r.get('collectives') or 0} collectives"
            )
        z.append(zr)
        hover.append(hr)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[str(x) for x in steps],
            y=[f"rank {r}" for r in ranks],
            colorscale=HEATMAP_SCALE,
            reversescale=True,  # more waiting is darker
            zmin=0,
            colorbar={"title": {"text": "ms"}},
            hovertext=hover,
            hoverinfo="text",
            xgap=1,
            ygap=1,
        )
    )
    fig.update_xaxes(type="category", title="step")
    fig.update_yaxes(autorange="reversed", type="category")
    return _layout(fig, title, max(260, 120 + 28 * len(ranks)))


_PARTS = (
    ("compute_us", "compute", KIND_COLORS["gemm"], ""),
    ("exposed_transfer_us", "exposed transfer", KIND_COLORS["communication"], ""),
    ("exposed_wait_us", "exposed wait", HOST_COLORS["blocking sync"], "x"),
    ("idle_us", "GPU idle", CAUSE_COLORS["kernel launch"], "/"),
    ("other_us", "other", CAUSE_COLORS["python"], "."),
)


def ranks_figure(jd) -> go.Figure:
    """Per rank (medians over its steps, ms): compute, exposed transfer, exposed wait, GPU
    idle and other (the rest of the step: on a CPU rank its host time outside ops and collectives;
    on a GPU rank copies, memsets and what the medians leave), stacked, with the median step time as a marker. Compute on concurrent streams and
    medians taken one by one need not add up to the step exactly."""
    title = "Each rank's step (medians, ms)"
    r = jd.ranks
    if r.height == 0:
        return _empty(title, "no ranks")
    r = r.sort("rank")
    x = [f"rank {v}" for v in r["rank"].to_list()]
    fig = go.Figure()
    for col, name, color, hatch in _PARTS:
        if col not in r.columns:
            continue
        fig.add_trace(
            go.Bar(
                x=x,
                y=[None if v is None else v / 1e3 for v in r[col].to_list()],
                name=name,
                marker={"color": color, "pattern": {"shape": hatch, "fgcolor": "#111",
                                                    "fgopacity": 0.5, "solidity": 0.3}},
                hovertemplate=f"{name}: %{{y:.3f}} ms<extra>%{{x}}</extra>",
            )
        )  # fmt: skip
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[None if v is None else v / 1e3 for v in r["step_time_us"].to_list()],
            mode="markers",
            name="step time",
            marker={"symbol": "line-ew", "size": 40, "line": {"width": 3, "color": "#000"}},
            hovertemplate="step %{y:.3f} ms<extra>%{x}</extra>",
        )
    )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="ms per step")
    return _layout(fig, title, 420)


def _verdict(d: dict, jd) -> str:
    head = regime_head(d["regime"], d["bottleneck"])
    if not d["regime"] and d["bottleneck"]:  # no GPU activity: a bottleneck, no regime
        head = (
            "<span class='regime none'>NO REGIME</span> <span class='bott'>no GPU activity; "
            f"bottleneck: <b>{e(d['bottleneck'])}</b></span>"
        )
    st = d["steps"]
    kpis = [
        ("ranks", str(len(d["ranks"]))),
        ("typical step", f"{st['step_time_ms']:.3f} ms" if st["step_time_ms"] else "n/a"),
        ("compute", f"{st['compute_ms']:.3f} ms" if st["compute_ms"] is not None else "n/a"),
        (
            "exposed wait",
            f"{st['exposed_wait_ms']:.3f} ms" if st["exposed_wait_ms"] is not None else "n/a",
        ),
        (
            "exposed transfer",
            f"{st['exposed_transfer_ms']:.3f} ms"
            if st["exposed_transfer_ms"] is not None
            else "n/a",
        ),
        (
            "load balance of compute",
            "n/a" if st["load_balance"] is None else f"{st['load_balance']:.2f}",
        ),
        ("parallel efficiency", _pct(st["parallel_efficiency"])),
    ]
    kpi = "".join(f"<div class='kpi'><span>{k}</span><b>{e(v)}</b></div>" for k, v in kpis)
    ev = "".join(f"<li>{e(x)}</li>" for x in d["evidence"])
    s = d["straggler"]
    if s:  # its evidence lines are in the verdict's evidence above: the test's figures here
        # no effect: the ranks never ran together, so the wait is no share of a step of theirs
        wait = (
            "is no share of a step (the ranks never ran at the same time)"
            if s["effect"] is None
            else f"is {s['effect']:.1%} of the step"
        )
        strag = (
            f"<h3>Straggler: rank {e(s['rank'])} ({e(s['cause'])})</h3><p>It paced (waited "
            f"least in) {s['last_in_steps']} of {s['steps']} steps (chance "
            f"{s['chance']:.0%} per step, binomial p = {s['p_value']:.2g}); the others' exposed "
            f"wait {wait}; {s['excess_ms']:.3f} ms per step more than the median peer.</p>"
        )
    else:
        strag = (
            "<h3>Straggler: none</h3><p class='dim'>No rank arrives last often enough, by "
            "enough and in enough steps to be named.</p>"
        )
    rows = "".join(
        f"<tr><td><code>{e(f['fix'])}</code><br>{e(f['title'])}</td>"
        f"<td class='n'><b>{e(speedup_label(f))}</b></td>"
        f"<td class='n'>{f['estimated_step_ms']:.3f} ms</td><td class='n'>{f['fraction']:.0%}</td>"
        f"<td>{e(' '.join(f['evidence'][:2]))}</td></tr>"
        for f in d["findings"]
    )
    fixes = (
        "<h3>Fixes (Amdahl estimate against the typical step)</h3><table class='fixes'>"
        "<thead><tr><th>fix</th><th>whole step</th><th>step after</th><th>f</th>"
        f"<th>evidence</th></tr></thead><tbody>{rows}</tbody></table>"
        if rows
        else "<h3>Fixes</h3><p>No job-level fix is estimated"
        + (f": {e(APART_FIXES)}.</p>" if d["collectives"]["clock"].get("runs_apart") else ".</p>")
    )
    return (
        f"<section id='verdict' class='card'><h2>Verdict</h2><p class='verdict'>{head}</p>"
        f"<div class='kpis'>{kpi}</div><ul class='evidence'>{ev}</ul>{strag}{fixes}</section>"
    )


_RANK_TABLE = (
    ("rank", "rank", "text"),
    ("host", "host", "text"),
    ("step ms", "step_time_us", "ms"),
    ("compute ms", "compute_us", "ms"),
    ("comm ms", "comm_us", "ms"),
    ("exposed wait ms", "exposed_wait_us", "ms"),
    ("exposed transfer ms", "exposed_transfer_us", "ms"),
    ("overlap", "overlap_ratio", "pct"),
    ("GPU idle ms", "idle_us", "ms"),
    ("other ms", "other_us", "ms"),
    ("wait in collectives ms (all steps)", "wait_total_us", "ms"),
    ("arrived last", "last_arrivals", "int"),
    ("collectives", "collectives", "int"),
    ("verdict", "bottleneck", "text"),
)


def _rank_table(jd) -> str:
    r = jd.ranks
    if r.height == 0:
        return "<p>No rank could be read.</p>"
    cols = [c for c in _RANK_TABLE if c[1] in r.columns]
    straggler = jd.straggler.rank if jd.straggler is not None else None
    head = "".join(
        f"<th data-type='{'text' if k == 'text' else 'num'}' title='click to sort'>{e(h)}</th>"
        for h, _, k in cols
    )
    body = []
    for row in r.sort("rank").iter_rows(named=True):
        cells = []
        for _, c, k in cols:
            v = row.get(c)
            if k == "ms":
                shown, key = _ms(v), "" if v is None else repr(v / 1e3)
            elif k == "pct":
                shown, key = _pct(v), "" if v is None else repr(v)
            elif k == "int":
                shown, key = ("n/a" if v is None else str(v)), "" if v is None else str(v)
            else:
                shown = key = "" if v is None else str(v)
            cls = " class='n'" if k != "text" else ""
            cells.append(f"<td data-v='{e(key)}'{cls}>{e(shown)}</td>")
        cls = " class='straggler'" if row["rank"] == straggler else ""
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    return (
        "<p class='dim'>Per rank, medians over its steps (wait in collectives and arrivals: "
        "totals over all steps); click a header to sort.</p>"
        f"<div class='scroll'><table id='ranks' class='sortable'><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _collectives(jd) -> str:
    g = collective_groups(jd)
    if g.height == 0:
        return "<p>No matched collective.</p>"
    rows = "".join(
        f"<tr><td>{e(group_label(r))}</td><td>{e(r['coll_type'])}</td>"
        f"<td class='n'>{r['group_size']}</td><td class='n'>{r['count']}</td>"
        f"<td class='n'>{(r['msg_bytes'] or 0) / 2**20:.1f}</td>"
        f"<td class='n'>{_ms(r['transfer_total_us'])}</td>"
        f"<td class='n'>{_ms(r['max_wait_us'])}</td>"
        f"<td class='n'>{'n/a' if r['busbw_gbs'] is None else format(r['busbw_gbs'], '.1f')}</td>"
        f"<td>{e(r['link'] or 'n/a')}</td><td class='n'>{_pct(r['busbw_fraction'])}</td></tr>"
        for r in g.iter_rows(named=True)
    )
    return (
        "<div class='scroll'><table id='collectives'><thead><tr><th>process group</th>"
        "<th>type</th><th>ranks</th><th>count</th><th>MiB per collective (median)</th>"
        "<th>transfer ms (in all)</th>"
        "<th>max wait ms (median)</th><th>busbw GB/s (median)</th><th>link</th>"
        f"<th>of link</th></tr></thead><tbody>{rows}</tbody></table></div>"
    )


def render_job_html(jd) -> str:
    """The job report as one HTML document (plotly.js inlined; a few MB)."""
    d = job_dict(jd)
    steps = d["steps"]["numbers"]
    devices = sorted({r.get("device_name") or "unknown device" for r in d["ranks"]})
    meta = [f"{len(d['ranks'])} ranks", ", ".join(devices)]
    if steps:
        meta.append(f"steps {steps[0]}..{steps[-1]}")
    header = (
        f"<header><h1>tracedx job report</h1><p class='meta'>{e(' · '.join(meta))}</p></header>"
    )
    warning = (
        f"<p class='warn'><strong>{e(RUNS_APART_WARNING)}</strong></p>"
        if d["collectives"]["clock"].get("runs_apart")
        else ""
    )
    body = [
        header,
        warning,
        _verdict(d, jd),
        f"<section id='ranks-section'><h2>Ranks</h2>{_rank_table(jd)}</section>",
        figure_section(
            "waits",
            "Waiting, rank by step",
            "Each rank's exposed wait per step: the part of its communication kernels spent "
            "waiting for the last rank to arrive (each kernel's duration minus the shortest "
            "duration of the same collective over its ranks), where no compute runs under it. "
            "A dark column is a slow step for everyone but one rank; a light row in dark "
            "columns is the rank the others wait for.",
            wait_heatmap(jd),
        ),
        figure_section(
            "rank-steps",
            "Each rank's step",
            "Medians per rank: compute, exposed transfer (moving bytes with nothing to hide "
            "it), exposed wait (hatched), GPU idle and other (the rest: on a CPU rank its host "
            "time outside ops and collectives, such as Python between them; on a GPU rank "
            "copies and memsets); the black line is the step time.",
            ranks_figure(jd),
        ),
        f"<section id='collectives-section'><h2>Collectives</h2>{_collectives(jd)}</section>",
    ]
    body.append(notes_section(d["notes"]))
    return page(f"tracedx job · {len(d['ranks'])} ranks", body, CSS)


def write_job_html(jd, path: str | Path) -> Path:
    """Write :func:`render_job_html` to ``path`` (UTF-8) and return the path."""
    return write_page(render_job_html(jd), path)


__all__ = ["ranks_figure", "render_job_html", "wait_heatmap", "write_job_html"]
