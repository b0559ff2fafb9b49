"""Build typed polars tables from decoded events (one pass to bucket, then column-wise).

Every time column is microseconds (``_us``) as written by the profiler; start/end are the
trace's own absolute timestamps so each value can be checked against the file by hand.
Events with a negative duration or a non-finite / outlier timestamp are left out and
counted in the data-quality warnings (see :func:`build_tables`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import polars as pl

from tracedx.trace.events import CATEGORY_ALIASES, LEGACY_PID_KINDS, Event

_STREAM_RE = re.compile(r"(-?\d+)")


@dataclass
class DataWarning:
    """A data-quality problem found while reading: what, how many events, and what was done."""

    kind: str
    count: int
    message: str


@dataclass
class RawTables:
    kernels: pl.DataFrame
    memcpys: pl.DataFrame
    memsets: pl.DataFrame
    launches: pl.DataFrame
    ops: pl.DataFrame
    annotations: pl.DataFrame
    syncs: pl.DataFrame
    python_frames: pl.DataFrame
    process_names: dict[Any, str] = field(default_factory=dict)
    thread_names: dict[tuple[Any, Any], str] = field(default_factory=dict)
    unknown_categories: dict[str, int] = field(default_factory=dict)
    warnings: list[DataWarning] = field(default_factory=list)


def _to_int(v: Any) -> int | None:
    """Ids may be ints, floats or strings such as ``"stream 7"``; anything else is null."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else None
    if isinstance(v, float):
        return int(v) if math.isfinite(v) else None
    if isinstance(v, str):
        m = _STREAM_RE.search(v)
        return int(m.group(1)) if m else None
    return None


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None


def _dim3(v: Any, i: int) -> int | None:
    if isinstance(v, (list, tuple)) and len(v) > i:
        return _to_int(v[i])
    return None


def _ext_id(a) -> int | None:
    if a is None:
        return None
    v = a.external_id if a.external_id is not None else a.external_id_lc
    return _to_int(v)


def _shapes(v: Any) -> list[list[int]] | None:
    """``Input Dims`` -> one int list per input; scalars and TensorLists become ``[]``."""
    if not isinstance(v, list):
        return None
    out = []
    for d in v:
        if isinstance(d, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in d):
            out.append([x if -(2**63) <= x < 2**63 else 0 for x in d])
        else:
            out.append([])
    return out


def _interned_lists(raws: list, parse, dtype) -> pl.Series:
    """Decode raw-JSON list values once per distinct value and gather them into a Series.

    Real traces repeat a few thousand distinct shapes over millions of ops; building nested
    polars lists per row is the slow part of a naive reader.
    """
    codes: dict[bytes, int] = {}
    idx = []
    for r in raws:
        key = bytes(r)
        c = codes.get(key)
        if c is None:
            c = codes[key] = len(codes)
        idx.append(c)
    uniq = []
    for key in codes:
        try:
            uniq.append(parse(msgspec.json.decode(key)) if key else None)
        except msgspec.DecodeError:
            uniq.append(None)
    values = pl.Series(uniq, dtype=dtype, strict=False)
    return values.gather(pl.Series(idx, dtype=pl.UInt32)) if idx else pl.Series([], dtype=dtype)


def _strs(v: Any) -> list[str] | None:
    if not isinstance(v, list):
        return None
    return [x if isinstance(x, str) else ("" if x is None else str(x)) for x in v]


def _classify(ev: Event) -> str:
    cat = ev.cat
    if cat is None:
        if isinstance(ev.pid, str) and ev.pid in LEGACY_PID_KINDS and ev.ph == "X":
            return LEGACY_PID_KINDS[ev.pid]
        return "uncategorised"
    kind = CATEGORY_ALIASES.get(cat.lower())
    if kind is None:
        return "unknown:" + cat
    return kind


_GPU_SCHEMA = {
    "device": pl.Int64,
    "stream": pl.Int64,
    "start_us": pl.Float64,
    "duration_us": pl.Float64,
    "name": pl.Utf8,
    "correlation": pl.Int64,
    "external_id": pl.Int64,
}


