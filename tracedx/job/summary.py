"""The per-rank summary: what the cross-rank analysis needs from one trace file, small.

``summarize_path(path, **options) -> RankSummary`` is the map of a multi-rank diagnosis: a pure
function of one file (local path, or an fsspec URL when fsspec is installed) that loads it,
runs the single-rank diagnosis and keeps a few small tables. Everything after it reads
summaries only. Names, shapes and units are fixed in ``docs/multirank.md`` (schema
``tracedx.rank-summary/1``); in short:

- ``meta``: a JSON-able dict (rank and where it came from, world size, backend, process
  groups, hostname, device, time base, analysed steps, the one-rank verdict, notes).
- ``steps``: one row per analysed step of the primary device: windows, step/CPU/busy time,
  compute, communication, overlap, exposed communication, idle time by cause.
- ``colls``: one row per communication kernel (and host-side gloo collective) in the analysed
  steps, with its metadata, message bytes, order within its group and step, and ``free_us``:
  the parts of it not covered by this rank's compute.
- ``kernels``: per non-communication kernel name: count, total and median duration.
- ``opsig``: per top-level op signature (name, input dims): count and GPU time.

Serialized forms (both standard, both byte-identical for identical input: no clock reading,
sorted keys, tables in a fixed row order):

- :meth:`RankSummary.to_bytes`: a MessagePack map ``{"schema", "meta", "steps", "colls",
  "kernels", "opsig"}`` where ``meta`` is a map and each table is the bytes of one Arrow IPC
  stream (zstd-compressed). Any MessagePack library and any Arrow reader open it.
- :meth:`RankSummary.write` (a directory): ``meta.json`` and one Parquet file per table
  (``steps.parquet``, ...), written into a temporary sibling directory that is renamed into
  place at the end, so an interrupted run never leaves a half-written summary behind.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from tracedx.analysis.comm import comm_compute_by_step, comm_rows, compute_union, free_segments
from tracedx.analysis.timeline import CAUSES
from tracedx.trace.collectives import is_comm_kernel
from tracedx.trace.dtypes import DTYPE_BYTES

SCHEMA = "tracedx.rank-summary/1"
TABLES = ("steps", "colls", "kernels", "opsig")
MAX_FREE_SEGMENTS = 16
# a tensorboard_trace_handler file name: {worker_name}.{time}.pt.trace.json[.gz], the
# default worker_name being {hostname}_{pid} (torch/profiler/profiler.py); the time is ns
# (older versions: ms), so 10 digits or more: a custom worker name such as
# "rank-34.Jul_15_10_52_41" followed by a short counter is not a host and pid
TB_NAME_RE = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.(?P<ns>\d{10,})\.pt\.trace\.json(\.gz)?$")
_SIZED_BY_MAX = ("all_reduce", "all_gather", "reduce_scatter")

_ENCODER = msgspec.msgpack.Encoder(order="deterministic")
_JSON = msgspec.json.Encoder(order="deterministic")

STEP_COLUMNS: dict[str, Any] = {
    "step": pl.Int64,
    "window_start_us": pl.Float64,
    "window_end_us": pl.Float64,
    "step_time_us": pl.Float64,
    "cpu_time_us": pl.Float64,
    "gpu_busy_us": pl.Float64,
    "compute_us": pl.Float64,
    "comm_us": pl.Float64,
    "comm_overlap_us": pl.Float64,
    "exposed_comm_us": pl.Float64,
    "kernels": pl.Int64,
    "idle_us": pl.Float64,
    **{f"idle_{c.replace(' ', '_')}_us": pl.Float64 for c in CAUSES},
}
FREE_DTYPE = pl.List(pl.Struct({"start_us": pl.Float64, "end_us": pl.Float64}))
COLL_COLUMNS: dict[str, Any] = {
    "step": pl.Int64,
    "stream": pl.Int64,
    "kernel_name": pl.Utf8,
    "coll_type": pl.Utf8,
    "collective_name": pl.Utf8,
    "pg_name": pl.Utf8,
    "pg_desc": pl.Utf8,
    "pg_ranks": pl.Utf8,
    "group_size": pl.Int64,
    "seq": pl.Int64,
    "comms_id": pl.Utf8,
    "ordinal": pl.Int64,
    "start_us": pl.Float64,
    "end_us": pl.Float64,
    "duration_us": pl.Float64,
    "dtype": pl.Utf8,
    "in_nelems": pl.Int64,
    "out_nelems": pl.Int64,
    "msg_bytes": pl.Int64,
    "free_us": FREE_DTYPE,
    "free_total_us": pl.Float64,
    # beyond the core columns (docs/multirank.md lists them)
    "host_side": pl.Boolean,
    "tid": pl.Int64,
    "meta_source": pl.Utf8,
    "group_rank": pl.Int64,
    "rank_start": pl.Int64,
    "rank_stride": pl.Int64,
    "in_split_size": pl.Utf8,
    "out_split_size": pl.Utf8,
    "src_rank": pl.Int64,
    "dst_rank": pl.Int64,
}
KERNEL_COLUMNS: dict[str, Any] = {
    "name": pl.Utf8,
    "count": pl.Int64,
    "total_us": pl.Float64,
    "median_us": pl.Float64,
}
OPSIG_COLUMNS: dict[str, Any] = {
    "name": pl.Utf8,
    "input_dims": pl.Utf8,
    "count": pl.Int64,
    "gpu_us": pl.Float64,
}
_SCHEMAS = {
    "steps": STEP_COLUMNS,
    "colls": COLL_COLUMNS,
    "kernels": KERNEL_COLUMNS,
    "opsig": OPSIG_COLUMNS,
}


@dataclass(eq=False)
class RankSummary:
    """One rank's summary (schema ``tracedx.rank-summary/1``; ``docs/multirank.md``).

    Attributes:
        meta: JSON-able dict (keys in ``docs/multirank.md``).
        steps, colls, kernels, opsig: polars DataFrames with the columns of
            :data:`STEP_COLUMNS`, :data:`COLL_COLUMNS`, :data:`KERNEL_COLUMNS`,
            :data:`OPSIG_COLUMNS`. Times in us on the rank's own trace clock.
    """

    meta: dict[str, Any]
    steps: pl.DataFrame
    colls: pl.DataFrame
    kernels: pl.DataFrame
    opsig: pl.DataFrame

    @property
    def rank(self) -> int | None:
        return self.meta.get("rank")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RankSummary):
            return NotImplemented
        return self.meta == other.meta and all(
            getattr(self, t).equals(getattr(other, t), null_equal=True) for t in TABLES
        )

    def __repr__(self) -> str:
        return (
            f"RankSummary(rank={self.meta.get('rank')}, path={self.meta.get('path')!r}, "
            f"steps={self.steps.height}, colls={self.colls.height})"
        )

    # --- bytes ------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """A MessagePack map: ``schema``, ``meta`` (a map), and per table one Arrow IPC stream."""
        doc: dict[str, Any] = {"schema": SCHEMA, "meta": self.meta}
        for t in TABLES:
            buf = BytesIO()
            # the bytes depend on the content only: one record batch whatever the chunking,
            # and plain Arrow strings (polars' string views lay the same strings out in
            # buffers that depend on how they were built)
            getattr(self, t).rechunk().write_ipc_stream(
                buf, compression="zstd", compat_level=pl.CompatLevel.oldest()
            )
            doc[t] = buf.getvalue()
        return _ENCODER.encode(doc)

    @classmethod
    def from_bytes(cls, data: bytes) -> RankSummary:
        """The inverse of :meth:`to_bytes`. Raises ValueError on another schema or bad bytes."""
        doc = _decode(data)
        tables = {t: pl.read_ipc_stream(BytesIO(doc[t])) for t in TABLES}
        return cls(meta=doc["meta"], **tables)

    # --- a directory ------------------------------------------------------------------------
    def write(self, directory: str | Path) -> Path:
        """Write ``meta.json`` and ``<table>.parquet`` files into ``directory`` (replaced if it
        exists). Atomic: everything goes to a temporary sibling first, renamed at the end."""
        d = Path(directory)
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = d.parent / f".{d.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            (tmp / "meta.json").write_bytes(
                msgspec.json.format(_JSON.encode({"schema": SCHEMA, "meta": self.meta})) + b"\n"
            )
            for t in TABLES:
                getattr(self, t).rechunk().write_parquet(tmp / f"{t}.parquet", statistics=False)
            if d.exists():
                old = d.parent / f".{d.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                os.replace(d, old)
                os.replace(tmp, d)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, d)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return d

    @classmethod
    def read(cls, directory: str | Path) -> RankSummary:
        """Read what :meth:`write` wrote. Raises ValueError when it is not a summary."""
        d = Path(directory)
        doc = _meta_json(d)
        tables = {t: _read_parquet(d / f"{t}.parquet", t, None) for t in TABLES}
        return cls(meta=doc["meta"], **tables)


def read(directory: str | Path) -> RankSummary:
    """:meth:`RankSummary.read`."""
    return RankSummary.read(directory)


def _decode(data: bytes) -> dict:
    """The MessagePack map of :meth:`RankSummary.to_bytes`; ValueError when it is not one."""
    try:
        doc = msgspec.msgpack.decode(data)
    except msgspec.DecodeError as e:
        raise ValueError(f"not a rank summary: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"not a {SCHEMA} summary (schema {got!r})")
    return doc


def _meta_json(d: Path) -> dict:
    """A summary directory's ``meta.json``; ValueError when it is not one."""
    try:
        doc = json.loads((d / "meta.json").read_bytes())
    except (OSError, ValueError) as e:
        raise ValueError(f"{d}: not a rank summary directory ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{d}: not a {SCHEMA} summary")
    return doc


