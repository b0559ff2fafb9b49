"""The HTML report: one self-contained, offline file (plotly.js inlined once, no CDN).

Order: the verdict (regime, bottleneck, evidence, top fixes with their Amdahl estimates), then
the roofline, the step timeline, where the time goes, the fix estimates and a sortable op
table, then notes. Numbers come from the Diagnosis (:func:`tracedx.report.json.diagnosis_dict`
and its tables); this module only lays them out.

Safety: every string from the trace is escaped with :func:`html.escape`; figure JSON sits in
``<script type="application/json">`` blocks with ``<``, ``>`` and ``&`` written as ``\\u003c``,
``\\u003e``, ``\\u0026``; and a Content-Security-Policy lets only this page's two script
blocks run (by nonce) and fetch nothing, so a crafted kernel name cannot run script.
"""

from __future__ import annotations

import html
import math
import secrets
from pathlib import Path
from typing import Any

import plotly.io as pio
from plotly.offline import get_plotlyjs

from tracedx.report.figures import all_figures, fmt_shapes, num
from tracedx.report.json import diagnosis_dict
from tracedx.report.text import estimate_label, rate, short_name, speedup_label

OP_TABLE_ROWS = 200
"""The op table lists at most this many op groups (the largest by device time)."""

FIGURES = (
    ("roofline", "Roofline", "Each op with a FLOP/byte model at its arithmetic intensity and "
     "achieved rate; marker area grows with its device time. Ops far below the roofs are worth a "
     "look; the ridge point separates bandwidth-bound from compute-bound."),
    ("timeline", "Step timeline", "One typical step (the one closest to the median step time): "
     "host threads above, GPU streams below, GPU idle gaps coloured by their cause."),
    ("breakdown", "Where the time goes", "Per step: GPU device time by kernel kind, copies, and "
     "GPU idle time by cause (hatched); markers give the step time and the GPU busy time. "
     "Kernels on concurrent streams overlap, so a stack can rise above the step time."),
    ("fixes", "Fix estimates", "The median step the estimates are against (unprofiled when "
     "timed) and the Amdahl estimate after each fix: 1/((1-f)+f/s) for the fraction f of the "
     "step a fix acts on and its local speedup s."),
)  # fmt: skip


def e(x: Any) -> str:
    """HTML-escape any value (None -> empty)."""
    return html.escape("" if x is None else str(x), quote=True)


def script_json(text: str) -> str:
    """Make JSON text safe inside a ``<script>`` element: ``<``, ``>``, ``&`` (only ever inside
    JSON strings) become ``\\u003c``, ``\\u003e``, ``\\u0026``, so ``</script>`` cannot occur."""
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _ms(v: Any) -> str:
    return "n/a" if v is None else f"{v:.3f} ms"


def _header(d: dict) -> str:
    tr, st = d["trace"], d["steps"]
    bits = [e(tr["device_name"] or "unknown device")]
    if st["synthetic"]:
        bits.append("no ProfilerStep markers: whole trace as one step")
    elif st["numbers"]:
        n = st["numbers"]
        bits.append(f"{st['count']} step{'s' if st['count'] != 1 else ''} ({n[0]}..{n[-1]})")
    if tr["pytorch_version"]:
        bits.append(f"PyTorch {e(tr['pytorch_version'])}")
    if tr["device"]:
        bits.append(f"peaks: {e(tr['device']['name'])}")
    return (
        f"<header><h1>tracedx report</h1><p class='path'><code>{e(tr['path'])}</code></p>"
        f"<p class='meta'>{' · '.join(bits)}</p></header>"
    )


def regime_head(regime: str | None, bottleneck: str | None) -> str:
    """The verdict's first line: the regime badge and the bottleneck (or NO REGIME)."""
    if not regime:
        return "<span class='regime none'>NO REGIME</span> <span class='bott'>see the notes</span>"
    return (
        f"<span class='regime {e(regime.replace(' ', '-'))}'>{e(regime.upper())}</span> "
        f"<span class='bott'>bottleneck: <b>{e(bottleneck)}</b></span>"
    )