def _gpu_cols(evs: list[Event]) -> dict[str, list]:
    dev, stream = [], []
    for e in evs:
        a = e.args
        d = _to_int(a.device) if a is not None else None
        s = _to_int(a.stream) if a is not None else None
        if d is None:
            d = _to_int(e.pid)
        if s is None:
            s = _to_int(e.tid)
        # Legacy autograd-profiler lanes ("CUDA functions") and other unnumbered devices: 0.
        dev.append(0 if d is None else d)
        stream.append(0 if s is None else s)
    return {
        "device": dev,
        "stream": stream,
        "start_us": [e.ts for e in evs],
        "duration_us": [e.dur for e in evs],
        "name": [e.name or "" for e in evs],
        "correlation": [_to_int(e.args.correlation) if e.args else None for e in evs],
        "external_id": [_ext_id(e.args) for e in evs],
    }


def _frame(cols: dict[str, list], schema: dict[str, Any]) -> pl.DataFrame:
    df = pl.DataFrame(cols, schema=schema, strict=False)
    if "start_us" in df.columns and "duration_us" in df.columns:
        df = df.with_columns(end_us=pl.col("start_us") + pl.col("duration_us"))
    return df


def _kernels(evs: list[Event]) -> pl.DataFrame:
    cols = _gpu_cols(evs)
    args = [e.args for e in evs]
    for axis, i in (("x", 0), ("y", 1), ("z", 2)):
        cols[f"grid_{axis}"] = [_dim3(a.grid, i) if a else None for a in args]
        cols[f"block_{axis}"] = [_dim3(a.block, i) if a else None for a in args]
    cols["registers_per_thread"] = [_to_int(a.registers_per_thread) if a else None for a in args]
    cols["shared_memory_bytes"] = [_to_int(a.shared_memory) if a else None for a in args]
    cols["blocks_per_sm"] = [_finite(a.blocks_per_sm) if a else None for a in args]
    cols["warps_per_sm"] = [_finite(a.warps_per_sm) if a else None for a in args]
    cols["achieved_occupancy_pct"] = [_finite(a.occupancy) if a else None for a in args]
    cols["graph_node_id"] = [_to_int(a.graph_node_id) if a else None for a in args]
    schema = dict(_GPU_SCHEMA)
    for axis in "xyz":
        schema[f"grid_{axis}"] = pl.Int64
        schema[f"block_{axis}"] = pl.Int64
    schema |= {
        "registers_per_thread": pl.Int64,
        "shared_memory_bytes": pl.Int64,
        "blocks_per_sm": pl.Float64,
        "warps_per_sm": pl.Float64,
        "achieved_occupancy_pct": pl.Float64,
        "graph_node_id": pl.Int64,
    }
    return _frame(cols, schema)


_MEMCPY_RE = re.compile(r"Memcpy\s+(\w+)(?:\s*\((\w+)\s*->\s*(\w+)\))?", re.IGNORECASE)


def _memcpys(evs: list[Event]) -> pl.DataFrame:
    cols = _gpu_cols(evs)
    kinds, src, dst = [], [], []
    for e in evs:
        m = _MEMCPY_RE.search(e.name or "")
        kinds.append(m.group(1) if m else None)
        src.append(m.group(2) if m and m.group(2) else None)
        dst.append(m.group(3) if m and m.group(3) else None)
    cols["direction"] = kinds  # HtoD, DtoH, DtoD, HtoH, PtoP
    cols["src_memory"] = src  # Pageable, Pinned, Device
    cols["dst_memory"] = dst
    cols["bytes"] = [_to_int(e.args.bytes) if e.args else None for e in evs]
    schema = dict(_GPU_SCHEMA) | {
        "direction": pl.Utf8,
        "src_memory": pl.Utf8,
        "dst_memory": pl.Utf8,
        "bytes": pl.Int64,
    }
    return _frame(cols, schema)


def _memsets(evs: list[Event]) -> pl.DataFrame:
    cols = _gpu_cols(evs)
    cols["bytes"] = [_to_int(e.args.bytes) if e.args else None for e in evs]
    return _frame(cols, dict(_GPU_SCHEMA) | {"bytes": pl.Int64})


def _syncs(evs: list[Event]) -> pl.DataFrame:
    cols = _gpu_cols(evs)
    cols["sync_kind"] = [
        str(e.args.cuda_sync_kind) if e.args and e.args.cuda_sync_kind is not None else None
        for e in evs
    ]
    return _frame(cols, dict(_GPU_SCHEMA) | {"sync_kind": pl.Utf8})