# --- the driver's form ------------------------------------------------------------------------

HELD_TABLES = ("colls", "kernels", "opsig")  # kept serialized; ``steps`` is decoded


class HeldSummary:
    """A rank's summary as the cross-rank step holds it: ``meta`` and ``steps`` decoded, the
    ``colls``, ``kernels`` and ``opsig`` tables kept in their serialized form (the Arrow IPC
    bytes of :meth:`RankSummary.to_bytes`, zstd-compressed, or the Parquet files of a
    summaries directory) and decoded at each access, optionally only some columns
    (:meth:`table`). A decoded summary of a small rank takes about 200 KB of the driver's
    memory, its serialized tables 15 to 30 KB; with a summaries directory only the paths are
    held. Same attributes as :class:`RankSummary` (``meta``, ``steps``, ``colls``, ``kernels``,
    ``opsig``, ``rank``); :meth:`decoded` gives the RankSummary.

    ``keep_steps``: when set, the decoded ``colls`` keep only the rows of those steps (a job cut
    to the steps all its ranks cover). ``shared`` (of :meth:`from_bytes`, :meth:`read`): a dict
    the summaries of one job share, so that the process groups their ``meta.pg_config`` repeats
    (each lists its ranks) are held once, not once per rank.
    """

    __slots__ = ("meta", "steps", "_sources", "keep_steps")

    def __init__(self, meta: dict, steps: pl.DataFrame, sources: dict[str, bytes | Path]):
        self.meta = meta
        self.steps = steps
        self._sources = sources
        self.keep_steps: tuple[int, ...] | None = None

    @classmethod
    def from_bytes(cls, data: bytes, shared: dict | None = None) -> HeldSummary:
        """From :meth:`RankSummary.to_bytes`'s bytes. Raises ValueError like ``from_bytes``."""
        doc = _decode(data)
        meta = _share(doc["meta"], shared)
        return cls(
            meta, pl.read_ipc_stream(BytesIO(doc["steps"])), {t: doc[t] for t in HELD_TABLES}
        )

    @classmethod
    def read(cls, directory: str | Path, shared: dict | None = None) -> HeldSummary:
        """From a directory :meth:`RankSummary.write` wrote: ``meta.json`` and ``steps`` read
        now, the other tables' Parquet files at each access. Raises ValueError when it is not
        a summary."""
        d = Path(directory)
        doc = _meta_json(d)
        try:  # each file whole (its footer readable), the tables themselves read later
            for t in HELD_TABLES:
                pl.read_parquet_schema(d / f"{t}.parquet")
            steps = _read_parquet(d / "steps.parquet", "steps", None)
        except (OSError, pl.exceptions.PolarsError) as e:
            raise ValueError(f"{d}: not a whole rank summary ({e})") from None
        return cls(_share(doc["meta"], shared), steps, {t: d / f"{t}.parquet" for t in HELD_TABLES})

    def table(self, name: str, columns: list[str] | None = None) -> pl.DataFrame:
        """One table decoded from its serialized form (``columns``: only those, in that
        order; each must be in the table's schema)."""
        if name == "steps":
            return self.steps if columns is None else self.steps.select(columns)
        src = self._sources[name]
        cut = name == "colls" and self.keep_steps is not None
        want = (
            None if columns is None else list(dict.fromkeys([*columns, *(["step"] if cut else [])]))
        )
        if isinstance(src, Path):
            df = _read_parquet(src, name, want)
        else:
            df = pl.read_ipc_stream(BytesIO(src), columns=want)
        if cut:
            keep = pl.Series(list(self.keep_steps), dtype=pl.Int64).implode()
            df = df.filter(pl.col("step").is_in(keep))
        return df if columns is None or df.columns == columns else df.select(columns)

    colls = property(lambda self: self.table("colls"))
    kernels = property(lambda self: self.table("kernels"))
    opsig = property(lambda self: self.table("opsig"))

    @property
    def rank(self) -> int | None:
        return self.meta.get("rank")

    def decoded(self) -> RankSummary:
        """The whole :class:`RankSummary`."""
        return RankSummary(self.meta, self.steps, self.colls, self.kernels, self.opsig)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HeldSummary):
            other = other.decoded()
        if not isinstance(other, RankSummary):
            return NotImplemented
        return self.decoded() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"HeldSummary(rank={self.meta.get('rank')}, path={self.meta.get('path')!r}, "
            f"steps={self.steps.height})"
        )


