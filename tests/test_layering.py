"""Data flows one way: read -> tables -> per-rank summary -> cross-rank -> findings -> reports.

Scanned from the source (ast), so a new import that breaks the direction fails here:
- the reader and the analysis (``tracedx/trace``, ``tracedx/analysis``, ``tracedx/job``) import
  ``tracedx.report`` or the CLI only lazily, inside a result object's presentation method;
- no report module and analysis module import each other, at any level (a lazy import
  included): a report reads the analysis, never the other way round.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "tracedx"
ANALYSIS = ("trace", "analysis", "job")
PRESENTATION = {
    "to_dict",
    "to_json",
    "to_text",
    "to_markdown",
    "to_html",
    "_repr_html_",
    "__repr__",
    "figures",
    "figure",
    "write_html",
}


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, str | None]]:
    """(imported module, enclosing function name or None at module level)."""
    tree = ast.parse(path.read_text())
    out: list[tuple[str, str | None]] = []

    def visit(node: ast.AST, func: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            f = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Import):
                out.extend((a.name, func) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                out.append((child.module, func))
                # `from tracedx.report import figures` imports tracedx.report.figures
                out.extend((f"{child.module}.{a.name}", func) for a in child.names)
            visit(child, f)

    visit(tree, None)
    return [(m, f) for m, f in out if m.startswith("tracedx")]


def _all() -> dict[str, list[tuple[str, str | None]]]:
    mods = {_module(p): _imports(p) for p in PKG.rglob("*.py")}
    return {m: [(t, f) for t, f in imps if t in mods] for m, imps in mods.items()}


def test_analysis_imports_reports_only_in_presentation_methods():
    bad = []
    for mod, imps in _all().items():
        if mod.split(".")[1:2] and mod.split(".")[1] in ANALYSIS:
            for target, func in imps:
                if target.startswith(("tracedx.report", "tracedx.cli")) and (
                    func not in PRESENTATION
                ):
                    bad.append(f"{mod} imports {target} in {func or 'module scope'}")
    assert not bad, bad


def _layer(mod: str) -> str:
    return mod.split(".")[1] if mod.count(".") else ""


def test_reports_and_analysis_never_import_each_other():
    graph = {m: {t for t, _ in imps} for m, imps in _all().items()}
    pairs = sorted(
        (a, b)
        for a, ts in graph.items()
        for b in ts
        if _layer(a) == "report" and _layer(b) in ANALYSIS and a in graph.get(b, ())
    )
    assert not pairs, pairs


def test_scanner_sees_lazy_imports():
    """The scan is not vacuous: it finds Diagnosis.to_dict's lazy import of the JSON report."""
    imps = _all()["tracedx.analysis.diagnosis"]
    assert ("tracedx.report.json", "to_dict") in imps
