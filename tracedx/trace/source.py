"""Open a trace file and decode it into typed events.

``read_document(path, repair=False)`` returns the decoded :class:`~tracedx.trace.events.TraceFile`
and a list of repair notes. Errors are :class:`~tracedx.errors.TraceFormatError` with one line
that names the file, what is wrong and where (line, column and byte offset when known).

Strict by default: bytes that are not JSON (``NaN``/``inf`` literals, raw control characters,
invalid escapes, invalid UTF-8, a truncated file) are refused. ``repair=True`` is the salvage
mode: it replaces invalid UTF-8, doubles stray backslashes (unescaped Windows paths), reads
non-finite literals as null, accepts raw control characters, and keeps the complete events of a
truncated file; each repair is reported so the user knows the trace was not clean.
"""

from __future__ import annotations

import ctypes
import gc
import gzip
import json
import os
import queue
import re
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import msgspec

from tracedx.errors import TraceFormatError
from tracedx.trace.events import (
    COMM_MARKER,
    CommFastEvent,
    CommFastPart,
    CommTraceDocument,
    FastEvent,
    FastPart,
    TraceDocument,
    TraceFile,
)

_DECODER = msgspec.json.Decoder(TraceDocument, strict=False)
# the same with the collective metadata of events.CommArgs, for bytes that hold any
_COMM_DECODER = msgspec.json.Decoder(CommTraceDocument, strict=False)


def _marker_search():
    """``has_comms(data)``: whether bytes hold :data:`COMM_MARKER`. The C library's ``memmem``
    scans at ~14 GB/s against ~3 GB/s for ``bytes.__contains__`` (measured here on an 18 MB
    trace: 1.3 against 5.4 ms, a few % of its load); ``in`` where there is no ``memmem``."""
    try:
        memmem = ctypes.CDLL(None).memmem
    except (OSError, AttributeError, TypeError):
        return lambda data: COMM_MARKER in data
    memmem.restype = ctypes.c_void_p
    memmem.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    n = len(COMM_MARKER)
    return lambda data: memmem(bytes(data), len(data), COMM_MARKER, n) is not None


has_comms = _marker_search()


def _with_comms(decoder, comm_decoder, data) -> msgspec.json.Decoder:
    """``comm_decoder`` when ``data`` holds collective metadata (one scan), else ``decoder``."""
    return comm_decoder if has_comms(data) else decoder


_GZIP_MAGIC = b"\x1f\x8b"


def read_bytes(path: str | Path, repair_mode: bool = False) -> bytes:
    """Return the JSON bytes of ``path``, gunzipped when it starts with the gzip magic bytes.

    A leading UTF-8 byte-order mark (Windows editors write one) is dropped. With
    ``repair_mode`` a cut gzip stream yields the JSON decompressed before the cut.

    Raises TraceFormatError: missing file, directory, empty file, empty or truncated gzip.
    """
    p = Path(path)
    if not p.exists():
        raise TraceFormatError(f"{p}: no such file")
    if p.is_dir():
        raise TraceFormatError(f"{p}: is a directory, not a trace file")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise TraceFormatError(f"{p}: cannot read: {e.strerror or e}") from None
    if not raw:
        raise TraceFormatError(f"{p}: trace is empty (0 bytes)")
    if raw[:2] == _GZIP_MAGIC:
        raw = _gunzip(p, raw, repair_mode)
        if not raw.strip():
            raise TraceFormatError(f"{p}: trace is empty (the gzip stream holds no data)")
    elif not raw.strip():
        raise TraceFormatError(f"{p}: trace is empty (only whitespace)")
    return raw[3:] if raw[:3] == b"\xef\xbb\xbf" else raw


def _gunzip(p: Path, raw: bytes, repair_mode: bool = False) -> bytes:
    try:
        return gzip.decompress(raw)
    except EOFError:
        # Say how much was recoverable: decompress what is there.
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            part = d.decompress(raw)
        except zlib.error:
            part = b""
        if repair_mode and part.strip():
            return part  # the JSON salvage then keeps the complete events
        raise TraceFormatError(
            f"{p}: truncated gzip: the compressed stream ends early "
            f"(after {len(raw)} compressed bytes, {len(part)} bytes of JSON); the file was cut short"
        ) from None
    except (OSError, zlib.error) as e:
        raise TraceFormatError(f"{p}: corrupt gzip data: {e}") from None


