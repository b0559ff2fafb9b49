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

import gzip
import json
import re
import zlib
from pathlib import Path

import msgspec

from tracedx.errors import TraceFormatError
from tracedx.trace.events import TraceDocument, TraceFile

_DECODER = msgspec.json.Decoder(TraceDocument, strict=False)
_GZIP_MAGIC = b"\x1f\x8b"


def read_bytes(path: str | Path) -> bytes:
    """Return the JSON bytes of ``path``, gunzipped when it starts with the gzip magic bytes.

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
        raw = _gunzip(p, raw)
        if not raw.strip():
            raise TraceFormatError(f"{p}: trace is empty (the gzip stream holds no data)")
    elif not raw.strip():
        raise TraceFormatError(f"{p}: trace is empty (only whitespace)")
    return raw


def _gunzip(p: Path, raw: bytes) -> bytes:
    try:
        return gzip.decompress(raw)
    except EOFError:
        # Say how much was recoverable: decompress what is there.
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            part = d.decompress(raw)
        except zlib.error:
            part = b""
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
        return (
            f"{p}: invalid escape `{esc}` at {_where(data, bs)}: probably an unescaped Windows path{_HINT}"
        )
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
        doc = _DECODER.decode(data)
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
        obj, kept = _salvage_events(text, _const)
        notes.append(
            f"the JSON is truncated or broken: kept the {kept} complete event(s) before the break"
        )
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
        doc = _DECODER.decode(msgspec.json.encode(obj))
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise TraceFormatError(f"{p}: not a usable chrome trace even after repair: {e}") from None
    return _as_tracefile(p, doc), notes


def _salvage_events(text: str, parse_constant) -> tuple[dict, int]:
    """Parse the complete events of a truncated trace, one at a time."""
    start = text.find('"traceEvents"')
    if start < 0:
        raise TraceFormatError("nothing to salvage: no `traceEvents` array before the break")
    i = text.find("[", start)
    dec = json.JSONDecoder(strict=False, parse_constant=parse_constant)
    events: list = []
    i += 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
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
    return head, len(events)


def read_document(path: str | Path, repair_mode: bool = False) -> tuple[TraceFile, list[str]]:
    """Read and decode a chrome trace (``.json`` or gzip, detected by magic bytes).

    Returns (TraceFile, repair notes). Raises TraceFormatError on unusable input.
    """
    p = Path(path)
    data = read_bytes(p)
    if not repair_mode:
        return decode(p, data), []
    try:
        return decode(p, data), []
    except TraceFormatError:
        return repair(p, data)
