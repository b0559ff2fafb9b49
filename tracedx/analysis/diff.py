"""``diff(a, b, fix=None) -> TraceDiff``: the re-measure step of the method.

The method (measure, classify, fix, re-measure) ends with re-measuring, because a fix moves
the bottleneck. ``diff`` diagnoses BEFORE and AFTER and puts
them side by side: step time, GPU busy, idle fraction, kernels, copies, syncs, regime and
bottleneck; the op names and kernel kinds whose device time changed most; the kernels that
appeared or vanished (grouped by a normalised name); AFTER's new top findings.

Then it checks the prediction. BEFORE's diagnosis carries an Amdahl estimate per fix id
(:mod:`tracedx.analysis.findings`); ``diff`` names the fix AFTER most likely applied, from the
evidence in the two traces (or takes it from ``fix=``), and sets the estimate next to the
achieved speedup: the ratio of the traced median step times and, when both traces carry
``tracedx capture --time-unprofiled`` timings, of the unprofiled medians. A miss gets a
one-line explanation built from the two step models.

Units: times are microseconds (``_us``) in tables and milliseconds (``_ms``) where named;
counts and bytes are per step (the mean over the analysed steps) unless named ``median``.
Speedups are ratios BEFORE / AFTER (> 1 is faster).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from tracedx.analysis import findings as fx
from tracedx.analysis.diagnosis import Diagnosis, diagnose
from tracedx.analysis.findings import MIN_SCORE, ON_TARGET
from tracedx.analysis.kernels import kind_expr
from tracedx.analysis.timeline import sync_calls
from tracedx.errors import TraceError
from tracedx.results import Presentable
from tracedx.trace import Trace

UNKNOWN = "unknown"
HALF_DTYPES = ("c10::BFloat16", "c10::Half", "BFloat16", "Half", "bfloat16", "half")


# --- kernel names ----------------------------------------------------------------------------

_WRAPPERS = re.compile(r"(^|::)(Kernel2?|device_kernel|kernel|launch_kernel)$")


def _strip_templates(s: str) -> tuple[str, str | None]:
    """Remove every ``<...>`` (nested) from ``s``; also return the first template argument."""
    out: list[str] = []
    first: list[str] = []
    depth = 0
    seen_first = False
    for ch in s:
        if ch == "<":
            depth += 1
            continue
        if ch == ">" and depth:
            depth -= 1
            if depth == 0:
                seen_first = True
            continue
        if depth == 0:
            out.append(ch)
        elif not seen_first:
            first.append(ch)
    arg = "".join(first).split(",")[0].strip() if first else None
    return "".join(out), arg


def normalize_kernel_name(name: str) -> str:
    """A kernel's family name: template arguments, parameter lists, tile sizes and hashes removed.

    ``void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, ...>(...)``
    -> ``at::native::vectorized_elementwise_kernel``; ``triton_poi_fused_add_mul_0`` ->
    ``triton_poi_fused_add_mul``; ``void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(...)``
    -> ``cutlass_80_tensorop_s1688gemm_nn`` (a generic wrapper takes its first template argument).
    Precision markers (``tf32``, ``bf16``, ``f16``) are kept, so a change of math mode shows as
    one family vanishing and another appearing.
    """
    s = (name or "").strip()
    s = s.replace("(anonymous namespace)", "anon")
    s = re.sub(r"^void\s+", "", s)
    bare, arg = _strip_templates(s)
    bare = bare.split("(")[0].strip()
    if arg and _WRAPPERS.search(bare) and re.match(r"^[A-Za-z_][\w:]*$", arg):
        bare = arg.split("::")[-1] if arg.startswith("cutlass") else arg
    s = bare
    s = re.sub(r"_\d+x\d+(x\d+)*", "", s)  # tile sizes
    s = re.sub(r"_align\d+", "", s)
    s = re.sub(r"_[0-9a-f]{8,}\b", "", s)  # hashes
    if s.startswith("triton_"):
        s = re.sub(r"_\d+$", "", s)
    s = re.sub(r"\s+", " ", s).strip()
    return s or (name or "")


def gemm_precision(name: str) -> str:
    """The math a GEMM kernel ran, read from its cuBLAS/CUTLASS/nvjet name.

    Returns ``tf32``, ``half`` (bf16 or fp16), ``fp32`` or ``unknown``. CUTLASS ``tensorop``
    kernels named ``s1688gemm``/``s16816gemm`` take fp32 operands on tensor cores, i.e. TF32.
    """
    n = (name or "").lower()
    if "tf32" in n or re.search(r"tensorop_s\d+gemm", n):
        return "tf32"
    if re.search(r"bf16|bfloat16|f16|fp16|half|hgemm|h\d{3,5}gemm|_hsh|_hss|_bss|_bsb|_h_", n):
        return "half"
    if re.search(r"sgemm|f32f32_f32f32|_sss|simt_s|gemm_f32", n):
        return "fp32"
    return "unknown"


# --- per-trace evidence ----------------------------------------------------------------------


@dataclass
class Signals:
    """The per-step evidence one trace gives for each fix (means over the analysed steps).

    Times in us per step, bytes per step, counts per step; ``gemm_*_us`` are device time of
    GEMM/convolution ops by the precision they ran in.
    """

    steps: int
    step_us: float | None
    graph_launches: float = 0.0
    kernels: float = 0.0
    triton_kernels: float = 0.0
    triton_us: float = 0.0
    eager_fusable_kernels: float = 0.0
    eager_fusable_us: float = 0.0
    gemm_kernels: dict[str, float] = field(default_factory=dict)
    gemm_us: dict[str, float] = field(default_factory=dict)
    gemm_op_us: dict[str, float] = field(default_factory=dict)
    sync_calls: float = 0.0
    sync_us: float = 0.0
    dataloader_us: float = 0.0
    memcpys: float = 0.0
    memsets: float = 0.0
    pageable_bytes: float = 0.0
    pinned_bytes: float = 0.0
    attention_kernels: float = 0.0
    attention_us: float = 0.0
    square_softmax_us: float = 0.0


def _primary_kernels(d: Diagnosis) -> pl.DataFrame:
    k = d.trace.kernels.filter(pl.col("step").is_in(d.steps))
    if d.primary_device is not None:
        k = k.filter(pl.col("device") == d.primary_device)
    return k.with_columns(kkind=kind_expr("name"))


def _op_precision(ops: pl.DataFrame) -> pl.DataFrame:
    """GEMM/conv/attention op groups of an op table with a ``prec`` column (tf32/half/fp32)."""
    if ops.height == 0:
        return ops.with_columns(prec=pl.lit(None, pl.Utf8))
    if "family" in ops.columns:
        mm = ops.filter(
            pl.col("family").is_in(["gemm", "conv"])
            | (pl.col("family").is_null() & pl.col("kernel_kind").is_in(["gemm", "convolution"]))
        )
    else:
        mm = ops.filter(pl.col("kernel_kind").is_in(["gemm", "convolution"]))
    dts = pl.col("input_dtypes").fill_null(pl.lit([], pl.List(pl.Utf8)))
    half = dts.list.eval(pl.element().is_in(list(HALF_DTYPES))).list.any()
    cd = pl.col("compute_dtype") if "compute_dtype" in mm.columns else pl.lit(None, pl.Utf8)
    return mm.with_columns(
        prec=pl.when(cd.is_in(["bf16", "fp16"]) | half)
        .then(pl.lit("half"))
        .when(pl.col("math_mode") == "tf32")
        .then(pl.lit("tf32"))
        .when(cd == "fp32")
        .then(pl.lit("fp32"))
        .when(dts.list.contains("float"))
        .then(pl.lit("fp32"))
        .otherwise(pl.lit("unknown"))
    )


def signals(d: Diagnosis) -> Signals:
    """Collect the per-step evidence :func:`infer_fix` compares between two traces."""
    t = d.trace
    n = max(len(d.steps), 1)
    s = Signals(steps=len(d.steps), step_us=_median_step_us(d))
    k = _primary_kernels(d)
    s.kernels = k.height / n
    s.graph_launches = (
        t.launches.filter(pl.col("step").is_in(d.steps) & (pl.col("api_kind") == "graph")).height
        / n
    )
    tri = k.filter(pl.col("name").str.contains(r"^triton_|\btriton_"))
    s.triton_kernels = tri.height / n
    s.triton_us = float(tri["duration_us"].sum()) / n
    eager = k.filter(
        pl.col("kkind").is_in(["elementwise", "reduction", "normalization"])
        & ~pl.col("name").str.contains("triton_")
    )
    s.eager_fusable_kernels = eager.height / n
    s.eager_fusable_us = float(eager["duration_us"].sum()) / n
    g = k.filter(pl.col("kkind").is_in(["gemm", "convolution"]))
    if g.height:
        g = g.with_columns(prec=pl.col("name").map_elements(gemm_precision, return_dtype=pl.Utf8))
        for p, c, us in g.group_by("prec").agg(pl.len(), pl.col("duration_us").sum()).rows():
            s.gemm_kernels[p] = c / n
            s.gemm_us[p] = float(us) / n
    op = _op_precision(d.op_table)
    if op.height:
        for p, us in op.group_by("prec").agg(pl.col("device_time_us").sum()).rows():
            s.gemm_op_us[p] = float(us) / n
    sc = sync_calls(t).filter(
        pl.col("step").is_in(d.steps) & (pl.col("blocking_reason") != "pageable memcpy")
    )
    s.sync_calls = sc.height / n
    s.sync_us = float(sc["duration_us"].sum()) / n
    s.dataloader_us = d.model.dataloader_us if d.model is not None else 0.0
    m = t.memcpys.filter(pl.col("step").is_in(d.steps))
    if d.primary_device is not None:
        m = m.filter(pl.col("device") == d.primary_device)
    host_mem = (
        pl.when(pl.col("direction") == "HtoD")
        .then(pl.col("src_memory"))
        .when(pl.col("direction") == "DtoH")
        .then(pl.col("dst_memory"))
    )
    s.memcpys = m.height / n
    mset = t.memsets.filter(pl.col("step").is_in(d.steps))
    if d.primary_device is not None:
        mset = mset.filter(pl.col("device") == d.primary_device)
    s.memsets = mset.height / n
    m = m.with_columns(hm=host_mem)
    s.pageable_bytes = float(m.filter(pl.col("hm") == "Pageable")["bytes"].sum() or 0) / n
    s.pinned_bytes = float(m.filter(pl.col("hm") == "Pinned")["bytes"].sum() or 0) / n
    att = k.filter(pl.col("kkind") == "attention")
    s.attention_kernels = att.height / n
    s.attention_us = float(att["duration_us"].sum()) / n
    ot = d.op_table
    if ot.height and "input_shapes" in ot.columns:
        sm = ot.filter(
            pl.col("name").str.contains("softmax") & ~pl.col("name").str.contains("backward")
        )
        sq = 0.0
        for r in sm.iter_rows(named=True):
            shp = (r["input_shapes"] or [[]])[0] or []
            if len(shp) >= 2 and shp[-1] >= 128 and shp[-2] >= 128:
                sq += r["device_time_us"] or 0.0
        s.square_softmax_us = sq / n
    return s


def _median_step_us(d: Diagnosis) -> float | None:
    w = d.windows
    if d.primary_device is not None:
        w = w.filter(pl.col("device") == d.primary_device)
    v = w["step_time_us"].drop_nulls()
    return float(v.median()) if v.len() else None


def batch_scale(before: Diagnosis, after: Diagnosis) -> tuple[float | None, str]:
    """The factor by which the batch grew, read from the shapes of the ops with device time.

    For each op name among BEFORE's 20 costliest, the dominant input shapes of BEFORE and AFTER
    are compared (ops whose inputs record no dimension, such as the foreach optimizer ops'
    TensorLists, are left out); when every dimension that changed grew by one same factor k > 1
    the op votes k, weighted by its device time. Returns (k, evidence) when votes covering at least half of
    the compared device time agree, else (None, "").
    """
    a, b = before.op_table, after.op_table
    if a.height == 0 or b.height == 0 or "input_shapes" not in a.columns:
        return None, ""

    def dominant(t: pl.DataFrame) -> dict[str, tuple[list, float]]:
        out: dict[str, tuple[list, float]] = {}
        for r in t.sort("device_time_us", descending=True).iter_rows(named=True):
            if r["name"] not in out and r["input_shapes"]:
                out[r["name"]] = (r["input_shapes"], r["device_time_us"] or 0.0)
        return out

    da, db = dominant(a), dominant(b)
    names = sorted(da, key=lambda x: -da[x][1])[:20]
    votes: dict[float, float] = {}
    compared = 0.0
    for nm in names:
        if nm not in db:
            continue
        sa, w = da[nm]
        sb = db[nm][0]
        if not any(sa) and not any(sb):
            # no dimension recorded (TensorList inputs: foreach optimizer ops): no vote either way
            continue
        compared += w
        if len(sa) != len(sb) or any(
            len(x or []) != len(y or []) for x, y in zip(sa, sb, strict=True)
        ):
            continue
        ratios = {
            round(y / x, 3)
            for xs, ys in zip(sa, sb, strict=True)
            for x, y in zip(xs or [], ys or [], strict=True)
            if x and y and x != y
        }
        if len(ratios) == 1:
            k = ratios.pop()
            if k > 1:
                votes[k] = votes.get(k, 0.0) + w
    if not votes or compared <= 0:
        return None, ""
    k, w = max(votes.items(), key=lambda kv: kv[1])
    if w < 0.5 * compared:
        return None, ""
    return (
        k,
        f"input shapes grew {k:g}x in one dimension for ops holding {w / compared:.0%} of the compared device time",
    )


# --- which fix was applied -------------------------------------------------------------------


@dataclass
class FixEvidence:
    """One candidate fix with how strongly the two traces point at it (0..1) and why."""

    fix: str
    score: float
    evidence: str


def _ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1e3:.3f} ms"


def _per(v: float) -> str:
    return f"{v:.0f}" if v >= 10 or v == int(v) else f"{v:.1f}"


def infer_fix(before: Diagnosis, after: Diagnosis) -> list[FixEvidence]:
    """Candidate fixes AFTER applied, strongest first (score >= 0.3 listed).

    Rules (per step, BEFORE -> AFTER): cudaGraphLaunch appeared -> ``cuda-graphs``; Triton kernels
    appeared and eager elementwise kernels vanished -> ``torch-compile``; GEMM kernels gained TF32
    (or fp32 GEMM time fell >= 1.8x with fp32 inputs) -> ``tf32``; GEMM ops moved to bf16/fp16
    inputs or kernels -> ``bf16-autocast``; sync calls dropped -> ``remove-host-sync``; DataLoader
    time on the main thread dropped -> ``dataloader-workers``; pageable copies became pinned ->
    ``pinned-memory``; attention kernels appeared and softmax over square scores vanished ->
    ``fused-attention``; op input shapes grew by one factor -> ``larger-batch``.
    """
    sa, sb = signals(before), signals(after)
    out: list[FixEvidence] = []
    T = sa.step_us or 1.0

    if sb.graph_launches >= 1 and sa.graph_launches < 0.5:
        out.append(
            FixEvidence(
                "cuda-graphs",
                1.0,
                f"cudaGraphLaunch appeared: {_per(sa.graph_launches)} -> {_per(sb.graph_launches)} per step",
            )
        )
    if sb.triton_kernels > sa.triton_kernels and sb.triton_kernels >= 1:
        drop = sa.eager_fusable_kernels - sb.eager_fusable_kernels
        vanished = drop >= 1 and drop >= 0.2 * max(sa.eager_fusable_kernels, 1)
        out.append(
            FixEvidence(
                "torch-compile",
                0.9 if vanished else 0.5,
                f"Triton kernels appeared ({_per(sa.triton_kernels)} -> {_per(sb.triton_kernels)} per step)"
                + (
                    f" and eager elementwise/reduction kernels fell {_per(sa.eager_fusable_kernels)} -> "
                    f"{_per(sb.eager_fusable_kernels)} per step"
                    if vanished
                    else ""
                ),
            )
        )
    # precision of the GEMMs
    ka, kb = sa.gemm_kernels, sb.gemm_kernels
    oa, ob = sa.gemm_op_us, sb.gemm_op_us
    tot_a = sum(oa.values()) or 0.0
    tot_b = sum(ob.values()) or 0.0
    half_a = oa.get("half", 0.0) / tot_a if tot_a else 0.0
    half_b = ob.get("half", 0.0) / tot_b if tot_b else 0.0
    khalf_a = ka.get("half", 0.0) / (sum(ka.values()) or 1.0)
    khalf_b = kb.get("half", 0.0) / (sum(kb.values()) or 1.0)
    if half_b - half_a >= 0.5 or (not tot_b and khalf_b - khalf_a >= 0.5):
        out.append(
            FixEvidence(
                "bf16-autocast",
                0.9,
                f"GEMM/conv ops in bf16/fp16: {half_a:.0%} -> {half_b:.0%} of their device time"
                + (
                    f"; bf16/fp16 GEMM kernels {_per(ka.get('half', 0))} -> {_per(kb.get('half', 0))} per step"
                    if kb.get("half")
                    else ""
                ),
            )
        )
    elif khalf_b - khalf_a >= 0.5:
        out.append(
            FixEvidence(
                "bf16-autocast",
                0.7,
                f"GEMM kernel names moved to bf16/fp16: {khalf_a:.0%} -> {khalf_b:.0%} of GEMM kernels",
            )
        )
    tf_a = ka.get("tf32", 0.0) / (sum(ka.values()) or 1.0)
    tf_b = kb.get("tf32", 0.0) / (sum(kb.values()) or 1.0)
    if tf_b - tf_a >= 0.5:
        out.append(
            FixEvidence(
                "tf32",
                0.9,
                f"fp32 GEMM kernels gained TF32: {tf_a:.0%} -> {tf_b:.0%} of GEMM kernels "
                f"(GEMM device time {_ms(sum(sa.gemm_us.values()))} -> {_ms(sum(sb.gemm_us.values()))} per step)",
            )
        )
    else:
        f32a, f32b = oa.get("fp32", 0.0), ob.get("fp32", 0.0) + ob.get("tf32", 0.0)
        if (
            tot_a
            and f32a >= 0.5 * tot_a
            and half_b < 0.5
            and f32b > 0
            and f32a / f32b >= 1.8
            and f32a - f32b >= 0.1 * T
        ):
            out.append(
                FixEvidence(
                    "tf32",
                    0.6,
                    f"fp32 GEMM device time fell {f32a / f32b:.1f}x ({_ms(f32a)} -> {_ms(f32b)} per step) "
                    "with inputs still fp32",
                )
            )
    if sa.attention_kernels < sb.attention_kernels and sb.attention_kernels >= 1:
        gone = sa.square_softmax_us > 0 and sb.square_softmax_us <= 0.5 * sa.square_softmax_us
        out.append(
            FixEvidence(
                "fused-attention",
                0.95 if gone else 0.5,
                f"fused attention kernels appeared ({_per(sa.attention_kernels)} -> {_per(sb.attention_kernels)} per step)"
                + (
                    f" and softmax over square score matrices fell {_ms(sa.square_softmax_us)} -> "
                    f"{_ms(sb.square_softmax_us)} per step"
                    if gone
                    else ""
                ),
            )
        )
    # BEFORE already had worker processes: less DataLoader time on the main thread is another
    # fix's doing (pin_memory's thread takes the batches), not workers
    had_workers = before.model is not None and before.model.dataloader_multiprocess
    if (
        not had_workers
        and sa.dataloader_us >= 0.05 * T
        and sb.dataloader_us <= 0.5 * sa.dataloader_us
    ):
        out.append(
            FixEvidence(
                "dataloader-workers",
                0.88,
                f"DataLoader time on the main thread fell {_ms(sa.dataloader_us)} -> {_ms(sb.dataloader_us)} per step",
            )
        )
    if (
        sa.pageable_bytes >= 2**20
        and sb.pageable_bytes <= 0.5 * sa.pageable_bytes
        and sb.pinned_bytes >= 0.5 * sa.pageable_bytes
    ):
        out.append(
            FixEvidence(
                "pinned-memory",
                0.85,
                f"pageable copies became pinned: pageable {sa.pageable_bytes / 2**20:.1f} -> "
                f"{sb.pageable_bytes / 2**20:.1f} MiB, pinned {sa.pinned_bytes / 2**20:.1f} -> "
                f"{sb.pinned_bytes / 2**20:.1f} MiB per step",
            )
        )
    if sa.sync_calls >= 1 and sb.sync_calls <= 0.5 * sa.sync_calls:
        # a sync that blocked under 2% of the step is a by-product of another fix
        out.append(
            FixEvidence(
                "remove-host-sync",
                0.8 if sa.sync_us - sb.sync_us >= 0.02 * T else 0.3,
                f"sync calls fell {_per(sa.sync_calls)} -> {_per(sb.sync_calls)} per step "
                f"(host blocked {_ms(sa.sync_us)} -> {_ms(sb.sync_us)})",
            )
        )
    k, ev = batch_scale(before, after)
    if k is not None:
        out.append(FixEvidence("larger-batch", 0.7, ev))
    return sorted(out, key=lambda e: -e.score)


# --- the result ------------------------------------------------------------------------------


@dataclass
class Prediction:
    """BEFORE's estimate for the applied fix against what AFTER achieved.

    Speedups are BEFORE / AFTER ratios of median step times; ``ratio_*`` is estimate /
    achieved (1.0 = exact, > 1 = the estimate promised more). For ``larger-batch`` the achieved
    speedups are per sample (scaled by the batch growth ``batch_scale``).
    """

    fix: str
    source: str  # "given" (--fix) or "inferred"
    finding: fx.Finding | None
    estimated_speedup: float | None
    estimated_step_ms: float | None
    before_step_ms: float | None
    after_step_ms: float | None
    achieved_traced: float | None
    before_unprofiled_ms: float | None
    after_unprofiled_ms: float | None
    achieved_unprofiled: float | None
    ratio_traced: float | None
    ratio_unprofiled: float | None
    verdict: str  # "on target", "over-estimate", "under-estimate", "no estimate", "unknown fix"
    explanation: str
    batch_scale: float | None = None
    combined_fixes: list[str] | None = None
    combined_estimated_speedup: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "fix": self.fix,
            "source": self.source,
            "finding": self.finding.to_dict() if self.finding else None,
            "recommended": self.finding.recommended if self.finding else None,
            "estimated_speedup": _r(self.estimated_speedup),
            "estimated_step_ms": _r(self.estimated_step_ms),
            "before_step_ms": _r(self.before_step_ms),
            "after_step_ms": _r(self.after_step_ms),
            "achieved_speedup_traced": _r(self.achieved_traced),
            "before_unprofiled_ms": _r(self.before_unprofiled_ms),
            "after_unprofiled_ms": _r(self.after_unprofiled_ms),
            "achieved_speedup_unprofiled": _r(self.achieved_unprofiled),
            "estimate_over_achieved_traced": _r(self.ratio_traced),
            "estimate_over_achieved_unprofiled": _r(self.ratio_unprofiled),
            "batch_scale": self.batch_scale,
            "combined_fixes": self.combined_fixes,
            "combined_estimated_speedup": _r(self.combined_estimated_speedup),
            "verdict": self.verdict,
            "explanation": self.explanation,
        }


def _r(x: float | None, nd: int = 6) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(x, nd)


REGRESSION_PCT = 5.0
"""AFTER's step longer than BEFORE's by more than this (percent) is a regression: the same
bound as a fix worth recommending (:data:`tracedx.analysis.findings.MIN_RECOMMENDED_SPEEDUP`)."""


@dataclass(repr=False, eq=False)
class TraceDiff(Presentable):
    """The result of :func:`diff`. DataFrames are per step (means over the analysed steps).

    Attributes:
        before, after: the two Diagnoses.
        metrics: ``metric``, ``unit``, ``before``, ``after``, ``change`` (after - before),
            ``ratio`` (after / before): step time (median, ms), unprofiled step (median, ms),
            CPU time, GPU busy (medians, ms), idle fraction (median), kernels (every kernel
            run, a CUDA graph's included), graph launches, memcpys, memsets (per step), memcpy
            time (median, ms), memcpy MiB, pageable MiB, sync calls, sync time (median, ms),
            DataLoader time (ms).
        verdicts: regime and bottleneck of each side: ``{"regime": (b, a), "bottleneck": (b, a)}``.
        kind_changes: ``kind``, ``before_us``, ``after_us``, ``change_us``, ``before_count``,
            ``after_count``: device time and GPU ops per step by kind (memcpys and memsets
            are kind ``copy``), and the GPU ops split: ``before_kernels``, ``after_kernels``,
            ``before_memcpys``, ``after_memcpys``, ``before_memsets``, ``after_memsets``; the
            kinds' kernels add up to the ``kernels`` metric, their memcpys and memsets to
            ``memcpys`` and ``memsets``.
        op_changes: ``name``, ``before_us``, ``after_us``, ``change_us``, ``before_count``,
            ``after_count``: device time per step by launching op name, largest change first.
        kernel_changes: ``kernel`` (normalised name), ``kind``, ``status`` (appeared / vanished /
            changed), ``before_count``, ``after_count``, ``before_us``, ``after_us``,
            ``change_us``, ``example`` (one full name).
        fix, fix_source: the applied fix id (or ``"unknown"``) and ``"given"``/``"inferred"``.
        candidates: every fix the evidence points at, strongest first.
        prediction: estimate against achievement for ``fix``.
        new_findings: AFTER's recommended findings, best first.
        notes: caveats (different GPUs, no steps, ...).
        unrelated: a warning when the traces share almost no tensor shapes (or kernel names).
    """

    before: Diagnosis
    after: Diagnosis
    metrics: pl.DataFrame
    verdicts: dict[str, tuple[str | None, str | None]]
    kind_changes: pl.DataFrame
    op_changes: pl.DataFrame
    kernel_changes: pl.DataFrame
    fix: str
    fix_source: str
    candidates: list[FixEvidence]
    prediction: Prediction
    new_findings: list[fx.Finding]
    notes: list[str] = field(default_factory=list)
    unrelated: str | None = None
    """A warning (also first in ``notes``) when the two traces look like different programs."""

    _present = {
        "repr": "tracedx.report.card:diff_repr",
        "card": "tracedx.report.card:diff_card",
        "text": "tracedx.report.diff_report:render_text",
        "md": "tracedx.report.diff_report:render_markdown",
        "html": "tracedx.report.diff_html:render_diff_html",
        "json": "tracedx.report.diff_report:render_json",
        "figures": "tracedx.report.diff_html:diff_figures",
    }

    @property
    def step_change(self) -> dict[str, Any]:
        """How AFTER's step compares with BEFORE's, on the number that counts: the unprofiled
        median step when tracedx capture timed both sides, else the traced median step (per
        sample when the batch grew: ``Prediction.batch_scale``).

        Returns ``basis`` ("unprofiled", "traced" or None when a side has no step time),
        ``speedup`` (before / after), ``slower_pct`` (100 * (after / before - 1); negative when
        AFTER is faster), ``regression`` (slower by more than :data:`REGRESSION_PCT` percent)
        and ``summary``, one line saying by how much.
        """
        p = self.prediction
        if p.achieved_unprofiled:
            basis, x, b, a = (
                "unprofiled",
                p.achieved_unprofiled,
                p.before_unprofiled_ms,
                p.after_unprofiled_ms,
            )
        elif p.achieved_traced:
            basis, x, b, a = "traced", p.achieved_traced, p.before_step_ms, p.after_step_ms
        else:
            return {"basis": None, "speedup": None, "slower_pct": None, "regression": False,
                    "summary": "no step time to compare"}  # fmt: skip
        slower = 100.0 * (1.0 / x - 1.0)
        # the batch grew: the speedup is per sample; the step times are the steps' own
        k = p.batch_scale
        per = " per sample" if k else ""
        how = f"{basis} median step {b:.3f} -> {a:.3f} ms" + (
            f" with {k:g}x the samples" if k else ""
        )
        if slower >= 100:
            summary = f"AFTER is {1 / x:.2f}x slower{per} (+{slower:.0f}% step time{per}; {how})"
        elif slower > 0:
            summary = f"AFTER is {slower:.1f}% slower{per} ({1 / x:.2f}x the time; {how})"
        elif slower == 0:
            summary = f"AFTER takes the same time{per} ({how})"
        else:
            summary = f"AFTER is {x:.2f}x faster{per} ({-slower:.1f}% less time{per}; {how})"
        return {
            "basis": basis,
            "speedup": _r(x),
            "slower_pct": _r(slower, 3),
            "regression": slower > REGRESSION_PCT,
            "summary": summary,
        }

    def to_dict(self) -> dict[str, Any]:
        """The ``tracedx.diff/2`` JSON document (see README "diff JSON output")."""
        from tracedx.report.diff_report import diff_dict

        return diff_dict(self)


# --- tables ----------------------------------------------------------------------------------


def _win(d: Diagnosis) -> pl.DataFrame:
    w = d.windows
    if d.primary_device is not None:
        w = w.filter(pl.col("device") == d.primary_device)
    return w


def _med(w: pl.DataFrame, c: str) -> float | None:
    if c not in w.columns:
        return None
    v = w[c].drop_nulls()
    return float(v.median()) if v.len() else None


def _unprofiled_ms(d: Diagnosis) -> float | None:
    """The side's unprofiled median step (ms); None without one or when it cannot be right
    (``diagnosis.unprofiled_timing``)."""
    u = d.summary.get("unprofiled_step_ms") or {}
    if u.get("implausible") or not u.get("median"):
        return None
    return float(u["median"])


def _metrics(before: Diagnosis, after: Diagnosis, sa: Signals, sb: Signals) -> pl.DataFrame:
    wa, wb = _win(before), _win(after)

    def ms(x):
        return None if x is None else x / 1e3

    rows: list[tuple[str, str, float | None, float | None]] = [
        ("step time", "ms, median", ms(_med(wa, "step_time_us")), ms(_med(wb, "step_time_us"))),
    ]
    ua, ub = _unprofiled_ms(before), _unprofiled_ms(after)
    if ua is not None or ub is not None:
        rows.append(("unprofiled step", "ms, median", ua, ub))
    rows += [
        ("CPU time", "ms, median", ms(_med(wa, "cpu_time_us")), ms(_med(wb, "cpu_time_us"))),
        ("GPU busy", "ms, median", ms(_med(wa, "gpu_busy_us")), ms(_med(wb, "gpu_busy_us"))),
        ("GPU idle", "fraction, median", _med(wa, "idle_fraction"), _med(wb, "idle_fraction")),
        ("kernels", "per step", sa.kernels, sb.kernels),
        ("graph launches", "per step", sa.graph_launches, sb.graph_launches),
        # kernels, memcpys and memsets: each kind's counts in kind_changes add up to
        # these three (the means over the analysed steps)
        ("memcpys", "per step", sa.memcpys, sb.memcpys),
        ("memsets", "per step", sa.memsets, sb.memsets),
        ("memcpy time", "ms, median", ms(_med(wa, "memcpy_us")), ms(_med(wb, "memcpy_us"))),
        (
            "memcpy bytes",
            "MiB, median",
            (_med(wa, "memcpy_bytes") or 0) / 2**20,
            (_med(wb, "memcpy_bytes") or 0) / 2**20,
        ),
        ("pageable copies", "MiB per step", sa.pageable_bytes / 2**20, sb.pageable_bytes / 2**20),
        ("sync calls", "per step", sa.sync_calls, sb.sync_calls),
        (
            "host blocked (syncs, pageable copies)",
            "ms, median",
            ms(_med(wa, "sync_us")),
            ms(_med(wb, "sync_us")),
        ),
        ("DataLoader", "ms per step", sa.dataloader_us / 1e3, sb.dataloader_us / 1e3),
    ]
    return pl.DataFrame(
        rows,
        schema={"metric": pl.Utf8, "unit": pl.Utf8, "before": pl.Float64, "after": pl.Float64},
        orient="row",
    ).with_columns(
        change=pl.col("after") - pl.col("before"),
        ratio=pl.when(pl.col("before") != 0).then(pl.col("after") / pl.col("before")),
    )


def _outer(a: pl.DataFrame, b: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    j = a.join(b, on=key, how="full", coalesce=True, suffix="_after")
    return j.with_columns(
        pl.col("before_us").fill_null(0.0),
        pl.col("after_us").fill_null(0.0),
        pl.col("before_count").fill_null(0.0),
        pl.col("after_count").fill_null(0.0),
    ).with_columns(change_us=pl.col("after_us") - pl.col("before_us"))


KIND_COUNTS = ("count", "kernels", "memcpys", "memsets")
"""The counts of a kind change row, per step: ``count`` all its GPU ops, which ``kernels``,
``memcpys`` and ``memsets`` split (only kind ``copy`` has memcpys and memsets)."""


def _kind_changes(before: Diagnosis, after: Diagnosis) -> pl.DataFrame:
    def side(d: Diagnosis, tag: str) -> pl.DataFrame:
        k = d.kernel_kinds
        counts = [f"{tag}_{c}" for c in KIND_COUNTS]
        if k.height == 0:
            return pl.DataFrame(
                schema={"kind": pl.Utf8, f"{tag}_us": pl.Float64}
                | dict.fromkeys(counts, pl.Float64)
            )
        n = max(len(d.steps), 1)
        return k.select(
            "kind",
            pl.col("device_time_us_per_step").cast(pl.Float64).alias(f"{tag}_us"),
            pl.col("count_per_step").cast(pl.Float64).alias(f"{tag}_count"),
            *(
                (pl.col(c).cast(pl.Float64) / n).alias(f"{tag}_{c}")
                for c in ("kernels", "memcpys", "memsets")
            ),
        )

    j = _outer(side(before, "before"), side(after, "after"), ["kind"])
    extra = [f"{t}_{c}" for c in KIND_COUNTS[1:] for t in ("before", "after")]
    return (
        j.with_columns(pl.col(extra).fill_null(0.0))
        .select(
            "kind",
            "before_us",
            "after_us",
            "change_us",
            "before_count",
            "after_count",
            *extra,
        )
        .sort(pl.col("change_us").abs(), descending=True)
    )


def _op_changes(before: Diagnosis, after: Diagnosis) -> pl.DataFrame:
    def side(d: Diagnosis, tag: str) -> pl.DataFrame:
        n = max(len(d.steps), 1)
        t = d.op_table
        if t.height == 0:
            return pl.DataFrame(
                schema={"name": pl.Utf8, f"{tag}_us": pl.Float64, f"{tag}_count": pl.Float64}
            )
        return t.group_by("name").agg(
            (pl.col("device_time_us").sum() / n).cast(pl.Float64).alias(f"{tag}_us"),
            (pl.col("count").sum() / n).cast(pl.Float64).alias(f"{tag}_count"),
        )

    j = _outer(side(before, "before"), side(after, "after"), ["name"])
    return j.select(
        "name", "before_us", "after_us", "change_us", "before_count", "after_count"
    ).sort(pl.col("change_us").abs(), "name", descending=[True, False])


def _kernel_side(d: Diagnosis, tag: str) -> pl.DataFrame:
    k = _primary_kernels(d)
    n = max(len(d.steps), 1)
    if k.height == 0:
        return pl.DataFrame(
            schema={
                "kernel": pl.Utf8,
                "kind": pl.Utf8,
                f"{tag}_us": pl.Float64,
                f"{tag}_count": pl.Float64,
                f"{tag}_example": pl.Utf8,
            }
        )
    names = k["name"].unique()
    norm = pl.DataFrame(
        {"name": names, "kernel": [normalize_kernel_name(x) for x in names.to_list()]}
    )
    return (
        k.join(norm, on="name", how="left")
        .group_by("kernel")
        .agg(
            pl.col("kkind").mode().first().alias("kind"),
            (pl.col("duration_us").sum() / n).cast(pl.Float64).alias(f"{tag}_us"),
            (pl.len() / n).cast(pl.Float64).alias(f"{tag}_count"),
            pl.col("name").sort_by(pl.col("name").str.len_chars()).first().alias(f"{tag}_example"),
        )
    )


def kernel_changes(before: Diagnosis, after: Diagnosis) -> pl.DataFrame:
    """Kernels by normalised name, BEFORE against AFTER, per step (see :class:`TraceDiff`)."""
    a = _kernel_side(before, "before")
    b = _kernel_side(after, "after").rename({"kind": "kind_after"})
    j = _outer(a, b, ["kernel"])
    j = j.with_columns(
        kind=pl.coalesce("kind", "kind_after"),
        example=pl.coalesce("before_example", "after_example"),
        status=pl.when(pl.col("before_count") == 0)
        .then(pl.lit("appeared"))
        .when(pl.col("after_count") == 0)
        .then(pl.lit("vanished"))
        .otherwise(pl.lit("changed")),
    )
    # kernels that appeared or vanished first, together, largest change first (a list of
    # appeared ones first hid the vanished ones, often the largest, past the reports' top rows)
    order = pl.col("status").replace_strict(
        {"appeared": 0, "vanished": 0, "changed": 1}, return_dtype=pl.Int8
    )
    return (
        j.with_columns(_o=order, _a=pl.col("change_us").abs())
        .sort(["_o", "_a", "kernel"], descending=[False, True, False])
        .select(
            "kernel",
            "kind",
            "status",
            "before_count",
            "after_count",
            "before_us",
            "after_us",
            "change_us",
            "example",
        )
    )


# --- the prediction check --------------------------------------------------------------------


def _find(d: Diagnosis, fix: str) -> fx.Finding | None:
    return next((f for f in d.findings if f.fix == fix), None)


def _no_finding_reason(fix: str, sa: Signals, before: Diagnosis) -> str:
    """What BEFORE shows for a fix its diagnosis gave no finding for (numbers per step)."""
    m = before.model
    if fix == "cuda-graphs":
        if sa.graph_launches >= 1:
            return "BEFORE already replays CUDA graphs"
        return f"BEFORE launches {_per(sa.kernels)} kernels per step"
    if fix == "remove-host-sync":
        return f"BEFORE makes {_per(sa.sync_calls)} sync calls per step, blocked {_ms(sa.sync_us)}"
    if fix == "dataloader-workers" and m is not None:
        return (
            f"BEFORE spends {_ms(m.dataloader_us)} per step in the DataLoader "
            f"(the rule needs > 5% of the {_ms(m.mean_step_us)} step)"
        )
    if fix == "pinned-memory":
        return f"BEFORE copies {sa.pageable_bytes / 2**20:.1f} MiB from pageable memory per step"
    if fix in ("tf32", "bf16-autocast"):
        parts = ", ".join(f"{k} {_ms(v)}" for k, v in sorted(sa.gemm_op_us.items()) if v)
        return f"BEFORE's GEMM/conv op time per step by precision: {parts or 'none'}"
    if fix == "fused-attention":
        return f"BEFORE's softmax over square score matrices takes {_ms(sa.square_softmax_us)} per step"
    if fix == "torch-compile":
        return (
            f"BEFORE runs {_per(sa.eager_fusable_kernels)} eager elementwise/reduction/normalization "
            f"kernels per step ({_ms(sa.eager_fusable_us)})"
        )
    if fix == "larger-batch":
        w = _win(before)
        idle = _med(w, "idle_fraction")
        return f"BEFORE's GPU is idle {idle or 0:.0%} of the step (the rule needs >= 50%)"
    return "its rule found nothing to act on"


def _within(r: float | None) -> bool:
    return r is not None and 1 / ON_TARGET <= r <= ON_TARGET


def _explain(
    fix: str,
    finding: fx.Finding,
    before: Diagnosis,
    after: Diagnosis,
    est: float,
    ach: float,
    ach_u: float | None,
    sa: Signals,
    sb: Signals,
) -> tuple[str, str]:
    """(verdict, one line) for an estimate against the achievement.

    The verdict is judged on the unprofiled speedup when both traces carry one (that is the
    speedup a user gets), else on the traced one; the line explains a miss from the two step
    models (host H, GPU G, serialised E per step; :class:`tracedx.analysis.findings.StepModel`).
    """
    r_t = est / ach
    r_u = est / ach_u if ach_u else None
    primary = r_u if r_u is not None else r_t
    kind = "unprofiled" if r_u is not None else "traced"
    ub, ua = _unprofiled_ms(before), _unprofiled_ms(after)
    infl = ""
    # the profiler is to blame when it slows BEFORE and AFTER by factors 15% or more apart
    blame = False
    if ub and ua and sa.step_us and sb.step_us:
        fa, fb = sa.step_us / 1e3 / ub, sb.step_us / 1e3 / ua
        infl = f" (traced/unprofiled step: BEFORE {fa:.2f}x, AFTER {fb:.2f}x)"
        blame = not (1 / 1.15 <= fa / fb <= 1.15)
    if _within(primary):
        got = ach_u if r_u is not None else ach
        # a speedup promised and a slowdown got, within the tolerance: true, but say it
        slower = "; but AFTER is slower: the fix did not pay here" if est > 1 > got else ""
        return "on target", (
            f"estimate {est:.2f}x against {got:.2f}x achieved ({kind}): within {ON_TARGET:g}x"
            f"{slower}"
        )
    verdict = "over-estimate" if primary > 1 else "under-estimate"
    if _within(r_t) and r_u is not None and blame:
        return verdict, (
            f"the estimate ({est:.2f}x) is close to the traced speedup ({ach:.2f}x) but the "
            f"unprofiled speedup is {ach_u:.2f}x: the profiler slows BEFORE and AFTER by "
            f"different factors{infl}"
        )
    if r_u is not None and (r_t > 1) != (r_u > 1):
        return verdict, (
            f"traced and unprofiled disagree: the traced step changed {ach:.2f}x, the unprofiled "
            f"one {ach_u:.2f}x, so the profiler's overhead differs between the two programs{infl}"
        )
    profiler = ""
    if ach_u is not None and not (1 / ON_TARGET <= ach_u / ach <= ON_TARGET):
        profiler = f"; unprofiled the speedup is {ach_u:.2f}x against {ach:.2f}x traced{infl}"
    ma, mb = before.model, after.model
    if ma is None or mb is None:
        return verdict, (
            f"estimate {est:.2f}x against {ach:.2f}x achieved; no GPU step model to say why"
            + profiler
        )
    ha, ga, ea = ma.host_us, ma.gpu_us, ma.serial_us
    hb, gb, eb = mb.host_us, mb.gpu_us, mb.serial_us
    t_est = ma.step_us / est
    tb = mb.step_us
    if r_t > 1:
        # the estimate promised more than the fix delivered: what still binds AFTER
        if eb > 0.25 * tb and eb >= max(hb, gb) * 0.5:
            why = (
                f"{_ms(eb)} per step is still serialised (host syncs {_ms(mb.sync_us)}, blocking "
                f"copies {_ms(mb.pageable_block_us)}) beyond max(host {_ms(hb)}, GPU {_ms(gb)})"
            )
        elif hb >= gb:
            if fix == "cuda-graphs":
                why = (
                    f"estimate assumed launch gaps vanish (a {_ms(t_est)} traced step); {_ms(hb)} of host "
                    f"work per step remains against {_ms(mb.busy_us)} of GPU busy"
                )
            elif fix in ("tf32", "bf16-autocast", "fused-attention", "torch-compile"):
                why = (
                    f"the fix removed {_ms(max(ga - gb, 0.0))} of device time per step but the step "
                    f"is bound by host time ({_ms(hb)} of host work against {_ms(gb)} on the GPU)"
                )
            else:
                why = (
                    f"estimate expected a {_ms(t_est)} traced step; host work of {_ms(hb)} per step "
                    f"remains (was {_ms(ha)}) against {_ms(gb)} on the GPU"
                )
        else:
            moved = "fell only" if gb < ga else "went"
            why = (
                f"estimate expected a {_ms(t_est)} traced step; GPU time per step {moved} "
                f"{_ms(ga)} -> {_ms(gb)} and binds (host {_ms(hb)})"
            )
            g0, g1 = sum(sa.gemm_us.values()), sum(sb.gemm_us.values())
            if fix in ("tf32", "bf16-autocast") and g0 > 0 and g1 > 0:
                why += (
                    f": GEMM/conv kernels {_ms(g0)} -> {_ms(g1)} ({g0 / g1:.1f}x faster), "
                    f"all other device time {_ms(max(ma.busy_us - g0, 0.0))} -> "
                    f"{_ms(max(mb.busy_us - g1, 0.0))}"
                )
            grown = _op_changes(before, after).filter(pl.col("change_us") > 0)
            if grown.height and grown["change_us"][0] >= 0.05 * mb.busy_us:
                why += f"; most new device time: {grown['name'][0]} +{_ms(grown['change_us'][0])}"
        return verdict, why + profiler
    # the fix did better than estimated: what fell beyond the model's assumptions
    parts = [f"host {_ms(ha)} -> {_ms(hb)}", f"GPU {_ms(ga)} -> {_ms(gb)}"]
    if ea > 0.01 * ma.mean_step_us or eb > 0.01 * mb.mean_step_us:
        parts.append(f"serialised {_ms(ea)} -> {_ms(eb)}")
    why = (
        f"the traced step fell to {_ms(tb)}, below the {_ms(t_est)} the estimate gives for it "
        f"(acts on f = {finding.fraction:.0%}): " + ", ".join(parts)
    )
    if fix == "cuda-graphs" and mb.kernels:
        why += (
            f"; replay host cost {hb / mb.kernels:.2f} us per kernel against the "
            f"{fx.GRAPH_HOST_US_PER_KERNEL} us assumed"
        )
    elif fix in ("tf32", "bf16-autocast"):
        g0, g1 = sum(sa.gemm_us.values()), sum(sb.gemm_us.values())
        if g1 > 0:
            why += f"; GEMM device time fell {g0 / g1:.1f}x"
    elif fix == "fused-attention":
        att = after.op_table
        if "family" in att.columns and "bound_fraction" in att.columns:
            att = att.filter(pl.col("family") == "attention").sort(
                "device_time_us", descending=True
            )
            if att.height and att["bound_fraction"][0] is not None:
                why += (
                    f"; the fused kernel ran at {att['bound_fraction'][0]:.0%} of its roof "
                    f"({fx.FUSED_ATTENTION_EFFICIENCY:.0%} assumed)"
                )
    elif fix == "torch-compile":
        why += f"; kernels per step {_per(sa.kernels)} -> {_per(sb.kernels)}"
    elif fix == "dataloader-workers":
        why += f"; DataLoader {_ms(sa.dataloader_us)} -> {_ms(sb.dataloader_us)} per step"
    region = finding.fraction * ma.mean_step_us
    if fix in ("tf32", "bf16-autocast", "fused-attention", "torch-compile") and ga >= ha:
        s = finding.local_speedup
        new_region = 0.0 if math.isinf(s) else region / s
        why += (
            f"; the estimate expected {_ms(region)} of device work to become {_ms(new_region)} "
            f"and {_ms(max(ga - region, 0.0))} outside it to stay, and AFTER's GPU time is {_ms(gb)}"
        )
        if fix == "fused-attention" and sb.attention_us:
            why += f" ({_ms(sb.attention_us)} of it in attention kernels)"
    return verdict, why + profiler


def _together(before: Diagnosis, found: list[fx.Finding]) -> fx.Finding:
    """One finding for several fixes applied at once: their step-model changes added up
    (:func:`tracedx.analysis.findings.combined_speedup`), as an Amdahl (f, s) over the sum of
    their regions."""
    m = before.model
    total = fx.combined_change(m, found)
    t = m.predict() if m.unprofiled_step_us else m.reference_step_us
    names = " + ".join(f.fix for f in found)
    return fx.make_finding(
        m,
        names,
        f"{names}, applied together",
        min(sum(f.fraction for f in found), 1.0) * t,
        total,
        "the step model with every fix's change applied at once: "
        + "; ".join(f"{f.fix}: {f.derivation}" for f in found),
        [e for f in found for e in f.evidence[:2]],
    )


RELATED_SHARE = 0.2
"""Two traces sharing fewer than this share of their distinct tensor shapes (or, where a side
records none, as with a replayed CUDA graph, of their normalised kernel names) are likely
different programs. Every before/after pair in sample_traces/ shares 75-100%; unrelated
pairs of them share 0-29%."""


SAME_OPS_SHARE = 0.5
"""Trailing shapes relate two traces only when this share of their top-level op names is
common (the smaller set's): matmul-fp32 ({aten::matmul}) and decode-eager (14 names, no
matmul) share none; a batch change keeps them all."""


def _shape_set(d: Diagnosis, trailing: bool) -> set[tuple]:
    """The distinct input shapes of the trace's ops; ``trailing``: without their first
    dimension (what a batch change leaves alone)."""
    out: set[tuple] = set()
    for row in d.trace.ops["input_shapes"].drop_nulls().to_list():
        for sh in row or []:
            key = tuple(sh[1:]) if trailing and sh else tuple(sh or ())
            if key:
                out.add(key)
    return out


def _top_op_names(d: Diagnosis) -> set[str]:
    ops = d.trace.ops
    return set(ops.filter(ops["depth"] == 0)["name"].unique().to_list()) if ops.height else set()


def _share(a: set, b: set) -> float:
    return len(a & b) / min(len(a), len(b))


def _unrelated_note(before: Diagnosis, after: Diagnosis) -> str | None:
    """A warning when BEFORE and AFTER look like different programs: they share few tensor
    shapes (full shapes, or shapes without their first dimension, which a batch change moves),
    or, when a side has no shapes, few normalised kernel names. None when they look related or
    there is nothing to compare."""
    sa, sb = _shape_set(before, False), _shape_set(after, False)
    if sa and sb:
        ta, tb = _shape_set(before, True), _shape_set(after, True)
        # trailing shapes relate a batch change, but a lone hidden size such as (4096,) is
        # common to unrelated programs (matmul-fp32's (4096, 4096) and decode-eager's (1, 4096)):
        # they count only between traces whose top-level ops are mostly the same
        na, nb = _top_op_names(before), _top_op_names(after)
        same_ops = bool(na and nb) and _share(na, nb) >= SAME_OPS_SHARE
        share = max(_share(sa, sb), _share(ta, tb) if ta and tb and same_ops else 0.0)
        what = f"tensor shapes ({len(sa)} and {len(sb)} distinct)"
    else:
        ka = {normalize_kernel_name(n) for n in before.trace.kernels["name"].unique().to_list()}
        kb = {normalize_kernel_name(n) for n in after.trace.kernels["name"].unique().to_list()}
        if not (ka and kb):
            return None
        share = _share(ka, kb)
        what = f"kernel names ({len(ka)} and {len(kb)} distinct)"
    if share >= RELATED_SHARE:
        return None
    return (
        f"BEFORE and AFTER share {share:.0%} of their {what}: they look like different "
        "programs, so the speedup and the fix check below may mean nothing"
    )


def _prediction(
    fix: str,
    source: str,
    before: Diagnosis,
    after: Diagnosis,
    sa: Signals,
    sb: Signals,
    k: float | None,
    checked: fx.Finding | None,
    together: list[fx.Finding] | None = None,
) -> Prediction:
    """The check of BEFORE's estimate ``checked`` for ``fix`` (None: BEFORE has no finding for
    it); with ``together`` (two or more of BEFORE's findings, AFTER applied them all), of the
    step model's estimate for all of them at once."""
    tb_ms = None if sa.step_us is None else sa.step_us / 1e3
    ta_ms = None if sb.step_us is None else sb.step_us / 1e3
    ach = tb_ms / ta_ms if tb_ms and ta_ms else None
    ub, ua = _unprofiled_ms(before), _unprofiled_ms(after)
    ach_u = ub / ua if ub and ua else None
    scale = k if "larger-batch" in fix.split(" + ") and k else None
    if scale:
        ach = ach * scale if ach else None
        ach_u = ach_u * scale if ach_u else None
    if together and len(together) > 1 and before.model is not None:
        f = _together(before, together)
    else:
        f = checked
    est = f.estimated_speedup if f else None
    est_ms = f.estimated_step_ms if f else None
    r = est / ach if est and ach else None
    ru = est / ach_u if est and ach_u else None
    if fix == UNKNOWN:
        verdict, why = (
            "unknown fix",
            "no evidence matched a known fix; pass --fix ID to check an estimate",
        )
    elif f is None:
        verdict = "no estimate"
        why = f"BEFORE's diagnosis has no {fix} finding; {_no_finding_reason(fix, sa, before)}"
        if before.trace.truncated:
            why = "BEFORE was salvaged from a truncated file: it has no estimate (see the notes)"
        if ach:
            why += f"; achieved {ach:.2f}x traced" + (f", {ach_u:.2f}x unprofiled" if ach_u else "")
    elif not ach:
        verdict, why = "no estimate", "no step time to compare"
    else:
        verdict, why = _explain(fix, f, before, after, est, ach, ach_u, sa, sb)
        if not f.recommended:
            why = f"BEFORE judged {f.fix} not worth it (estimate {est:.2f}x < {fx.MIN_RECOMMENDED_SPEEDUP:g}x); {why}"
    if scale:
        why += f" (per-sample speedups: the batch grew {scale:g}x; the estimate is for 2x)"
    combined = [x.fix for x in together] if together and len(together) > 1 else None
    return Prediction(
        fix=fix,
        source=source,
        combined_fixes=combined,
        combined_estimated_speedup=est if combined else None,
        finding=f,
        estimated_speedup=est,
        estimated_step_ms=est_ms,
        before_step_ms=tb_ms,
        after_step_ms=ta_ms,
        achieved_traced=ach,
        before_unprofiled_ms=ub,
        after_unprofiled_ms=ua,
        achieved_unprofiled=ach_u,
        ratio_traced=r,
        ratio_unprofiled=ru,
        verdict=verdict,
        explanation=why,
        batch_scale=scale,
    )


# --- entry point -----------------------------------------------------------------------------


def _as_diagnosis(x: Trace | Diagnosis, which: str, **kw) -> Diagnosis:
    if isinstance(x, Diagnosis):
        return x
    if isinstance(x, Trace):
        return diagnose(x, **kw)
    if isinstance(x, (str, os.PathLike)):
        raise TypeError(
            f"{which}: diff takes loaded traces or diagnoses, not a path: "
            f"tracedx.diff(tracedx.load({str(x)!r}), ...)"
        )
    raise TypeError(f"{which}: expected a tracedx Trace or Diagnosis, got {type(x).__name__}")


def diff(
    a: Trace | Diagnosis, b: Trace | Diagnosis, fix: str | None = None, **diagnose_kw
) -> TraceDiff:
    """Compare BEFORE (``a``) and AFTER (``b``) and check BEFORE's estimate for the applied fix.

    Args:
        a, b: Traces (from :func:`tracedx.load`; diagnosed here with ``diagnose_kw``) or
            Diagnoses.
        fix: the fix id AFTER applied (one of :data:`tracedx.analysis.findings.FIX_IDS`), or
            several joined by ``,`` or ``+`` when AFTER applied them all; None infers it from
            the evidence (:func:`infer_fix`), ``"unknown"`` if nothing matches. When several
            fixes are given, or inferred (each with evidence scoring >= ``MIN_SCORE`` and a
            finding in BEFORE), the estimate checked is the step model's for all of them at
            once, and ``TraceDiff.fix`` names them joined by `` + ``.

    Returns:
        TraceDiff. Raises TraceError (exit 2 in the CLI) for an unknown fix id, TypeError for
        a side that is not a Trace or Diagnosis (a path: load it first).
    """
    given = None if fix is None else [x.strip() for x in re.split(r"[,+]", fix) if x.strip()]
    for x in given or []:
        if x not in fx.FIX_IDS:
            raise TraceError(
                f"--fix {x!r} (fix= in Python): not a fix id; one of {', '.join(fx.FIX_IDS)}"
            )
    if given is not None and not given:
        raise TraceError(
            f"--fix {fix!r} (fix= in Python): no fix id given; one of {', '.join(fx.FIX_IDS)}"
        )
    before = _as_diagnosis(a, "BEFORE", **diagnose_kw)
    after = _as_diagnosis(b, "AFTER", **diagnose_kw)
    sa, sb = signals(before), signals(after)
    cands = infer_fix(before, after)
    strong = [c for c in cands if c.score >= MIN_SCORE]
    if given is not None:
        given = list(dict.fromkeys(given))
    applied = given if given is not None else [c.fix for c in strong]
    found = [f for f in (_find(before, x) for x in applied) if f is not None]
    # findings the step model can add up (larger-batch changes the work, not the step)
    addable = [f for f in found if f.change is not None]
    together = addable if len(addable) > 1 else None
    if given is not None:
        chosen = " + ".join(given)
    elif together:
        chosen = " + ".join(f.fix for f in together)
    elif strong:
        chosen = found[0].fix if found else strong[0].fix
    else:
        chosen = UNKNOWN
    source = "given" if given is not None else "inferred"
    k, _ = batch_scale(before, after)
    checked = (addable or found or [None])[0]  # the finding checked when not several together
    pred = _prediction(chosen, source, before, after, sa, sb, k, checked, together)
    notes: list[str] = []
    na, nb = before.trace.device_name, after.trace.device_name
    if na and nb and na != nb:
        notes.append(
            f"BEFORE ran on {na}, AFTER on {nb}: the change mixes the fix with the GPU change"
        )
    unchecked = [c.fix for c in strong if given is not None and c.fix not in given]
    unseen = [x for x in given or [] if x not in {c.fix for c in cands}]
    if unchecked:
        also = "also " if len(unseen) < len(given or []) else ""
        notes.append(
            f"--fix {fix} given; the evidence {also}points at {', '.join(unchecked)}, which the "
            "achieved speedup includes and the estimate checked does not"
        )
    if unseen:
        notes.append(
            f"nothing in the two traces shows {', '.join(unseen)} applied (given with --fix)"
        )
    if together:
        notes.append(
            f"{len(together)} fixes were applied ({', '.join(f.fix for f in together)}): the "
            "estimate checked is BEFORE's step model with all of their changes at once"
        )
    named = applied if given is not None or len(strong) > 1 else []
    missing = [x for x in named if _find(before, x) is None]
    if missing:
        notes.append(
            f"BEFORE's diagnosis has no finding for {', '.join(missing)}: "
            + (
                f"the estimate checked covers {', '.join(f.fix for f in found)} only"
                if found
                else "there is no estimate to check"
            )
        )
    left_out = [f.fix for f in found if f.change is None] if addable else []
    if left_out:
        notes.append(
            f"{', '.join(left_out)} cannot be added to the other fixes in the step model "
            "(it changes the work per step): its estimate is not part of the one checked"
        )
    cut = [
        f"{side} was salvaged from a truncated file: its steps may have lost launches and GPU "
        "events (Kineto does not write events in time order), so every change below mixes the "
        "fix with what was lost"
        for side, d in (("BEFORE", before), ("AFTER", after))
        if d.trace.truncated
    ]
    unrelated = _unrelated_note(before, after)
    notes[:0] = cut + ([unrelated] if unrelated else [])  # first: they qualify everything else
    for side, d in (("BEFORE", before), ("AFTER", after)):
        if d.trace.steps_synthetic:
            notes.append(f"{side} has no ProfilerStep markers: the whole trace is one step")
    if before.findings:  # say what the estimates are against (there may be none)
        notes.append(
            "BEFORE's estimates are against its unprofiled step (profiler cost per host event "
            "taken out); the unprofiled speedup is the one to compare"
            if before.model is not None and before.model.unprofiled_step_us
            else "estimates are against the traced step time; the profiler slows the host "
            f"({fx.PROFILER_SLOWDOWN}), so the unprofiled speedup is the one that counts"
        )
    verdicts = {
        "regime": (before.regime, after.regime),
        "bottleneck": (before.bottleneck, after.bottleneck),
    }
    return TraceDiff(
        before=before,
        after=after,
        metrics=_metrics(before, after, sa, sb),
        verdicts=verdicts,
        kind_changes=_kind_changes(before, after),
        op_changes=_op_changes(before, after),
        kernel_changes=kernel_changes(before, after),
        fix=chosen,
        fix_source=source,
        candidates=cands,
        prediction=pred,
        new_findings=[f for f in after.findings if f.recommended],
        notes=notes,
        unrelated=unrelated,
    )