def _verdict(d: dict, key: str = "verdict", title: str = "Verdict") -> str:
    st = d["steps"]
    head = regime_head(d["regime"], d["bottleneck"])
    idle = st["idle_fraction"]
    kpis = [
        ("median step", _ms(st["step_time_ms"])),
        ("GPU busy", _ms(st["gpu_busy_ms"])),
        ("GPU idle", "n/a" if idle is None else f"{idle:.0%}"),
        ("kernels / step", num(st["kernels_per_step"], ".0f")),
        ("host blocked / step (syncs, pageable copies)", _ms(st["sync_ms"])),
    ]
    if "unprofiled_step_ms" in st and st["unprofiled_step_ms"].get("median"):
        kpis.append(("unprofiled step", _ms(st["unprofiled_step_ms"]["median"])))
    kpi = "".join(f"<div class='kpi'><span>{k}</span><b>{v}</b></div>" for k, v in kpis)
    ev = "".join(f"<li>{e(x)}</li>" for x in d["evidence"])
    return (
        f"<section id='{key}' class='card'><h2>{e(title)}</h2><p class='verdict'>{head}</p>"
        f"<div class='kpis'>{kpi}</div><ul class='evidence'>{ev}</ul>{_top_fixes(d)}</section>"
    )


def _top_fixes(d: dict) -> str:
    rec = [f for f in d["findings"] if f["recommended"]]
    rest = [f for f in d["findings"] if not f["recommended"]]
    if not d["findings"]:
        out = "<h3>Top fixes</h3><p>No estimate (see the notes).</p>"
    elif not rec:
        out = "<h3>Top fixes</h3><p>No fix is worth 5% or more of the step.</p>"
    else:
        rows = []
        for i, f in enumerate(rec[:3], 1):
            s = "∞" if f["local_speedup_unbounded"] else f"{f['local_speedup']:.2f}x"
            ev = "".join(f"<li>{e(x)}</li>" for x in f["evidence"][:3])
            rows.append(
                f"<tr><td>{i}</td><td><code>{e(f['fix'])}</code><br>{e(f['title'])}"
                f"<details><summary>how</summary><p>{e(f['derivation'])}</p><ul>{ev}</ul>"
                f"</details></td><td class='n'><b>{e(speedup_label(f))}</b></td>"
                f"<td class='n'>{e(estimate_label(f))}</td>"
                f"<td class='n'>{f['fraction']:.0%}</td><td class='n'>{s}</td></tr>"
            )
        ref = d.get("estimates_against") or {}
        against = (
            f"the unprofiled step, {ref['step_ms']:.3f} ms"
            if ref.get("kind") == "unprofiled"
            else "the traced step time"
        )
        out = (
            f"<h3>Top fixes (Amdahl estimate against {e(against)})</h3>"
            "<table class='fixes'><thead><tr><th>#</th><th>fix</th><th>whole step</th>"
            "<th>time after</th><th>f</th><th>s</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
        )
        more = rec[3:]
        if more:
            out += "<p>More: " + ", ".join(
                f"<code>{e(f['fix'])}</code> {e(speedup_label(f))}" for f in more
            )
            out += "</p>"
    if rest:
        out += "<p class='dim'>Not worth it (&lt; 5%): " + ", ".join(
            f"<code>{e(f['fix'])}</code> {e(speedup_label(f))}" for f in rest
        )
        out += "</p>"
    return out


# (header, column or None, kind: "num"/"text", formatter)
_OP_COLS = (
    ("op", "name", "text"),
    ("input shapes", "input_shapes", "text"),
    ("dtypes", "input_dtypes", "text"),
    ("calls", "count", "num"),
    ("device ms", "device_time_us", "num"),
    ("kind", "kernel_kind", "text"),
    ("GFLOP", "flops", "num"),
    ("MB", "bytes", "num"),
    ("FLOP/B", "intensity", "num"),
    ("TFLOP/s", "achieved_tflops", "num"),
    ("GB/s", "achieved_gbps", "num"),
    ("of roof", "bound_fraction", "num"),
    ("regime", "regime", "text"),
)


_WRAPPED = {"name": "w name", "input_shapes": "w shapes", "input_dtypes": "w dtypes"}
"""Op-table cells whose text wraps within a bounded width, so the table fits a 1,400 px window."""


