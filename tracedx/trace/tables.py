"""Build typed polars tables from decoded events, chunk by chunk and column-wise.

Every time column is microseconds (``_us``) as written by the profiler; start/end are the
trace's own absolute timestamps so each value can be checked against the file by hand.
Events with a negative duration or a non-finite / outlier timestamp are left out and
counted in the data-quality warnings (see :func:`build_tables`).

Speed: a trace of a gigabyte holds millions of events, so nothing here runs Python code per
event and per column beyond pulling attributes out with ``map(attrgetter(...))``. Events are
bucketed by category with integer codes in numpy, each column goes to polars in one call,
and values that repeat (shapes, dtypes, launch grids) are decoded once per distinct value;
names are stored once per distinct name (see :func:`_str_col`).
The scalar helpers (``_to_int``, ``_finite``, ``_dim3``, ...) define what every value means;
the vectorised paths match them exactly and fall back to them for any unusual value.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Annotated, Any

import msgspec
import numpy as np
import numpy.ma  # noqa: F401 (imported with tracedx, not inside the first load: see below)
import polars as pl

from tracedx.trace.events import (
    ANNOTATION_CAT,
    CATEGORY_ALIASES,
    LEGACY_PID_KINDS,
    Args,
    CommArgs,
    Event,
)

# numpy.ma: polars imports it on the first Series it builds from an array (for np.ma.getmask),
# which took 9 to 13 ms of the first load in a process (python -X importtime, 3 runs).

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
    comm_args: pl.DataFrame
    memory: pl.DataFrame | None = None
    process_names: dict[Any, str] = field(default_factory=dict)
    thread_names: dict[tuple[Any, Any], str] = field(default_factory=dict)
    unknown_categories: dict[str, int] = field(default_factory=dict)
    warnings: list[DataWarning] = field(default_factory=list)


# --- what one value means (the reference semantics) ----------------------------------------


def _to_int(v: Any) -> int | None:
    """Ids may be ints, floats or strings such as ``"stream 7"``; anything else is null."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else None
    if isinstance(v, float):
        return int(v) if math.isfinite(v) and -(2.0**63) <= v < 2.0**63 else None
    if isinstance(v, str):
        m = _STREAM_RE.search(v)
        if not m:
            return None
        i = int(m.group(1))
        return i if -(2**63) <= i < 2**63 else None
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


_MEMCPY_RE = re.compile(r"Memcpy\s+(\w+)(?:\s*\((\w+)\s*->\s*(\w+)\))?", re.IGNORECASE)


def _memcpy_kind(name: str | None) -> tuple[str | None, str | None, str | None]:
    """``Memcpy HtoD (Pageable -> Device)`` -> (direction, source memory, destination memory)."""
    m = _MEMCPY_RE.search(name or "")
    return (
        m.group(1) if m else None,
        m.group(2) if m and m.group(2) else None,
        m.group(3) if m and m.group(3) else None,
    )


# --- columns from many events at once -----------------------------------------------------

_NONE_TYPE = type(None)
_INT_TYPES = frozenset((int, _NONE_TYPE))
_NUM_TYPES = frozenset((int, float, _NONE_TYPE))
_EMPTY_ARGS = Args()
_EMPTY_COMM_ARGS = CommArgs()


def _get(objs: list, name: str) -> list:
    """``[o.name for o in objs]`` at C speed; a None object (an event without args) gives None."""
    try:
        return list(map(attrgetter(name), objs))
    except AttributeError:
        return [None if o is None else getattr(o, name) for o in objs]


def _id_col(vals: list) -> pl.Series:
    """Id values (int | str | None, as the decoder gives them) -> Int64 with ``_to_int``'s rules."""
    try:
        return pl.Series(vals, dtype=pl.Int64, strict=True)
    except (TypeError, ValueError, OverflowError):
        return pl.Series(list(map(_to_int, vals)), dtype=pl.Int64)


def _any_int_col(vals: list) -> pl.Series:
    """Values of any JSON type -> Int64 with ``_to_int``'s rules (bools and floats included)."""
    if set(map(type, vals)) <= _INT_TYPES:
        try:
            return pl.Series(vals, dtype=pl.Int64, strict=True)
        except (TypeError, ValueError, OverflowError):
            pass
    return pl.Series(list(map(_to_int, vals)), dtype=pl.Int64)


def _any_float_col(vals: list) -> pl.Series:
    """Values of any JSON type -> Float64 with ``_finite``'s rules (non-finite -> null)."""
    if set(map(type, vals)) <= _NUM_TYPES:
        try:
            s = pl.Series(vals, dtype=pl.Float64, strict=True)
        except (TypeError, ValueError, OverflowError):
            pass
        else:
            return _finite_only(s)
    return pl.Series(list(map(_finite, vals)), dtype=pl.Float64)


def _finite_only(s: pl.Series) -> pl.Series:
    # the check in numpy (a null reads as NaN: the rare column with one takes the polars path,
    # which keeps it null): polars' is_finite().all() costs ~0.7 ms a call, numpy's microseconds
    if s.len() and not np.isfinite(s.to_numpy()).all():
        s = s.to_frame("v").select(pl.when(pl.col("v").is_finite()).then(pl.col("v"))).to_series()
    return s


def _float_col(vals: list) -> pl.Series:
    """``ts``/``dur`` (float | None from the decoder) -> Float64, NaN and inf kept as they are."""
    return pl.Series(vals, dtype=pl.Float64, strict=True)


_DEDUP_MIN = 256


def _str_col(vals: list, dedup: bool = True) -> pl.Series:
    """``name or ""``, each distinct value stored once: the column's views all point to it
    (polars' strings are views into shared buffers, and ``gather`` copies only the views), so
    a kernel name repeated over thousands of launches takes 16 bytes a row, not its length.
    On the 107 MB benchmark trace the diagnosis peaked at 196 MB instead of 208 (3 runs each),
    for about 1 ms more per chunk of 8 MB (hashing each name). A few hundred values are
    stored as they are: the saving is nothing, the extra polars calls are not; so are all of
    them with ``dedup=False``: short values (categories), which polars keeps inside the view,
    and the names of a whole small document (:meth:`Converter.convert`)."""
    if not dedup or len(vals) < _DEDUP_MIN:
        s = pl.Series(vals, dtype=pl.Utf8)
        return s.fill_null("") if s.null_count() else s
    codes = _Codes(lambda v, c: len(c))
    idx = np.fromiter(map(codes.__getitem__, vals), np.uint32, len(vals))
    s = pl.Series(list(codes), dtype=pl.Utf8)
    return (s.fill_null("") if s.null_count() else s).gather(idx)


