"""Markdown report (for PRs and issues): the same content as the text report, in tables."""

from __future__ import annotations

from tracedx.report.json import as_doc
from tracedx.report.safe import HEADER_CHARS, md_code, md_prose, md_text, safe_strings, term
from tracedx.report.text import _unplaced, estimate_label, shape_tag, short_name, speedup_label


def render_markdown(diag) -> str:
    doc = as_doc(diag)
    d = safe_strings(doc)  # every string escaped once; the header's path, cut shorter, from doc
    st = d["steps"]
    out = [
        f"# tracedx diagnosis: {md_code(term(doc['trace']['path'], HEADER_CHARS), table=False)}",
        "",
    ]
    out.append(
        f"**{md_text((d['regime'] or 'no regime').upper())}**, bottleneck: "
        f"**{md_text(d['bottleneck'] or 'n/a')}**"
    )
    out.append("")
    out += [f"- {md_prose(e)}" for e in d["evidence"]]
    out += ["", "| metric (median per step) | value |", "|---|---|"]
    for label, key in (
        ("step time (ms)", "step_time_ms"),
        ("CPU time (ms)", "cpu_time_ms"),
        ("GPU busy (ms)", "gpu_busy_ms"),
        ("GPU idle fraction", "idle_fraction"),
        ("kernels", "kernels_per_step"),
        ("host blocked: syncs + pageable copies (ms)", "sync_ms"),
        ("memcpy (ms)", "memcpy_ms"),
    ):
        v = st[key]
        out.append(f"| {label} | {'n/a' if v is None else format(v, '.4g')} |")
    unprof = st.get("unprofiled_step_ms")
    if isinstance(unprof, dict) and unprof.get("median") is not None:
        out.append(f"| unprofiled step (ms, timed by tracedx capture) | {unprof['median']:.4g} |")
    out += [
        "",
        "## Fixes",
        "",
        "| fix | f | s | estimated speedup | estimated time | recommended |",
        "|---|---|---|---|---|---|",
    ]
    for f in d["findings"]:
        s = "∞" if f["local_speedup_unbounded"] else f"{f['local_speedup']:.2f}"
        out.append(
            f"| `{f['fix']}` | {f['fraction']:.2f} | {s} | {speedup_label(f)} | "
            f"{estimate_label(f)} | {'yes' if f['recommended'] else 'no (< 5%)'} |"
        )
    if d["ops"]:
        out += [
            "",
            "## Top ops",
            "",
            "| op | inputs | count | device ms | FLOP/B | TFLOP/s | GB/s | of roof | regime |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for o in d["ops"][:10]:

            def f(v, fmt):
                return "-" if v is None else format(v, fmt)

            out.append(
                f"| {md_code(short_name(o['name'], 60))} | {md_text(short_name(shape_tag(o['input_shapes']), 60)) or '-'} | "
                f"{o['count']} | {o['device_time_ms']:.3f} | "
                f"{f(o['intensity'], '.1f')} | {f(o['achieved_tflops'], '.1f')} | {f(o['achieved_gbps'], '.0f')} | "
                f"{f(o['bound_fraction'], '.0%')} | {md_text(o['regime'] or _unplaced(o))} |"
            )
    notes = d["notes"] + d["trace"]["device_notes"] + [w["message"] for w in d["warnings"]]
    if notes:
        out += ["", "## Notes", ""] + [f"- {md_prose(n)}" for n in notes]
    return "\n".join(out) + "\n"
