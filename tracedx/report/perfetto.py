"""``tracedx annotate``: the trace itself, with what tracedx found laid on its timeline.

The output is the input trace (Chrome Trace Event Format JSON, as torch.profiler writes it)
with every original event and top-level key copied through byte for byte, in order (each is
validated JSON kept as its own bytes: ``msgspec.Raw``, so a 1 GB trace is never built as Python
objects), and events
appended on tracks of their own: one new process (``pid`` above every pid of the trace, its
threads' tids above every tid, both inside the uint32 range Perfetto keeps (:func:`free_ids`), named
``tracedx: findings`` by a ``process_name`` metadata event) whose threads (``thread_name``
metadata) are

- ``steps``: one slice per analysed step over its window (the one its step time measures),
  named with its step time, GPU idle share and its largest
  idle cause; args carry the step's metrics and the trace's verdict. An instant event at the
  first step's start carries the verdict (regime, bottleneck, evidence, top fixes);
- ``GPU N idle``: each idle gap of the primary GPU, named by its cause (``idle: host sync``);
- ``host syncs · thread T``: each blocking host call (``cudaStreamSynchronize`` ...) on host
  thread T, named with the Python line that made it when the trace has stacks
  (``--with-stack``), with an instant event at its start;
- ``fusable chains · GPU N stream S``: each run of back-to-back fusable kernels (what the
  ``torch-compile`` estimate counts), with its kernels and the device time fusing would save;
- for a rank of a job (``annotate(..., job=, rank=)``), ``rank R in collectives``: each of its
  communication kernels split into the wait for the last rank and the transfer.

Slices that overlap on one track are spread over extra threads of the same name (``(2)``...),
so every thread's slices nest, as the trace processor of the Perfetto UI requires. Every added
event has ``cat: "tracedx"``, which tracedx's reader ignores: a re-read annotated trace gives
the same tables and diagnosis as the original. Times are the trace's own microseconds.
Format: the Trace Event Format document (``ph`` X, i, M; ``s: "t"`` instants).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from tracedx.errors import TraceError, TraceFormatError
from tracedx.report.text import speedup_label
from tracedx.trace.events import ANNOTATION_CAT
from tracedx.trace.source import read_bytes

PROCESS_NAME = "tracedx: findings"
MAX_SLICES_PER_TRACK = 100_000
"""A track keeps at most this many slices (the longest), so a huge trace stays loadable."""


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


class _Ids(msgspec.Struct):
    """An event's pid and tid, the only fields annotate reads of the original events."""

    pid: Any = None
    tid: Any = None


def _clean(ev: dict) -> dict:
    """An event with its null args left out (importers count a null where a value belongs
    as a failure; an absent arg is simply absent)."""
    if "args" in ev:
        ev = {**ev, "args": {k: v for k, v in ev["args"].items() if v is not None}}
    return ev