class _Codes(dict):
    """A dict that computes a missing value once: ``fn(key, self)``. Its ``__getitem__`` is the
    dict's own (C speed) for every key already there, so ``map(codes.__getitem__, values)``
    codes values in one pass, without a list of them or of their distinct values."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def __missing__(self, key):
        v = self[key] = self.fn(key, self)
        return v


class _Interner:
    """Distinct tuples of raw JSON values -> small integer codes, decoded once each at the end.

    The key of an event is its raw values joined by NUL, which never occurs in JSON text: one
    bytes object per event whatever the number of fields (``bytes(raw)`` is the costly part).
    """

    def __init__(self, n_fields: int) -> None:
        self.n_fields = n_fields
        self.codes: dict[bytes, int] = _Codes(lambda key, codes: len(codes))

    def encode(self, args: list, fields: tuple[str, ...]) -> pl.Series:
        """The codes of the raw ``fields`` of the events' ``args`` (:class:`Args` or
        :class:`CommArgs`, never None)."""
        n = len(args)
        columns = [_get(args, f) for f in fields]
        absent = [getattr(_EMPTY_ARGS, f) for f in fields]  # each field's default: one object
        if all(c[0] is a and c.count(a) == n for c, a in zip(columns, absent, strict=True)):
            # no event has any of the fields (ops without record_shapes): the one key b"" joined,
            # told by identity, without a key per event
            code = self.codes[b"\x00" * (self.n_fields - 1)]
            return pl.Series(np.full(n, code, dtype=np.uint32), dtype=pl.UInt32)
        join = b"\x00".join
        code = self.codes.__getitem__  # a new key gets the next code (_Codes.__missing__)
        try:
            out = np.fromiter(map(code, map(join, zip(*columns, strict=True))), np.uint32, n)
        except TypeError:  # None: an event without args
            keys = (join(b"" if r is None else r for r in v) for v in zip(*columns, strict=True))
            out = np.fromiter(map(code, keys), np.uint32, n)
        return pl.Series(out, dtype=pl.UInt32)

    def remap(self, keys: list[bytes]) -> pl.Series:
        """Codes in this interner for another interner's keys (listed in its code order)."""
        codes = self.codes
        for k in keys:
            if k not in codes:
                codes[k] = len(codes)
        return pl.Series([codes[k] for k in keys], dtype=pl.UInt32)

    def fields(self) -> list[tuple[bytes, ...]]:
        """Each field of the distinct keys, in code order, as raw JSON (``b""``: absent)."""
        split = list(zip(*(key.split(b"\x00") for key in self.codes), strict=True))
        return split or [()] * self.n_fields


_JSON = msgspec.json.Decoder()


def _decode_each(raws: tuple[bytes, ...]) -> list:
    """The JSON values ``raws`` decoded (None for ``b""`` and for a value that is not JSON)."""
    out = []
    for raw in raws:
        try:
            out.append(_JSON.decode(raw) if raw else None)
        except msgspec.DecodeError:
            out.append(None)
    return out


_INT64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
# Values that _shapes and _strs keep as they are: a typed decoder checks it in C
_PLAIN = {
    "input_shapes": msgspec.json.Decoder(list[list[list[_INT64]] | None]),
    "input_dtypes": msgspec.json.Decoder(list[list[str] | None]),
    "concrete_inputs": msgspec.json.Decoder(list[list[str] | None]),
}


def _plain_column(raws: tuple[bytes, ...], col: str) -> tuple[pl.Series, list] | None:
    """Column ``col`` of the cpu ops' interned ``raws``, parsed by polars from the raw JSON,
    when :func:`_shapes` or :func:`_strs` would keep every value as it is (checked by a typed
    decoder: lists of int64 or of strings, or absent) and no string has an escape (the
    decoders could differ on a lone surrogate); else None. With the kernels' launch shapes
    decoded once per field (not once per column), the 10 MB benchmark trace's 354 distinct
    op keys and 65 launch shapes take 1.1 ms instead of 2.4 (decoding, checking and encoding
    each value in Python; best of 30, collector off as in a load). Returns the column and
    the values as the typed decoder read them (the same values, in Python)."""
    text = b"[" + b",".join([r or b"null" for r in raws]) + b"]"  # b"": absent
    if b"\\" in text:
        return None
    dtype = _SCHEMAS["cpu_op"][col]
    try:
        values = _PLAIN[col].decode(text)  # (a ValidationError is a DecodeError)
        text_col = pl.Series([r.decode() if r else None for r in raws], dtype=pl.Utf8)
        out = text_col.str.json_decode(dtype)
    except (msgspec.DecodeError, pl.exceptions.PolarsError):
        return None
    return (out, values) if out.dtype == dtype else None


# Kind codes used while bucketing.
_KINDS = (
    "kernel",
    "memcpy",
    "memset",
    "runtime",
    "cpu_op",
    "user_annotation",
    "gpu_user_annotation",
    "python_function",
    "cuda_sync",
)
_KIND_CODE = {k: i for i, k in enumerate(_KINDS)}
_SKIP, _UNKNOWN, _CAT_NONE = 100, 101, 102
_PH_X, _PH_M, _PH_NONE, _PH_OTHER, _PH_BE, _PH_I = 0, 1, 2, 3, 4, 5

_GET_PH = attrgetter("ph")
_GET_CAT = attrgetter("cat")
_GET_ARGS = attrgetter("args")


def _cat_code(cat: str | None) -> int:
    if cat is None:
        return _CAT_NONE
    kind = CATEGORY_ALIASES.get(cat.lower())
    if kind is None:
        return _UNKNOWN
    if kind in ("flow", "ignore"):
        return _SKIP
    return _KIND_CODE[kind]


def _ph_code(ph: str | None) -> int:
    codes = {
        "X": _PH_X,
        "M": _PH_M,
        None: _PH_NONE,
        "B": _PH_BE,
        "E": _PH_BE,
        "i": _PH_I,
        "I": _PH_I,
    }
    return codes.get(ph, _PH_OTHER)


def _type_code(t: type) -> int:
    """The ph code of every event of type ``t`` when the type tells the phase (the fast
    reader's types, tagged by ``ph``), else -1."""
    cfg = getattr(t, "__struct_config__", None)
    if cfg is None or cfg.tag_field != "ph" or not isinstance(cfg.tag, str):
        return -1
    return _ph_code(cfg.tag)


