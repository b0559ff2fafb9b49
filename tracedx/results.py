"""Presentation methods shared by result objects (Diagnosis, TraceDiff, and the job's result).

A subclass names its renderers; every import of :mod:`tracedx.report` happens inside a method,
so analysis modules stay free of report imports at module level.
"""

from __future__ import annotations

import importlib
from pathlib import Path


class Presentable:
    """Mixin: a few-line ``repr``, a notebook verdict card, and the report in every format.

    Subclasses set ``_present`` to ``{"repr", "card", "text", "md", "html"}`` -> ``"module:function"``
    (functions taking the object and returning a string). Dataclasses using it need
    ``@dataclass(repr=False)`` so the generated repr does not replace this one.
    """

    _present: dict[str, str] = {}

    def _render(self, what: str) -> str:
        module, func = self._present[what].split(":")
        return getattr(importlib.import_module(module), func)(self)

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

    def to_html(self) -> str:
        """The report as one self-contained HTML page."""
        return self._render("html")

    def write_html(self, path: str | Path) -> Path:
        """Write :meth:`to_html` to ``path`` (UTF-8) and return it. Raises OSError when the
        file cannot be written."""
        p = Path(path)
        p.write_text(self.to_html(), encoding="utf-8")
        return p
