"""Presentation methods shared by result objects (Diagnosis, TraceDiff, and the job's result).

A subclass names its renderers; every import of :mod:`tracedx.report` happens inside a method,
so analysis modules stay free of report imports at module level.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any


def _figures(figs: dict) -> dict[str, Any]:
    from tracedx.report.card import Figures, notebook_figure

    return Figures({k: notebook_figure(f) for k, f in figs.items()})


class Presentable:
    """Mixin: a few-line ``repr``, a notebook verdict card, and the report in every format.

    Subclasses set ``_present`` to ``{"repr", "card", "text", "md", "html", "json",
    "figures"}`` -> ``"module:function"`` (functions taking the object and returning a string;
    ``figures``' returns a dict of plotly figures). Dataclasses using it need
    ``@dataclass(repr=False, eq=False)``: the generated repr would replace this one, and the
    generated ``==`` compares polars tables, which raises.
    """

    _present: dict[str, str] = {}

    def _render(self, what: str, **kwargs):
        module, func = self._present[what].split(":")
        return getattr(importlib.import_module(module), func)(self, **kwargs)

    def __repr__(self) -> str:
        return self._render("repr")

    def _repr_html_(self) -> str:
        return self._render("card")

    def to_text(self) -> str:
        """The terminal report (what ``tracedx`` prints)."""
        return self._render("text")

    def to_markdown(self) -> str:
        """The report as markdown (for PRs and issues)."""
        return self._render("md")

    def to_json(self) -> str:
        """The report as its JSON document (what ``--format json`` prints)."""
        return self._render("json")

    def figures(self) -> dict[str, Any]:
        """Plotly figures of the result, by name, in report order, for notebooks: each also
        displays as HTML where a viewer does not run plotly's own output (a static notebook)."""
        return _figures(self._render("figures"))

    def to_html(self) -> str:
        """The report as one self-contained HTML page."""
        return self._render("html")

    def write_html(self, path: str | Path) -> Path:
        """Write :meth:`to_html` to ``path`` (UTF-8) and return it. Raises OSError when the
        file cannot be written."""
        p = Path(path)
        p.write_text(self.to_html(), encoding="utf-8")
        return p