_GPU_SCHEMA = {
    "device": pl.Int64,
    "stream": pl.Int64,
    "start_us": pl.Float64,
    "duration_us": pl.Float64,
    "name": pl.Utf8,
    "correlation": pl.Int64,
    "external_id": pl.Int64,
}
_HOST_SCHEMA = {
    "pid": pl.Int64,
    "tid": pl.Int64,
    "start_us": pl.Float64,
    "duration_us": pl.Float64,
    "name": pl.Utf8,
    "external_id": pl.Int64,
}
_KERNEL_SCHEMA = dict(_GPU_SCHEMA)
for _axis in "xyz":
    _KERNEL_SCHEMA[f"grid_{_axis}"] = pl.Int64
    _KERNEL_SCHEMA[f"block_{_axis}"] = pl.Int64
_KERNEL_SCHEMA |= {
    "registers_per_thread": pl.Int64,
    "shared_memory_bytes": pl.Int64,
    "blocks_per_sm": pl.Float64,
    "warps_per_sm": pl.Float64,
    "achieved_occupancy_pct": pl.Float64,
}
_SCHEMAS: dict[str, dict[str, Any]] = {
    "memory": {
        "start_us": pl.Float64,
        "duration_us": pl.Float64,
        "device": pl.Int64,
        "device_type": pl.Int64,
        "bytes": pl.Int64,
        "allocated_bytes": pl.Int64,
        "reserved_bytes": pl.Int64,
    },
    "kernel": _KERNEL_SCHEMA,
    "memcpy": dict(_GPU_SCHEMA)
    | {"direction": pl.Utf8, "src_memory": pl.Utf8, "dst_memory": pl.Utf8, "bytes": pl.Int64},
    "memset": dict(_GPU_SCHEMA) | {"bytes": pl.Int64},
    "cuda_sync": dict(_GPU_SCHEMA) | {"sync_kind": pl.Utf8},
    "runtime": dict(_HOST_SCHEMA) | {"correlation": pl.Int64, "category": pl.Utf8},
    "cpu_op": dict(_HOST_SCHEMA)
    | {
        "input_shapes": pl.List(pl.List(pl.Int64)),
        "input_dtypes": pl.List(pl.Utf8),
        "concrete_inputs": pl.List(pl.Utf8),
        "shape_code": pl.UInt32,  # (not in the trace: numbered by TableBuilder._op_shapes)
    },
    "annotation": dict(_HOST_SCHEMA)
    | {"category": pl.Utf8, "device": pl.Int64, "stream": pl.Int64},
    "python_function": dict(_HOST_SCHEMA) | {"python_id": pl.Int64, "python_parent_id": pl.Int64},
}
# Collective metadata, for the few events that carry it (kernels and cpu ops with a
# ``Collective name``; ``nccl:*``/``gloo:*`` user annotations): one side table, so traces
# without collectives pay one C-speed scan per kind and no column.
COMM_SCHEMA: dict[str, Any] = {
    "source": pl.Utf8,  # kernel | cpu_op | annotation
    "pid": pl.Int64,
    "tid": pl.Int64,
    **_GPU_SCHEMA,  # device, stream, start_us, duration_us, name, correlation, external_id
    "collective_name": pl.Utf8,
    "dtype": pl.Utf8,
    "in_nelems": pl.Int64,
    "out_nelems": pl.Int64,
    "group_size": pl.Int64,
    "pg_name": pl.Utf8,
    "pg_desc": pl.Utf8,
    "pg_ranks": pl.Utf8,
    "rank": pl.Int64,
    "seq": pl.Int64,
    "comms_id": pl.Utf8,
    "rank_start": pl.Int64,
    "rank_stride": pl.Int64,
    "in_split_size": pl.Utf8,
    "out_split_size": pl.Utf8,
    "src_rank": pl.Int64,
    "dst_rank": pl.Int64,
}
_COMM_INT_ARGS = (
    "in_nelems",
    "out_nelems",
    "group_size",
    "rank",
    "seq",
    "rank_start",
    "rank_stride",
    "src_rank",
    "dst_rank",
)
_COMM_STR_ARGS = (
    "collective_name",
    "dtype",
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "in_split_size",
    "out_split_size",
)
# ``<backend>:<op>`` labels of ProcessGroupNCCL / ProcessGroupGloo work (``nccl:all_reduce``,
# ``gloo:broadcast``, ``nccl:send 0->1``)
COMM_ANNOTATION_RE = r"^(nccl|rccl|gloo|ucc|xccl|mpi):"
_COMM_ANNOTATION = re.compile(COMM_ANNOTATION_RE)

# Interned columns: stored as codes while reading, replaced by their values at the end.
# column -> field of the interned key (kernels: grid, block; ops: dims, types, concrete inputs)
_INTERNED = {
    "kernel": {"grid_x": 0, "block_x": 1, "grid_y": 0, "block_y": 1, "grid_z": 0, "block_z": 1},
    "cpu_op": {"input_shapes": 0, "input_dtypes": 1, "concrete_inputs": 2},
}