_HOST_SCHEMA = {
    "pid": pl.Int64,
    "tid": pl.Int64,
    "start_us": pl.Float64,
    "duration_us": pl.Float64,
    "name": pl.Utf8,
    "external_id": pl.Int64,
}


def _host_cols(evs: list[Event]) -> dict[str, list]:
    return {
        "pid": [_to_int(e.pid) for e in evs],
        "tid": [_to_int(e.tid) for e in evs],
        "start_us": [e.ts for e in evs],
        "duration_us": [e.dur for e in evs],
        "name": [e.name or "" for e in evs],
        "external_id": [_ext_id(e.args) for e in evs],
    }


def _launches(evs: list[Event]) -> pl.DataFrame:
    cols = _host_cols(evs)
    cols["correlation"] = [_to_int(e.args.correlation) if e.args else None for e in evs]
    cols["category"] = [e.cat or "" for e in evs]
    return _frame(cols, dict(_HOST_SCHEMA) | {"correlation": pl.Int64, "category": pl.Utf8})


def _ops(evs: list[Event]) -> pl.DataFrame:
    cols = _host_cols(evs)
    args = [e.args for e in evs]
    empty = msgspec.Raw()
    cols["input_shapes"] = _interned_lists([a.input_dims if a else empty for a in args], _shapes,
                                           pl.List(pl.List(pl.Int64)))
    cols["input_dtypes"] = _interned_lists([a.input_type if a else empty for a in args], _strs, pl.List(pl.Utf8))
    cols["concrete_inputs"] = _interned_lists([a.concrete_inputs if a else empty for a in args], _strs,
                                              pl.List(pl.Utf8))
    cols["sequence_number"] = [_to_int(a.sequence_number) if a else None for a in args]
    cols["fwd_thread_id"] = [_to_int(a.fwd_thread_id) if a else None for a in args]
    schema = dict(_HOST_SCHEMA) | {
        "input_shapes": pl.List(pl.List(pl.Int64)),
        "input_dtypes": pl.List(pl.Utf8),
        "concrete_inputs": pl.List(pl.Utf8),
        "sequence_number": pl.Int64,
        "fwd_thread_id": pl.Int64,
    }
    return _frame(cols, schema)


def _annotations(evs: list[Event], gpu: list[Event]) -> pl.DataFrame:
    host = _host_cols(evs)
    host["category"] = ["user_annotation"] * len(evs)
    host["device"] = [None] * len(evs)
    host["stream"] = [None] * len(evs)
    g = _gpu_cols(gpu)
    cols = {
        "pid": host["pid"] + [_to_int(e.pid) for e in gpu],
        "tid": host["tid"] + [_to_int(e.tid) for e in gpu],
        "start_us": host["start_us"] + g["start_us"],
        "duration_us": host["duration_us"] + g["duration_us"],
        "name": host["name"] + g["name"],
        "external_id": host["external_id"] + g["external_id"],
        "category": host["category"] + ["gpu_user_annotation"] * len(gpu),
        "device": host["device"] + g["device"],
        "stream": host["stream"] + g["stream"],
    }
    schema = dict(_HOST_SCHEMA) | {"category": pl.Utf8, "device": pl.Int64, "stream": pl.Int64}
    return _frame(cols, schema)


def _python_frames(evs: list[Event]) -> pl.DataFrame:
    cols = _host_cols(evs)
    cols["python_id"] = [_to_int(e.args.python_id) if e.args else None for e in evs]
    cols["python_parent_id"] = [_to_int(e.args.python_parent_id) if e.args else None for e in evs]
    return _frame(cols, dict(_HOST_SCHEMA) | {"python_id": pl.Int64, "python_parent_id": pl.Int64})