def _line_col(data: bytes, pos: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, pos) + 1
    col = pos - (data.rfind(b"\n", 0, pos) + 1) + 1
    return line, col


def _where(data: bytes, pos: int) -> str:
    line, col = _line_col(data, pos)
    return f"line {line}, column {col} (byte {pos})"


_HINT = "; `--repair` loads what can be salvaged"
# The start of the repair note for a file of which only the events before a break were kept.
TRUNCATED_NOTE = "the JSON is truncated or broken"


def _explain_malformed(p: Path, data: bytes, pos: int) -> str:
    """One line describing the JSON syntax error at byte ``pos``."""
    at = data[pos : pos + 12]
    where = _where(data, pos)
    for tok in (b"NaN", b"Infinity", b"-Infinity", b"inf", b"-inf"):
        if at.startswith(tok):
            return (
                f"{p}: non-finite number `{tok.decode()}` at {where} is not valid JSON "
                f"(a profiler bug writes it for 0-duration events){_HINT}"
            )
    if pos < len(data) and data[pos] < 0x20:
        return f"{p}: raw control character U+{data[pos]:04X} inside a string at {where}{_HINT}"
    bs = data.rfind(b"\\", max(0, pos - 2), pos + 1)
    if bs >= 0:
        esc = data[bs : bs + 2].decode("latin-1")
        return f"{p}: invalid escape `{esc}` at {_where(data, bs)}: probably an unescaped Windows path{_HINT}"
    snippet = data[max(0, pos - 20) : pos + 20].decode("utf-8", "replace").replace("\n", " ")
    return f"{p}: not valid JSON at {where}, near `{snippet}`{_HINT}"


def decode(p: Path, data: bytes) -> TraceFile:
    """Strictly decode JSON bytes into a TraceFile. Raises TraceFormatError."""
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TraceFormatError(
                f"{p}: invalid UTF-8 byte 0x{data[e.start]:02X} at {_where(data, e.start)}{_HINT}"
            ) from None
    try:
        doc = _with_comms(_DECODER, _COMM_DECODER, data).decode(data)
    except msgspec.ValidationError as e:
        raise TraceFormatError(f"{p}: not a usable chrome trace: {e}") from None
    except msgspec.DecodeError as e:
        msg = str(e)
        m = re.search(r"\(byte (\d+)\)", msg)
        if "truncated" in msg:
            raise TraceFormatError(
                f"{p}: JSON ends early after {len(data)} bytes: the trace is truncated "
                f"(a job killed mid-export?){_HINT}"
            ) from None
        if m:
            raise TraceFormatError(_explain_malformed(p, data, int(m.group(1)))) from None
        raise TraceFormatError(f"{p}: not valid JSON: {msg}{_HINT}") from None
    return _as_tracefile(p, doc)


def _as_tracefile(p: Path, doc: TraceFile | list) -> TraceFile:
    if isinstance(doc, list):  # legacy autograd-profiler array format
        return TraceFile(traceEvents=doc, schemaVersion="legacy-array")
    if doc.traceEvents is None:
        raise TraceFormatError(f"{p}: JSON is not a chrome trace: it has no `traceEvents` array")
    return doc


# --- salvage mode -------------------------------------------------------------------------
_BAD_ESCAPE = re.compile(rb'\\(?=[^"\\/bfnrtu])')
_BARE_INF = re.compile(rb"(?<=[:\[,])(\s*)-?inf(?=\s*[,}\]])")


