"""Kernel kinds from kernel names (the way HolisticTraceAnalysis and TraceLens do it).

Kinds: gemm, convolution, attention, elementwise, reduction, normalization, copy,
communication, other. Rules are ordered (first match wins) and match lower-cased names.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from tracedx.analysis.intervals import (
    column_by_scalar,
    grouped_ps_to_us,
    mask_of,
    rows_in_steps,
    sum_us_of,
    to_ps,
)
from tracedx.trace.collectives import COMM_KERNEL_RE

KINDS = (
    "gemm",
    "convolution",
    "attention",
    "elementwise",
    "reduction",
    "normalization",
    "copy",
    "communication",
    "other",
)
KIND_CODES = tuple(sorted(KINDS))
"""The kinds sorted by name: a kind's code is its index here (:func:`kind_codes`)."""

# (kind, regex on the lower-cased kernel name). Order matters.
_RULES: list[tuple[str, str]] = [
    ("communication", COMM_KERNEL_RE),
    ("attention", r"flash|fmha|attention|attn|sdpa|mha_|_mha|pytorch_flash"),
    (
        "convolution",
        r"conv|implicit_?gemm|winograd|fprop|dgrad|wgrad|xmma_fprop|cudnn::.*(convolve|fft)",
    ),
    ("normalization", r"norm|layer_?norm|batch_?norm|rms"),
    (
        "gemm",
        r"gemm|gemv|nvjet|cublas|cutlass|matmul|splitk|triton_tem_fused_(mm|bmm|addmm)|_mm_|xmma",
    ),
    ("reduction", r"reduce|softmax|triton_red|triton_per|cub::|argmax|argmin|\bsum\b|scan"),
    ("copy", r"copy|memcpy|memset|cat_?array|transpose|gather|scatter|index|permute|fill_kernel"),
    (
        "elementwise",
        r"elementwise|vectorized|unrolled|triton_poi|pointwise|at::native::|fill|_kernel_impl",
    ),
]


def _alternatives(rx: str) -> list[str]:
    """The top-level alternatives of a regex (split at ``|`` outside parentheses)."""
    out, depth, cur = [], 0, ""
    for ch in rx:
        if ch == "|" and depth == 0:
            out.append(cur)
            cur = ""
            continue
        depth += (ch == "(") - (ch == ")")
        cur += ch
    return [*out, cur]


_WORD = r"[a-z0-9_:]*"


def _tests(rx: str) -> tuple[tuple[str, ...], tuple[tuple[str, re.Pattern], ...]]:
    """A rule's regex as substrings (its alternatives that are plain text, ``a_?b`` as ``a_b``
    and ``ab``, ``a(b|c)`` as ``ab`` and ``ac``) and its other alternatives as (text any match
    must hold, regex): a name matches the rule when it holds one of the substrings, or holds
    a regex's text and the regex matches. Substring tests run at C speed where Python's
    regex engine tries every alternative at every position (1 ms for 60 long kernel names at
    10 MB)."""
    subs: list[str] = []
    rest: list[tuple[str, re.Pattern]] = []
    for alt in _alternatives(rx):
        if m := re.fullmatch(f"({_WORD})_\\?({_WORD})", alt):
            subs += [f"{m[1]}_{m[2]}", m[1] + m[2]]
        elif m := re.fullmatch(f"({_WORD})\\(([a-z0-9_|]+)\\)", alt):
            subs += [m[1] + x for x in m[2].split("|")]
        elif re.fullmatch(_WORD, alt):
            subs.append(alt)
        else:
            # the plain text it starts with, after anchors (less a last character that a
            # quantifier makes optional): every match holds it
            m = re.match(f"(?:\\^|\\\\b)*({_WORD})([?*{{]?)", alt)
            held = m[1][:-1] if m[2] else m[1]
            rest.append((held, re.compile(alt)))
    return tuple(subs), tuple(rest)


_COMPILED = [(kind, *_tests(rx)) for kind, rx in _RULES]


def _kind_of(low: str) -> str:
    """The kind of a lower-cased ASCII kernel name: :func:`kind_expr`'s rules in Python."""
    for kind, subs, rest in _COMPILED:
        for sub in subs:
            if sub in low:
                return kind
        for held, rx in rest:
            if held in low and rx.search(low):
                return kind
    return "other"


def kind_expr(col: str = "name") -> pl.Expr:
    """Polars expression giving the kind of each kernel from its name."""
    low = pl.col(col).str.to_lowercase()
    expr = pl.lit("other")
    for kind, rx in reversed(_RULES):
        expr = pl.when(low.str.contains(rx)).then(pl.lit(kind)).otherwise(expr)
    return expr


def is_tf32_expr(col: str = "name") -> pl.Expr:
    """True when a GEMM kernel's name says it ran on TF32 tensor cores (cuBLAS/CUTLASS names)."""
    return pl.col(col).str.to_lowercase().str.contains("tf32", literal=True)


def kernel_name_kinds(trace) -> pl.DataFrame:
    """One row per distinct kernel name of ``trace.kernels``: ``name``, ``kind``
    (:func:`kind_expr`) and ``tf32`` (:func:`is_tf32_expr`), in no set order. The name rules
    are regexes: they run once per distinct name, and once per kernels table (the analyses
    look the kinds up here)."""

    def build() -> pl.DataFrame:
        names = trace.kernels["name"].unique().to_list()
        if not all(n is not None and n.isascii() for n in names):
            return trace.kernels.select(pl.col("name").unique()).with_columns(
                kind=kind_expr("name"), tf32=is_tf32_expr("name")
            )
        return _python_kinds(names)

    return trace.memo("kernel_name_kinds", (trace.kernels,), build)


