"""B/E (begin/end) duration events: paired into complete (X) events before the tables are built.

The Chrome Trace Event Format has two ways to write a duration: one complete event (``ph:
"X"``, ``ts`` and ``dur``), as torch.profiler writes it, or a begin event (``ph: "B"``) and a
later end event (``ph: "E"``) on the same thread. Begin/end pairs "must be properly nested"
per thread, and an ``E`` closes the most recent open ``B`` of its thread (Trace Event Format,
"Duration Events", https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
so they are matched with one stack per ``(pid, tid)``. A matched pair becomes one X event with
the begin event's ``cat``, ``name``, ``pid``, ``tid``, ``ts`` and ``args`` (the end event's
``args`` when the begin event has none, its ``name`` when the begin event has none) and
``dur = E.ts - B.ts`` (microseconds, as every ``ts``). Within a thread, events are taken in
``ts`` order (ties in file order), so a file that lists threads one after the other pairs the
same way as one written in time order.

The fast reader skips the fields of B/E events (torch.profiler never writes them), and
:mod:`.tables` counts them. :func:`read_tables` is the reader's one call into this module: when
the count is not zero, the trace is read again whole (bounded like every whole-document read,
see :mod:`.source`), B/E events are replaced by their X events in place of the begin event,
and the tables are built again. A begin event never ended, an end event with no open begin
event, and one without a usable ``ts`` are left out and counted in one warning.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from tracedx.errors import TraceFormatError
from tracedx.trace.events import Event
from tracedx.trace.source import read_document, read_into
from tracedx.trace.tables import DataWarning, RawTables, TableBuilder


def pair(events: list) -> tuple[list, dict[str, int]]:
    """``events`` with every matched B/E pair replaced by one X event (at the begin event's
    place) and every other B/E event left out.

    Returns (events, counts): ``counts`` has ``paired`` (pairs made), ``unmatched_begin``
    (B never ended), ``unmatched_end`` (E with no open B on its thread) and ``no_ts`` (B or E
    without a finite ``ts``). Linear in the events, plus a sort of each thread's B/E events.
    """
    lanes: dict[tuple, list[int]] = defaultdict(list)
    no_ts = 0
    for i, e in enumerate(events):
        ph = getattr(e, "ph", None)
        if ph != "B" and ph != "E":
            continue
        ts = e.ts
        if ts is None or ts != ts or ts in (float("inf"), float("-inf")):
            no_ts += 1
            continue
        lanes[(_key(e.pid), _key(e.tid))].append(i)
    if not lanes and not no_ts:
        return events, {"paired": 0, "unmatched_begin": 0, "unmatched_end": 0, "no_ts": 0}
    done: dict[int, Event] = {}  # begin index -> its X event
    unmatched_begin = unmatched_end = 0
    for idx in lanes.values():
        idx.sort(key=lambda i: events[i].ts)  # stable: ties keep file order
        stack: list[int] = []
        for i in idx:
            if events[i].ph == "B":
                stack.append(i)
            elif stack:
                b = stack.pop()
                done[b] = _complete(events[b], events[i])
            else:
                unmatched_end += 1
        unmatched_begin += len(stack)
    out = []
    for i, e in enumerate(events):
        ph = getattr(e, "ph", None)
        if ph == "B":
            if i in done:
                out.append(done[i])
        elif ph != "E":
            out.append(e)
    counts = {
        "paired": len(done),
        "unmatched_begin": unmatched_begin,
        "unmatched_end": unmatched_end,
        "no_ts": no_ts,
    }
    return out, counts


def _key(v):
    """A pid/tid as a hashable value (ids are ints, floats or strings)."""
    return v if isinstance(v, (int, float, str)) or v is None else repr(v)


def _complete(b, e) -> Event:
    return Event(
        ph="X",
        cat=b.cat if b.cat is not None else e.cat,
        name=b.name if b.name is not None else e.name,
        pid=b.pid,
        tid=b.tid,
        ts=b.ts,
        dur=e.ts - b.ts,
        id=b.id,
        args=b.args if b.args is not None else e.args,
    )


def note(counts: dict[str, int]) -> DataWarning | None:
    """One warning for the B/E events that could not be paired (None when all were)."""
    n = counts["unmatched_begin"] + counts["unmatched_end"] + counts["no_ts"]
    if not n:
        return None
    parts = [
        f"{v} {what}"
        for v, what in (
            (counts["unmatched_begin"], "begin (B) event(s) never ended"),
            (counts["unmatched_end"], "end (E) event(s) with no open begin event on their thread"),
            (counts["no_ts"], "B/E event(s) without a usable ts"),
        )
        if v
    ]
    return DataWarning(
        "begin_end_unmatched",
        n,
        f"{counts['paired']} B/E (begin/end) pair(s) read as complete events; left out: "
        + ", ".join(parts),
    )


def read_tables(p: Path, repair: bool = False, progress=None):
    """Read ``p`` into raw tables, with B/E pairs read as complete events.

    Returns (TraceFile without its events, repair notes, RawTables). Raises TraceFormatError
    as :func:`tracedx.trace.source.read_into` does. A trace with B/E events is read a second
    time, whole: when that read is refused (over the whole-document limit), the tables of the
    first read are kept and the B/E events are said to be unused, as before.
    """
    builder = TableBuilder()
    doc, repairs = read_into(p, builder, repair_mode=repair, progress=progress)
    raw = builder.finish()
    if not any(w.kind == "begin_end_unused" for w in raw.warnings):
        return doc, repairs, raw
    try:
        whole, repairs = read_document(p, repair)
    except TraceFormatError as e:
        for w in raw.warnings:
            if w.kind == "begin_end_unused":
                w.message += f" (pairing them needs the whole trace at once: {e})"
        return doc, repairs, raw
    events, counts = pair(whole.traceEvents or [])
    whole.traceEvents = None
    builder.add(events)
    del events
    raw2: RawTables = builder.finish()
    w = note(counts)
    if w is not None:
        raw2.warnings.append(w)
    return whole, repairs, raw2
