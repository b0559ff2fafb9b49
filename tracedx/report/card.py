"""Short views of result objects: a few-line ``repr`` and a notebook verdict card (HTML).

A card shows the regime and bottleneck, the median step, GPU busy and idle time, and the top
fixes with their Amdahl estimates; the full report is ``to_text()`` / ``to_html()``. Numbers
come from :func:`tracedx.report.json.diagnosis_dict`,
:func:`tracedx.report.diff_report.diff_dict` and :func:`tracedx.report.job.job_dict`; nothing
here computes one. Strings from a trace or a path go through :func:`tracedx.report.safe.term`
(and HTML escaping in a card).
"""

from __future__ import annotations

import functools
import html
from pathlib import Path
from typing import Any

TOP_FIXES = 3


def _e(x: Any) -> str:
    from tracedx.report.safe import term

    return html.escape("" if x is None else term(x), quote=True)


def _t(x: Any) -> str:
    """A trace's or a path's string for a plain-text repr: escaped, capped."""
    from tracedx.report.safe import HEADER_CHARS, term

    return term(x, HEADER_CHARS)


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f} ms"


def _name(path: str | None) -> str:
    return _t(Path(path).name) if path else "(no path)"


def _idle_cause(d: dict) -> str:
    causes = sorted(d["idle_causes"].items(), key=lambda kv: -(kv[1]["ms_per_step"] or 0))
    return f"{causes[0][0]} {causes[0][1]['ms_per_step']:.3f} ms" if causes else ""


def _steps_label(st: dict) -> str:
    if st["synthetic"]:
        return "whole trace as one step"
    return f"{st['count']} step{'s' if st['count'] != 1 else ''}"


def _verdict(d: dict) -> str:
    if not d["regime"]:
        return "no verdict (see the notes)"
    return f"{d['regime'].upper()}, bottleneck: {d['bottleneck']}"


def _busy_idle(st: dict, cause: str) -> str:
    if st["gpu_busy_ms"] is None:
        return "no GPU activity in the trace"
    idle = "n/a" if st["idle_fraction"] is None else f"{st['idle_fraction']:.0%}"
    return f"GPU busy {_ms(st['gpu_busy_ms'])}, idle {idle}" + (f" ({cause})" if cause else "")


def _fixes(d: dict) -> list[dict]:
    return [f for f in d["findings"] if f["recommended"]][:TOP_FIXES]


def diagnosis_repr(diag) -> str:
    from tracedx.report.json import diagnosis_dict
    from tracedx.report.text import speedup_label

    d = diagnosis_dict(diag)
    st = d["steps"]
    dev = _t(d["trace"]["device_name"] or "unknown device")
    fixes = ", ".join(f"{f['fix']} {speedup_label(f)}" for f in _fixes(d))
    lines = [
        f"<Diagnosis of {_name(d['trace']['path'])}: {dev}, {_steps_label(st)}>",
        f"  {_verdict(d)}",
        f"  step {_ms(st['step_time_ms'])} (median per step); " + _busy_idle(st, _idle_cause(d)),
        f"  top fixes{_against(d)}: {fixes or 'none worth 5% or more'}",
        "  (.to_text() for the full report, .figures() for plots)",
    ]
    return _fit("\n".join(lines))


def _against(d: dict) -> str:
    """`` (against the unprofiled 9.896 ms step)`` when the estimates are not against the
    traced median step the line before shows; else nothing."""
    ref = d["estimates_against"] or {}
    if ref.get("kind") != "unprofiled" or ref.get("step_ms") is None:
        return ""
    return f" (against the unprofiled {_ms(ref['step_ms'])} step)"


REPR_WIDTH = 100
"""Columns a repr's lines fit in (the text report's width when stdout is not a terminal)."""


def _fit(text: str) -> str:
    """Each line of a repr wrapped at :data:`REPR_WIDTH`, continuations indented 4 more."""
    import textwrap

    out = []
    for line in text.split("\n"):
        pad = " " * (len(line) - len(line.lstrip(" ")))
        out += textwrap.wrap(
            line,
            REPR_WIDTH,
            initial_indent="",
            subsequent_indent=pad + "    ",
            break_long_words=False,
            break_on_hyphens=False,
        ) or [line]
    return "\n".join(out)


def _card(title: str, subtitle: str, verdict: str, rows: list[tuple[str, str]], fixes: str) -> str:
    body = "".join(
        f"<tr><th style='text-align:left;padding-right:1em;font-weight:normal;color:#555'>"
        f"{_e(k)}</th><td style='text-align:left'>{_e(v)}</td></tr>"
        for k, v in rows
    )
    return (
        "<div class='tracedx-card' style='border:1px solid #bbb;border-radius:6px;"
        "padding:0.6em 1em;max-width:46em;font-family:sans-serif;line-height:1.4'>"
        f"<div style='color:#555'>{_e(title)} · {_e(subtitle)}</div>"
        f"<div class='tracedx-verdict' style='font-size:1.2em;font-weight:bold;margin:0.3em 0'>"
        f"{_e(verdict)}</div><table style='border-collapse:collapse'>{body}</table>{fixes}</div>"
    )