def _text(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    return str(v).lower() if isinstance(v, bool) else str(v)


def _comms_id(v: Any) -> str | None:
    """``Comms Id``: an unsigned 64-bit hash, kept as decimal text (it overflows int64)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return str(v % 2**64)  # a signed writer's negative value is the same 64 bits
    if isinstance(v, float):
        return str(int(v)) if math.isfinite(v) else None
    v = str(v).strip()
    return v or None


def _numel(shape: Any) -> int | None:
    if not isinstance(shape, list):
        return None
    n = 1
    for d in shape:
        if not isinstance(d, int) or isinstance(d, bool):
            return None
        n *= d
    return n if n < 2**63 else None


def _nelems(dims: Any, every_input: bool = False) -> int | None:
    """Elements of the first input of ``Input Dims`` (``[[1000]]`` -> 1000), or of all inputs
    (a coalesced all-reduce: ``gloo:all_reduce`` with ``[[4], [3]]`` moves 7)."""
    if not (isinstance(dims, list) and dims):
        return None
    if not every_input:
        return _numel(dims[0])
    sizes = [_numel(d) for d in dims]
    if any(n is None for n in sizes):
        return None
    total = sum(sizes)
    return total if total < 2**63 else None


def _lane(arg: Any, fallback: Any) -> int:
    """A GPU event's device or stream as :func:`_gpu_cols` reads it (the kernels table's keys):
    from args, else from pid/tid, else 0."""
    v = _to_int(arg)
    if v is None:
        v = _to_int(fallback)
    return 0 if v is None else v


def _comm_rows(source: str, evs: list, args: list, idx: list[int]) -> pl.DataFrame:
    """The side-table rows of ``evs[idx]`` (the few events that carry collective metadata)."""
    ev = [evs[i] for i in idx]
    a = [args[i] if args[i] is not None else _EMPTY_COMM_ARGS for i in idx]
    gpu = source == "kernel"
    n = len(ev)
    cols: dict[str, Any] = {
        "source": [source] * n,
        "pid": list(map(_to_int, _get(ev, "pid"))),
        "tid": list(map(_to_int, _get(ev, "tid"))),
        "device": list(map(_lane, _get(a, "device"), _get(ev, "pid"))) if gpu else [None] * n,
        "stream": list(map(_lane, _get(a, "stream"), _get(ev, "tid"))) if gpu else [None] * n,
        "start_us": list(map(_finite, _get(ev, "ts"))),
        "duration_us": list(map(_finite, _get(ev, "dur"))),
        "name": _get(ev, "name"),
        "correlation": list(map(_to_int, _get(a, "correlation"))),
        "external_id": [_ext_id(x) for x in a],
    }
    if source == "annotation":
        # ``nccl:all_reduce`` -> all_reduce; ``nccl:send 0->1`` -> send; the first input's
        # dims and type give the message (ProcessGroup record_function inputs)
        cols["collective_name"] = [nm.split(":", 1)[1].split(" ")[0] for nm in cols["name"]]
        dims, types = [], []
        for x, op in zip(a, cols["collective_name"], strict=True):
            try:
                d = msgspec.json.decode(x.input_dims) if x.input_dims else None
                t = msgspec.json.decode(x.input_type) if x.input_type else None
            except msgspec.DecodeError:
                d = t = None
            dims.append(_nelems(d, every_input=op.replace("_", "").startswith("allreduce")))
            types.append(t[0] if isinstance(t, list) and t and isinstance(t[0], str) else None)
        cols["in_nelems"] = dims  # out: tracedx.trace.collectives decides by type
        cols["dtype"] = types
        for c in COMM_SCHEMA:
            cols.setdefault(c, [None] * n)
    else:
        for c in _COMM_STR_ARGS:
            cols[c] = list(map(_text, _get(a, c)))
        for c in _COMM_INT_ARGS:
            cols[c] = list(map(_to_int, _get(a, c)))
        cols["comms_id"] = list(map(_comms_id, _get(a, "comms_id")))
    df = pl.DataFrame({c: cols[c] for c in COMM_SCHEMA}, schema=COMM_SCHEMA)
    return df.filter(
        pl.col("start_us").is_not_null()
        & pl.col("duration_us").is_not_null()
        & (pl.col("duration_us") >= 0)
    )


def _with_collective(args: list) -> list[int]:
    """Indices of the events whose args carry a ``Collective name`` (C-speed scan); none when
    the chunk was decoded without collective fields (its bytes hold no ``Collective name``)."""
    first = next((a for a in args if a is not None), None)
    if not isinstance(first, CommArgs):
        return []
    names = _get(args, "collective_name")
    if names.count(None) == len(names):
        return []
    has = np.fromiter(map(operator.is_not, names, repeat(None)), dtype=bool, count=len(names))
    return np.flatnonzero(has).tolist()


def _ext_col(args: list) -> pl.Series:
    ext = _get(args, "external_id")
    if None in ext:  # the lower-case spelling is used only where the other is absent
        lc = _get(args, "external_id_lc")
        if lc.count(None) != len(lc):
            ext = [x if x is not None else y for x, y in zip(ext, lc, strict=True)]
    return _id_col(ext)


def _host_cols(evs: list[Event], args: list, dedup: bool = True) -> dict[str, pl.Series]:
    return {
        "pid": _id_col(_get(evs, "pid")),
        "tid": _id_col(_get(evs, "tid")),
        "start_us": _float_col(_get(evs, "ts")),
        "duration_us": _float_col(_get(evs, "dur")),
        "name": _str_col(_get(evs, "name"), dedup),
        "external_id": _ext_col(args),
    }


_FEW = 256
"""Up to this many GPU events, their lanes are worked out in Python, not by polars."""


def _lane_col(vals: list, evs: list[Event], fallback: str) -> pl.Series:
    """A GPU event's device or stream (:func:`_lane`): ``vals`` from args, else the events'
    ``fallback`` (pid or tid), else 0. A few rows go through :func:`_lane` in Python: the
    two ``fill_null`` of polars cost 0.3 ms for the 12 GPU annotations of a trace."""
    col = _id_col(vals)
    if not col.null_count():
        return col
    if len(vals) <= _FEW:
        return pl.Series(list(map(_lane, vals, _get(evs, fallback))), dtype=pl.Int64)
    return col.fill_null(_id_col(_get(evs, fallback))).fill_null(0)


def _gpu_cols(evs: list[Event], args: list, dedup: bool = True) -> dict[str, pl.Series]:
    # device/stream from args, else from pid/tid; legacy lanes ("CUDA functions") and other
    # unnumbered devices: 0.
    return {
        "device": _lane_col(_get(args, "device"), evs, "pid"),
        "stream": _lane_col(_get(args, "stream"), evs, "tid"),
        "start_us": _float_col(_get(evs, "ts")),
        "duration_us": _float_col(_get(evs, "dur")),
        "name": _str_col(_get(evs, "name"), dedup),
        "correlation": _id_col(_get(args, "correlation")),
        "external_id": _ext_col(args),
    }


@dataclass
class ChunkColumns:
    """The columns of one chunk of events, ready to be merged (picklable: a worker process of
    :mod:`tracedx.trace.parallel` sends it back). Interned columns hold codes into ``keys``."""

    frames: dict[str, pl.DataFrame]
    keys: dict[str, list[bytes]]
    invalid: dict[str, int]
    unknown: dict[str, int]
    process_names: dict[Any, str]
    thread_names: dict[tuple[Any, Any], str]
    # B/E (begin/end) duration events: not read (torch.profiler writes complete X events)
    begin_end: int = 0


class Converter:
    """Decoded events -> :class:`ChunkColumns`; keeps only caches between chunks."""

    def __init__(self) -> None:
        self._ph_codes = _Codes(lambda ph, _: _ph_code(ph))
        self._type_codes = _Codes(lambda t, _: _type_code(t))
        self._cat_codes = _Codes(lambda cat, _: _cat_code(cat))
        self._memcpy_cache: dict = {}

    def convert(self, evs: list[Event], whole: bool = False) -> ChunkColumns:
        """The columns of ``evs``; ``whole``: they are all the events of a small document
        (read in one piece), whose names are stored as they are (see :func:`_str_col`: the
        saving is memory at scale, and hashing them took 0.6 ms of the 10 MB benchmark
        trace's read)."""
        out = ChunkColumns({}, {}, {}, {}, {}, {})
        interners = {"kernel": _Interner(2), "cpu_op": _Interner(3)}
        n = len(evs)
        if n:
            self._convert(evs, n, out, interners, whole)
        out.keys = {k: list(it.codes) for k, it in interners.items()}
        return out

    def _convert(
        self, evs: list[Event], n: int, out: ChunkColumns, interners: dict, whole: bool
    ) -> None:
        # the fast reader's events are tagged by ph: their type says it (-1: an untagged type)
        ph = np.fromiter(map(self._type_codes.__getitem__, map(type, evs)), np.int16, n)
        if ph.min() < 0:
            ph = np.fromiter(map(self._ph_codes.__getitem__, map(_GET_PH, evs)), np.int16, n)
        kind = np.fromiter(map(self._cat_codes.__getitem__, map(_GET_CAT, evs)), np.int16, n)
        for i in np.flatnonzero(ph == _PH_M).tolist():
            _metadata(evs[i], out)
        out.begin_end += int(np.count_nonzero(ph == _PH_BE))
        mem = [
            e
            for i in np.flatnonzero(ph == _PH_I).tolist()  # instants only: flows are a third
            if getattr(e := evs[i], "name", None) == "[memory]"
        ]
        if mem:
            out.frames["memory"] = _memory_frame(mem)
        cand = ph == _PH_X
        for i in np.flatnonzero(ph == _PH_NONE).tolist():
            cand[i] = evs[i].dur is not None
        for i in np.flatnonzero(cand & (kind == _CAT_NONE)).tolist():
            k = _classify(evs[i])
            kind[i] = _KIND_CODE.get(k, _UNKNOWN)
        unknown = out.unknown
        for i in np.flatnonzero(cand & (kind == _UNKNOWN)).tolist():
            c = evs[i].cat if evs[i].cat is not None else "uncategorised"
            unknown[c] = unknown.get(c, 0) + 1
        for code, name in enumerate(_KINDS):
            idx = np.flatnonzero(cand & (kind == code))
            if len(idx):
                sub = list(map(evs.__getitem__, idx.tolist())) if len(idx) < n else evs
                self._kind(name, sub, out, interners, whole)

    def _kind(self, kind: str, evs: list[Event], out: ChunkColumns, it: dict, whole: bool) -> None:
        args = list(map(_GET_ARGS, evs))
        if None in args:
            # an event without args reads as one with empty args of the chunk's type (every
            # field None or empty raw, as _get and _Interner read a None): every column below
            # is then one C-speed attrgetter pass instead of a Python loop
            first = next((a for a in args if a is not None), None)
            empty = _EMPTY_COMM_ARGS if isinstance(first, CommArgs) else _EMPTY_ARGS
            args = [empty if a is None else a for a in args]
        if kind in ("kernel", "memcpy", "memset", "cuda_sync", "gpu_user_annotation"):
            cols = _gpu_cols(evs, args, not whole)
        else:
            cols = _host_cols(evs, args, not whole)
        if kind == "kernel":
            launch = it["kernel"].encode(args, ("grid", "block"))
            for axis in "xyz":
                cols[f"grid_{axis}"] = launch
                cols[f"block_{axis}"] = launch
            cols["registers_per_thread"] = _any_int_col(_get(args, "registers_per_thread"))
            cols["shared_memory_bytes"] = _any_int_col(_get(args, "shared_memory"))
            cols["blocks_per_sm"] = _any_float_col(_get(args, "blocks_per_sm"))
            cols["warps_per_sm"] = _any_float_col(_get(args, "warps_per_sm"))
            cols["achieved_occupancy_pct"] = _any_float_col(_get(args, "occupancy"))
            idx = _with_collective(args)
            if idx:
                _add_comm(out, _comm_rows("kernel", evs, args, idx))
        elif kind == "memcpy":
            cache = self._memcpy_cache
            names = _get(evs, "name")
            for nm in set(names):
                if nm not in cache:
                    cache[nm] = _memcpy_kind(nm)
            parsed = list(map(cache.__getitem__, names))
            for j, c in enumerate(("direction", "src_memory", "dst_memory")):
                cols[c] = pl.Series([p[j] for p in parsed], dtype=pl.Utf8)
            cols["bytes"] = _any_int_col(_get(args, "bytes"))
        elif kind == "memset":
            cols["bytes"] = _any_int_col(_get(args, "bytes"))
        elif kind == "cuda_sync":
            vals = _get(args, "cuda_sync_kind")
            cols["sync_kind"] = pl.Series(
                [None if v is None else str(v) for v in vals], dtype=pl.Utf8
            )
        elif kind == "runtime":
            cols["correlation"] = _id_col(_get(args, "correlation"))
            cols["category"] = _str_col(_get(evs, "cat"), dedup=False)  # cuda_runtime...
        elif kind == "cpu_op":
            shapes = it["cpu_op"].encode(args, ("input_dims", "input_type", "concrete_inputs"))
            cols["input_shapes"] = cols["input_dtypes"] = cols["concrete_inputs"] = shapes
            idx = _with_collective(args)
            if idx:
                _add_comm(out, _comm_rows("cpu_op", evs, args, idx))
        elif kind in ("user_annotation", "gpu_user_annotation"):
            n = len(evs)
            if kind == "gpu_user_annotation":
                cols = {
                    "pid": _id_col(_get(evs, "pid")),
                    "tid": _id_col(_get(evs, "tid")),
                    "start_us": cols["start_us"],
                    "duration_us": cols["duration_us"],
                    "name": cols["name"],
                    "external_id": cols["external_id"],
                    "category": pl.Series([kind] * n, dtype=pl.Utf8),
                    "device": cols["device"],
                    "stream": cols["stream"],
                }
            else:
                cols["category"] = pl.Series([kind] * n, dtype=pl.Utf8)
                cols["device"] = pl.Series([None] * n, dtype=pl.Int64)
                cols["stream"] = pl.Series([None] * n, dtype=pl.Int64)
                match = _COMM_ANNOTATION.match
                idx = [i for i, nm in enumerate(_get(evs, "name")) if nm and match(nm)]
                if idx:
                    _add_comm(out, _comm_rows("annotation", evs, args, idx))
        elif kind == "python_function":
            cols["python_id"] = _any_int_col(_get(args, "python_id"))
            cols["python_parent_id"] = _any_int_col(_get(args, "python_parent_id"))
        ts = cols["start_us"].to_numpy()
        dur = cols["duration_us"].to_numpy()
        if whole:
            # a whole small document: here, in numpy, for the one constructor below (for each
            # table a with_columns cost more); chunks get it at the end (_final), so that the
            # columns kept while a big trace is read are no larger (the 1 GB read peaked 12
            # MB higher with it)
            cols["end_us"] = ts + dur
        df = pl.DataFrame(cols)
        ok = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0)
        n_bad = len(ok) - int(ok.sum())
        if n_bad:
            out.invalid[kind] = out.invalid.get(kind, 0) + n_bad
            df = df.filter(pl.Series(ok))
        out.frames[kind] = df