class _Tracks:
    """Slices and instants on threads of one new process; overlapping slices go to lanes."""

    def __init__(self, pid: int, first_tid: int = 1) -> None:
        self.pid = pid
        self.events: list[dict[str, Any]] = [
            {"ph": "M", "cat": ANNOTATION_CAT, "name": "process_name", "pid": pid, "tid": 0,
             "args": {"name": PROCESS_NAME}},
            {"ph": "M", "cat": ANNOTATION_CAT, "name": "process_sort_index", "pid": pid,
             "tid": 0, "args": {"sort_index": -1}},
        ]  # fmt: skip
        self.next_tid = first_tid

    def _thread(self, name: str) -> int:
        tid = self.next_tid
        self.next_tid += 1
        self.events.append(
            {"ph": "M", "cat": ANNOTATION_CAT, "name": "thread_name", "pid": self.pid,
             "tid": tid, "args": {"name": name}}
        )  # fmt: skip
        self.events.append(
            {"ph": "M", "cat": ANNOTATION_CAT, "name": "thread_sort_index", "pid": self.pid,
             "tid": tid, "args": {"sort_index": tid}}
        )  # fmt: skip
        return tid

    def track(self, name: str, slices: list[dict], instants: list[dict] = ()) -> list[int]:
        """Add one named track: ``slices`` (dicts with ``ts``, ``dur``, ``name``, ``args``) are
        packed into the fewest lanes in which none overlap (first fit by start time; a lane is
        one thread); ``instants`` (``ts``, ``name``, ``args``) go on the first lane. Returns the
        lanes' tids."""
        if len(slices) > MAX_SLICES_PER_TRACK:
            slices = sorted(slices, key=lambda s: -s["dur"])[:MAX_SLICES_PER_TRACK]
        lanes: list[tuple[int, float]] = []  # (tid, end of its last slice)
        out = []
        for s in sorted(slices, key=lambda s: (s["ts"], -s["dur"])):
            for i, (tid, end) in enumerate(lanes):
                if s["ts"] >= end:
                    lanes[i] = (tid, s["ts"] + s["dur"])
                    break
            else:
                tid = self._thread(name if not lanes else f"{name} ({len(lanes) + 1})")
                lanes.append((tid, s["ts"] + s["dur"]))
            out.append({"ph": "X", "cat": ANNOTATION_CAT, "pid": self.pid, "tid": tid, **_clean(s)})
        if instants and not lanes:
            lanes.append((self._thread(name), 0.0))
        self.events += out
        self.events += [
            {
                "ph": "i",
                "s": "t",
                "cat": ANNOTATION_CAT,
                "pid": self.pid,
                "tid": lanes[0][0],
                **_clean(i),
            }  # fmt: skip
            for i in instants
        ]
        return [t for t, _ in lanes]


def _step_slices(diag) -> tuple[list[dict], list[dict]]:
    from tracedx.report.json import diagnosis_dict

    w = diag.windows
    w = w.filter(
        pl.col("device") == diag.primary_device
        if diag.primary_device is not None
        else pl.col("device").is_null()
    ).sort("step")
    ic = diag.idle_causes
    if diag.primary_device is not None:
        ic = ic.filter(pl.col("device") == diag.primary_device)
    verdict = (
        f"{diag.regime}, bottleneck: {diag.bottleneck}" if diag.regime else "no verdict (notes)"
    )
    slices = []
    for r in w.iter_rows(named=True):
        start, end = r["window_start_us"], r["window_end_us"]
        if start is None or end is None:
            continue
        causes = dict(ic.filter(pl.col("step") == r["step"]).select("cause", "idle_us").rows())
        top = max(causes.items(), key=lambda kv: kv[1], default=None)
        name = f"step {r['step']}: {r['step_time_us'] / 1e3:.3f} ms"
        if r["idle_fraction"] is not None:
            name += f", GPU idle {r['idle_fraction']:.0%}"
        if top and top[1] > 0:
            name += f" (most: {top[0]} {top[1] / 1e3:.3f} ms)"
        slices.append(
            {
                "ts": start,
                "dur": end - start,
                "name": name,
                "args": {
                    "step": r["step"],
                    "step_time_us": _r(r["step_time_us"]),
                    "cpu_time_us": _r(r["cpu_time_us"]),
                    "gpu_busy_us": _r(r["gpu_busy_us"]),
                    "idle_fraction": _r(r["idle_fraction"], 4),
                    "kernels": r["kernels"],
                    **{f"idle_{c.replace(' ', '_')}_us": _r(v) for c, v in causes.items()},
                    "trace_verdict": verdict,
                },
            }
        )
    instants = []
    if slices:
        d = diagnosis_dict(diag)
        instants.append(
            {
                "ts": min(s["ts"] for s in slices),
                "name": f"tracedx verdict: {verdict}",
                "args": {
                    "regime": d["regime"],
                    "bottleneck": d["bottleneck"],
                    "evidence": d["evidence"],
                    "top_fixes": [
                        f"{f['fix']}: {speedup_label(f)} ({f['title']})"
                        for f in d["findings"]
                        if f["recommended"]
                    ][:5],
                },
            }
        )
    return slices, instants


