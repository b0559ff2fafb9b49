"""Reading torch.profiler traces: ``load(path) -> Trace`` with typed, linked polars tables.

Data flows one way: file -> decoded events (:mod:`.source`) -> typed tables (:mod:`.tables`)
-> linked tables and steps (:mod:`.link`). Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tracedx.alloc import trim_heap
from tracedx.errors import TraceFormatError
from tracedx.trace.begin_end import read_tables
from tracedx.trace.collectives import build_collectives
from tracedx.trace.link import (
    api_kind,
    api_kind_expr,
    assign_step,
    external_id_index,
    extract_steps,
    launch_table,
    link_gpu_tables,
    link_launches_to_ops,
    op_tree,
    starts_with,
    step_windows,
)
from tracedx.trace.source import TRUNCATED_NOTE, collector_paused
from tracedx.trace.tables import COMM_SCHEMA, DataWarning

__all__ = ["DataWarning", "Trace", "load"]


@dataclass(repr=False, eq=False)
class Trace:
    """A loaded trace. All times are microseconds on the trace's own clock.

    Tables (polars DataFrames):

    - ``kernels``, ``memcpys``, ``memsets``: GPU activity. ``device``, ``stream``, ``start_us``,
      ``end_us``, ``duration_us``, ``name``, ``correlation``, ``external_id``; kernels add
      ``grid_x..z``, ``block_x..z``, ``registers_per_thread``, ``shared_memory_bytes``,
      ``blocks_per_sm``, ``warps_per_sm``, ``achieved_occupancy_pct``; memcpys add ``direction``
      (HtoD/DtoH/DtoD/...), ``src_memory``/``dst_memory`` (Pageable/Pinned/Device) and ``bytes``;
      memsets add ``bytes``. Linked columns: ``launch_name``, ``launch_tid``, ``launch_start_us``,
      ``launch_duration_us``, ``op_id``, ``op_name``, ``top_op_id``, ``top_op_name``, ``step``.
    - ``syncs``: ``cuda_sync`` events (host waits drawn on the GPU track; never busy time).
    - ``launches``: cuda_runtime / cuda_driver / hip calls: ``pid``, ``tid``, ``start_us``,
      ``end_us``, ``duration_us``, ``name``, ``correlation``, ``external_id``, ``api_kind``
      (kernel/graph/memcpy/memset/sync/other), ``op_id``, ``step``.
    - ``ops``: cpu_op: ``op_id``, ``pid``, ``tid``, ``start_us``, ``end_us``, ``duration_us``,
      ``name``, ``external_id``, ``input_shapes`` (list of int lists), ``input_dtypes``,
      ``concrete_inputs``, ``shape_code`` (UInt32, equal for two ops of the trace exactly when
      their three list columns are: a key to group on; codes of two traces are unrelated),
      ``parent_id``, ``top_op_id``, ``depth``, ``step``.
    - ``annotations``: user_annotation and gpu_user_annotation (``category``).
    - ``steps``: one row per ``ProfilerStep#N``: ``step``, ``start_us``, ``end_us``,
      ``duration_us`` (the host window). Without markers, one synthetic step 0 spanning the
      trace (``steps_synthetic`` is True).
    - ``python_frames``: python_function events (with_stack=True).
    - ``memory``: ``[memory]`` allocator events (``profile_memory=True``): ``start_us``,
      ``device`` (-1 or null for host memory), ``device_type`` (1 = CUDA), ``bytes`` (> 0
      allocated, < 0 freed), ``allocated_bytes`` and ``reserved_bytes`` (the caching
      allocator's totals on that device after the event), ``step``. Empty without them.
    - ``comm_args``: the collective args of the few events that carry them (kernels and
      ``record_param_comms`` ops with ``Collective name``, ``nccl:*``/``gloo:*`` annotations);
      read :attr:`collectives` instead.
    """

    path: str
    kernels: pl.DataFrame
    memcpys: pl.DataFrame
    memsets: pl.DataFrame
    syncs: pl.DataFrame
    launches: pl.DataFrame
    ops: pl.DataFrame
    annotations: pl.DataFrame
    steps: pl.DataFrame
    python_frames: pl.DataFrame
    steps_synthetic: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    warnings: list[DataWarning] = field(default_factory=list)
    memory: pl.DataFrame = field(default_factory=lambda: pl.DataFrame())
    comm_args: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema={**COMM_SCHEMA, "end_us": pl.Float64})
    )
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def memo(self, name: str, tables: tuple, build):
        """``build()``, computed once per set of ``tables`` (compared by identity, so replacing
        a table rebuilds it) and kept under ``name``: what analyses derive from the tables and
        ask for more than once (the GPU activity, the host syncs, the collectives)."""
        hit = self._memo.get(name)
        if (
            hit is not None
            and len(hit[0]) == len(tables)
            and all(a is b for a, b in zip(hit[0], tables, strict=True))
        ):
            return hit[1]
        out = build()
        self._memo[name] = (tables, out)
        return out

    @property
    def distributed_info(self) -> dict[str, Any] | None:
        """The top-level ``distributedInfo`` object as written (``backend``, ``rank``,
        ``world_size``, and since 2024 ``pg_count``, ``pg_config``, ``nccl_version``), or None."""
        return self.metadata.get("distributed_info")

    @property
    def collectives(self) -> pl.DataFrame:
        """One row per communication kernel, and per host-side (gloo) collective.

        Columns: ``device``, ``stream``, ``tid`` (host rows: the worker thread), ``start_us``,
        ``end_us``, ``duration_us``, ``kernel_name`` (host rows: the ``gloo:*`` label),
        ``correlation``, ``external_id``, ``step``, ``host_side``, ``meta_source``,
        ``coll_type`` (normalised from ``Collective name``), ``collective_name`` (raw),
        ``pg_name``, ``pg_desc``, ``pg_ranks`` (as written, may end in ``...``),
        ``group_size``, ``rank`` (this process's rank in the group), ``seq``, ``comms_id``
        (unsigned 64-bit, as decimal text), ``rank_start``, ``rank_stride``, ``dtype``,
        ``in_nelems``, ``out_nelems``, ``in_split_size``, ``out_split_size``, ``src_rank``,
        ``dst_rank``. See :mod:`tracedx.trace.collectives` for where each value comes from.
        Built once per set of tables.
        """
        return self.memo(
            "collectives",
            (self.kernels, self.comm_args, self.steps),
            lambda: build_collectives(self.kernels, self.comm_args, self.steps),
        )

    def __repr__(self) -> str:
        from tracedx.report.card import trace_repr

        return trace_repr(self)

    def _repr_html_(self) -> str:
        from tracedx.report.card import trace_card

        return trace_card(self)

    @property
    def devices(self) -> list[int]:
        """Device indices with GPU activity, sorted."""
        return sorted(self._device_counts())

    def _device_counts(self) -> dict[int, int]:
        """GPU events (kernels, memcpys, memsets) per device index, a null device left out."""

        def build() -> dict[int, int]:
            counts: dict[int, int] = {}
            for t in (self.kernels, self.memcpys, self.memsets):
                for dev, n in _value_counts(t["device"]):
                    counts[dev] = counts.get(dev, 0) + n
            return counts

        return self.memo("device_counts", (self.kernels, self.memcpys, self.memsets), build)

    @property
    def truncated(self) -> bool:
        """Whether ``--repair`` kept only the events before a break inside the event list: any
        step may then have lost launches or GPU events (Kineto does not write events in time
        order)."""
        return any(r.startswith(TRUNCATED_NOTE) for r in self.metadata.get("repairs") or [])

    @property
    def device_entry(self) -> dict | None:
        """The ``deviceProperties`` entry of the GPU the kernels ran on: the one whose ``id`` is
        the busiest device (most GPU events), else the first named entry (no GPU events). Matched
        by id, never by position: a display GPU listed first, or entries out of id order, must
        not give another GPU's peaks. None when no listed entry is that device (a note says so)."""
        props = [
            p
            for p in self.metadata.get("device_properties") or []
            if isinstance(p, dict) and isinstance(p.get("name"), str)
        ]
        busiest = self._busiest_device()
        if busiest is not None and any(_as_int(p.get("id")) is not None for p in props):
            for p in props:
                if _as_int(p.get("id")) == busiest:
                    return p
            self.metadata["device_mismatch"] = busiest
            return None
        return props[0] if props else None

    def _busiest_device(self) -> int | None:
        counts = self._device_counts()
        # ties: the lowest device index
        return max(sorted(counts), key=counts.get) if counts else None

    @property
    def inconsistent_timestamps(self) -> str | None:
        """What makes the host and GPU timestamps inconsistent (a GPU clock far from the host's,
        a GPU event seconds after its launch), or None: verdicts and estimates that rest on
        the step windows are withheld then."""
        for w in self.warnings:
            if w.kind == INCONSISTENT_TIMESTAMPS:
                return w.message
        return None

    @property
    def has_gpu_activity(self) -> bool:
        return (self.kernels.height + self.memcpys.height + self.memsets.height) > 0

    def gpu_activity(self) -> pl.DataFrame:
        """Kernels, memcpys and memsets in one frame with a ``kind`` column (busy-time intervals).

        Built once per set of tables (analyses call it often; replacing a table rebuilds it).
        """
        return self.memo(
            "gpu_activity", (self.kernels, self.memcpys, self.memsets), self._gpu_activity
        )

    def _gpu_activity(self) -> pl.DataFrame:
        cols = [
            "device",
            "stream",
            "start_us",
            "end_us",
            "duration_us",
            "name",
            "correlation",
            "launch_start_us",
            "launch_tid",
            "launch_name",
            "op_id",
            "top_op_id",
            "step",
        ]
        parts = [
            t[cols].hstack([pl.Series("kind", [k]).new_from_index(0, t.height)])
            for k, t in (
                ("kernel", self.kernels),
                ("memcpy", self.memcpys),
                ("memset", self.memsets),
            )
        ]
        return pl.concat(parts, how="vertical_relaxed")

    @property
    def device_name(self) -> str | None:
        """The name of the GPU the trace's kernels ran on (:attr:`device_entry`), else the one
        tracedx capture recorded."""
        entry = self.device_entry
        if entry is not None:
            return entry["name"]
        if self.metadata.get("device_mismatch"):
            return None
        cap = self.metadata.get("tracedx") or {}
        name = cap.get("gpu_name") if isinstance(cap, dict) else None
        return name if isinstance(name, str) else None


# A GPU event that starts this far before its launch call means the GPU clock is off (CUPTI
# and the host clock agree to a few microseconds on a sane trace).
MAX_CLOCK_SKEW_US = 1_000.0
# A GPU event that starts this long after its launch call was not queued that long: one
# corrupt timestamp (500 s) would make a step of minutes.
MAX_LAUNCH_LAG_US = 60e6
INCONSISTENT_TIMESTAMPS = "inconsistent_timestamps"


# A start time above this many microseconds is after the year 5000: it can only be ns.
_NS_START = 1e17
# With displayTimeUnit "ns", a median kernel of a millisecond or more (in us) is read as ns.
_NS_MEDIAN_KERNEL = 1_000.0


_SHORT_RANGE = 4096
"""Integer values spanning fewer than this are counted by numpy's bincount, not polars."""


def _value_counts(s: pl.Series) -> list[tuple[int, int]]:
    """(value, count) of each value of an integer column, nulls left out: counted by numpy
    where the values span a short range (device indices), else by polars."""
    if not len(s) or s.null_count() == len(s):
        return []
    v = _non_null(s).to_numpy()
    lo, hi = int(v.min()), int(v.max())
    if hi - lo < _SHORT_RANGE:
        n = np.bincount(v - lo)
        return [(lo + int(i), int(n[i])) for i in np.flatnonzero(n)]
    return [(d, n) for d, n in s.drop_nulls().value_counts().rows()]


def _gpu_events(n: int, one: str, many: str) -> str:
    """``1 GPU event has`` / ``3 GPU events have``: the count, the noun and the verb agreeing."""
    return f"{n} GPU event {one}" if n == 1 else f"{n} GPU events {many}"


def _nanoseconds(doc, raw) -> str | None:
    """Why the trace's times are nanoseconds (the evidence, for the note), or None.

    The Chrome trace format's ``ts`` and ``dur`` are microseconds, and ``displayTimeUnit`` only
    sets the viewer's display; some writers still write ns. Read as ns: start times that can
    only be ns (over 1e17 us), or ``displayTimeUnit: "ns"`` with a median kernel of 1 ms or
    more in us (a few microseconds is usual)."""
    starts = [t["start_us"] for t in (raw.kernels, raw.ops, raw.launches) if t.height]
    if not starts:
        return None
    # the median is over the bound only if some start is (a NaN never is)
    if any((s > _NS_START).any() for s in starts):
        med_start = float(pl.concat(starts).median())
        if med_start > _NS_START:
            return f"start times near {med_start:.3g}, which can only be ns"
    unit = doc.displayTimeUnit if isinstance(doc.displayTimeUnit, str) else ""
    if unit.lower() == "ns" and raw.kernels.height:
        med_k = float(raw.kernels["duration_us"].median())
        if med_k >= _NS_MEDIAN_KERNEL:
            return f'displayTimeUnit "ns" and a median kernel of {med_k:,.0f} units'
    return None


def _scaled(raw, factor: float):
    """``raw`` with every time column (start, duration, end) multiplied by ``factor``."""
    import dataclasses

    cols = ("start_us", "duration_us", "end_us")
    out = {}
    for f in dataclasses.fields(raw):
        v = getattr(raw, f.name)
        if isinstance(v, pl.DataFrame):
            v = v.with_columns(pl.col(c) * factor for c in cols if c in v.columns)
        out[f.name] = v
    return dataclasses.replace(raw, **out)


def _as_int(v) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().isascii() and v.strip().isdigit():
        return int(v)
    return None


def _metadata(doc, path: str, repairs: list[str]) -> dict[str, Any]:
    dist = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else None
    cap = doc.tracedx if isinstance(doc.tracedx, dict) else None
    return {
        "path": path,
        "schema_version": doc.schemaVersion,
        "device_properties": doc.deviceProperties if isinstance(doc.deviceProperties, list) else [],
        "cuda_runtime_version": doc.cuda_runtime_version,
        "cuda_driver_version": doc.cuda_driver_version,
        "distributed_info": dist,
        "rank": dist.get("rank") if dist else None,
        "world_size": dist.get("world_size") if dist else None,
        "trace_name": doc.traceName if isinstance(doc.traceName, str) else None,
        "host_name": doc.host_name if isinstance(doc.host_name, str) else None,
        "base_time_ns": doc.baseTimeNanoseconds,
        "record_shapes": doc.record_shapes,
        "tracedx": cap,
        "pytorch_version": cap.get("torch_version") if cap else None,
        "repairs": repairs,
    }


def load(path: str | Path, *, repair: bool = False, progress=None, cache: bool = False) -> Trace:
    """Read a torch.profiler chrome trace (``.json`` or gzip) into linked polars tables.

    Args:
        path: the trace file (``export_chrome_trace`` or ``tensorboard_trace_handler`` output,
            plain or gzipped; gzip is detected by its magic bytes).
        repair: salvage a broken file (truncated JSON, NaN/inf literals, invalid UTF-8, raw
            control characters, unescaped Windows paths); every repair becomes a warning.
        progress: optional ``f(bytes_read)``, called with the bytes of the file read so far
            (for a progress bar; the file's size is the total): from the reading thread, or
            once from this one for a plain file read at once (under 16 MB).
        cache: read and fill the command line's cache of tables (:func:`tracedx.cache.load`,
            which also says whether it hit): an unchanged file loaded before comes back from
            its Arrow IPC files instead of its JSON (about a tenth of the time at 100 MB and
            up). A cache that cannot be written is a ``UserWarning``, not an error.

    Returns:
        Trace.

    Raises:
        tracedx.errors.TraceFormatError: the file is missing, empty, not JSON, truncated, or
            not a chrome trace (a directory, a ``.py`` script: the message says what to call
            instead); the message is one line that says what and where.
    """
    p = Path(path)
    if p.is_dir():
        raise TraceFormatError(
            f"{p}: is a directory, not a trace file (a job's traces: tracedx.load_job)"
        )
    if p.suffix == ".py" and p.is_file():
        raise TraceFormatError(
            f"{p} is a Python script, not a trace: `tracedx capture {p}` runs it under "
            "torch.profiler and writes its trace (in Python: `with tracedx.profile(): ...`)"
        )
    if cache:
        import warnings

        from tracedx.cache import load as cached_load

        return cached_load(p, repair=repair, progress=progress, on_note=warnings.warn)[0]
    with collector_paused():
        return _load(p, repair, progress)


def _load(p: Path, repair: bool, progress) -> Trace:
    """:func:`load` of a path that is not a directory."""
    doc, repairs, raw = read_tables(p, repair=repair, progress=progress)  # B/E paired as X
    # the decoded events are gone: the heap they left free goes back
    trim_heap(max(raw.ops.height, raw.launches.height, raw.kernels.height))
    warnings = [DataWarning("repaired", 1, f"repaired: {r}") for r in repairs] + raw.warnings
    ns = _nanoseconds(doc, raw)
    if ns:
        raw = _scaled(raw, 1e-3)
        warnings.append(
            DataWarning(
                "ns_timestamps",
                1,
                f"timestamps and durations are in nanoseconds ({ns}), not the microseconds of "
                "the Chrome trace format: they were divided by 1000",
            )
        )

    # Old traces wrote ProfilerStep#N as a cpu_op (cat Operator): it is a step annotation, not an
    # op (as an op it would be the parent of every op and the top-level op of every kernel).
    is_step_op = starts_with(raw.ops["name"], "ProfilerStep#")
    step_ops = None
    if is_step_op.any():
        is_step_op = raw.ops["name"].str.contains(r"^ProfilerStep#[0-9]{1,18}$")
        step_ops = raw.ops.filter(is_step_op)
        if not step_ops.height:
            step_ops = None
    # a copy of the op table only when there is something to take out
    ops, not_nested, thread = op_tree(
        raw.ops.filter(~is_step_op) if step_ops is not None else raw.ops
    )
    if not_nested:
        warnings.append(
            DataWarning(
                "not_nested",
                not_nested,
                f"{not_nested} cpu ops end after their enclosing op (ranges that overlap without nesting); kept under the enclosing op",
            )
        )

    annotations = raw.annotations
    if step_ops is not None:
        annotations = pl.concat(
            [
                annotations,
                step_ops.select(annotations.columns[:6]).with_columns(
                    category=pl.lit("user_annotation"),
                    device=pl.lit(None, pl.Int64),
                    stream=pl.lit(None, pl.Int64),
                    end_us=pl.col("start_us") + pl.col("duration_us"),
                ),
            ],
            how="vertical_relaxed",
        )
    steps = extract_steps(annotations, warnings)
    synthetic = steps.height == 0
    if synthetic:
        starts, ends = [], []
        for t in (
            raw.kernels,
            raw.memcpys,
            raw.memsets,
            raw.launches,
            ops,
            raw.annotations,
            raw.syncs,
        ):
            if t.height:
                starts.append(t["start_us"].min())
                ends.append(t["end_us"].max())
        if starts:
            s0, e0 = min(starts), max(ends)
            steps = pl.DataFrame(
                {
                    "step": [0],
                    "name": ["whole trace"],
                    "pid": [None],
                    "tid": [None],
                    "start_us": [s0],
                    "end_us": [e0],
                    "duration_us": [e0 - s0],
                },
                schema={
                    "step": pl.Int64,
                    "name": pl.Utf8,
                    "pid": pl.Int64,
                    "tid": pl.Int64,
                    "start_us": pl.Float64,
                    "end_us": pl.Float64,
                    "duration_us": pl.Float64,
                },
            )

    windows = step_windows(steps)
    ops = assign_step(ops, steps, "start_us", windows=windows)
    launches = _with_api_kind(raw.launches)
    n_dup = _n_repeated(_non_null(launches["correlation"]))
    if n_dup:
        warnings.append(
            DataWarning(
                "duplicate_correlation",
                n_dup,
                f"{n_dup} host calls share a correlation id with another; the first is used for linking",
            )
        )
        launches = pl.concat(
            [
                launches.filter(pl.col("correlation").is_null()),
                launches.filter(pl.col("correlation").is_not_null()).unique(
                    "correlation", keep="first", maintain_order=True
                ),
            ]
        ).sort("start_us")
    ext_index = external_id_index(ops)
    launches, _ = link_launches_to_ops(launches, ops, ext_index, thread)
    reused = int(np.count_nonzero(ext_index["n_ops"].to_numpy() > 1))
    if reused:
        warnings.append(
            DataWarning(
                "reused_external_id",
                reused,
                f"{reused} External id(s) are carried by more than one op: their launches go to "
                "the op that holds them in time, so device time is not all put on one op",
            )
        )
    launches = assign_step(launches, steps, "start_us", windows=windows)

    launch_info = launch_table(launches, ops)

    # Exact duplicates (a merged or re-exported trace) are one event: they would otherwise
    # count twice in kernel counts and device time by kind.
    n_gpu_dup = 0
    deduped = []
    for t in (raw.kernels, raw.memcpys, raw.memsets):
        # a copy only when there is something to drop (hashing the keys is the cheap part),
        # and a look at the keys only when two events share a correlation id (or have none)
        c = t["correlation"]
        maybe = c.null_count() > 1 or _n_repeated(_non_null(c)) > 0
        if maybe and t.select(pl.struct(_GPU_DUP_KEY).is_duplicated().any()).item():
            u = t.unique(subset=_GPU_DUP_KEY, keep="first", maintain_order=True)
            n_gpu_dup += t.height - u.height
            t = u
        deduped.append(t)
    kernels, memcpys, memsets, syncs = link_gpu_tables([*deduped, raw.syncs], launch_info)
    if synthetic and steps.height:
        kernels, memcpys, memsets, syncs = (
            t.with_columns(step=pl.lit(0, pl.Int64)) for t in (kernels, memcpys, memsets, syncs)
        )
    if n_gpu_dup:
        warnings.append(
            DataWarning(
                "duplicate_gpu_event",
                n_gpu_dup,
                f"{_gpu_events(n_gpu_dup, 'is', 'are')} exact duplicates of another (same device, stream, "
                "start, duration, name and correlation): each is counted once",
            )
        )
    warnings += _quality(kernels, memcpys, memsets, launches)
    meta = _metadata(doc, str(p), repairs)
    meta["process_names"] = {str(k): v for k, v in raw.process_names.items()}
    meta["unknown_categories"] = raw.unknown_categories
    return Trace(
        path=str(p),
        kernels=kernels,
        memcpys=memcpys,
        memsets=memsets,
        syncs=syncs,
        launches=launches,
        ops=ops,
        annotations=annotations,
        steps=steps,
        python_frames=raw.python_frames,
        memory=assign_step(raw.memory, steps, "start_us", windows=windows)
        if raw.memory is not None
        else pl.DataFrame(),
        steps_synthetic=synthetic,
        metadata=meta,
        warnings=warnings,
        comm_args=raw.comm_args,
    )


_FEW_LAUNCHES = 500
"""Up to this many launches, their API kinds come from a dict of the names in Python."""


def _with_api_kind(launches: pl.DataFrame) -> pl.DataFrame:
    """``launches`` with ``api_kind``: the name rules (:func:`api_kind_expr`) once per distinct
    call name, not once per call, the names read as codes of an enum of the distinct ones."""
    name = launches["name"]
    if name.null_count():
        kinds = launches.select(pl.col("name").unique()).with_columns(
            api_kind=api_kind_expr("name")
        )
        return launches.with_columns(
            api_kind=pl.col("name").replace_strict(kinds["name"], kinds["api_kind"])
        )
    if len(name) <= _FEW_LAUNCHES:  # a few launches: a dict of the names in Python
        kinds: dict[str, str] = {}
        out = [kinds.get(x) or kinds.setdefault(x, api_kind(x)) for x in name.to_list()]
        return launches.hstack([pl.Series("api_kind", out, dtype=pl.Utf8)])
    names = name.unique()
    code = name.cast(pl.Enum(names)).to_physical().to_numpy()
    kind = pl.Series("api_kind", [api_kind(x) for x in names.to_list()], dtype=pl.Utf8)
    return launches.hstack([kind[code]])


def _non_null(s: pl.Series) -> pl.Series:
    return s.drop_nulls() if s.null_count() else s


_GPU_DUP_KEY = ["device", "stream", "start_us", "duration_us", "name", "correlation"]


def _n_repeated(ids: pl.Series) -> int:
    """How many of ``ids`` (integers, no nulls) equal another of them (polars'
    ``is_duplicated().sum()``); ids that strictly increase, as correlation ids are written, are
    seen to repeat none without hashing them."""
    v = ids.to_numpy()
    if len(v) < 2 or (v[1:] > v[:-1]).all():
        return 0
    return int(ids.is_duplicated().sum())


def _column(tables: list[pl.DataFrame], name: str, fill=None) -> np.ndarray:
    """A column of several tables as one array (nulls as ``fill``; a float column's nulls
    read as NaN without one)."""
    parts = [_filled(t[name], fill) for t in tables if t.height]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _filled(s: pl.Series, fill) -> np.ndarray:
    """``s.fill_null(fill).to_numpy()``, with no polars call when it has no nulls, or is a
    float column (its nulls read as NaN: filled in numpy when it holds no NaN of its own)."""
    n_null = s.null_count()
    if fill is None or not n_null:
        return s.to_numpy()
    if s.dtype == pl.Float64:
        a = s.to_numpy()
        if np.isnan(fill):
            return a
        nan = np.isnan(a)
        if np.count_nonzero(nan) == n_null:
            return np.where(nan, fill, a)
    return s.fill_null(fill).to_numpy()


def _null_mask(tables: list[pl.DataFrame], name: str) -> np.ndarray | None:
    """Where a column of several tables (as :func:`_column` puts them) is null; None: nowhere."""
    if not any(t[name].null_count() for t in tables):
        return None
    return np.concatenate([t[name].is_null().to_numpy() for t in tables])


def _is_kernel_launch(launches: pl.DataFrame) -> np.ndarray:
    """Which launches are kernel or graph launches (``api_kind``)."""
    kind = launches["api_kind"]
    if kind.null_count():
        return kind.is_in(["kernel", "graph"]).fill_null(False).to_numpy()
    return (kind == "kernel").to_numpy() | (kind == "graph").to_numpy()


def _quality(
    kernels: pl.DataFrame, memcpys: pl.DataFrame, memsets: pl.DataFrame, launches: pl.DataFrame
) -> list[DataWarning]:
    """Data-quality counts that do not change the metrics but must be reported.

    On the GPU events' columns as arrays, one stream at a time; each count is the rule stated
    where it is made, and none depends on the order of the tables' rows."""
    out: list[DataWarning] = []
    tables = [t for t in (kernels, memcpys, memsets) if t.height]
    if not tables:
        n_launch = int(np.count_nonzero(_is_kernel_launch(launches)))
        if n_launch:
            out.append(
                DataWarning(
                    "no_gpu_activity",
                    n_launch,
                    f"{n_launch} kernel launches but 0 kernels recorded: device activity is missing from the trace",
                )
            )
        return out
    n = sum(t.height for t in tables)
    start = _column(tables, "start_us")
    launch_start = _column(tables, "launch_start_us", np.nan)  # null: no launch
    linked = ~np.isnan(launch_start)
    unlinked = sum(t["launch_name"].null_count() for t in tables)
    if unlinked:
        out.append(
            DataWarning(
                "unattributed_gpu",
                unlinked,
                f"{unlinked} of {_gpu_events(n, '', '').strip()} {'has' if unlinked == 1 else 'have'} no launch record (launched before the trace "
                "window, or correlation missing): counted in busy time, unattributed to ops",
            )
        )
    corr = np.concatenate([_non_null(t["correlation"]).to_numpy() for t in tables])
    lk = launches["correlation"]
    is_k = _is_kernel_launch(launches)
    if lk.null_count():
        is_k &= lk.is_not_null().to_numpy()
    lk = _filled(lk, 0)[is_k]
    orphan = len(lk) - int(
        np.count_nonzero(np.isin(lk, corr))
    )  # launches whose GPU work is missing
    if orphan:
        out.append(
            DataWarning(
                "launch_without_gpu",
                orphan,
                f"{orphan} kernel launches have no GPU event in the trace (the trace ended before they ran, or CUPTI dropped them)",
            )
        )
    zero = int(np.count_nonzero(_column(tables, "duration_us") == 0))
    if zero:
        out.append(
            DataWarning("zero_duration", zero, f"{_gpu_events(zero, 'has', 'have')} zero duration")
        )
    lag = (start - launch_start)[linked]
    early = int(np.count_nonzero(lag < 0))
    worst_early = -float(lag.min()) if early else 0.0
    late = lag[lag > MAX_LAUNCH_LAG_US]
    if early:
        out.append(
            DataWarning(
                "gpu_before_launch",
                early,
                f"{_gpu_events(early, 'starts', 'start')} before their launch call, by up to "
                f"{worst_early / 1e3:.3f} ms (host and GPU clocks disagree)",
            )
        )
    if worst_early > MAX_CLOCK_SKEW_US or len(late):
        what = []
        if worst_early > MAX_CLOCK_SKEW_US:
            what.append(f"a GPU event starts {worst_early / 1e3:,.3f} ms before its launch call")
        if len(late):
            what.append(
                f"{len(late)} GPU event(s) start up to {float(late.max()) / 1e6:,.3f} s after "
                "their launch call"
            )
        out.append(
            DataWarning(
                INCONSISTENT_TIMESTAMPS,
                early + len(late),
                "the host and GPU timestamps are inconsistent ("
                + "; ".join(what)
                + "): no verdict and no fix estimate rest on them",
            )
        )
    end = _column(tables, "end_us")
    launch_end = launch_start + _column(tables, "launch_duration_us", 0.0)
    ov, ooo = _stream_order_counts(tables, start, end, launch_start, launch_end, linked)
    if ov:
        out.append(
            DataWarning(
                "stream_overlap",
                ov,
                f"{_gpu_events(ov, 'starts', 'start')} before the previous event on their stream ended (a few us "
                "is normal with programmatic dependent launch on Hopper and later; busy time is a "
                "union, so nothing is counted twice)",
            )
        )
    if ooo:
        out.append(
            DataWarning(
                "gpu_out_of_order",
                ooo,
                f"{_gpu_events(ooo, 'ran', 'ran')} before work launched earlier on the same stream (a stream "
                "runs in launch order: timestamps or correlation ids are inconsistent)",
            )
        )
    return out


def _stream_order_counts(
    tables: list[pl.DataFrame],
    start: np.ndarray,
    end: np.ndarray,
    launch_start: np.ndarray,
    launch_end: np.ndarray,
    linked: np.ndarray,
) -> tuple[int, int]:
    """(GPU events that start before an earlier event of their stream ended, events that
    start before an event of their stream launched after theirs returned): the ``tables``'
    rows (kernels, memcpys, memsets, in that order, as the arrays, us) taken one stream at a
    time. ``linked``: the events with a launch record; the second count reads only those."""
    ov = ooo = 0
    for rows, has_ids in _stream_rows(tables):
        # by start, the shorter first on a tie (so the count does not depend on the table's
        # order): an event starting before an earlier one ended
        s, e = start[rows], end[rows]
        if not ((s[1:] > s[:-1]) | ((s[1:] == s[:-1]) & (e[1:] >= e[:-1]))).all():
            rows = rows[np.lexsort((e, s))]
            s, e = start[rows], end[rows]
        ov += int(np.count_nonzero(s[1:] < np.maximum.accumulate(e)[:-1] - 1e-3))
        # A stream runs its work in launch order. An event that starts before another event of
        # its stream whose launch call had already returned when this one's began is out of
        # order: the timestamps (or the correlation ids) are inconsistent.
        if not has_ids:
            continue
        rows = rows[linked[rows]]
        by_end = rows[np.argsort(launch_end[rows], kind="stable")]
        ends = launch_end[by_end]
        latest = np.maximum.accumulate(start[by_end])
        j = np.searchsorted(ends, launch_start[rows], side="left") - 1
        ooo += int(np.count_nonzero((j >= 0) & (start[rows] < latest[np.maximum(j, 0)] - 1e-3)))
    return ov, ooo


_ONE_KEY_MAX = 2**62
"""(device, stream) pairs with fewer combinations than this sort as one int64 key."""


def _stream_rows(tables: list[pl.DataFrame]) -> list[tuple[np.ndarray, bool]]:
    """The rows of each (device, stream) of the ``tables`` (numbered as :func:`_column` puts
    them), in row order, and whether both ids are there (not null). A stable sort of the
    (device, stream) pairs, as one integer key where their ranges allow."""
    dev, stream = _column(tables, "device", 0), _column(tables, "stream", 0)
    null_d, null_s = _null_mask(tables, "device"), _null_mask(tables, "stream")
    if null_d is None and null_s is None and len(dev):
        d0, s0 = int(dev.min()), int(stream.min())
        span = int(stream.max()) - s0 + 1
        if (int(dev.max()) - d0 + 1) * span < _ONE_KEY_MAX:
            key = (dev - d0) * span + (stream - s0)
            order = np.argsort(key, kind="stable")
            k = key[order]
            cut = np.flatnonzero(k[1:] != k[:-1]) + 1
            return [(r, True) for r in np.split(order, cut)]
    nd = np.zeros(len(dev), bool) if null_d is None else null_d
    ns = np.zeros(len(dev), bool) if null_s is None else null_s
    order = np.lexsort((stream, ns, dev, nd))
    keys = [a[order] for a in (nd, dev, ns, stream)]
    change = np.zeros(max(len(order) - 1, 0), bool)
    for k in keys:
        change |= k[1:] != k[:-1]
    cut = np.flatnonzero(change) + 1
    return [(r, not (nd[r[0]] or ns[r[0]])) for r in np.split(order, cut)]