def _memory_frame(evs: list[Event]) -> pl.DataFrame:
    """``[memory]`` instant events (torch.profiler ``profile_memory=True``): one row per
    allocation (``bytes`` > 0) or free (< 0), with the caching allocator's totals after it."""
    args = [e.args for e in evs]

    def col(key: str) -> list:
        return [None if a is None else getattr(a, key, None) for a in args]

    ts = _float_col([e.ts for e in evs])
    return pl.DataFrame(
        {
            "start_us": ts,
            "duration_us": pl.Series([0.0] * len(evs), dtype=pl.Float64),
            "device": _any_int_col(col("device_id")),
            "device_type": _any_int_col(col("device_type")),
            "bytes": _any_int_col(col("alloc_bytes")),
            "allocated_bytes": _any_int_col(col("total_allocated")),
            "reserved_bytes": _any_int_col(col("total_reserved")),
        }
    ).filter(pl.col("start_us").is_finite())


def _add_comm(out: ChunkColumns, df: pl.DataFrame) -> None:
    prev = out.frames.get("comm")
    out.frames["comm"] = df if prev is None else pl.concat([prev, df], how="vertical")


def _metadata(e: Event, out: ChunkColumns) -> None:
    a = e.args
    if e.cat == ANNOTATION_CAT:  # names of `tracedx annotate`'s own tracks
        return
    if a is not None and isinstance(a.name, str):
        if e.name == "process_name":
            out.process_names[e.pid] = a.name
        elif e.name == "thread_name":
            out.thread_names[(e.pid, e.tid)] = a.name