def _read_parquet(path: Path, table: str, columns: list[str] | None) -> pl.DataFrame:
    """A summary table's Parquet file; a column added to the schema since it was written
    (``free_total_us``) reads as null."""
    schema = _SCHEMAS[table]
    names = list(schema) if columns is None else columns
    lf = pl.scan_parquet(path)
    have = set(lf.collect_schema().names())
    return (
        lf.select(
            [pl.col(k) if k in have else pl.lit(None, dtype=schema[k]).alias(k) for k in names]
        )
        .collect()
        .cast({k: schema[k] for k in names})
    )


def _share(meta: dict, shared: dict | None) -> dict:
    """``meta`` with each process group of its ``pg_config`` replaced by the equal one already
    in ``shared`` (a group lists its ranks: held once per rank, the default group alone would
    grow with ranks squared)."""
    pg = meta.get("pg_config")
    if shared is None or not isinstance(pg, list):
        return meta
    meta["pg_config"] = [shared.setdefault(_JSON.encode(g), g) for g in pg]
    return meta


# --- building ---------------------------------------------------------------------------------


def _clean(v: Any) -> Any:
    """JSON-able copy: non-finite floats -> None, tuples -> lists, keys -> str."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if v is None or isinstance(v, (bool, int, str)):
        return v
    return str(v)


def _count(v: Any) -> int | None:
    """A rank or size as written: an int, or digits (Kineto's on-demand form writes text)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if v >= 0 else None
    if isinstance(v, str) and v.strip().isdigit():
        return int(v)
    return None


def _rank(trace, dist: dict | None, notes: list[str]) -> tuple[int | None, str | None]:
    """The global rank: ``distributedInfo.rank``, else the ``Rank`` of the earliest
    default-group ``record_param_comms`` (a group rank, which in the default group is the
    global rank; ``send``/``recv`` write the peer's, so they are skipped). When both exist and
    disagree, or ``Group size`` disagrees with the world size, a note says so."""
    r = _count(dist.get("rank")) if dist else None
    rpc = trace.comm_args.filter(
        (pl.col("source") == "cpu_op")
        & (pl.col("pg_desc") == "default_pg")
        & ~pl.col("collective_name").str.to_lowercase().is_in(["send", "recv", "wait"])
    )
    ranks = sorted(set(rpc["rank"].drop_nulls().to_list()))
    sizes = sorted(set(rpc["group_size"].drop_nulls().to_list()))
    world = _count(dist.get("world_size")) if dist else None
    if ranks and (len(ranks) > 1 or (r is not None and ranks != [r])):
        notes.append(
            f"the default group's record_param_comms give rank {', '.join(map(str, ranks))}"
            + (f", distributedInfo rank {r}" if r is not None else "")
        )
    if sizes and (len(sizes) > 1 or (world is not None and sizes != [world])):
        notes.append(
            f"the default group's record_param_comms give group size {', '.join(map(str, sizes))}"
            + (f", distributedInfo world size {world}" if world is not None else "")
        )
    if r is not None:
        return r, "distributedInfo"
    first = rpc.filter(pl.col("rank").is_not_null()).sort("start_us", maintain_order=True)
    if first.height:
        return int(first["rank"][0]), "record_param_comms"
    return None, None


def _hostname(trace, path: str) -> str | None:
    m = TB_NAME_RE.match(path.rstrip("/").rsplit("/", 1)[-1])
    if m:
        return m.group("host")
    if isinstance(trace.metadata.get("host_name"), str):
        return trace.metadata["host_name"]
    cap = trace.metadata.get("tracedx") or {}  # `tracedx capture` under torchrun
    dist = cap.get("distributed") if isinstance(cap, dict) else None
    host = dist.get("hostname") if isinstance(dist, dict) else None
    return host if isinstance(host, str) else None


def _steps_table(d, device, metrics: pl.DataFrame) -> pl.DataFrame:
    w = d.windows
    w = w.filter(pl.col("device") == device) if device is not None else w
    w = w.filter(pl.col("step").is_in(d.steps))
    gaps = d.gaps
    if device is not None:
        gaps = gaps.filter(pl.col("device") == device)
    cols = []
    for c in CAUSES:
        per = gaps.filter(pl.col("cause") == c).group_by("step").agg(idle_us=_sum("duration_us"))
        w = w.join(per.rename({"idle_us": f"idle_{c.replace(' ', '_')}_us"}), on="step", how="left")
        col = f"idle_{c.replace(' ', '_')}_us"
        # no gap of a cause: 0 where the GPU was measured, null without GPU activity
        cols.append(
            pl.when(pl.col("gpu_busy_us").is_not_null()).then(pl.col(col).fill_null(0.0)).alias(col)
        )
    w = w.with_columns(cols).join(metrics, on="step", how="left")
    return w.select(list(STEP_COLUMNS)).cast(STEP_COLUMNS).sort("step")


def _sum(col: str) -> pl.Expr:
    """A float sum that does not depend on how polars splits the work (the values are added in
    sorted order): summaries must be byte-identical whatever ``POLARS_MAX_THREADS`` is."""
    return pl.col(col).sort().sum()


def _colls_table(trace, steps: list[int], device) -> tuple[pl.DataFrame, int]:
    parts = [comm_rows(trace, device)] if device is not None else []
    parts.append(comm_rows(trace, None))  # host-side (gloo) collectives in any trace
    c = pl.concat(parts, how="vertical") if len(parts) > 1 else parts[0]
    inside = c.filter(pl.col("step").is_in(steps))
    left_out = c.height - inside.height
    c = inside.sort(
        "start_us", "stream", "tid", "end_us", "kernel_name", nulls_last=True, maintain_order=True
    )
    size = pl.col("dtype").replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64)
    elems = (
        pl.when(pl.col("coll_type").is_in(list(_SIZED_BY_MAX)))
        .then(pl.max_horizontal("in_nelems", "out_nelems"))
        .otherwise(pl.col("in_nelems"))
    )
    c = c.with_columns(
        msg_bytes=elems * size,
        ordinal=pl.int_range(pl.len(), dtype=pl.Int64).over(["pg_name", "pg_ranks", "step"]),
        group_rank=pl.col("rank"),
    )
    free: list = [None] * c.height
    free_total: list = [None] * c.height
    for host in (False, True):
        idx = c.with_row_index("_i").filter(pl.col("host_side") == host)
        if idx.height == 0:
            continue
        segs, totals = free_segments(
            idx["start_us"].to_numpy(),
            idx["end_us"].to_numpy(),
            compute_union(trace, None if host else device),
            MAX_FREE_SEGMENTS,
        )
        for i, s, t in zip(idx["_i"].to_list(), segs, totals, strict=True):
            free[i], free_total[i] = s, t
    c = c.with_columns(
        free_us=pl.Series(free, dtype=FREE_DTYPE),
        free_total_us=pl.Series(free_total, dtype=pl.Float64),
    )
    return c.select(list(COLL_COLUMNS)).cast(COLL_COLUMNS), left_out