def _gap_slices(diag) -> list[dict]:
    g = diag.gaps
    if diag.primary_device is not None:
        g = g.filter(pl.col("device") == diag.primary_device)
    return [
        {
            "ts": r["start_us"],
            "dur": r["duration_us"],
            "name": f"idle: {r['cause']}",
            "args": {"cause": r["cause"], "step": r["step"], "idle_us": _r(r["duration_us"])},
        }
        for r in g.iter_rows(named=True)
    ]


def _sync_tracks(diag, tracks: _Tracks) -> None:
    from tracedx.analysis.diagnosis import sync_call_sites

    sc = sync_call_sites(diag.trace, diag.steps)
    for tid in sorted(sc["tid"].unique().drop_nulls().to_list()):
        slices, instants = [], []
        for r in sc.filter(pl.col("tid") == tid).iter_rows(named=True):
            where = r["site"] or "no Python stack (capture with --with-stack for the line)"
            args = {
                "call": r["name"],
                "op": r["op"],
                "python": r["site"],
                "blocking_reason": r.get("blocking_reason"),
                "blocked_us": _r(r["duration_us"]),
                "step": r["step"],
            }
            slices.append(
                {
                    "ts": r["start_us"],
                    "dur": r["duration_us"],
                    "name": f"host sync: {r['op']} · {r['name']} · {where}",
                    "args": args,
                }
            )
            if r["site"]:
                instants.append({"ts": r["start_us"], "name": f"sync at {r['site']}", "args": args})
        tracks.track(f"host syncs · thread {tid}", slices, instants)


def _chain_tracks(diag, tracks: _Tracks) -> None:
    from tracedx.analysis.diagnosis import fusable_runs

    if diag.primary_device is None:
        return
    runs = fusable_runs(diag.trace, diag.steps, diag.primary_device)
    for stream in sorted(runs["stream"].unique().drop_nulls().to_list()):
        slices = [
            {
                "ts": r["start_us"],
                "dur": r["end_us"] - r["start_us"],
                "name": f"fusable chain: {r['n']} kernels, fusing saves ~"
                f"{(r['total'] - r['longest']):.1f} us of device time",
                "args": {
                    "kernels": r["n"],
                    "device_us": _r(r["total"]),
                    "saved_device_us": _r(r["total"] - r["longest"]),
                    "step": r["step"],
                    "kernel_names": r["names"][:16],
                },
            }
            for r in runs.filter(pl.col("stream") == stream).iter_rows(named=True)
        ]
        tracks.track(f"fusable chains · GPU {diag.primary_device} stream {stream}", slices)


def collective_wait_slices(job, rank: int) -> list[dict]:
    """Rank ``rank``'s communication kernels split as the job analysis splits them
    (:func:`tracedx.job.metrics.collective_metrics`): the first ``wait_us`` of each kernel is
    waiting for the last rank (its duration minus the shortest duration of the same collective
    over its ranks), the rest is transfer. Times on the rank's own clock (its trace's). A kernel
    of a collective that could not be matched or validated gets one ``unsplit`` slice."""
    m = job.members.filter(pl.col("rank") == rank).sort("start_us")
    coll = job.collectives.select("coll_id", "status", "transfer_us", "last_rank")
    m = m.join(coll, on="coll_id", how="left")
    out = []
    for r in m.iter_rows(named=True):
        group = r["pg_desc"] or r["pg_name"]
        what = r["coll_type"] + (f" ({group})" if group else "")
        args = {
            "collective": r["coll_type"],
            "process_group": group,
            "step": r["step"],
            "msg_bytes": r["msg_bytes"],
            "kernel_us": _r(r["duration_us"]),
            "wait_us": _r(r["wait_us"]),
            "transfer_us": _r(r["transfer_us"]),
            "last_rank": r["last_rank"],
            "status": r["status"],
        }
        w = r["wait_us"]
        if w is None:
            out.append({"ts": r["start_us"], "dur": r["duration_us"],
                        "name": f"{what}: unsplit ({r['status']})", "args": args})  # fmt: skip
            continue
        if w > 0:
            who = "" if r["last_rank"] is None else f" for rank {r['last_rank']}"
            out.append({"ts": r["start_us"], "dur": w, "name": f"{what}: wait{who}", "args": args})
        if r["duration_us"] - w > 0:
            out.append({"ts": r["start_us"] + w, "dur": r["duration_us"] - w,
                        "name": f"{what}: transfer", "args": args})  # fmt: skip
    return out