class TableBuilder:
    """Accumulates decoded events chunk by chunk (:meth:`add`) and builds the tables (:meth:`finish`).

    A chunk's events can be freed once :meth:`add` returns: only columns are kept. Chunks
    converted elsewhere (a worker process) go in with :meth:`reserve` and :meth:`fill`; they
    are merged in chunk order, so the tables do not depend on who converted what.
    """

    def __init__(self) -> None:
        self.converter = Converter()
        self._chunks: list[ChunkColumns | None] = []

    def reset(self) -> None:
        """Forget everything added (the reader starts over)."""
        self._chunks = []

    def add(self, evs: list[Event], whole: bool = False) -> None:
        """Add a chunk of decoded events (they are not kept); ``whole``: the events of a
        whole small document (:meth:`Converter.convert`)."""
        self._chunks.append(self.converter.convert(evs, whole))

    def reserve(self) -> int:
        """A place for the next chunk, filled later by :meth:`fill`."""
        self._chunks.append(None)
        return len(self._chunks) - 1

    def fill(self, slot: int, columns: ChunkColumns) -> None:
        self._chunks[slot] = columns

    # -- at the end -------------------------------------------------------------------------
    def finish(self) -> RawTables:
        parts: dict[str, list[pl.DataFrame]] = {k: [] for k in (*_KINDS, "comm", "memory")}
        self._interners = {"kernel": _Interner(2), "cpu_op": _Interner(3)}
        self._raw: dict[str, list[tuple[bytes, ...]]] = {}  # _Interner.fields, by kind
        self._decoded: dict[tuple[str, int], list] = {}  # a field's values decoded, by kind
        self.process_names: dict[Any, str] = {}
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.unknown: dict[str, int] = {}
        self.invalid: dict[str, int] = {}
        begin_end = 0
        # interned columns: one column of a chunk's codes is kept (they all hold the same), and
        # the codes of all chunks become this builder's in one lookup after the concatenation
        remaps: dict[str, list[np.ndarray]] = {k: [] for k in _INTERNED}
        self._columns: dict[str, list[str]] = {}
        several = len(self._chunks) > 1
        for c in self._chunks:
            if c is None:
                raise RuntimeError("a reserved chunk was never filled")
            for kind, df in c.frames.items():
                if kind in _INTERNED:
                    keep = [col for col in df.columns if not (several and col == "end_us")]
                    self._columns.setdefault(kind, keep)
                    remaps[kind].append(self._interners[kind].remap(c.keys[kind]).to_numpy())
                    if several:  # (else not concatenated: _final replaces them in place)
                        df = df.drop(list(_INTERNED[kind])[1:])
                if several and "end_us" in df.columns:  # (the chunks concatenated alike)
                    df = df.drop("end_us")
                parts[kind].append(df)
            for k, v in c.invalid.items():
                self.invalid[k] = self.invalid.get(k, 0) + v
            for k, v in c.unknown.items():
                self.unknown[k] = self.unknown.get(k, 0) + v
            self.process_names.update(c.process_names)
            self.thread_names.update(c.thread_names)
            begin_end += c.begin_end
        self._chunks = []
        frames: dict[str, pl.DataFrame | None] = {
            k: (pl.concat(v, how="vertical", rechunk=True) if len(v) > 1 else v[0]) if v else None
            for k, v in parts.items()
        }
        for kind, maps in remaps.items():
            if frames[kind] is not None:
                frames[kind] = _global_codes(frames[kind], parts[kind], maps, kind)
        del parts
        warnings: list[DataWarning] = []
        # Gross timestamp outliers: written as 0 in part of the trace (seen in a real trace), or
        # corrupt values far after the rest.
        # (the far-after check first: a single corrupt 1e300 must not make the whole real
        # trace look like a group "written as 0")
        for find, keep_expr, where in (
            (_outlier_ceiling, lambda b: pl.col("start_us") < b, "far after"),
            (_outlier_cutoff, lambda b: pl.col("start_us") >= b, "far before"),
        ):
            all_ts = [
                f["start_us"].to_numpy()
                for k, f in frames.items()
                if f is not None and k != "comm"  # its events are in the other tables
            ]
            bound = find(np.concatenate(all_ts) if all_ts else np.empty(0))
            if bound is None:
                continue
            dropped: dict[str, int] = {}
            for k, f in frames.items():
                if f is None:
                    continue
                if k == "comm":
                    frames[k] = f.filter(keep_expr(bound))
                    continue
                keep = f.filter(keep_expr(bound))
                if keep.height != f.height:
                    dropped[k] = f.height - keep.height
                frames[k] = keep
            n = sum(dropped.values())
            detail = ", ".join(f"{v} {k}" for k, v in sorted(dropped.items()))
            warnings.append(
                DataWarning(
                    "outlier_timestamp",
                    n,
                    f"{n} events have timestamps {where} the rest of the trace and were left out "
                    f"({detail}): the trace is partly corrupt",
                )
            )
        # A copy or memset of negative size (a corrupt or overflowed count) has no bandwidth.
        neg = 0
        for k in ("memcpy", "memset"):
            f = frames.get(k)
            if f is not None and f.height:
                bad = f["bytes"] < 0
                if bad.any():
                    neg += int(bad.sum())
                    frames[k] = f.with_columns(
                        bytes=pl.when(pl.col("bytes") < 0).then(None).otherwise(pl.col("bytes"))
                    )
        if neg:
            warnings.append(
                DataWarning(
                    "negative_bytes",
                    neg,
                    f"{neg} copy or memset event(s) have a negative byte count: their bytes and "
                    "bandwidth are left out",
                )
            )
        # Durations no real event has: over a day, or over twice the span of the trace's start
        # times plus a second (an unsigned end-minus-start underflow writes 2^64 ns).
        # (the comm side table describes events of the other tables: they decide for it)
        all_ts = [
            f["start_us"].to_numpy()
            for k, f in frames.items()
            if f is not None and f.height and k != "comm"
        ]
        if all_ts:
            ts = np.concatenate(all_ts)
            limit = min(MAX_DURATION_US, 2 * float(ts.max() - ts.min()) + 1e6)
            long: dict[str, int] = {}
            for k, f in frames.items():
                if f is None or k == "comm" or "duration_us" not in f.columns:
                    continue
                # counted first: a filter copies every column, and almost always keeps all
                if np.count_nonzero(~(f["duration_us"].to_numpy() <= limit)):
                    keep = f.filter(pl.col("duration_us") <= limit)
                    long[k] = f.height - keep.height
                    frames[k] = keep
            if long:
                n = sum(long.values())
                detail = ", ".join(f"{v} {k}" for k, v in sorted(long.items()))
                warnings.append(
                    DataWarning(
                        "impossible_duration",
                        n,
                        f"{n} event(s) last longer than the trace or than a day (over "
                        f"{limit / 1e6:,.3f} s) and were left out ({detail}): corrupt durations",
                    )
                )
        if self.invalid:
            n = sum(self.invalid.values())
            detail = ", ".join(f"{v} {k}" for k, v in sorted(self.invalid.items()))
            warnings.append(
                DataWarning(
                    "invalid_duration",
                    n,
                    f"{n} event(s) with a negative or missing duration/timestamp left out ({detail})",
                )
            )
        if begin_end:
            warnings.append(
                DataWarning(
                    "begin_end_unused",
                    begin_end,
                    f"{begin_end} B/E (begin/end) duration event(s) were not used: tracedx reads "
                    "complete (X) events, as torch.profiler writes them; steps, ops or kernels "
                    "written as B/E pairs are missing from this analysis",
                )
            )
        if self.unknown:
            n = sum(self.unknown.values())
            detail = ", ".join(f"{v} {k}" for k, v in sorted(self.unknown.items()))
            warnings.append(
                DataWarning(
                    "unknown_category", n, f"{n} events of unknown categories kept aside ({detail})"
                )
            )
        annotations = [
            f for f in (frames["user_annotation"], frames["gpu_user_annotation"]) if f is not None
        ]
        return RawTables(
            kernels=self._final("kernel", frames["kernel"]),
            memcpys=self._final("memcpy", frames["memcpy"]),
            memsets=self._final("memset", frames["memset"]),
            launches=self._final("runtime", frames["runtime"]),
            ops=self._final("cpu_op", frames["cpu_op"]),
            annotations=self._final(
                "annotation", pl.concat(annotations, how="vertical") if annotations else None
            ),
            syncs=self._final("cuda_sync", frames["cuda_sync"]),
            python_frames=self._final("python_function", frames["python_function"]),
            comm_args=self._final("comm", frames["comm"]),
            memory=self._final("memory", frames["memory"]),
            process_names=self.process_names,
            thread_names=self.thread_names,
            unknown_categories=self.unknown,
            warnings=warnings,
        )

    def _final(self, kind: str, df: pl.DataFrame | None) -> pl.DataFrame:
        """The table ``kind`` from its rows ``df`` (with ``end_us`` when the converter added it)."""
        if df is None:
            if kind not in _EMPTY:
                schema = COMM_SCHEMA if kind == "comm" else _SCHEMAS[kind]
                _EMPTY[kind] = pl.DataFrame(schema={**schema, "end_us": pl.Float64})
            df = _EMPTY[kind].clone()  # (a constructor from the schema: 70 us a table)
        else:
            interned = _INTERNED.get(kind, {})
            if kind == "cpu_op":
                df = self._op_shapes(df)
            elif interned:
                # the values of each distinct key, gathered by code (in parallel: one with_columns)
                code = pl.col(next(iter(interned)))
                df = df.with_columns(
                    pl.lit(self._values(kind, col, field)[0]).gather(code).alias(col)
                    for col, field in interned.items()
                ).select(self._columns[kind])
        if "end_us" not in df.columns:
            df = df.with_columns(end_us=pl.col("start_us") + pl.col("duration_us"))
        if kind == "comm":  # rows of several kinds: one order whatever the chunking
            df = df.sort(
                "start_us", "source", "pid", "tid", "device", "stream", "correlation",
                "external_id", "duration_us", "name", nulls_last=True, maintain_order=True,
            )  # fmt: skip
        return df

    def _op_shapes(self, df: pl.DataFrame) -> pl.DataFrame:
        """The cpu ops ``df`` (the builder's codes in ``input_shapes``) with their three list
        columns and ``shape_code``: a UInt32 equal for two ops exactly when their
        ``input_shapes``, ``input_dtypes`` and ``concrete_inputs`` are (nulls equal), so that
        analyses group on one integer instead of three nested columns. The builder's codes
        are of raw JSON: two spellings of one value (``[1,2]``, ``[1, 2]``) are two codes, so
        the distinct keys' values are grouped once here (polars' own equality, as a group_by
        on the list columns) and each group numbered by its first key (first seen)."""
        cols = _INTERNED["cpu_op"]
        got = {c: self._values("cpu_op", c, f) for c, f in cols.items()}
        vals = {c: v for c, (v, _) in got.items()}
        plain = [p for _, p in got.values() if p is not None]  # the columns read plain
        if len(plain) == len(cols):
            # every value as the typed decoder read it (ints and strings: equal exactly when
            # their JSON is): grouped in Python, 0.25 ms less than polars' group_by (354 keys)
            first: dict[bytes, int] = {}
            group = first.setdefault
            keys = map(_ENCODE, zip(*plain, strict=True))
            canon = np.fromiter(
                (group(k, len(first)) for k in keys), np.uint32, len(vals["input_shapes"])
            )
        else:
            frame = pl.DataFrame([v.alias(c) for c, v in vals.items()])
            keys = frame.with_row_index("key").group_by(list(cols), maintain_order=True).agg("key")
            canon = np.empty(frame.height, dtype=np.uint32)
            canon[keys["key"].explode().to_numpy()] = np.repeat(
                np.arange(keys.height, dtype=np.uint32), keys["key"].list.len().to_numpy()
            )
        code = df["input_shapes"]
        out = {c: v.gather(code) for c, v in vals.items()}
        out["shape_code"] = pl.Series(canon[code.to_numpy()], dtype=pl.UInt32)
        names = [c for c in self._columns["cpu_op"] if c != "end_us"] + ["shape_code"]
        names += ["end_us"] if "end_us" in df.columns else []
        return pl.DataFrame({n: out[n] if n in out else df[n] for n in names})

    def _values(self, kind: str, col: str, field: int) -> tuple[pl.Series, list | None]:
        """Column ``col``'s value for each distinct key of ``kind``, in code order, and those
        values as the typed decoder read them where the column is read plain (else None)."""
        if kind not in self._raw:
            self._raw[kind] = self._interners[kind].fields()
        raws = self._raw[kind][field]
        if kind == "kernel":
            if (kind, field) not in self._decoded:  # a grid or block gives 3 columns
                self._decoded[kind, field] = _decode_each(raws)
            i = "xyz".index(col[-1])
            dims = [_dim3(v, i) for v in self._decoded[kind, field]]
            return pl.Series(dims, dtype=pl.Int64), None
        plain = _plain_column(raws, col)
        if plain is not None:
            return plain
        parse = _shapes if col == "input_shapes" else _strs
        return _nested([parse(v) for v in _decode_each(raws)], _SCHEMAS[kind][col]), None