def _kernels_table(trace, steps: list[int], device) -> pl.DataFrame:
    if device is None:
        return pl.DataFrame(schema=KERNEL_COLUMNS)
    k = trace.kernels
    k = k.filter((pl.col("device") == device) & pl.col("step").is_in(steps) & ~is_comm_kernel(k))
    return (
        k.group_by("name")
        .agg(
            count=pl.len(),
            total_us=_sum("duration_us"),
            median_us=pl.col("duration_us").median(),
        )
        .cast(KERNEL_COLUMNS)
        .sort(["total_us", "name"], descending=[True, False])
    )


def _opsig_table(trace, steps: list[int], device) -> pl.DataFrame:
    ops = trace.ops.filter(pl.col("parent_id").is_null() & pl.col("step").is_in(steps)).select(
        "op_id", "name", "input_shapes"
    )
    if ops.height == 0:
        return pl.DataFrame(schema=OPSIG_COLUMNS)
    gpu = trace.gpu_activity()
    if device is not None:
        per_op = (
            gpu.filter((pl.col("device") == device) & pl.col("top_op_id").is_not_null())
            .group_by("top_op_id")
            .agg(gpu_us=_sum("duration_us"))
        )
        ops = ops.join(per_op, left_on="op_id", right_on="top_op_id", how="left")
    else:
        ops = ops.with_columns(gpu_us=pl.lit(None, pl.Float64))
    g = ops.group_by("name", "input_shapes").agg(count=pl.len(), gpu_us=_sum("gpu_us"))
    dims = [
        json.dumps(v.to_list() if isinstance(v, pl.Series) else v, separators=(",", ":"))
        if v is not None
        else ""
        for v in g["input_shapes"].to_list()
    ]
    return (
        g.with_columns(input_dims=pl.Series(dims, dtype=pl.Utf8))
        .with_columns(
            gpu_us=pl.col("gpu_us").fill_null(0.0) if device is not None else pl.col("gpu_us")
        )
        .select(list(OPSIG_COLUMNS))
        .cast(OPSIG_COLUMNS)
        .sort(["gpu_us", "count", "name", "input_dims"], descending=[True, True, False, False])
    )