def annotation_events(
    diag, pid: int, job=None, rank: int | None = None, first_tid: int = 1
) -> list[dict[str, Any]]:
    """The events ``tracedx annotate`` adds for one Diagnosis, on process ``pid`` (see the
    module docstring for the tracks). With ``job`` (the JobDiagnosis the trace is rank ``rank``
    of) a track ``rank R in collectives`` splits each of its communication kernels into wait
    and transfer (:func:`collective_wait_slices`). The tracks' threads get tids from
    ``first_tid`` on. Pure: its inputs are only read."""
    tracks = _Tracks(pid, first_tid)
    slices, instants = _step_slices(diag)
    tracks.track("steps", slices, instants)
    if diag.primary_device is not None:
        tracks.track(f"GPU {diag.primary_device} idle", _gap_slices(diag))
    _sync_tracks(diag, tracks)
    _chain_tracks(diag, tracks)
    if job is not None and rank is not None:
        tracks.track(f"rank {rank} in collectives", collective_wait_slices(job, rank))
    return tracks.events


ID_MAX = 2**32 - 1
"""The largest pid or tid Perfetto's JSON importer keeps: it reads them as uint32, and a pid
or tid outside 0..2^32-1 is dropped (the event lands on pid 0, or on the thread tid = pid),
which would pile every added track onto one thread (``CoerceToUint32`` in the trace
processor's ``src/trace_processor/importers/json/json_utils.cc``)."""

TID_ROOM = 1 << 16
"""Consecutive tids kept free for the added tracks (one a track lane)."""


def free_ids(events: list) -> tuple[int, int]:
    """A pid and a first tid that no event of the trace uses, inside Perfetto's range
    (:data:`ID_MAX`): one above the largest integer pid, and one above the largest integer
    tid or pid, with :data:`TID_ROOM` tids free after it (Perfetto's importer names threads by
    tid alone, so the added threads' tids must be new to the whole trace). Ids past the range
    (64-bit thread ids) do not count: Perfetto drops them; when the ids above the largest
    are past the range, the lowest free ones are taken."""

    def ints(key: str) -> set[int]:
        return {
            v
            for e in events
            if isinstance(e, dict) and isinstance(v := e.get(key), int) and 0 <= v <= ID_MAX
        }

    pids = ints("pid")
    tids = pids | ints("tid")
    pid = max(pids, default=0) + 1
    if pid > ID_MAX:
        pid = _first_gap(pids, 1)
    tid = max(tids, default=0) + 2
    if tid + TID_ROOM > ID_MAX:
        tid = _first_gap(tids, TID_ROOM)
    return pid, tid


def _first_gap(used: set[int], room: int) -> int:
    """The lowest id >= 1 followed by ``room`` ids (itself included) none of which is used."""
    start = 1
    for v in sorted(used):
        if v - start >= room:
            break
        start = max(start, v + 1)
    return start


@dataclass
class Annotated:
    """What :func:`annotate` wrote: the output ``path``, the number of original events copied
    through and of events added."""

    path: Path
    original_events: int
    added_events: int