_ENCODE = msgspec.json.encode
_EMPTY: dict[str, pl.DataFrame] = {}  # each kind's table without rows, made once


def _global_codes(
    df: pl.DataFrame, parts: list[pl.DataFrame], remaps: list[np.ndarray], kind: str
) -> pl.DataFrame:
    """``df`` (the concatenated ``parts``) with its code column in the builder's codes:
    ``remaps[i]`` maps part i's codes to them."""
    col = next(iter(_INTERNED[kind]))
    if len(remaps) == 1 and np.array_equal(remaps[0], np.arange(len(remaps[0]))):
        return df  # one chunk, whose codes are the builder's (its keys in the same order)
    offset = np.cumsum([0] + [len(m) for m in remaps[:-1]], dtype=np.int64)
    rows = np.repeat(offset, [p.height for p in parts])
    lookup = np.concatenate(remaps) if remaps else np.empty(0, np.uint32)
    codes = lookup[df[col].to_numpy().astype(np.int64) + rows]
    return df.with_columns(pl.Series(col, codes, dtype=pl.UInt32))


def _nested(vals: list, dtype) -> pl.Series:
    """A list column from Python lists (or None). polars builds one from lists element by
    element in Python (every inner list its own Series); its JSON reader does it natively, so
    the values go through JSON text: 10x faster for the shapes of a real trace, same values."""
    try:
        text = [None if v is None else msgspec.json.encode(v).decode() for v in vals]
        out = pl.Series(text, dtype=pl.Utf8).str.json_decode(dtype)
    except Exception:  # noqa: BLE001 (an odd value: polars' own conversion decides)
        return pl.Series(vals, dtype=dtype, strict=False)
    return out if out.dtype == dtype else pl.Series(vals, dtype=dtype, strict=False)


