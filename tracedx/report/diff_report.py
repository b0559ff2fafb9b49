"""Rendering a :class:`tracedx.analysis.diff.TraceDiff`: ``tracedx.diff/2`` JSON, text, markdown.

Nothing here computes a number; every value comes from :func:`diff_dict`. Times are ms unless
named ``_us``; per-step values are means over the analysed steps, step times are medians.
"""

from __future__ import annotations

import json
import math
from typing import Any

import polars as pl

from tracedx.analysis.findings import MIN_SCORE, ON_TARGET
from tracedx.console import WIDTH, fit
from tracedx.report.json import _clean
from tracedx.report.safe import HEADER_CHARS, md_code, md_prose, md_text, safe_strings, term
from tracedx.report.text import distinct_names, estimate_label, speedup_label

SCHEMA = "tracedx.diff/2"
TOP = 8


def _side(d) -> dict[str, Any]:
    tr = d.trace
    return {
        "path": tr.path,
        "device_name": tr.device_name,
        "pytorch_version": tr.metadata.get("pytorch_version"),
        "steps": d.steps,
        "regime": d.regime,
        "bottleneck": d.bottleneck,
        "evidence": d.evidence,
        # what the side's fix estimates are against: "unprofiled" (timed by tracedx capture)
        # or "traced"
        "estimates_against": "unprofiled"
        if d.model is not None and d.model.unprofiled_step_us
        else "traced",
    }


def diff_dict(td) -> dict[str, Any]:
    """The ``tracedx.diff/2`` document as a dict (non-finite numbers become null)."""
    doc = {
        "schema": SCHEMA,
        "before": _side(td.before),
        "after": _side(td.after),
        "step_change": td.step_change,
        "fix": td.fix,
        "fix_source": td.fix_source,
        "candidates": [
            {"fix": c.fix, "score": c.score, "evidence": c.evidence} for c in td.candidates
        ],
        "prediction": td.prediction.to_dict(),
        "metrics": td.metrics.to_dicts(),
        "verdicts": {k: {"before": v[0], "after": v[1]} for k, v in td.verdicts.items()},
        "kind_changes": td.kind_changes.to_dicts(),
        "op_changes": td.op_changes.head(OP_ROWS).to_dicts(),
        "kernel_changes": _kernel_rows(td.kernel_changes),
        "new_findings": [f.to_dict() for f in td.new_findings],
        "notes": td.notes,
        "unrelated": td.unrelated,
    }
    return _clean(doc)


CHANGED_KERNEL_ROWS = 20
"""The JSON's kernels that ran on both sides: those with the largest change in time."""
OP_ROWS = 20
"""The JSON's ops: those with the largest change in device time."""


def _kernel_rows(kc) -> list[dict]:
    """Every kernel that appeared or vanished (the reports' "... N more" points here), then
    the :data:`CHANGED_KERNEL_ROWS` changed ones with the largest change."""
    new_or_gone = kc.filter(pl.col("status") != "changed")
    changed = kc.filter((pl.col("status") == "changed") & (pl.col("change_us").abs() > 0))
    return pl.concat([new_or_gone, changed.head(CHANGED_KERNEL_ROWS)]).to_dicts()


def render_json(td) -> str:
    return json.dumps(diff_dict(td), indent=2, allow_nan=False, default=str) + "\n"