def repair(p: Path, data: bytes) -> tuple[TraceFile, list[str]]:
    """Decode leniently; returns the trace and one note per repair made."""
    notes: list[str] = []
    text_bytes = data
    try:
        text = text_bytes.decode("utf-8")
    except UnicodeDecodeError:
        text = text_bytes.decode("utf-8", "replace")
        notes.append(f"replaced {text.count(chr(0xFFFD))} invalid UTF-8 byte(s) with U+FFFD")
    b = text.encode("utf-8")
    b2, n = _BAD_ESCAPE.subn(rb"\\\\", b)
    if n:
        notes.append(f"doubled {n} stray backslash(es) (unescaped Windows paths)")
    b3, n_inf = _BARE_INF.subn(rb"\1null", b2)
    text = b3.decode("utf-8")
    n_ctrl = len(re.findall(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", text))
    if n_ctrl:
        notes.append(f"accepted {n_ctrl} raw control character(s) inside strings")
    n_nonfinite = 0

    def _const(_tok: str):
        nonlocal n_nonfinite
        n_nonfinite += 1
        return None

    try:
        obj = json.loads(text, strict=False, parse_constant=_const)
    except json.JSONDecodeError:
        obj, kept, whole = _salvage_events(text, _const, p)
        if whole:
            notes.append(
                f"the JSON is broken after its event list: kept all {kept} event(s); keys "
                "written after the list (such as traceName) may be lost"
            )
        else:
            notes.append(f"{TRUNCATED_NOTE}: kept the {kept} complete event(s) before the break")
    if n_inf or n_nonfinite:
        notes.append(
            f"read {n_inf + n_nonfinite} non-finite number literal(s) (NaN/Infinity/inf) as null"
        )
    if isinstance(obj, dict):
        # Drop non-dict events; keep the rest.
        evs = obj.get("traceEvents")
        if isinstance(evs, list):
            obj["traceEvents"] = [e for e in evs if isinstance(e, dict)]
    try:
        # Re-encode the repaired document so both paths share one typed decoder.
        data = msgspec.json.encode(obj)
        doc = _with_comms(_DECODER, _COMM_DECODER, data).decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise TraceFormatError(f"{p}: not a usable chrome trace even after repair: {e}") from None
    return _as_tracefile(p, doc), notes


def _salvage_events(text: str, parse_constant, p: Path | None = None) -> tuple[dict, int, bool]:
    """Parse the complete events of a truncated trace, one at a time.

    Returns (document, events kept, whether the event list was read to its closing ``]``: the
    break is after it, and no event was lost)."""
    start = text.find('"traceEvents"')
    if start < 0:
        raise TraceFormatError(f"{p}: nothing to salvage: no `traceEvents` array before the break")
    i = text.find("[", start)
    dec = json.JSONDecoder(strict=False, parse_constant=parse_constant)
    events: list = []
    i += 1
    n = len(text)
    whole = False
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            whole = i < n
            break
        try:
            ev, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        events.append(ev)
    # Salvage top-level keys written before traceEvents (deviceProperties, versions).
    head: dict = {}
    try:
        head = json.loads(text[:start].rstrip().rstrip(",") + "}", strict=False)
    except json.JSONDecodeError:
        head = {}
    head = head if isinstance(head, dict) else {}
    head["traceEvents"] = events
    return head, len(events), whole


def read_document(path: str | Path, repair_mode: bool = False) -> tuple[TraceFile, list[str]]:
    """Read and decode a chrome trace (``.json`` or gzip, detected by magic bytes).

    Returns (TraceFile, repair notes). Raises TraceFormatError on unusable input.
    """
    p = Path(path)
    data = read_bytes(p, repair_mode)
    if not repair_mode:
        return decode(p, data), []
    try:
        return decode(p, data), []
    except TraceFormatError:
        return repair(p, data)


# --- the fast reader: a big trace in chunks -----------------------------------------------
#
# A trace of a gigabyte decoded in one piece holds every event as a Python object at once
# (several times the file size) and keeps one core busy for seconds. ``read_into`` instead
# reads the decompressed stream in blocks (a background thread reads and gunzips: zlib
# releases the GIL), cuts it into chunks of about ``CHUNK_BYTES`` at boundaries between
# events, decodes each chunk with a union tagged by ``ph`` (``events.FastEvent``: events
# tracedx does not read are skipped without building their fields) and hands its events to a
# sink (``tables.TableBuilder``), which keeps only columns. Events are never all alive at once.
#
# Where to cut: before a ``{`` that follows ``}`` and ``,`` (whitespace allowed). A cut that
# falls anywhere else (inside a string, or inside an event's args) makes a chunk invalid JSON,
# so it cannot go unnoticed: the first chunk is closed with a sentinel event and ``]}``, middle
# chunks are wrapped in ``[...]`` with the sentinel last, and the last chunk is opened with
# ``{"traceEvents":[`` and the sentinel; each must decode and hold the sentinel where it was put.
# Any failure (bad JSON, invalid UTF-8, a truncated or odd gzip stream, an unusual layout, a
# phase outside the Chrome format) abandons the fast reader, and the whole file is read again
# by :func:`read_document`, whose messages and repair mode are the reference. So the fast
# reader changes speed and memory, never a result or an error message.

CHUNK_BYTES = 16 << 20
# A second process decodes and converts chunks alongside (it takes each chunk offered while
# fewer than two of its chunks are out) when the JSON is at least this big. Measured on the
# 2-core benchmark machine (benchmarks/bench.py's traces), it saved no time at 100 MB and
# about 5% at 300 MB, for 100 to 150 MB more memory (its own interpreter and imports), 15% at
# 650 MB and 25 to 35% of the load at 1 GB.
PARALLEL_MIN_BYTES = 256 << 20
_READ_BYTES = 8 << 20
_GZIP_IN = 1 << 20
_KEY = b'"traceEvents"'
_KEY_SEARCH_LIMIT = 256 << 20
_SENTINEL_NAME = "tracedx:chunk-boundary"
_SENTINEL = b'{"ph":"M","name":"' + _SENTINEL_NAME.encode() + b'"}'
_WS = frozenset(b" \t\r\n")
_FAST_PART = msgspec.json.Decoder(FastPart, strict=False)
_FAST_LIST = msgspec.json.Decoder(list[FastEvent], strict=False)
_COMM_PART = msgspec.json.Decoder(CommFastPart, strict=False)
_COMM_LIST = msgspec.json.Decoder(list[CommFastEvent], strict=False)
_META_FIELDS = tuple(f for f in FastPart.__struct_fields__ if f != "traceEvents")


class EventSink(Protocol):
    """Where the reader puts decoded events (``tables.TableBuilder``)."""

    def add(self, events: list) -> None: ...

    def reserve(self) -> int: ...

    def fill(self, slot: int, columns) -> None: ...

    def reset(self) -> None: ...


class _NotFast(Exception):
    """The fast reader cannot vouch for this file: read it the reference way."""


def read_into(path: str | Path, sink: EventSink, repair_mode: bool = False, progress=None):
    """Read and decode a trace, handing its events to ``sink`` chunk by chunk. ``progress``, if
    given, is called (from the reading thread) with the bytes of the file read so far.

    Returns (TraceFile with ``traceEvents=None``, repair notes). Same errors as
    :func:`read_document` (TraceFormatError, one line that says what and where).
    """
    p = Path(path)
    was_enabled = gc.isenabled()
    gc.disable()  # millions of new objects, none of them in cycles: the collector only costs
    try:
        try:
            return _read_fast(p, sink, progress), []
        except _NotFast:
            pass
        sink.reset()
        doc, notes = read_document(p, repair_mode)
        events = doc.traceEvents or []
        doc.traceEvents = None
        sink.add(events)
        return doc, notes
    finally:
        if was_enabled:
            gc.enable()


def _blocks(p: Path, progress=None) -> Iterator[bytes]:
    """The decompressed bytes of ``p`` in blocks of at most ``_READ_BYTES``; ``progress`` gets
    the file position after each read."""
    with open(p, "rb") as f:
        magic = f.read(2)
        f.seek(0)
        if magic != _GZIP_MAGIC:
            while block := f.read(_READ_BYTES):
                if progress:
                    progress(f.tell())
                yield block
            return
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not d.eof:
            data = d.unconsumed_tail or f.read(_GZIP_IN)
            if not data:
                raise _NotFast("truncated gzip stream")
            if progress:
                progress(f.tell())
            out = d.decompress(data, _READ_BYTES)
            if out:
                yield out
        if d.unused_data or f.read(1):
            raise _NotFast("data after the gzip stream (several members?)")


class _Reader:
    """Runs :func:`_blocks` in a thread, a few blocks ahead of the decoder."""

    def __init__(self, p: Path, progress=None) -> None:
        self._q: queue.Queue = queue.Queue(maxsize=2)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(p, progress), daemon=True)
        self._t.start()

    def _run(self, p: Path, progress=None) -> None:
        try:
            for b in _blocks(p, progress):
                if not self._put(b):
                    return
            self._put(None)
        except BaseException as e:  # handed to the consumer
            self._put(_NotFast(f"{type(e).__name__}: {e}"))

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[bytes]:
        while True:
            b = self._q.get()
            if b is None:
                return
            if isinstance(b, BaseException):
                raise b
            yield b

    def close(self) -> None:
        self._stop.set()
        try:
            while True:
                self._q.get_nowait()
        except queue.Empty:
            pass


def _find_cut(buf: bytes, lo: int) -> int:
    """The last ``{`` after ``lo`` that follows ``}`` and ``,`` (whitespace allowed), or -1."""
    i = len(buf)
    for _ in range(256):
        i = buf.rfind(b"{", lo, i)
        if i <= lo:
            return -1
        j = i - 1
        while j > lo and buf[j] in _WS:
            j -= 1
        if buf[j] != 0x2C:  # ","
            continue
        j -= 1
        while j > lo and buf[j] in _WS:
            j -= 1
        if buf[j] == 0x7D:  # "}"
            return i
    return -1


def _check_text(buf: bytes) -> None:
    """Refuse invalid UTF-8 (the reference reader's rule). Chunks are cut before ``{``, so a
    multi-byte character is never split between two chunks."""
    if not buf.isascii():
        try:
            buf.decode("utf-8")
        except UnicodeDecodeError:
            raise _NotFast("invalid UTF-8") from None


def _is_sentinel(ev) -> bool:
    return getattr(ev, "ph", None) == "M" and getattr(ev, "name", None) == _SENTINEL_NAME


def decode_middle_chunk(payload: bytes) -> list:
    """Events of a middle chunk, ``[`` events sentinel ``]`` (also run by the worker process)."""
    _check_text(payload)
    events = _decode_part(payload, _FAST_LIST, "chunk")
    if not events or not _is_sentinel(events[-1]):
        raise _NotFast("cut is not between events")
    events.pop()
    return events


def _json_size(p: Path) -> int:
    """The size of the JSON: the file's, or for gzip the size its trailer records (mod 4 GiB)."""
    size = p.stat().st_size
    with open(p, "rb") as f:
        if f.read(2) != _GZIP_MAGIC:
            return size
        f.seek(max(size - 4, 0))
        return max(int.from_bytes(f.read(4), "little"), size)


def _idle_cpu() -> bool:
    """Whether a core is free for the worker now: the machine's idle time over the last 0.1 s
    (``/proc/stat``) is at least 0.6 of a core. Two processes on a busy machine only fight over
    it. Without ``/proc/stat``, the 1-minute load average is used."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return False
    if cpus < 2:
        return False
    try:
        mine = os.sched_getaffinity(0)
        first = _cpu_times(mine)
        time.sleep(0.1)
        second = _cpu_times(mine)
        busy, idle = (b - a for a, b in zip(first, second, strict=True))
        return idle >= 0.6 * (busy + idle) / len(mine)
    except (OSError, ValueError, ZeroDivisionError):
        try:
            return os.getloadavg()[0] <= cpus - 1.5
        except OSError:
            return False


def _cpu_times(cpus: set[int]) -> tuple[int, int]:
    """(busy, idle) jiffies summed over ``cpus`` (this process's affinity), from the ``cpuN``
    lines of /proc/stat: user nice system idle iowait irq softirq steal (guest time is already
    in user and nice). Raises ValueError when none of them is listed."""
    busy = idle = seen = 0
    with open("/proc/stat", "rb") as f:
        for line in f:
            name, _, rest = line.partition(b" ")
            if not name.startswith(b"cpu") or name == b"cpu" or int(name[3:]) not in cpus:
                continue
            fields = [int(x) for x in rest.split()[:8]]
            quiet = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
            busy += sum(fields) - quiet
            idle += quiet
            seen += 1
    if not seen:
        raise ValueError("no per-CPU lines in /proc/stat")
    return busy, idle


def _start_worker():
    from tracedx.trace.parallel import Worker

    try:
        return Worker()
    except OSError:
        return None


def _decode_part(payload: bytes, decoder, where: str):
    if has_comms(payload):
        decoder = _COMM_PART if decoder is _FAST_PART else _COMM_LIST
    try:
        return decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise _NotFast(f"{where}: {e}") from None


def _read_fast(p: Path, sink: EventSink, progress=None) -> TraceFile:
    if not p.is_file():
        raise _NotFast("not a file")
    reader = _Reader(p, progress)  # reading starts while the machine's idle time is measured
    worker = None
    ok = False
    try:
        if _json_size(p) >= PARALLEL_MIN_BYTES and _idle_cpu():
            worker = _start_worker()
        doc = _read_chunks(reader, sink, worker)
        ok = True
        return doc
    finally:
        reader.close()
        if worker is not None:
            worker.close(abandon=not ok)


def _read_chunks(reader: _Reader, sink: EventSink, worker) -> TraceFile:
    from tracedx.trace.parallel import WorkerError

    def collect(block: bool) -> None:
        nonlocal worker
        try:
            while worker is not None and (r := worker.poll(block)) is not None:
                sink.fill(*r)
        except WorkerError as e:
            raise _NotFast(f"worker: {e}") from None

    pending: list = []  # blocks (or the tail of one) not decoded yet
    size = 0
    head: FastPart | None = None
    for block in reader:
        pending.append(block)
        size += len(block)
        if size < CHUNK_BYTES:
            continue
        if head is None and len(pending) > 1:
            pending = [b"".join(pending)]
        last = pending[-1]
        lo = 0
        if head is None:
            lo = last.find(_KEY)
            if lo < 0:
                if size > _KEY_SEARCH_LIMIT:
                    raise _NotFast("no traceEvents key near the start")
                continue
        cut = _find_cut(last, lo)
        if cut < 0:
            continue
        parts = [*pending[:-1], memoryview(last)[:cut]]
        if head is None:
            payload = b"".join((*parts, _SENTINEL, b"]}"))
            del parts
            _check_text(payload)
            head = _decode_part(payload, _FAST_PART, "first chunk")
            del payload
            events = head.traceEvents
            if not events or not _is_sentinel(events[-1]):
                raise _NotFast("first cut is not inside traceEvents")
            head.traceEvents = None
            events.pop()
            sink.add(events)
            del events
        else:
            payload = b"".join((b"[", *parts, _SENTINEL, b"]"))
            del parts
            if worker is not None:
                try:
                    use_worker = worker.can_take()
                except WorkerError:  # it did not start: carry on alone
                    worker.close(abandon=True)
                    worker, use_worker = None, False
            else:
                use_worker = False
            if use_worker:
                worker.submit(sink.reserve(), payload)
                del payload
            else:
                events = decode_middle_chunk(payload)
                del payload
                sink.add(events)
                del events
        collect(False)
        pending = [memoryview(last)[cut:]]
        size = len(pending[0])
    rest = b"".join(pending)
    del pending
    if head is None:  # one chunk: the whole document
        if not rest.strip():
            raise _NotFast("empty")
        _check_text(rest)
        doc = _decode_part(rest, _FAST_PART, "document")
        if doc.traceEvents is None:
            raise _NotFast("no traceEvents")
        events, doc.traceEvents = doc.traceEvents, None
        sink.add(events)
        return _tracefile(doc, None)
    payload = b"".join((b'{"traceEvents":[', _SENTINEL, b",", rest))
    del rest
    _check_text(payload)
    tail = _decode_part(payload, _FAST_PART, "last chunk")
    del payload
    events = tail.traceEvents
    if not events or not _is_sentinel(events[0]):
        raise _NotFast("last chunk")
    tail.traceEvents = None
    events[0:1] = []
    sink.add(events)  # after the slots reserved for the worker's chunks: order is kept
    del events
    collect(True)
    return _tracefile(head, tail)


def _tracefile(head: FastPart, tail: FastPart | None) -> TraceFile:
    """The top-level keys of the document: a key in the tail wins (JSON objects: last wins)."""
    values = {}
    for f in _META_FIELDS:
        v = getattr(tail, f) if tail is not None else msgspec.UNSET
        if v is msgspec.UNSET:
            v = getattr(head, f)
        values[f] = None if v is msgspec.UNSET else v
    return TraceFile(traceEvents=None, **values)
