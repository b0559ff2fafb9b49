"""Renderers: text, json, markdown (and html in :mod:`.html`). Nothing here computes a number."""

from __future__ import annotations


def render(diag, fmt: str = "text", width: int | None = None) -> str:
    """Render a Diagnosis, or its ``tracedx.diagnosis/1`` document (a dict: a cached result),
    as ``text`` (wrapped to ``width`` columns, 100 by default), ``json`` or ``md``: the same
    report from either. Raises ValueError for another format."""
    if fmt == "text":
        from tracedx.report.text import WIDTH, render_text

        return render_text(diag, width or WIDTH)
    if fmt == "json":
        from tracedx.report.json import render_json

        return render_json(diag)
    if fmt == "md":
        from tracedx.report.markdown import render_markdown

        return render_markdown(diag)
    raise ValueError(f"unknown format {fmt!r}")