def _num(v, unit: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if unit.startswith("fraction"):
        return f"{v:.0%}"
    if unit.startswith("ms"):
        return f"{v:.3f} ms"
    if "MiB" in unit:  # under 1 MiB in KiB, under 1 KiB in bytes: never "0.000954 MiB"
        if abs(v) >= 1 or v == 0:
            return f"{v:.1f} MiB"
        return f"{v * 1024:.1f} KiB" if abs(v) >= 1 / 1024 else f"{v * 2**20:,.0f} bytes"
    return f"{v:.1f}" if v != int(v) else f"{v:.0f}"


BYTE_UNITS = (("MiB", 1.0, ".1f"), ("KiB", 1 / 1024, ".1f"), ("bytes", 1 / 2**20, ",.0f"))
"""A size row's units (name, its size in MiB, format), largest first."""


def _row_unit(m: dict) -> tuple[str, float, str] | None:
    """The one unit of a size row (unit ``MiB...``, values in MiB): the largest of
    :data:`BYTE_UNITS` that the larger side reaches (MiB when both are 0), so that BEFORE, AFTER
    and the change read in it (before: each cell its own, "1,000 bytes" beside "0.0 MiB");
    None for any other row."""
    if "MiB" not in m["unit"]:
        return None
    top = max((abs(v) for v in (m["before"], m["after"]) if _finite(v)), default=0.0)
    return next(
        (u for u in BYTE_UNITS if top >= u[1]), BYTE_UNITS[0] if top == 0 else BYTE_UNITS[-1]
    )


KIND_TITLE = "DEVICE TIME BY KIND (per step; kind copy holds memcpys and memsets too)"


def kind_counts(k: dict) -> str:
    """A kind change row's counts per step, each GPU op under its own name:
    ``21 -> 21 kernels, 132 -> 254 memsets`` (kernels always, memcpys and memsets where a side
    has some), so that a column of kernels adds up to the ``kernels`` metric."""
    parts = [
        f"{_num(k['before_kernels'], 'per step')} -> {_num(k['after_kernels'], 'per step')} kernels"
    ]
    for c in ("memcpys", "memsets"):
        b, a = k[f"before_{c}"], k[f"after_{c}"]
        if b or a:
            parts.append(f"{_num(b, 'per step')} -> {_num(a, 'per step')} {c}")
    return ", ".join(parts)


def _finite(v) -> bool:
    return v is not None and not (isinstance(v, float) and not math.isfinite(v))


def metric_cells(m: dict) -> tuple[str, str, str, str]:
    """A SIDE BY SIDE row as it is shown: its unit (``MiB, median``), BEFORE, AFTER and the
    change, all in that one unit (a size row's from :func:`_row_unit`)."""
    u = _row_unit(m)
    if u is None:
        return m["unit"], _num(m["before"], m["unit"]), _num(m["after"], m["unit"]), _chg(m)
    name, size, fmt = u

    def cell(v) -> str:
        return f"{v / size:{fmt}} {name}" if _finite(v) else "n/a"

    c, r = m["change"], m["ratio"]
    chg = ""
    if c is not None:
        chg = ("+" if c >= 0 else "-") + cell(abs(c))
        if r is not None and m["before"] and r != 1:
            chg += f" ({r:.2f}x)"
    return m["unit"].replace("MiB", name, 1), cell(m["before"]), cell(m["after"]), chg


def _chg(m: dict) -> str:
    c, r, u = m["change"], m["ratio"], m["unit"]
    if c is None:
        return ""
    if u.startswith("fraction"):
        return f"{c * 100:+.0f} pts"
    s = _num(abs(c), u)
    s = ("+" if c >= 0 else "-") + s
    if r is not None and m["before"] and r != 1:
        s += f" ({r:.2f}x)"
    return s


def _x(v) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _weak(candidate: dict) -> str:
    """The mark of a candidate fix whose evidence is too weak to count as applied."""
    return "" if candidate["score"] >= MIN_SCORE else " (weak evidence: not checked)"


def _ratio(r: float) -> str:
    """An estimate/achieved ratio; three decimals where two would hide which side of the
    on-target bounds (1/1.25, 1.25) it falls (1.253 prints 1.253, not 1.25)."""
    return f"{r:.3f}" if round(r, 2) in (round(1 / ON_TARGET, 2), ON_TARGET) else f"{r:.2f}"


def _us(v) -> str:
    return f"{v / 1e3:.3f} ms"


def _step_line(d: dict) -> str:
    """The first line: REGRESSION when AFTER is slower by more than 5%, else the step change."""
    c = d["step_change"]
    return ("REGRESSION: " if c["regression"] else "STEP: ") + c["summary"]


def _estimate(p: dict, f: dict, unit: str = " ms") -> str:
    """The prediction's estimate with its scope (:func:`~tracedx.report.text.estimate_label`):
    per step, or for larger-batch per sample and per today's batch."""
    if p["estimated_speedup"] is None:
        return "n/a"
    est = {
        "estimated_speedup": p["estimated_speedup"],
        "estimated_step_ms": p["estimated_step_ms"],
        "batch_factor": f.get("batch_factor"),
    }
    if p["estimated_speedup"] == f["estimated_speedup"]:  # the finding's own (not a combination)
        est["unclamped_speedup"] = f.get("unclamped_speedup")
    return f"{speedup_label(est)} -> {estimate_label(est, unit)}"


def graph_note(d: dict) -> str | None:
    """Why op times fall to zero on a side that replays CUDA graphs (None when neither does):
    a replayed kernel is launched by ``cudaGraphLaunch``, not by the op that recorded it."""
    m = next((m for m in d["metrics"] if m["metric"] == "graph launches"), None)
    sides = [s.upper() for s in ("before", "after") if m and (m[s] or 0) > 0]
    if not sides:
        return None
    return (
        f"{' and '.join(sides)} replay{'s' if len(sides) == 1 else ''} CUDA graphs: a graph's "
        "kernels have no launching op there, so op times count only kernels outside graphs"
    )


def _prediction_lines(d: dict) -> list[str]:
    p = d["prediction"]
    out = []
    src = "given with --fix" if d["fix_source"] == "given" else "inferred"
    out.append(f"APPLIED FIX: {d['fix']} ({src})")
    for c in d["candidates"][:3]:
        out.append(f"  evidence     {c['fix']}{_weak(c)}: {c['evidence']}")
    f = p["finding"]
    if f:
        rec = "" if f["recommended"] else "  [not recommended: < 5%]"
        out.append(
            f"  estimate     {_estimate(p, f)} (BEFORE's Amdahl estimate, f = {f['fraction']:.0%}){rec}"
        )
    else:
        out.append("  estimate     none")
    # the batch grew: speedups per sample, from the steps' own times
    k = p.get("batch_scale")
    per, more = (" per sample", f" with {k:g}x the samples") if k else ("", "")
    if p["achieved_speedup_traced"] is not None:
        out.append(
            f"  achieved     {_x(p['achieved_speedup_traced'])}{per} traced "
            f"({p['before_step_ms']:.3f} -> {p['after_step_ms']:.3f} ms, median step{more})"
        )
    if p["achieved_speedup_unprofiled"] is not None:
        out.append(
            f"  achieved     {_x(p['achieved_speedup_unprofiled'])}{per} unprofiled "
            f"({p['before_unprofiled_ms']:.3f} -> {p['after_unprofiled_ms']:.3f} ms, median step{more})"
        )
    rs = []
    if p["estimate_over_achieved_traced"] is not None:
        rs.append(f"{_ratio(p['estimate_over_achieved_traced'])} traced")
    if p["estimate_over_achieved_unprofiled"] is not None:
        rs.append(f"{_ratio(p['estimate_over_achieved_unprofiled'])} unprofiled")
    if rs:
        out.append("  est/achieved " + ", ".join(rs) + f"  -> {p['verdict']}")
    out.append(f"  why          {p['explanation']}")
    return out


def render_text(td, width: int = WIDTH) -> str:
    """The terminal report, wrapped to ``width`` columns: the prediction check first, then the
    side-by-side tables."""
    doc = diff_dict(td)
    d = safe_strings(doc)  # every string escaped once; the header's names, cut shorter, from doc
    b, a = d["before"], d["after"]
    rb, ra = doc["before"], doc["after"]
    out = [f"tracedx diff · {term(rb['path'], HEADER_CHARS)} -> {term(ra['path'], HEADER_CHARS)}"]
    dev = term(rb["device_name"] or "unknown device", HEADER_CHARS)
    if ra["device_name"] and ra["device_name"] != rb["device_name"]:
        dev += f" -> {term(ra['device_name'], HEADER_CHARS)}"
    out.append(f"{dev} · {len(b['steps'])} steps -> {len(a['steps'])} steps")
    out.append("")
    out.append(_step_line(d))
    if d["unrelated"]:
        out.append(f"WARNING: {d['unrelated']}")
    out += _prediction_lines(d)
    out.append("")
    shown = [m for m in d["metrics"] if not (m["before"] in (None, 0) and m["after"] in (None, 0))]
    cells = [
        (f"{m['metric']} ({u})", b_s, a_s, c) for m in shown for u, b_s, a_s, c in [metric_cells(m)]
    ]
    w = max([30, *(len(c[0]) for c in cells)])
    out.append(f"{'SIDE BY SIDE':<{w + 2}} {'BEFORE':>12} {'AFTER':>12}  change")
    for label, b_s, a_s, chg in cells:
        out.append(f"  {label:<{w}} {b_s:>12} {a_s:>12}  {chg}")
    for k, v in d["verdicts"].items():
        same = "" if v["before"] != v["after"] else "  (same)"
        out.append(f"  {k:<{w}} {v['before'] or 'n/a':>12} -> {v['after'] or 'n/a'}{same}")
    # every kind either side has (nine at most), unchanged ones too: the kernels column adds
    # up to the kernels row above
    kinds = [k for k in d["kind_changes"] if k["before_count"] or k["after_count"]]
    if kinds:
        out.append("")
        out.append(KIND_TITLE)
        for k in kinds:
            out.append(
                f"  {k['kind']:<14} {_us(k['before_us']):>11} -> {_us(k['after_us']):>11}  "
                f"({'+' if k['change_us'] >= 0 else '-'}{_us(abs(k['change_us']))}; "
                f"{kind_counts(k)})"
            )
    ops = [o for o in d["op_changes"] if abs(o["change_us"]) > 0][:TOP]
    if ops:
        out.append("")
        out.append("OPS WHOSE DEVICE TIME CHANGED MOST (per step)")
        if note := graph_note(d):
            out.append(f"  ({note})")
        for o, name in zip(ops, distinct_names([o["name"] for o in ops], 36), strict=True):
            out.append(
                f"  {name:<36} {_us(o['before_us']):>11} -> {_us(o['after_us']):>11}  "
                f"({'+' if o['change_us'] >= 0 else '-'}{_us(abs(o['change_us']))})"
            )
    kc = [k for k in d["kernel_changes"] if k["status"] != "changed"]
    if kc:
        out.append("")
        out.append("KERNELS THAT APPEARED (+) OR VANISHED (-) (normalised names, per step)")
        kw = max(12, min(50, width - 45))  # the kernel column takes what the numbers leave
        names = distinct_names([k["kernel"] for k in kc[:TOP]], kw)
        for k, name in zip(kc[:TOP], names, strict=True):
            sign = "+" if k["status"] == "appeared" else "-"
            out.append(
                f"  {sign} {name:<{kw}} {k['kind']:<13} "
                f"{k['before_count']:>5.0f} -> {k['after_count']:<5.0f} {_us(k['after_us'] if sign == '+' else k['before_us']):>11}"
            )
        if len(kc) > TOP:
            out.append(f"  ... {len(kc) - TOP} more (see --format json)")
    out.append("")
    out.append(
        f"AFTER: {(a['regime'] or 'no regime').upper()}, bottleneck: {a['bottleneck'] or 'none'}"
    )
    for e in a["evidence"][:3]:
        out.append(f"  - {e}")
    nf = d["new_findings"]
    if nf:
        out.append(f"  next fixes (Amdahl estimate against AFTER's {a['estimates_against']} step):")
        for i, f in enumerate(nf[:3], 1):
            # the title on its own line, as diagnose prints a fix
            out += [
                f"  {i}. {f['fix']}: {speedup_label(f)} -> {estimate_label(f)}",
                f"     {f['title']}",
            ]
    else:
        out.append("  no further fix worth 5% or more")
    if d["notes"]:
        out.append("")
        out.append("NOTES")
        out += [f"  - {n}" for n in d["notes"]]
    return fit("\n".join(out), width) + "\n"


def render_markdown(td) -> str:
    """Markdown for PRs and issues: the prediction check, then the side-by-side tables."""
    doc = diff_dict(td)
    d = safe_strings(doc)  # every string escaped once; the header's paths, cut shorter, from doc
    a = d["after"]
    p = d["prediction"]
    paths = (md_code(term(doc[x]["path"], HEADER_CHARS), table=False) for x in ("before", "after"))
    out = ["# tracedx diff: {} -> {}".format(*paths), ""]
    out += [f"**{md_prose(_step_line(d))}**", ""]
    if d["unrelated"]:
        out += [f"**Warning:** {md_prose(d['unrelated'])}", ""]
    src = "given" if d["fix_source"] == "given" else "inferred"
    out.append(f"**Applied fix: {md_code(d['fix'], table=False)}** ({src})")
    out.append("")
    out += [
        f"- {md_text(c['fix'])}{_weak(c)}: {md_prose(c['evidence'])}" for c in d["candidates"][:3]
    ]
    per = " per sample" if p.get("batch_scale") else ""  # the batch grew (larger-batch)
    out += [
        "",
        f"| estimate{per} | achieved{per} (traced) | achieved{per} (unprofiled) | est/achieved "
        "| verdict |",
    ]
    out.append("|---|---|---|---|---|")
    rat = ", ".join(
        f"{_ratio(v)} {k}"
        for k, v in (
            ("traced", p["estimate_over_achieved_traced"]),
            ("unprofiled", p["estimate_over_achieved_unprofiled"]),
        )
        if v is not None
    )
    out.append(
        f"| {_x(p['estimated_speedup'])} | {_x(p['achieved_speedup_traced'])} | "
        f"{_x(p['achieved_speedup_unprofiled'])} | {rat or 'n/a'} | {p['verdict']} |"
    )
    out += ["", f"Why: {md_prose(p['explanation'])}", ""]
    out += ["## Side by side", "", "| metric | before | after | change |", "|---|---|---|---|"]
    for m in d["metrics"]:
        if m["before"] in (None, 0) and m["after"] in (None, 0):
            continue
        unit, b_s, a_s, chg = metric_cells(m)
        out.append(f"| {m['metric']} ({unit}) | {b_s} | {a_s} | {chg} |")
    for k, v in d["verdicts"].items():
        out.append(
            f"| {md_text(k)} | {md_text(v['before'] or 'n/a')} | {md_text(v['after'] or 'n/a')} | |"
        )
    kinds = [k for k in d["kind_changes"] if k["before_count"] or k["after_count"]]
    if kinds:  # as in the text report
        out += ["", f"## {KIND_TITLE.capitalize()}", ""]
        out += ["| kind | before ms | after ms | change ms | GPU ops |", "|---|---|---|---|---|"]
        for k in kinds:
            out.append(
                f"| {md_text(k['kind'])} | {k['before_us'] / 1e3:.3f} | {k['after_us'] / 1e3:.3f} | "
                f"{k['change_us'] / 1e3:+.3f} | {kind_counts(k)} |"
            )
    ops = [o for o in d["op_changes"] if abs(o["change_us"]) > 0][:TOP]
    if ops:
        out += ["", "## Ops whose device time changed most (per step)", ""]
        if note := graph_note(d):
            out += [md_prose(f"{note}."), ""]
        out += ["| op | before ms | after ms | change ms |", "|---|---|---|---|"]
        for o, name in zip(ops, distinct_names([o["name"] for o in ops], 60), strict=True):
            out.append(
                f"| {md_code(name)} | {o['before_us'] / 1e3:.3f} | {o['after_us'] / 1e3:.3f} | "
                f"{o['change_us'] / 1e3:+.3f} |"
            )
    kc = [k for k in d["kernel_changes"] if k["status"] != "changed"]
    if kc:
        out += ["", "## Kernels that appeared or vanished (per step)", ""]
        out += ["| kernel | kind | status | count | device ms |", "|---|---|---|---|---|"]
        names = distinct_names([k["kernel"] for k in kc[:TOP]], 60)
        for k, name in zip(kc[:TOP], names, strict=True):
            us = k["after_us"] if k["status"] == "appeared" else k["before_us"]
            out.append(
                f"| {md_code(name)} | {md_text(k['kind'])} | {k['status']} | "
                f"{k['before_count']:.0f} -> {k['after_count']:.0f} | {us / 1e3:.3f} |"
            )
        if len(kc) > TOP:
            out += ["", f"... {len(kc) - TOP} more (see `--format json`)"]
    out += [
        "",
        f"## After: {md_text(a['regime'] or 'no regime')}, bottleneck {md_text(a['bottleneck'] or 'none')}",
        "",
    ]
    for f in d["new_findings"][:3]:
        out.append(
            f"- `{f['fix']}`: {speedup_label(f)} -> {md_prose(estimate_label(f))} ({md_prose(f['title'])})"
        )
    if not d["new_findings"]:
        out.append("- no further fix worth 5% or more")
    if d["notes"]:
        out += ["", "## Notes", ""] + [f"- {md_prose(n)}" for n in d["notes"]]
    return "\n".join(out) + "\n"


def render(td, fmt: str = "text", width: int | None = None) -> str:
    """Render a TraceDiff as ``text`` (wrapped to ``width`` columns, 100 by default), ``json``
    or ``md``. Raises ValueError for another format."""
    if fmt == "text":
        return render_text(td, width or WIDTH)
    if fmt == "json":
        return render_json(td)
    if fmt == "md":
        return render_markdown(td)
    raise ValueError(f"unknown format {fmt!r}")