def _outlier_cutoff(ts: list[float]) -> float | None:
    """Timestamps written as 0 (or near it) inside a trace that lives far from 0.

    Sort the start times and take the largest gap. When the lower group sits at less than
    1/1000 of the upper group's first timestamp and the gap is over 1000x the upper group's
    extent, the lower group is corrupt (CASES.md C07). Returns the cutoff or None.
    """
    if len(ts) < 2:
        return None
    s = sorted(ts)
    best_gap, best_i = 0.0, -1
    for i in range(len(s) - 1):
        g = s[i + 1] - s[i]
        if g > best_gap:
            best_gap, best_i = g, i
    if best_i < 0:
        return None
    lower_max, upper_min, upper_max = s[best_i], s[best_i + 1], s[-1]
    extent = max(upper_max - upper_min, 1.0)
    if upper_min > 0 and lower_max < upper_min * 1e-3 and best_gap > 1000 * extent:
        return upper_min
    return None


def build_tables(events: list[Event]) -> RawTables:
    """Bucket events by normalised category and build the typed tables.

    Returns RawTables with kernels, memcpys, memsets, launches (cuda_runtime/cuda_driver and
    hip calls), ops (cpu_op), annotations (user_annotation + gpu_user_annotation), syncs
    (cuda_sync: host syncs drawn on the GPU track; waiting, never busy time) and
    python_frames (python_function), plus data-quality warnings.
    """
    buckets: dict[str, list[Event]] = {}
    process_names: dict[Any, str] = {}
    thread_names: dict[tuple[Any, Any], str] = {}
    unknown: dict[str, int] = {}
    warnings: list[DataWarning] = []
    invalid: dict[str, int] = {}
    for e in events:
        ph = e.ph
        if ph == "M":
            a = e.args
            if a is not None and isinstance(a.name, str):
                if e.name == "process_name":
                    process_names[e.pid] = a.name
                elif e.name == "thread_name":
                    thread_names[(e.pid, e.tid)] = a.name
            continue
        if ph != "X" and not (ph is None and e.dur is not None):
            continue
        kind = _classify(e)
        if kind in ("flow", "ignore"):
            continue
        if kind.startswith("unknown:") or kind == "uncategorised":
            unknown[kind.split(":", 1)[-1]] = unknown.get(kind.split(":", 1)[-1], 0) + 1
            continue
        ts, dur = e.ts, e.dur
        if ts is None or not math.isfinite(ts) or dur is None or not math.isfinite(dur) or dur < 0:
            invalid[kind] = invalid.get(kind, 0) + 1
            continue
        buckets.setdefault(kind, []).append(e)

    # Gross timestamp outliers (ts written as 0 in part of the trace).
    all_ts = [e.ts for evs in buckets.values() for e in evs]
    cutoff = _outlier_cutoff(all_ts)
    if cutoff is not None:
        dropped: dict[str, int] = {}
        for k, evs in buckets.items():
            keep = [e for e in evs if e.ts >= cutoff]
            if len(keep) != len(evs):
                dropped[k] = len(evs) - len(keep)
            buckets[k] = keep
        n = sum(dropped.values())
        detail = ", ".join(f"{v} {k}" for k, v in sorted(dropped.items()))
        warnings.append(
            DataWarning(
                "outlier_timestamp",
                n,
                f"{n} events have timestamps far before the rest of the trace (written as 0?) "
                f"and were left out ({detail}): the trace is partly corrupt",
            )
        )
    if invalid:
        n = sum(invalid.values())
        detail = ", ".join(f"{v} {k}" for k, v in sorted(invalid.items()))
        warnings.append(
            DataWarning(
                "invalid_duration",
                n,
                f"{n} events with a negative or missing duration/timestamp were left out ({detail})",
            )
        )
    if unknown:
        n = sum(unknown.values())
        detail = ", ".join(f"{v} {k}" for k, v in sorted(unknown.items()))
        warnings.append(
            DataWarning(
                "unknown_category", n, f"{n} events of unknown categories kept aside ({detail})"
            )
        )

    b = buckets.get
    return RawTables(
        kernels=_kernels(b("kernel", [])),
        memcpys=_memcpys(b("memcpy", [])),
        memsets=_memsets(b("memset", [])),
        launches=_launches(b("runtime", [])),
        ops=_ops(b("cpu_op", [])),
        annotations=_annotations(b("user_annotation", []), b("gpu_user_annotation", [])),
        syncs=_syncs(b("cuda_sync", [])),
        python_frames=_python_frames(b("python_function", [])),
        process_names=process_names,
        thread_names=thread_names,
        unknown_categories=unknown,
        warnings=warnings,
    )