def summarize(trace, diagnosis=None) -> RankSummary:
    """Summarise a loaded trace (and its single-rank diagnosis, computed when not given).

    Args:
        trace: a :class:`tracedx.trace.Trace`.
        diagnosis: ``tracedx.diagnose(trace)``'s result, when already computed.

    Returns:
        RankSummary. ``meta['path']``, ``file_size_bytes`` and ``file_mtime`` describe
        ``trace.path`` when it is a local file (``summarize_path`` sets them for URLs).

    Raises:
        tracedx.errors.TraceError: from the diagnosis (a trace with no events to analyse).
    """
    import tracedx
    from tracedx.analysis.diagnosis import diagnose

    d = diagnosis if diagnosis is not None else diagnose(trace)
    device = d.primary_device
    steps = list(d.steps)
    metrics = d.comm_by_step  # computed once, by the diagnosis, when it has communication
    if metrics is None:
        metrics = comm_compute_by_step(trace, steps, device)
    steps_t = _steps_table(d, device, metrics)
    colls, left_out = _colls_table(trace, steps, device)
    notes = list(d.notes)
    if left_out:
        notes.append(f"{left_out} collective(s) outside the analysed steps left out of the summary")
    dist = trace.distributed_info
    rank, rank_source = _rank(trace, dist, notes)
    path = str(trace.path)
    size = mtime = None
    try:
        st = os.stat(path)
        size, mtime = st.st_size, st.st_mtime
    except OSError:
        pass
    base = trace.metadata.get("base_time_ns")
    meta = {
        "schema": SCHEMA,
        "tracedx_version": tracedx.__version__,
        "path": path,
        "file_size_bytes": size,
        "file_mtime": mtime,
        "rank": rank,
        "rank_source": rank_source,
        "world_size": _count(dist.get("world_size")) if dist else None,
        "backend": dist.get("backend") if dist else None,
        "pg_config": dist.get("pg_config") if dist else None,
        "hostname": _hostname(trace, path),
        "device_name": trace.device_name,
        "device": device,
        "base_time_ns": int(base) if isinstance(base, (int, float)) and math.isfinite(base) else 0,
        "steps": steps,
        "steps_synthetic": bool(trace.steps_synthetic),
        "single_rank": {
            "regime": d.regime,
            "bottleneck": d.bottleneck,
            "findings": [
                # 9 significant digits: the diagnosis' float sums may differ in the last bits
                # with the number of polars threads; the summary must not
                {"id": f.fix, "estimated_speedup": float(f"{f.estimated_speedup:.9g}")}
                for f in d.findings
            ],
        },
        "notes": notes,
        "warnings": [
            {"kind": w.kind, "count": w.count, "message": w.message} for w in trace.warnings
        ],
    }
    return RankSummary(
        meta=_clean(meta),
        steps=steps_t.rechunk(),
        colls=colls.rechunk(),
        kernels=_kernels_table(trace, steps, device).rechunk(),
        opsig=_opsig_table(trace, steps, device).rechunk(),
    )