def _python_kinds(names: list[str]) -> pl.DataFrame:
    """:func:`kernel_name_kinds` of the distinct ASCII ``names`` (all of them in practice): the
    same rules with Python's re, which matches as polars' regex engine does on ASCII text (a
    few dozen names: the two polars queries with nine regex passes cost 1 ms at 10 MB)."""
    low = [n.lower() for n in names]
    return pl.DataFrame(
        {
            "name": names,
            "kind": [_kind_of(x) for x in low],
            "tf32": ["tf32" in x for x in low],
        },
        schema={"name": pl.Utf8, "kind": pl.Utf8, "tf32": pl.Boolean},
    )


def kernel_name_codes(trace) -> np.ndarray:
    """Per row of ``trace.kernels``, the row of its name in :func:`kernel_name_kinds` (uint32,
    shape (kernels,)): the names' kinds and flags become array look-ups (``kind[codes]``), each
    kernel's name hashed once per kernels table rather than once per analysis that reads it."""

    def build() -> np.ndarray:
        names = kernel_name_kinds(trace)
        k = trace.kernels["name"]
        if not k.null_count():
            # an Enum of the distinct names in their rows' order: its codes are those rows
            # (a cast, where replace_strict hashed every name: 0.4 ms at 10 MB)
            got = k.cast(pl.Enum(names["name"].to_list())).to_physical()
            return got.to_numpy().astype(np.uint32, copy=False)
        codes = pl.Series(np.arange(names.height, dtype=np.uint32))
        got = k.replace_strict(names["name"], codes, return_dtype=pl.UInt32)
        return got.to_numpy().astype(np.uint32, copy=False)  # (no names: an empty object array)

    return trace.memo("kernel_name_codes", (trace.kernels,), build)


def kind_codes(name_kinds: pl.DataFrame) -> np.ndarray:
    """The ``kind`` of each row of :func:`kernel_name_kinds` as its index in :data:`KIND_CODES`
    (the kinds sorted by name), int64."""
    return name_kinds["kind"].cast(pl.Enum(KIND_CODES)).to_physical().to_numpy().astype(np.int64)


def gpu_breakdown(trace, steps: list[int], device: int | None, n_steps: int) -> pl.DataFrame:
    """Device time by kind per step: kind, count, device_time_us (totals), per-step means, share.

    Over the GPU events of ``trace`` launched in ``steps`` on ``device`` (every device for
    None): kernels by their name's kind (:func:`kernel_name_kinds`), memcpys and memsets as
    kind ``copy``. ``count`` counts all of a kind's GPU ops; ``kernels``, ``memcpys`` and
    ``memsets`` split it (only ``copy`` has memcpys and memsets), so that the kinds' ``kernels``
    add up to the kernels a step table counts. Sorted by device time (descending),
    then kind. Times are summed as exact
    picoseconds (:func:`~tracedx.analysis.intervals.sum_us`), converted as a polars
    ``group_by`` converts them; the rows are counted and summed in numpy (the polars filter,
    group_by and sort this took cost a fixed 0.5-1 ms on a few thousand events).
    """
    copy = KIND_CODES.index("copy")
    codes, ps, source = [], [], []
    tables = (trace.kernels, trace.memcpys, trace.memsets)
    for i, t in enumerate(tables):  # source 0: kernels, 1: memcpys, 2: memsets
        on = rows_in_steps(t, steps)
        if device is not None:
            on &= mask_of(t["device"] == device)
        if i == 0:
            codes.append(kernel_kind_codes(trace)[kernel_name_codes(trace)[on]])
        else:
            codes.append(np.full(int(on.sum()), copy, dtype=np.int64))
        ps.append(to_ps(t["duration_us"].to_numpy()[on]))
        source.append(np.full(len(codes[-1]), i, dtype=np.int64))
    code, of = np.unique(np.concatenate(codes), return_inverse=True)
    if len(code) == 0:
        return pl.DataFrame(schema=_BREAKDOWN_SCHEMA)
    sums = np.zeros(len(code), dtype=np.int64)
    np.add.at(sums, of, np.concatenate(ps))
    us = grouped_ps_to_us(sums)
    kind = np.array(KIND_CODES)[code]
    order = np.lexsort((kind, -us))
    count = np.bincount(of, minlength=len(code))[order]
    by_source = np.zeros((len(code), len(tables)), dtype=np.int64)
    np.add.at(by_source, (of, np.concatenate(source)), 1)
    by_source = by_source[order]
    us = us[order]
    total = sum_us_of(us) or 1.0
    n = max(n_steps, 1)
    return pl.DataFrame(
        {
            "kind": kind[order],
            "count": count,
            "device_time_us": us,
            "count_per_step": column_by_scalar(count, n),
            "device_time_us_per_step": column_by_scalar(us, n),
            "share": column_by_scalar(us, total),
            "kernels": by_source[:, 0],
            "memcpys": by_source[:, 1],
            "memsets": by_source[:, 2],
        },
        schema=_BREAKDOWN_SCHEMA,
    )


_BREAKDOWN_SCHEMA = {
    "kind": pl.Utf8,
    "count": pl.UInt32,
    "device_time_us": pl.Float64,
    "count_per_step": pl.Float64,
    "device_time_us_per_step": pl.Float64,
    "share": pl.Float64,
    "kernels": pl.UInt32,
    "memcpys": pl.UInt32,
    "memsets": pl.UInt32,
}


def kernel_kind_codes(trace) -> np.ndarray:
    """:func:`kind_codes` of :func:`kernel_name_kinds`, computed once per kernels table."""
    return trace.memo(
        "kernel_kind_codes", (trace.kernels,), lambda: kind_codes(kernel_name_kinds(trace))
    )