MAX_DURATION_US = 86_400e6  # a day


def _outlier_cutoff(ts: np.ndarray) -> float | None:
    """Timestamps written as 0 (or near it) inside a trace that lives far from 0.

    Sort the start times and take the largest gap. When the lower group sits at less than
    1/1000 of the upper group's first timestamp and the gap is over 1000x the upper group's
    extent, the lower group is corrupt (timestamps written as 0). Returns the cutoff or None.
    """
    if len(ts) < 2:
        return None
    ts = np.asarray(ts, dtype=np.float64)
    if ts.min() >= ts.max() * 1e-3:  # the rule cannot hold: skip the sort (NaN goes on)
        return None
    s = np.sort(ts)
    gaps = np.diff(s)
    best_i = int(np.argmax(gaps))
    best_gap = float(gaps[best_i])
    if not best_gap > 0.0:
        return None
    lower_max, upper_min, upper_max = float(s[best_i]), float(s[best_i + 1]), float(s[-1])
    extent = max(upper_max - upper_min, 1.0)
    if upper_min > 0 and lower_max < upper_min * 1e-3 and best_gap > 1000 * extent:
        return upper_min
    return None


def _outlier_ceiling(ts: np.ndarray) -> float | None:
    """Timestamps far after the rest of the trace (a corrupt 1e300): the mirror of the rule above.

    Split the sorted start times at the largest gap. When the upper group holds fewer events
    than the lower one, starts beyond 1000x the lower group's last timestamp, and the gap is
    over 1000x the lower group's extent, the upper group is corrupt. Returns its start or None.
    """
    if len(ts) < 2:
        return None
    ts = np.asarray(ts, dtype=np.float64)
    if ts.max() <= 1000 * max(ts.min(), 1.0):  # the rule cannot hold: skip the sort
        return None
    s = np.sort(ts)
    gaps = np.diff(s)
    best_i = int(np.argmax(gaps))
    best_gap = float(gaps[best_i])
    lower_min, lower_max, upper_min = float(s[0]), float(s[best_i]), float(s[best_i + 1])
    n_upper = len(s) - best_i - 1
    extent = max(lower_max - lower_min, 1.0)
    if (
        n_upper < best_i + 1
        and upper_min > 1000 * max(abs(lower_max), 1.0)
        and best_gap > 1000 * extent
    ):
        return upper_min
    return None


def build_tables(events: list[Event]) -> RawTables:
    """Bucket events by normalised category and build the typed tables.

    Returns RawTables with kernels, memcpys, memsets, launches (cuda_runtime/cuda_driver and
    hip calls), ops (cpu_op), annotations (user_annotation + gpu_user_annotation), syncs
    (cuda_sync: host syncs drawn on the GPU track; waiting, never busy time) and
    python_frames (python_function), plus data-quality warnings.
    """
    b = TableBuilder()
    b.add(events)
    return b.finish()