def _fix_list(fixes: list[dict], against: str) -> str:
    if not fixes:
        return "<p>No fix is worth 5% or more.</p>"
    from tracedx.report.text import estimate_label, speedup_label

    items = "".join(
        f"<li><code>{_e(f['fix'])}</code>: <b>{_e(speedup_label(f))}</b> -> "
        f"{_e(estimate_label(f))}. {_e(f['title'])}</li>"
        for f in fixes
    )
    return (
        f"<div style='margin-top:0.4em'>Top fixes (Amdahl estimate against "
        f"{'' if against.startswith('AFTER') else 'the '}{_e(against)} "
        f"step):</div><ol class='tracedx-fixes' style='margin-top:0.2em'>{items}</ol>"
    )


def diagnosis_card(diag) -> str:
    from tracedx.report.json import diagnosis_dict

    d = diagnosis_dict(diag)
    st = d["steps"]
    rows = [("step", f"{_ms(st['step_time_ms'])} median per step")]
    rows.append(("GPU", _busy_idle(st, _idle_cause(d)) + " (median per step)"))
    u = st.get("unprofiled_step_ms") or {}
    if u.get("median"):
        bad = "; cannot be right, not used" if u.get("implausible") else ""
        rows.append(
            ("unprofiled step", f"{_ms(u['median'])} median, timed by tracedx capture{bad}")
        )
    if d["notes"]:
        rows.append(("notes", f"{len(d['notes'])} (see .to_text())"))
    against = (d["estimates_against"] or {}).get("kind") or "traced"
    return _card(
        f"tracedx · {_name(d['trace']['path'])}",
        f"{d['trace']['device_name'] or 'unknown device'}, {_steps_label(st)}",
        _verdict(d),
        rows,
        _fix_list(_fixes(d), against),
    )


def _trace_facts(trace) -> tuple[str, list[tuple[str, str]]]:
    n = trace.steps.height
    steps = "no ProfilerStep markers" if trace.steps_synthetic else f"{n} step{'s' * (n != 1)}"
    rows = [
        ("steps", steps),
        ("events", f"{trace.kernels.height:,} kernels, {trace.memcpys.height:,} memcpys, "
         f"{trace.ops.height:,} CPU ops"),
    ]  # fmt: skip
    if trace.metadata.get("pytorch_version"):
        rows.append(("PyTorch", str(trace.metadata["pytorch_version"])))
    if trace.warnings:
        n = len(trace.warnings)
        rows.append(("warnings", f"{n} warning{'s' * (n != 1)} (see .warnings)"))
    return trace.device_name or "unknown device", rows


def trace_repr(trace) -> str:
    dev, rows = _trace_facts(trace)
    vals = [f"PyTorch {v}" if k == "PyTorch" else v for k, v in rows]
    return _fit(f"<Trace {_name(trace.path)}: {dev}; " + "; ".join(vals) + ">")


def trace_card(trace) -> str:
    dev, rows = _trace_facts(trace)
    return _card(
        f"tracedx trace · {_name(trace.path)}",
        dev,
        "not diagnosed yet: tracedx.diagnose(trace)",
        rows,
        "",
    )


def _diff_verdict(d: dict) -> str:
    c = d["step_change"]
    if c["regression"]:
        return f"REGRESSION: {c['summary']}"
    p = d["prediction"]
    if d["fix"] == "unknown":
        return f"{c['summary']}; fix not identified"
    return f"{c['summary']}; fix {d['fix']}: {p['verdict']}"


def _diff_rows(d: dict) -> list[tuple[str, str]]:
    p = d["prediction"]
    rows = [
        ("estimate", "none" if p["estimated_speedup"] is None else f"{p['estimated_speedup']:.2f}x"),
        ("achieved", ", ".join(
            f"{v:.2f}x {k}" for k, v in (("traced", p["achieved_speedup_traced"]),
                                         ("unprofiled", p["achieved_speedup_unprofiled"]))
            if v is not None) or "n/a"),
        ("verdicts", f"{d['before']['regime'] or 'none'} -> {d['after']['regime'] or 'none'}"),
    ]  # fmt: skip
    if d["unrelated"]:
        rows.insert(0, ("warning", d["unrelated"]))
    if d["notes"]:
        rows.append(("notes", f"{len(d['notes'])} (see .to_text())"))
    return rows


def diff_repr(td) -> str:
    from tracedx.report.diff_report import diff_dict

    d = diff_dict(td)
    rows = "; ".join(f"{k} {_t(v)}" for k, v in _diff_rows(d))
    return _fit(
        f"<TraceDiff {_name(d['before']['path'])} -> {_name(d['after']['path'])}>\n"
        f"  {_diff_verdict(d)}\n  {rows}\n  (.to_text() for the full report, .figures() for plots)"
    )


def diff_card(td) -> str:
    from tracedx.report.diff_report import diff_dict

    d = diff_dict(td)
    after = [f for f in d["new_findings"]][:TOP_FIXES]
    return _card(
        f"tracedx diff · {_name(d['before']['path'])} -> {_name(d['after']['path'])}",
        d["before"]["device_name"] or "unknown device",
        _diff_verdict(d),
        _diff_rows(d),
        _fix_list(after, f"AFTER's {d['after']['estimates_against']}"),
    )


