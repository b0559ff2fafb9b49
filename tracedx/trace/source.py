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
import json
import os
import queue
import re
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import msgspec

from tracedx.errors import TraceFormatError
from tracedx.files import GZIP_MAGIC as _GZIP_MAGIC
from tracedx.files import json_start as _json_start
from tracedx.files import regular_file
from tracedx.trace.events import (
    COMM_MARKER,
    CommFastEvent,
    CommFastPart,
    CommTraceDocument,
    Event,
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

    def search(data) -> bool:
        if type(data) is bytearray:  # a chunk the worker read in place: searched, not copied
            where = (ctypes.c_char * len(data)).from_buffer(data)
        else:
            where = bytes(data)
        return memmem(where, len(data), COMM_MARKER, n) is not None

    return search


has_comms = _marker_search()


def _with_comms(decoder, comm_decoder, data) -> msgspec.json.Decoder:
    """``comm_decoder`` when ``data`` holds collective metadata (one scan), else ``decoder``."""
    return comm_decoder if has_comms(data) else decoder


def read_bytes(path: str | Path, repair_mode: bool = False, limit: int | None = None) -> bytes:
    """Return the JSON bytes of ``path``, gunzipped when it starts with the gzip magic bytes.

    A leading UTF-8 byte-order mark (Windows editors write one) is dropped. With
    ``repair_mode`` a cut gzip stream yields the JSON decompressed before the cut.

    Raises TraceFormatError: missing or not a regular file, empty file, empty or truncated
    gzip, another compression format (named), a zero-filled file (stopped at the first run of
    NULs, so a sparse or inflated one never fills memory), and with ``limit`` more than
    ``limit`` bytes of JSON (TooLargeWhole).
    """
    p = Path(path)
    size = regular_file(p, "trace", TraceFormatError).st_size
    try:
        if limit is None or size <= limit:
            raw = p.read_bytes()
        else:
            raw = _read_capped(p, limit, repair_mode)
    except OSError as e:
        raise TraceFormatError(f"{p}: cannot read: {e.strerror or e}") from None
    if not raw:
        raise TraceFormatError(f"{p}: trace is empty (0 bytes)")
    check_format(p, raw[:8])
    if (
        not repair_mode
        and raw[:2] != _GZIP_MAGIC
        and p.name.lower().endswith(".gz")
        and not _json_start(raw)
    ):
        raise TraceFormatError(
            f"{p}: named .gz but is not gzip (it does not start with the gzip bytes 1f 8b) "
            f"nor JSON: it starts with {raw[:8].hex(' ')}" + _hint(raw)
        )
    if raw[:2] == _GZIP_MAGIC:
        raw = _gunzip(p, raw, repair_mode, limit)
        if not raw.strip():
            raise TraceFormatError(f"{p}: trace is empty (the gzip stream holds no data)")
    else:
        cut = check_zeros(p, raw, 0, repair_mode)
        raw = raw if cut is None else raw[:cut]
        if not raw.strip():
            raise TraceFormatError(f"{p}: trace is empty (only whitespace)")
    return raw[3:] if raw[:3] == b"\xef\xbb\xbf" else raw


# The whole-document reader (:func:`read_document`: a layout the fast reader cannot vouch for,
# ``--repair``, B/E pairing) holds the whole JSON and then every event as a Python object at
# once, several times the JSON's size (about 5x measured on a sample trace), so it refuses JSON
# larger than this. The fast reader has no such limit: its memory follows the events kept.
WHOLE_MAX_BYTES = 1 << 30
WHOLE_MAX_ENV = "TRACEDX_MAX_WHOLE_JSON_BYTES"


def whole_limit() -> int:
    """The most JSON bytes the whole-document reader takes: :data:`WHOLE_MAX_BYTES`, or the
    integer in the ``TRACEDX_MAX_WHOLE_JSON_BYTES`` environment variable when it is set."""
    v = os.environ.get(WHOLE_MAX_ENV, "").strip()
    return int(v) if v.isdigit() else WHOLE_MAX_BYTES


class TooLargeWhole(TraceFormatError):
    """JSON over :func:`whole_limit` that only the whole-document reader could read."""

    def __init__(self, p: Path, limit: int) -> None:
        super().__init__(
            f"{p}: over {limit:,} bytes of JSON that must be read whole (a layout the streaming "
            "reader does not read, repair mode, or B/E events): refused to bound memory (about 5 "
            f"bytes per JSON byte); set {WHOLE_MAX_ENV}=<bytes> to allow more"
        )


def _read_capped(p: Path, limit: int, repair_mode: bool) -> bytes:
    """The bytes of a plain file larger than ``limit``: read in pieces up to its first run of
    NULs (a preallocated file is then refused, or cut under ``repair_mode``, as
    :func:`check_zeros` says); past ``limit`` bytes without one, TooLargeWhole."""
    out: list[bytes] = []
    size = 0
    with open(p, "rb") as f:
        head = f.read(8)
        f.seek(0)
        if head[:2] == _GZIP_MAGIC:  # compressed bytes over the limit inflate to more
            raise TooLargeWhole(p, limit)
        while piece := f.read(_INFLATE_OUT):
            cut = check_zeros(p, piece, size, repair_mode)
            if cut is not None:
                out.append(piece[:cut])
                break
            size += len(piece)
            if size > limit:
                raise TooLargeWhole(p, limit)
            out.append(piece)
    return b"".join(out)


# Magic bytes of formats a trace is sometimes packed in: named, instead of "invalid UTF-8".
_PACKED = (
    (b"BZh", "bz2", "bunzip2"),
    (b"\xfd7zXZ\x00", "xz", "unxz"),
    (b"PK\x03\x04", "zip", "unzip"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
    (b"7z\xbc\xaf\x27\x1c", "7z", "7z x"),
    (b"\x04\x22\x4d\x18", "lz4", "unlz4"),
)
# A run of this many NUL bytes is no JSON: a file preallocated and never written.
_ZEROS = b"\x00" * 4096


def check_format(p: Path, head: bytes, inside_gzip: bool = False) -> None:
    """Refuse a file packed in a format tracedx does not unpack, naming it (``head``: its
    first bytes, or the first bytes inside the gzip stream). Raises TraceFormatError."""
    if inside_gzip and head[:2] == _GZIP_MAGIC:
        raise TraceFormatError(
            f"{p}: a gzip file inside a gzip file (compressed twice): run `gunzip -c {p.name} "
            "| gunzip > trace.json` and read trace.json"
        )
    for magic, fmt, tool in _PACKED:
        if head.startswith(magic):
            where = "inside the gzip stream " if inside_gzip else ""
            raise TraceFormatError(
                f"{p}: {where}a {fmt}-compressed file, not JSON or gzip: unpack it first (`{tool}`)"
            )


class ZeroFilled(TraceFormatError):
    """A long run of NUL bytes: the file was preallocated and never (or not fully) written."""

    def __init__(self, message: str, at: int) -> None:
        super().__init__(message)
        self.at = at  # where the NULs start, in bytes of the (decompressed) JSON


def check_zeros(p: Path, data, offset: int, repair_mode: bool = False) -> int | None:
    """Find the first long run of NUL bytes in ``data`` (JSON bytes from ``offset`` of the
    decompressed document). Returns None when there is none; with ``repair_mode`` and bytes
    before it, returns its index in ``data`` (the salvage keeps what came before).

    Raises ZeroFilled (a TraceFormatError) saying the file is zero-filled."""
    # JSON text holds no NUL byte at all, and one byte is searched (memchr) several times
    # faster than a run of them: about 1 against 4 ms for 8 MB, the GIL held
    if data.find(0) < 0:
        return None
    i = data.find(_ZEROS)
    if i < 0:
        return None
    at = offset + i
    if repair_mode and at > 0:
        return i
    what = "is zero-filled" if at == 0 else f"is zero-filled from byte {at:,} of its JSON"
    # (a later chunk: the document's start, where its traceEvents key is, was read before)
    hint = _hint(data[:i], truncated=True) if offset == 0 else _HINT
    raise ZeroFilled(
        f"{p}: the trace {what} (NUL bytes, not JSON): a trace file preallocated and never "
        f"written, or cut by a crash{hint}",
        at,
    )


# The gzip stream is inflated in pieces of this many bytes, each checked for NUL runs.
_INFLATE_OUT = 16 << 20


def _gunzip(p: Path, raw: bytes, repair_mode: bool = False, limit: int | None = None) -> bytes:
    """Inflate every gzip member of ``raw`` piece by piece (a bomb of NULs stops at its first
    piece; any bomb stops past ``limit`` bytes, TooLargeWhole). Raises TraceFormatError:
    truncated (unless ``repair_mode`` keeps what was inflated), corrupt, zero-filled, or
    another packed format inside."""
    out: list[bytes] = []
    size = 0
    data = raw
    try:
        while True:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            buf = data
            while buf and not d.eof:
                piece = d.decompress(buf, _INFLATE_OUT)
                buf = d.unconsumed_tail
                if piece:
                    if size == 0:
                        check_format(p, piece[:8], inside_gzip=True)
                    cut = check_zeros(p, piece, size, repair_mode)
                    if cut is not None:  # repair: keep the JSON before the NULs
                        return b"".join([*out, piece[:cut]])
                    out.append(piece)
                    size += len(piece)
                    if limit is not None and size > limit:
                        raise TooLargeWhole(p, limit)
            if not d.eof:
                part = b"".join(out)
                if repair_mode and part.strip():
                    return part  # the JSON salvage then keeps the complete events
                raise TraceFormatError(
                    f"{p}: truncated gzip: the compressed stream ends early "
                    f"(after {len(raw)} compressed bytes, {len(part)} bytes of JSON); the file "
                    f"was cut short{_hint(part, truncated=True)}"
                )
            data = d.unused_data
            if not data.lstrip(b"\x00"):  # no further member (NUL padding after one is allowed)
                return b"".join(out)
            if data[:2] != _GZIP_MAGIC:
                raise TraceFormatError(f"{p}: corrupt gzip data: bytes after the gzip stream")
    except zlib.error as e:
        raise TraceFormatError(f"{p}: corrupt gzip data: {e}") from None


def _line_col(data: bytes, pos: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, pos) + 1
    col = pos - (data.rfind(b"\n", 0, pos) + 1) + 1
    return line, col


def _where(data: bytes, pos: int) -> str:
    line, col = _line_col(data, pos)
    return f"line {line}, column {col} (byte {pos})"


_HINT = "; `--repair` (repair=True in Python) loads what can be salvaged"


def _hint(data: bytes, truncated: bool = False) -> str:
    """:data:`_HINT` where ``--repair`` can read something of ``data`` (JSON bytes), else "":
    past a break its salvage keeps the events of a ``traceEvents`` array (wherever it starts,
    junk before it too), and without one its lenient parse reads only a whole legacy array:
    not one that is ``truncated`` (cut short, or zero-filled from some byte on)."""
    legacy = not truncated and data[:4096].lstrip(b" \t\r\n")[:1] == b"["
    return _HINT if legacy or b'"traceEvents"' in data else ""


def _not_json(p: Path, data: bytes) -> None:
    """Raise TraceFormatError saying what ``data`` is not when it is no JSON at all (it starts
    with neither ``{`` nor ``[``) and ``--repair`` can read nothing of it (:func:`_hint`)."""
    if _json_start(data) or _hint(data):
        return
    head = data[:4096].lstrip()
    text = " ".join(head.decode("utf-8", "replace")[:20].split())
    if "\ufffd" in text or not text.isprintable():
        raise TraceFormatError(
            f"{p}: not a trace: a binary file, not JSON (it starts with {head[:8].hex(' ')})"
        )
    raise TraceFormatError(f"{p}: not a trace: not JSON (it starts with `{text}`)")


_LONE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# The start of the repair note for a file of which only the events before a break were kept.
TRUNCATED_NOTE = "the JSON is truncated or broken"


def _explain_malformed(p: Path, data: bytes, pos: int) -> str:
    """One line describing the JSON syntax error at byte ``pos``."""
    at = data[pos : pos + 12]
    where = _where(data, pos)
    hint = _hint(data)
    for tok in (b"NaN", b"Infinity", b"-Infinity", b"inf", b"-inf"):
        if at.startswith(tok):
            return (
                f"{p}: non-finite number `{tok.decode()}` at {where} is not valid JSON "
                f"(a profiler bug writes it for 0-duration events){hint}"
            )
    if pos < len(data) and data[pos] < 0x20:
        return f"{p}: raw control character U+{data[pos]:04X} inside a string at {where}{hint}"
    sur = _LONE_SURROGATE.search(data, max(0, pos - 12), pos + 12)
    if sur:
        return (
            f"{p}: lone surrogate escape `{sur.group().decode()}` at {_where(data, sur.start())}: "
            f"JSON allows it, but it is no character (a writer cut a UTF-16 pair){hint}"
        )
    bs = data.rfind(b"\\", max(0, pos - 2), pos + 1)
    if bs >= 0:
        esc = data[bs : bs + 2].decode("latin-1")
        return f"{p}: invalid escape `{esc}` at {_where(data, bs)}: probably an unescaped Windows path{hint}"
    snippet = data[max(0, pos - 20) : pos + 20].decode("utf-8", "replace").replace("\n", " ")
    return f"{p}: not valid JSON at {where}, near `{snippet}`{hint}"


def decode(p: Path, data: bytes) -> TraceFile:
    """Strictly decode JSON bytes into a TraceFile. Raises TraceFormatError."""
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            _not_json(p, data)
            raise TraceFormatError(
                f"{p}: invalid UTF-8 byte 0x{data[e.start]:02X} at {_where(data, e.start)}{_hint(data)}"
            ) from None
    try:
        doc = _with_comms(_DECODER, _COMM_DECODER, data).decode(data)
    except RecursionError:
        raise TraceFormatError(
            f"{p}: the JSON is nested too deeply to be a trace (a value over {_DEPTH_NOTE} "
            f"levels deep){_hint(data)}"
        ) from None
    except msgspec.ValidationError as e:
        raise TraceFormatError(f"{p}: not a usable chrome trace: {e}") from None
    except msgspec.DecodeError as e:
        _not_json(p, data)
        msg = str(e)
        m = re.search(r"\(byte (\d+)\)", msg)
        if "truncated" in msg:
            raise TraceFormatError(
                f"{p}: JSON ends early after {len(data)} bytes: the trace is truncated "
                f"(a job killed mid-export?){_hint(data, truncated=True)}"
            ) from None
        if m:
            raise TraceFormatError(_explain_malformed(p, data, int(m.group(1)))) from None
        raise TraceFormatError(f"{p}: not valid JSON: {msg}{_hint(data)}") from None
    return _as_tracefile(p, doc)


def _as_tracefile(p: Path, doc: TraceFile | list) -> TraceFile:
    if isinstance(doc, list):  # legacy autograd-profiler array format
        if doc and not any(e.ph is not None or e.ts is not None for e in doc):
            # every trace event has a phase and a time (Trace Event Format, "ph" and "ts");
            # an array of other objects (a results list, a config) is not a trace
            raise TraceFormatError(
                f"{p}: JSON is not a chrome trace: an array of {len(doc):,} "
                f"object{'s' * (len(doc) != 1)}, none with a trace event's `ph` or `ts` field"
            )
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
    except RecursionError:  # a value nested too deeply: read event by event, dropping it
        obj, kept, whole, deep = _salvage_events(text, _const, p)
        notes.append(
            f"dropped {deep} value(s) nested too deeply (over {_DEPTH_NOTE} levels), with the "
            "event or the top-level keys holding them"
            + ("" if whole else f"; {TRUNCATED_NOTE}: kept the {kept} complete event(s)")
        )
    except json.JSONDecodeError:
        obj, kept, whole, deep = _salvage_events(text, _const, p)
        if deep:
            notes.append(
                f"dropped {deep} value(s) nested too deeply (over {_DEPTH_NOTE} levels), with "
                "the event or the top-level keys holding them"
            )
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
        evs = obj.get("traceEvents")
        if isinstance(evs, list):
            obj["traceEvents"] = _typed_events(evs, notes)
    try:
        encoded = msgspec.json.encode(obj)
    except UnicodeEncodeError:  # a lone surrogate escape (valid JSON, not valid UTF-8)
        obj, n_sur = _replace_surrogates(obj)
        notes.append(f"replaced {n_sur} lone surrogate escape(s) (such as \\ud800) with U+FFFD")
        encoded = msgspec.json.encode(obj)
    try:
        # Re-encode the repaired document so both paths share one typed decoder.
        doc = _with_comms(_DECODER, _COMM_DECODER, encoded).decode(encoded)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise TraceFormatError(f"{p}: not a usable chrome trace even after repair: {e}") from None
    except RecursionError:
        raise TraceFormatError(
            f"{p}: a top-level value is nested too deeply to read, even after repair"
        ) from None
    return _as_tracefile(p, doc), notes


# Python's json and msgspec refuse nesting deeper than about this (the interpreter's
# recursion limit); no trace event nests more than a few levels.
_DEPTH_NOTE = 900
_EVENT_KEYS = ("name", "cat", "ph", "pid", "tid", "ts", "dur", "args", "id")
_DECODER_EVENT = msgspec.json.Decoder(list[Event] | Event, strict=False)


def _typed_events(evs: list, notes: list[str]) -> list:
    """The events of a repaired document that the typed decoder accepts; the others (not an
    object, or a field of the wrong type: ``args`` a string, ``ts`` a list...) are dropped
    and counted in a note, by field."""
    kept = [e for e in evs if isinstance(e, dict)]
    dropped: dict[str, int] = {}
    if len(kept) < len(evs):
        dropped["not an object"] = len(evs) - len(kept)

    def check(x, typ) -> None:  # the typed decoder's own check (Raw fields cannot be converted)
        try:
            msgspec.json.Decoder(typ, strict=False).decode(msgspec.json.encode(x))
        except UnicodeEncodeError:  # lone surrogates: replaced later, the types are what matter
            _DECODER_EVENT.decode(msgspec.json.encode(_replace_surrogates(x)[0]))

    try:
        check(kept, list[Event])
        bad = False
    except (msgspec.ValidationError, RecursionError):
        bad = True
    if bad:  # find which: one at a time
        good = []
        for e in kept:
            try:
                check(e, Event)
                good.append(e)
            except RecursionError:
                dropped["nested too deeply"] = dropped.get("nested too deeply", 0) + 1
            except msgspec.ValidationError as err:
                m = re.search(r"at `\$\.(\w+)", str(err))
                key = m.group(1) if m and m.group(1) in _EVENT_KEYS else "a field"
                dropped[key] = dropped.get(key, 0) + 1
        kept = good
    if dropped:
        n = sum(dropped.values())
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(dropped.items()))
        notes.append(f"dropped {n} event(s) of the wrong shape or field type ({detail})")
    return kept


def _replace_surrogates(x):
    """``x`` with every lone surrogate in its strings replaced by U+FFFD; returns (x, count)."""
    count = 0

    def fix(v):
        nonlocal count
        if isinstance(v, str):
            try:
                v.encode("utf-8")
                return v
            except UnicodeEncodeError:
                out = v.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
                count += sum(1 for c in v if 0xD800 <= ord(c) <= 0xDFFF)
                return out
        if isinstance(v, dict):
            return {fix(k): fix(w) for k, w in v.items()}
        if isinstance(v, list):
            return [fix(w) for w in v]
        return v

    return fix(x), count


def _skip_value(text: str, i: int) -> int:
    """The index just after the JSON value starting at ``text[i]`` (an object or array too
    deep for the decoder), found by counting brackets outside strings; ``len(text)`` when it
    does not end."""
    depth = 0
    n = len(text)
    in_str = False
    while i < n:
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


def _salvage_events(
    text: str, parse_constant, p: Path | None = None
) -> tuple[dict, int, bool, int]:
    """Parse the complete events of a truncated trace, one at a time.

    Returns (document, events kept, whether the event list was read to its closing ``]``: the
    break is after it, and no event was lost; events dropped for nesting too deep)."""
    start = text.find('"traceEvents"')
    if start < 0:
        raise TraceFormatError(f"{p}: nothing to salvage: no `traceEvents` array before the break")
    i = text.find("[", start)
    dec = json.JSONDecoder(strict=False, parse_constant=parse_constant)
    events: list = []
    deep = 0
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
        except RecursionError:
            deep += 1
            i = _skip_value(text, i)
            continue
        events.append(ev)
    # Salvage top-level keys written before traceEvents (deviceProperties, versions).
    head: dict = {}
    try:
        head = json.loads(text[:start].rstrip().rstrip(",") + "}", strict=False)
    except json.JSONDecodeError:
        head = {}
    except RecursionError:  # a top-level key nested too deeply: the keys before the list go
        head, deep = {}, deep + 1
    head = head if isinstance(head, dict) else {}
    head["traceEvents"] = events
    return head, len(events), whole, deep


def read_document(path: str | Path, repair_mode: bool = False) -> tuple[TraceFile, list[str]]:
    """Read and decode a chrome trace (``.json`` or gzip, detected by magic bytes).

    Returns (TraceFile, repair notes). Raises TraceFormatError on unusable input, and
    TooLargeWhole past :func:`whole_limit` bytes of JSON.
    """
    p = Path(path)
    data = read_bytes(p, repair_mode, whole_limit())
    if not repair_mode:
        return decode(p, data), []
    try:
        return decode(p, data), []
    except TraceFormatError:
        _not_json(p, data)  # nothing to repair: say what the file is not
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

CHUNK_BYTES = 8 << 20
# (8 MB, not 16: a chunk's decoded events are the reader's peak, several times the chunk's
# bytes; measured on benchmarks/bench.py's 107 MB trace, the read's peak resident set went
# from 201 to 179 MB with no measurable change of time.)
# A second process decodes and converts chunks alongside (it takes each chunk offered while
# fewer than three of its chunks are out; near the end of a plain file, only while it would not
# finish after this process) when the JSON is at least this big. Measured on the 2-core
# benchmark machine (benchmarks/bench.py's traces), it saved no time at 100 MB and about 5% at
# 300 MB, for 100 to 150 MB more memory (its own interpreter and imports), 15% at 650 MB and
# 25 to 35% of the load at 1 GB. Since a plain file's chunks are read by the worker itself
# (parallel.Span), on 2 pinned cores of an idle machine at 1 GB: the worker converts 63 of 130
# chunks (55 when they were piped) and waits 0.3 s for work, not 1.1 s, and the 1 GB diagnose
# takes 7.5 s, not 8.3 s (median of 3, interleaved).
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

    def add(self, events: list, whole: bool = False) -> None: ...

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
    regular_file(p, "trace", TraceFormatError)
    with collector_paused():
        try:
            return _read_fast(p, sink, progress), []
        except (_NotFast, OSError):  # an I/O error is said by the reference path
            pass
        except ZeroFilled as e:
            if not (repair_mode and e.at > 0):
                raise
            # the salvage reads the JSON before the NULs (bounded by them)
        sink.reset()
        doc, notes = read_document(p, repair_mode)
        events = doc.traceEvents or []
        doc.traceEvents = None
        sink.add(events)
        return doc, notes


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside (as it was after): reading a trace makes
    millions of new objects, none of them in cycles, so the collector only costs. Building and
    linking the tables makes fewer, but a full collection among them, which scans every object
    of the process (polars' and numpy's included), took 10 ms of a 85 ms load of the 10 MB
    benchmark trace, in about one load of five."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _blocks(p: Path, progress=None) -> Iterator[bytes]:
    """The decompressed bytes of ``p`` in blocks of at most ``_READ_BYTES``; ``progress`` gets
    the file position after each read."""
    with open(p, "rb") as f:
        magic = f.read(2)
        f.seek(0)
        offset = 0
        if magic != _GZIP_MAGIC:
            while block := f.read(_READ_BYTES):
                check_zeros(p, block, offset)
                offset += len(block)
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
                check_zeros(p, out, offset)
                offset += len(out)
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
        except TraceFormatError as e:  # the reference path would say the same: say it now
            self._put(e)
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


# A block of whitespace only, holding a tab, CR or LF, is read as one LF: outside a string
# they mean the same, and inside one a raw control character is invalid JSON either way, so
# padding costs no memory. Blocks of spaces only (which a string may hold) are counted, and
# more than this many of them with no event between is refused.
_MAX_PADDING = 256 << 20
_MAX_UNCUT = 256 << 20
"""Bytes the fast reader holds without finding a boundary between two events before it refuses
the file: no profiler event is that large, and holding more would make memory grow with the
inflated bytes (one huge string) instead of with the events kept."""


def _blank(block, chars: bytes | None = None) -> bool:
    """Whether ``block`` holds only whitespace (``chars``, default ASCII whitespace). A block
    of events is told by its first bytes, without the copy of the whole block that
    ``bytes.strip`` makes (8 MB per block: about 5% of a 1 GB read)."""
    if bytes(block[:256]).strip(chars):
        return False
    return not block.strip(chars)


def _squeeze(block):
    """``block``, or one LF when it is whitespace holding a tab, CR or LF."""
    if not _blank(block) or not (b"\n" in block or b"\r" in block or b"\t" in block):
        return block
    return b"\n"


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


def read_span(fd: int, span) -> bytearray:
    """The middle chunk ``[`` bytes sentinel ``]`` of a :class:`~tracedx.trace.parallel.Span`
    of the file ``fd``, read in place (run by the worker process: the parent neither joins nor
    pipes the bytes). Raises _NotFast when the file does not hold the bytes the parent read
    there (it changed, or shrank)."""
    offset, length, head, tail = span
    buf = bytearray(1 + length + len(_SENTINEL) + 1)
    buf[0:1] = b"["
    view = memoryview(buf)[1 : 1 + length]
    got = 0
    while got < length and (n := os.preadv(fd, [view[got:]], offset + got)):
        got += n
    view.release()
    if (
        got < length
        or buf[1 : 1 + len(head)] != head
        or buf[1 + length - len(tail) : 1 + length] != tail
    ):
        raise _NotFast(
            f"the file changed while it was read (bytes {offset:,} to {offset + length:,})"
        )
    buf[1 + length :] = _SENTINEL + b"]"
    return buf


def decode_middle_chunk(payload: bytes | bytearray) -> list:
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


def _start_worker(p: Path):
    """A worker process, or None when it cannot start. For a plain file it gets a descriptor
    of ``p`` of its own, to read the chunks it is handed as spans (see :func:`read_span`)."""
    from tracedx.trace.parallel import Worker

    try:
        with open(p, "rb") as f:
            plain = f.read(2) != _GZIP_MAGIC and hasattr(os, "preadv")
            return Worker(f.fileno() if plain else None)
    except OSError:
        return None


def _decode_part(payload: bytes, decoder, where: str):
    if has_comms(payload):
        decoder = _COMM_PART if decoder is _FAST_PART else _COMM_LIST
    try:
        return decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
        raise _NotFast(f"{where}: {e}") from None


def _read_fast(p: Path, sink: EventSink, progress=None) -> TraceFile:
    if not p.is_file():
        raise _NotFast("not a file")
    data = _read_small(p, progress)
    if data is not None:
        return _decode_whole(data, sink)
    reader = _Reader(p, progress)  # reading starts while the machine's idle time is measured
    worker = None
    ok = False
    try:
        if _json_size(p) >= PARALLEL_MIN_BYTES and _idle_cpu():
            worker = _start_worker(p)
        doc = _read_chunks(reader, sink, worker, p)
        ok = True
        return doc
    finally:
        reader.close()
        if worker is not None:
            worker.close(abandon=not ok)


def _read_small(p: Path, progress=None) -> bytes | None:
    """The bytes of a file of less than two chunks (``2 * CHUNK_BYTES``), read at once
    (gunzipped at once, :func:`_gunzip_small`, for a gzip file whose document is that small),
    or None for any other file. Decoded in one piece, such a file skips the
    reading thread, the copy of its first chunk and a second decode: on the 10 MB benchmark
    trace, reading it (decoding and freeing its events, no tables) took 31.5-32.6 ms instead
    of 37.9-40.6 (best of 40, 3 runs each, interleaved), for a peak of decoded events up to
    twice a chunk's. Raises ZeroFilled as :func:`_blocks` does."""
    limit = 2 * CHUNK_BYTES
    with open(p, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size >= limit:
            return None
        if f.read(2) == _GZIP_MAGIC:
            data = _gunzip_small(f, limit)
            if data is None:
                return None
            nbytes = size  # (progress counts the file's bytes, as the chunked reader does)
        else:
            f.seek(0)
            data = _read_plain(f, size, limit)
            nbytes = len(data)
    if len(data) >= limit:
        return None
    check_zeros(p, data, 0)
    if progress:
        progress(nbytes)
    return data


def _read_plain(f, size: int, limit: int) -> bytes:
    """The open file ``f`` of ``size`` bytes, at most ``limit`` of them (and one more, which
    tells it grew)."""
    # the file's size and one byte more, not ``limit``: a buffer of ``limit`` bytes shrunk
    # to the data took 2.5 ms for the 10 MB benchmark trace, against 0.75 (best of 30)
    data = f.read(size + 1)
    if len(data) > size:  # it grew since: the rest, up to the limit
        data += f.read(limit - len(data))
    return data


def _gunzip_small(f, limit: int) -> bytes | None:
    """The decompressed document of the open gzip file ``f`` when it is under ``limit`` bytes
    and one clean gzip stream (or several, one after the other); None for anything else, which
    the chunked reader then reads and names (a truncated stream, trailing bytes, a larger
    document). Gunzipped at once, a small trace skips the reading thread: the 10 MB benchmark
    trace, gzipped, loaded and diagnosed in 0.14-0.16 s instead of 0.15-0.19 on a first call
    (``benchmarks/inprocess.py``, 3 repeats, twice each, interleaved)."""
    f.seek(0)
    packed = f.read()
    # (the trailer's size of the last member, modulo 2**32: no gunzip of a large document)
    if len(packed) < 18 or int.from_bytes(packed[-4:], "little") >= limit:
        return None
    d = zlib.decompressobj(wbits=31)
    parts = []
    total = 0
    while packed:
        try:
            part = d.decompress(packed, limit - total)
        except zlib.error:
            return None
        parts.append(part)
        total += len(part)
        if total >= limit or d.unconsumed_tail:
            return None  # (too large: the chunked reader reads it in its blocks)
        if not d.eof:
            return None  # truncated
        packed = d.unused_data
        if packed:  # another member
            if packed[:2] != _GZIP_MAGIC:
                return None
            d = zlib.decompressobj(wbits=31)
    return b"".join(parts)


def _decode_whole(data: bytes, sink: EventSink) -> TraceFile:
    """Decode ``data``, a whole document, handing its events to ``sink``."""
    if _blank(data):
        raise _NotFast("empty")
    _check_text(data)
    doc = _decode_part(data, _FAST_PART, "document")
    del data
    if doc.traceEvents is None:
        raise _NotFast("no traceEvents")
    events, doc.traceEvents = doc.traceEvents, None
    sink.add(events, whole=True)
    return _tracefile(doc, None)


class _NoWorker(Exception):
    """Never raised: stands for parallel.WorkerError when no worker runs (not imported then)."""


def _ends(parts: list, n: int = 256) -> tuple[bytes, bytes]:
    """The first and the last ``n`` bytes of the bytes ``parts`` (all of them when fewer)."""
    head = bytearray()
    for part in parts:
        head += part[: n - len(head)]
        if len(head) >= n:
            break
    tail = bytearray()
    for part in reversed(parts):
        tail[:0] = part[max(len(part) - (n - len(tail)), 0) :]
        if len(tail) >= n:
            break
    return bytes(head), bytes(tail)


def _read_chunks(reader: _Reader, sink: EventSink, worker, p: Path) -> TraceFile:
    if worker is not None:
        from tracedx.trace.parallel import Span, WorkerError
    else:
        WorkerError = _NoWorker  # noqa: N806 (the class caught below)

    def collect(block: bool) -> None:
        nonlocal worker
        try:
            while worker is not None and (r := worker.poll(block)) is not None:
                sink.fill(*r)
        except WorkerError as e:
            raise _NotFast(f"worker: {e}") from None

    file_size = p.stat().st_size
    pending: list = []  # blocks (or the tail of one) not decoded yet
    size = 0
    at = raw = 0  # where pending starts in the file, and the file's bytes in it
    squeezed = False  # whether a block of pending is not the file's bytes (see _squeeze)
    spaces = 0  # bytes of blocks of spaces only in pending
    head: FastPart | None = None
    key_block = -1  # the index in pending of the block holding the traceEvents key
    key_at = -1  # its offset in that block
    for block in reader:
        raw += len(block)
        blank = _squeeze(block)
        squeezed |= blank is not block
        block = blank
        if _blank(block, b" "):
            spaces += len(block)
        pending.append(block)
        size += len(block)
        if head is None and key_block < 0:
            # search only the new block, and the key's length across its start: linear time
            i = block.find(_KEY)
            if i < 0 and len(pending) > 1:
                k = len(_KEY) - 1
                if _KEY in bytes(pending[-2][-k:]) + bytes(block[:k]):
                    pending[-2:] = [bytes(pending[-2]) + bytes(block)]  # once: the key is found
                    i = pending[-1].find(_KEY)
            if i >= 0:
                key_block, key_at = len(pending) - 1, i
            elif size > _KEY_SEARCH_LIMIT:
                raise _NotFast("no traceEvents key near the start")
        if size < CHUNK_BYTES:
            continue
        if spaces > _MAX_PADDING:
            raise TraceFormatError(
                f"{p}: {spaces:,} bytes of spaces without an event between them (padding, or "
                "a file filled to a preallocated size): not a trace tracedx reads"
            )
        if head is None and key_block < 0:
            continue
        last = pending[-1]
        lo = key_at if head is None and key_block == len(pending) - 1 else 0
        cut = _find_cut(last, lo)
        if cut < 0:
            if size > _MAX_UNCUT:
                raise TraceFormatError(
                    f"{p}: {size:,} bytes without a boundary between two events (one event, or "
                    "one string, that large): not a trace tracedx reads"
                )
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
            if worker is not None:
                try:
                    use_worker = worker.can_take()
                except WorkerError:  # it did not start: carry on alone
                    worker.close(abandon=True)
                    worker, use_worker = None, False
            else:
                use_worker = False
            # a worker with the file reads the bytes itself: no join, no copy through the pipe
            # (a chunk with a blank block read as one LF, not the file's bytes, stays here)
            # Near the end, a chunk that would wait behind the worker's others stays here too,
            # so that both processes finish about together.
            chunk = None
            if use_worker and worker.reads_file:
                length = raw - len(last) + cut
                left = (file_size - at - length) // CHUNK_BYTES  # chunks after this one
                use_worker = not squeezed and len(worker.inflight) <= left
                if use_worker:
                    chunk = Span(at, length, *_ends(parts))
            if chunk is None:
                chunk = b"".join((b"[", *parts, _SENTINEL, b"]"))
            del parts
            if use_worker:
                worker.submit(sink.reserve(), chunk)
                del chunk
            else:
                events = decode_middle_chunk(chunk)
                del chunk
                sink.add(events)
                del events
        collect(False)
        at += raw - len(last) + cut
        pending = [memoryview(last)[cut:]]
        size = raw = len(pending[0])
        squeezed = False
        spaces = 0
    rest = b"".join(pending)
    del pending
    if head is None:  # one chunk: the whole document
        return _decode_whole(rest, sink)
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