_LOAD_OPTIONS = ("repair",)
_DIAGNOSE_OPTIONS = ("device", "peak_tflops", "bandwidth_gbs", "calibration", "steps")


def check_options(options: dict, where: str = "summarize_path") -> dict:
    """``options`` of :func:`summarize_path` checked before any file is read: the same dict,
    ``steps`` in :func:`~tracedx.analysis.diagnosis.check_steps`' form.

    Raises TypeError for an unknown option or a ``steps`` of the wrong type, TraceError for a
    malformed ``steps`` string."""
    unknown = sorted(set(options) - set(_LOAD_OPTIONS) - set(_DIAGNOSE_OPTIONS))
    if unknown:
        known = ", ".join((*_LOAD_OPTIONS, *_DIAGNOSE_OPTIONS))
        raise TypeError(f"{where}: unknown option(s) {', '.join(unknown)} (known: {known})")
    if options.get("steps") is not None:
        from tracedx.analysis.diagnosis import check_steps

        options = {**options, "steps": check_steps(options["steps"])}
    return options


def summarize_path(path: str | os.PathLike, **options) -> RankSummary:
    """Load, diagnose and summarise one trace file: the per-rank map, a pure function of the file.

    Args:
        path: a local trace file, or an fsspec URL (``s3://...``, ``gs://...``, ``file://...``;
            needs ``fsspec`` and the protocol's package) which is copied to a temporary file.
        options: ``repair`` (for :func:`tracedx.load`) and ``device``, ``peak_tflops``,
            ``bandwidth_gbs``, ``calibration``, ``steps`` (for :func:`tracedx.diagnose`).

    Returns:
        RankSummary; ``meta['path']`` is ``path`` as given.

    Raises:
        TypeError: an unknown option (:func:`check_options`). tracedx.errors.TraceFormatError / TraceError: the file
        cannot be read or holds nothing to analyse (one line naming the file).
    """
    from tracedx.analysis.diagnosis import diagnose
    from tracedx.errors import TraceFormatError
    from tracedx.trace import load

    options = check_options(options)
    lopts = {k: v for k, v in options.items() if k in _LOAD_OPTIONS}
    dopts = {k: v for k, v in options.items() if k in _DIAGNOSE_OPTIONS}
    name = os.fspath(path)
    url = "://" in name and not name.startswith("file://")
    local = name[len("file://") :] if name.startswith("file://") else name
    if not url:
        trace = load(local, **lopts)
        s = summarize(trace, diagnose(trace, **dopts))
        s.meta["path"] = name
        return s
    try:
        import fsspec
    except ImportError:
        raise TraceFormatError(f"{name}: reading a URL needs fsspec (pip install fsspec)") from None
    try:
        fs, fpath = fsspec.core.url_to_fs(name)
        info = fs.info(fpath)
    except (OSError, ValueError, ImportError) as e:
        raise TraceFormatError(f"{name}: cannot open: {e}") from None
    with tempfile.TemporaryDirectory(prefix="tracedx-") as tmp:
        local_copy = Path(tmp) / (fpath.rstrip("/").rsplit("/", 1)[-1] or "trace.json")
        with fs.open(fpath, "rb") as src, open(local_copy, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        trace = load(local_copy, **lopts)
        # messages and notes name the URL, never the temporary copy
        trace.path = name
        trace.metadata["path"] = name
        s = summarize(trace, diagnose(trace, **dopts))
    mtime = info.get("mtime", info.get("LastModified", info.get("updated")))
    if hasattr(mtime, "timestamp"):
        mtime = mtime.timestamp()
    s.meta.update(
        path=name,
        file_size_bytes=info.get("size"),
        file_mtime=mtime if isinstance(mtime, (int, float)) else None,
    )
    return s