def _job_verdict(d: dict) -> str:
    from tracedx.report.job import verdict_line

    return verdict_line(d, "no verdict (see the notes)")


def _job_head(d: dict) -> str:
    n, nums = len(d["ranks"]), d["steps"]["numbers"]
    head = f"{n} rank{'s' if n != 1 else ''}"
    if nums:
        head += f", {len(nums)} step{'s' if len(nums) != 1 else ''} ({nums[0]}..{nums[-1]})"
    return head


def _job_rows(d: dict) -> list[tuple[str, str]]:
    from tracedx.job.diagnosis import typical_rank

    st = d["steps"]
    pe = st["parallel_efficiency"]
    # the median rank's figures; with an even number of ranks what that median is
    n = len(d["ranks"])
    scope = f" ({typical_rank(n)})" if n % 2 == 0 else ""
    rows = [
        ("step", f"{_ms(st['step_time_ms'])} (per step the median over ranks, then over steps)"),
        ("compute", f"{_ms(st['compute_ms'])}{scope}"),
        (
            "exposed wait",
            f"{_ms(st['exposed_wait_ms'])}, transfer {_ms(st['exposed_transfer_ms'])}{scope}",
        ),
        (
            "parallel efficiency",
            "n/a" if pe is None else f"{pe:.0%} (POP's: mean compute over ranks / step)",
        ),
    ]
    if d["notes"]:
        rows.append(("notes", f"{len(d['notes'])} (see .to_text())"))
    return rows


def _no_fixes(d: dict) -> str:
    """Why a job's repr lists no fix: none worth 5%, or none estimated (ranks that never ran
    at the same time share no step to estimate against)."""
    if d["collectives"]["clock"].get("runs_apart"):
        return "none estimated (the ranks never ran at the same time: no job step T)"
    return "none worth 5% or more"


def job_repr(jd) -> str:
    """``<JobDiagnosis: N ranks, S steps (a..b)>``, the verdict, the step and the top fixes."""
    from tracedx.report.job import job_dict
    from tracedx.report.text import speedup_label

    d = job_dict(jd)
    fixes = ", ".join(f"{f['fix']} {speedup_label(f)}" for f in _fixes(d))
    rows = "; ".join(f"{k} {v}" for k, v in _job_rows(d))
    return _fit(
        f"<JobDiagnosis: {_job_head(d)}>\n  {_t(_job_verdict(d))}\n  {rows}\n"
        f"  top fixes: {fixes or _no_fixes(d)}\n"
        "  (.to_text() for the full report, .figures() for plots, .write_html(path) for the job page)"
    )


def job_card(jd) -> str:
    """The job's verdict card (HTML, no script): verdict, typical step, top fixes."""
    from tracedx.report.job import job_dict

    d = job_dict(jd)
    return _card(
        "tracedx · job",
        _job_head(d),
        _job_verdict(d),
        _job_rows(d),
        _fix_list(_fixes(d), "typical"),
    )


class _NotebookFigure:
    """Mixin for a plotly Figure: its MIME bundle also carries ``text/html`` (plotly.js from
    its CDN), which static notebook viewers (nbconvert, a code host's viewer) show where
    they do not render plotly's own MIME type."""

    def _repr_mimebundle_(self, include=None, exclude=None, validate=True, **kwargs):
        bundle = super()._repr_mimebundle_(include, exclude, validate, **kwargs) or {}
        if "text/html" not in bundle:
            bundle["text/html"] = self.to_html(include_plotlyjs="cdn", full_html=False)
        bundle.setdefault("text/plain", repr(self))  # what a terminal (IPython) shows
        return bundle

    def __repr__(self) -> str:
        # plotly's repr is the figure's whole JSON: hundreds of lines in a terminal
        title = self.layout.title.text if self.layout.title else None
        what = f" {_t(title)!r}" if title else ""
        n = len(self.data)
        return (
            f"<plotly Figure{what}: {n} trace{'s' * (n != 1)}; .show(), "
            ".write_html(path), .to_dict()>"
        )

    def _ipython_display_(self):
        # plotly's own display sends only the renderer's MIME types; send the bundle above
        import plotly.io as pio
        from IPython.display import display

        if not (pio.renderers.render_on_display and pio.renderers.default):
            return super()._ipython_display_()
        display(self._repr_mimebundle_(), raw=True)


class Figures(dict):
    """A result's figures by name (a dict), with a short repr: one line per figure."""

    def __repr__(self) -> str:
        return "{" + ",\n ".join(f"{k!r}: {v!r}" for k, v in self.items()) + "}"


def notebook_figure(fig):
    """``fig`` (a plotly ``go.Figure``) as a Figure whose notebook display has an HTML
    fallback; the figure itself (data, layout) is unchanged."""
    fig.__class__ = _figure_class()
    return fig


@functools.cache
def _figure_class():
    import plotly.graph_objects as go

    return type("Figure", (_NotebookFigure, go.Figure), {"__module__": __name__})