def annotate(
    trace_path: str | Path,
    out_path: str | Path,
    diag=None,
    *,
    job=None,
    rank: int | None = None,
    **diagnose_kw,
) -> Annotated:
    """Write ``trace_path`` with tracedx's findings added (module docstring) to ``out_path``
    (gzip when it ends in ``.gz``). ``diag``: the trace's Diagnosis (computed with
    ``diagnose_kw`` when None); ``job`` and ``rank``: the JobDiagnosis this trace is rank
    ``rank`` of, for its waits inside collectives.

    Raises TraceError for a file that is not a clean JSON trace (annotate copies the original
    events, so it does not salvage: repair the trace first) or an unwritable ``out_path``.
    """
    if diag is None:
        from tracedx.analysis.diagnosis import diagnose
        from tracedx.trace import load

        diag = diagnose(load(trace_path), **diagnose_kw)
    raw = read_bytes(trace_path)
    try:  # each original event stays its own bytes (msgspec.Raw): copied through exactly
        top = msgspec.json.decode(raw, type=dict[str, msgspec.Raw] | list[msgspec.Raw])
        if isinstance(top, list):  # the bare-array form of the format
            top = {"traceEvents": msgspec.Raw(msgspec.json.encode(top))}
        if "traceEvents" not in top:
            raise TraceFormatError(f"{trace_path}: no traceEvents list")
        events = msgspec.json.decode(top["traceEvents"], type=list[msgspec.Raw])
        ids = msgspec.json.decode(top["traceEvents"], type=list[_Ids])
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise TraceFormatError(f"{trace_path}: not a clean JSON trace ({e}); annotate copies the "
                               "original events and cannot salvage a broken file") from None  # fmt: skip
    n = len(events)
    pid, tid = free_ids([{"pid": x.pid, "tid": x.tid} for x in ids])
    del ids
    added = annotation_events(diag, pid, job, rank, first_tid=tid)
    doc = {**top, "traceEvents": [*events, *added]}
    data = msgspec.json.encode(doc)
    out = Path(out_path)
    try:
        if out.name.endswith(".gz"):
            with gzip.open(out, "wb", compresslevel=6) as f:
                f.write(data)
        else:
            out.write_bytes(data)
    except OSError as e:
        raise TraceError(f"cannot write {out}: {e.strerror or e}") from None
    return Annotated(out, n, len(added))


def annotate_job(jd, out_dir: str | Path, **diagnose_kw) -> list[Annotated]:
    """Annotate every rank's trace of a job: for each summary of ``jd.job`` whose ``meta``
    names its trace (``path``, as :func:`tracedx.job.summary.summarize_path` records it), write
    ``out_dir/rank{R}-{name}.annotated.json.gz`` (``{name}.annotated.json.gz`` when the name holds ``rank{R}``) with the single-rank tracks (its own diagnosis,
    ``diagnose_kw``) and ``rank R in collectives``. A summary without a path is skipped (its
    rank is missing from the result). Raises TraceError when ``out_dir`` cannot be made."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TraceError(f"cannot make {out}: {e.strerror or e}") from None
    done = []
    for s in jd.job.summaries:
        path, rank = (s.meta or {}).get("path"), (s.meta or {}).get("rank")
        if not path or rank is None:
            continue
        name = Path(path).name
        for ext in (".gz", ".json"):
            name = name.removesuffix(ext)
        if f"rank{rank}" not in name:  # rank0.json.gz -> rank0.annotated.json.gz
            name = f"rank{rank}-{name}"
        target = out / f"{name}.annotated.json.gz"
        done.append(annotate(path, target, job=jd, rank=int(rank), **diagnose_kw))
    return done


__all__ = [
    "Annotated",
    "annotate",
    "annotate_job",
    "annotation_events",
    "collective_wait_slices",
    "free_ids",
    "ID_MAX",
]