def _cell(col: str, v: Any) -> tuple[str, str]:
    """(display HTML, sort key) for one op-table cell."""
    if col == "name":
        return f"<code title='{e(v)}'>{e(short_name(v or '', 60))}</code>", e(v)
    if col == "input_shapes":
        s = fmt_shapes(v)
        return f"<span title='{e(s)}'>{e(short_name(s, 40))}</span>", e(s)
    if col == "input_dtypes":
        s = ", ".join(str(x) for x in (v or []))
        return f"<span title='{e(s)}'>{e(short_name(s, 30))}</span>", e(s)
    if col in ("kernel_kind", "regime"):
        return e(v or ""), e(v or "")
    # display unit: device ms, GFLOP, MB, percent of the roofline bound; others as they are
    scale, fmt, unit = {
        "device_time_us": (1e-3, ".3f", ""),
        "flops": (1e-9, ".3g", ""),
        "bytes": (1e-6, ".3g", ""),
        "bound_fraction": (100, ".0f", "%"),
    }.get(col, (1, ".3g", ""))
    if v is None or not math.isfinite(v):
        return "–", ""
    x = float(v) * scale
    return (rate(x) if fmt == ".3g" else format(x, fmt)) + unit, repr(x)


def _op_table(diag) -> str:
    t = diag.op_table
    if t.height == 0:
        return "<p>No op launched GPU work in the analysed steps.</p>"
    t = t.sort("device_time_us", descending=True).head(OP_TABLE_ROWS)
    cols = [c for c in _OP_COLS if c[1] in t.columns]
    head = "".join(f"<th data-type='{k}' title='click to sort'>{e(h)}</th>" for h, _, k in cols)
    body = []
    for r in t.iter_rows(named=True):
        cells = []
        for _, c, k in cols:
            shown, key = _cell(c, r.get(c))
            cls = "n" if k == "num" else _WRAPPED.get(c, "")
            cells.append(f"<td data-v='{key}'{f' class={cls!r}' if cls else ''}>{shown}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    note = (
        f"<p class='dim'>The {OP_TABLE_ROWS} largest of {diag.op_table.height} op groups.</p>"
        if diag.op_table.height > OP_TABLE_ROWS
        else ""
    )
    return (
        "<p class='dim'>Op groups (name, shapes, dtypes) over all analysed steps; click a "
        f"header to sort. Hover a name for the full name.</p>{note}"
        f"<div class='scroll'><table id='ops' class='sortable'><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def notes_section(items: list[str]) -> str:
    """The ``Notes`` section (escaped list items), or nothing without notes."""
    if not items:
        return ""
    li = "".join(f"<li>{e(x)}</li>" for x in items)
    return f"<section id='notes'><h2>Notes</h2><ul>{li}</ul></section>"


def _notes(d: dict) -> str:
    return notes_section(
        d["notes"] + d["trace"]["device_notes"] + [w["message"] for w in d["warnings"]]
    )


CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#222;
background:#f6f7f9}
main{max-width:1320px;margin:0 auto;padding:16px 24px 48px}
header h1{margin:8px 0 0;font-size:22px} .path{margin:2px 0;color:#555} .meta{margin:2px 0;color:#555}
section{background:#fff;border:1px solid #e3e5e8;border-radius:8px;padding:12px 18px;margin:14px 0}
h2{font-size:18px;margin:4px 0 8px} h3{font-size:15px;margin:14px 0 6px}
.verdict{font-size:18px;margin:4px 0 10px}
.regime{font-weight:700;padding:2px 10px;border-radius:4px;color:#fff;background:#666}
.regime.overhead-bound{background:#e07b00} .regime.compute-bound{background:#1f77b4}
.regime.bandwidth-bound{background:#7b3fa0}
.kpis{display:flex;flex-wrap:wrap;gap:10px;margin:6px 0}
.kpi{border:1px solid #e3e5e8;border-radius:6px;padding:6px 12px;min-width:120px}
.kpi span{display:block;color:#666;font-size:12px} .kpi b{font-size:16px}
table{border-collapse:collapse;font-size:13px} th,td{padding:4px 8px;border-bottom:1px solid #eee;
text-align:left;vertical-align:top;white-space:nowrap} td.n{text-align:right;font-variant-numeric:tabular-nums}
table.sortable th{cursor:pointer;user-select:none;background:#f0f2f5;position:sticky;top:0}
th[aria-sort=ascending]::after{content:' ▲'} th[aria-sort=descending]::after{content:' ▼'}
.scroll{max-height:640px;overflow:auto;max-width:100%}
#ops td.w{white-space:normal;overflow-wrap:anywhere;min-width:90px}
#ops td.w.name{max-width:300px} #ops td.w.shapes{max-width:220px} #ops td.w.dtypes{max-width:130px}
#ops th,#ops td{padding:4px 6px} table.fixes td{white-space:normal} .dim{color:#666} .caption{color:#555;margin:0 0 6px}
nav a{margin-right:14px} code{font-size:12px} details summary{cursor:pointer;color:#1f5fa8}
"""

JS = """
(function () {
  document.querySelectorAll('div.fig[data-src]').forEach(function (div) {
    var spec = JSON.parse(document.getElementById(div.getAttribute('data-src')).textContent);
    Plotly.newPlot(div, spec.data, spec.layout, {responsive: true, displaylogo: false});
  });
  document.querySelectorAll('table.sortable').forEach(function (table) {
    var ths = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(ths, function (th, col) {
      th.addEventListener('click', function () {
        var numeric = th.getAttribute('data-type') === 'num';
        var cur = th.getAttribute('aria-sort');
        var dir = cur ? (cur === 'descending' ? 1 : -1) : (numeric ? -1 : 1);
        Array.prototype.forEach.call(ths, function (h) { h.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', dir === 1 ? 'ascending' : 'descending');
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        function key(r) {
          var v = r.cells[col].getAttribute('data-v');
          if (!numeric) return v;
          return v === '' ? NaN : parseFloat(v);
        }
        rows.sort(function (a, b) {
          var x = key(a), y = key(b);
          if (numeric) {
            if (isNaN(x)) return isNaN(y) ? 0 : 1;
            if (isNaN(y)) return -1;
            return dir * (x - y);
          }
          return dir * x.localeCompare(y);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
})();
"""


def figure_section(key: str, title: str, caption: str, fig, tag: str = "section") -> str:
    """One figure in its own ``<section id=key>`` (or another ``tag``): a title, a caption, the
    div plotly draws into and the figure's JSON (made script-safe by :func:`script_json`)."""
    data = script_json(pio.to_json(fig, validate=False))
    return (
        f"<{tag} id='{key}'><h2>{e(title)}</h2><p class='caption'>{e(caption)}</p>"
        f"<div class='fig' id='fig-{key}' data-src='fig-{key}-data'></div>"
        f"<script type='application/json' id='fig-{key}-data'>{data}</script></{tag}>"
    )


def page(title: str, body: list[str], css: str = "") -> str:
    """A whole self-contained document: ``body`` (HTML parts, already escaped) inside
    ``<main>``, then plotly.js and the page script (which draws every figure section and makes
    ``table.sortable`` sortable), both allowed by nonce under a CSP that fetches nothing."""
    nonce = secrets.token_urlsafe(18)
    csp = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; "
        "img-src data: blob:; font-src data:"
    )
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<meta http-equiv='Content-Security-Policy' content=\"{csp}\">",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>{e(title)}</title>",
        f"<style>{CSS}{css}</style></head><body><main>",
        *body,
        "<p class='dim'>Written by tracedx. Works offline: no network requests.</p>",
        f"</main><script nonce='{nonce}'>{get_plotlyjs()}</script>",
        f"<script nonce='{nonce}'>{JS}</script></body></html>",
    ]
    return "\n".join(parts)


def render_html(diag) -> str:
    """The whole report as one HTML document (a str of a few MB: plotly.js is inlined)."""
    d = diagnosis_dict(diag)
    figs = all_figures(diag)
    nav = (
        "".join(f"<a href='#{k}'>{t}</a>" for k, t, _ in FIGURES)
        + "<a href='#ops-section'>Op table</a>"
    )
    body = [_header(d), f"<nav>{nav}</nav>", _verdict(d)]
    body += [figure_section(key, title, caption, figs[key]) for key, title, caption in FIGURES]
    body.append(f"<section id='ops-section'><h2>Top ops</h2>{_op_table(diag)}</section>")
    body.append(_notes(d))
    return page(f"tracedx · {Path(d['trace']['path']).name}", body)


def write_page(text: str, path: str | Path) -> Path:
    """Write one page (a str) to ``path`` (UTF-8) and return the path."""
    p = Path(path)
    p.write_text(text, encoding="utf-8")
    return p


def write_html(diag, path: str | Path) -> Path:
    """Write :func:`render_html` to ``path`` (UTF-8) and return the path."""
    return write_page(render_html(diag), path)


__all__ = [
    "figure_section",
    "notes_section",
    "page",
    "render_html",
    "script_json",
    "write_html",
    "write_page",
]
