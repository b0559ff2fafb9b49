"""A second process for the fast reader: it decodes and converts chunks while this one does too.

Decoding JSON into Python objects holds the GIL, so a second core needs a second process. The
worker is a fresh interpreter (``python -m tracedx.trace.parallel``), not a fork, so it is safe
whatever the parent has done with polars' thread pool, and no multiprocessing bootstrap re-runs
the user's ``__main__``. It reads chunks (``[`` events, sentinel ``]``: see ``source``) from
stdin, or for a plain (not gzip) file only where each chunk lies in it (a :class:`Span`: it reads
the bytes itself from the parent's file descriptor, so the parent neither joins nor pipes them),
and writes each chunk's pickled :class:`~tracedx.trace.tables.ChunkColumns` to a file in
a folder the parent made, telling the parent its name over stdout, one per chunk, in order. A
file, not the pipe: the parent's thread that reads the pipe needs the GIL, which the parent's
own decoding holds for tens of milliseconds at a time, so megabytes of results through a 64 KB
pipe kept the worker blocked 40% of the time. The parent merges the chunks in chunk order, so
the tables are the same whoever converted a chunk. Anything unexpected (the worker cannot start, dies, or reports an error) makes the
reader fall back to its reference path, never to a different result.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import NamedTuple

_HEADER = struct.Struct("<Q")
# a chunk: its offset in the file (-1: its bytes follow on the pipe), its length, and the length
# of the head and tail of the span that follow (to check that the file still holds those bytes)
_CHUNK = struct.Struct("<qQI")
_HELLO = b"tracedx-chunk-worker 2\n"


class Span(NamedTuple):
    """Where a chunk's bytes lie in the (plain) file, with its first and last bytes as the
    parent read them: the worker checks that it reads the same."""

    offset: int
    length: int
    head: bytes
    tail: bytes


def _read_exact(f, n: int) -> bytearray | None:
    """Exactly ``n`` bytes from ``f`` (None at end of input), read in place: no copies."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            return None
        got += k
    view.release()
    return buf


def write_all(f, data) -> None:
    """Write every byte of ``data`` to ``f``: an unbuffered pipe's ``write`` may take only part
    of it (a short write, returning how many bytes it took), and ``None`` means none for now.

    Raises OSError from the pipe (the reader went away)."""
    view = memoryview(data).cast("B")
    while view.nbytes:
        n = f.write(view)
        if n is None:  # a non-blocking pipe that is full: wait for room
            import select

            select.select([], [f], [], 1.0)
            continue
        view = view[n:]


def worker_main(spool: str, fd: int | None = None) -> int:
    """The worker's loop: chunk in, columns out (a file in ``spool``), until stdin closes.
    ``fd``: the parent's trace file, for chunks sent as a :class:`Span`."""
    import gc

    gc.disable()
    from tracedx.trace.source import decode_middle_chunk, read_span
    from tracedx.trace.tables import Converter

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    out.write(_HELLO + str(Path(__file__).resolve()).encode() + b"\n")
    out.flush()
    conv = Converter()
    count = 0
    while True:
        head = _read_exact(inp, _CHUNK.size)
        if head is None:
            return 0
        offset, length, check = _CHUNK.unpack(head)
        payload = _read_exact(inp, length if offset < 0 else 2 * check)
        if payload is None:
            return 1
        try:
            if offset >= 0:
                ends = bytes(payload)
                payload = read_span(fd, Span(offset, length, ends[:check], ends[check:]))
            events = decode_middle_chunk(payload)
            del payload
            result = ("ok", conv.convert(events))
            del events
        except Exception as e:  # the parent decides what to do; never a traceback here
            result = ("error", f"{type(e).__name__}: {e}")
        if result[0] == "ok":
            count += 1
            path = os.path.join(spool, f"{count}.pickle")
            with open(path, "wb") as f:
                pickle.dump(result[1], f, protocol=pickle.HIGHEST_PROTOCOL)
            result = ("file", path)
        blob = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        del result
        out.write(_HEADER.pack(len(blob)))
        out.write(blob)
        out.flush()


class WorkerError(Exception):
    """The worker could not start, died, or could not convert a chunk."""


class Worker:
    """The parent's handle: :meth:`submit` chunks, :meth:`poll`/:meth:`wait` for their columns.

    Receiving runs in a thread, and so does sending chunks' bytes (pipe I/O releases the GIL),
    so the parent keeps decoding its own chunks meanwhile. A :class:`Span` (``reads_file``: the
    worker has the file) is a few hundred bytes, written at once: a sending thread would wait
    for the GIL, which the parent's own decoding holds for tens of milliseconds, while the
    worker waits for its next chunk. At most ``max_inflight`` chunks are out at once. A chunk
    whose columns do not come back within ``timeout_s`` seconds (a worker stuck or starved)
    raises :class:`WorkerError`, and the reader falls back to its one-process path.
    """

    # A 16 MB chunk takes the worker about 0.1 to 0.3 s; a minute is a hang, not a slow core.
    timeout_s = 60.0

    def __init__(self, fd: int | None = None, max_inflight: int = 3) -> None:
        import tracedx

        env = dict(os.environ)
        root = str(Path(tracedx.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.max_inflight = max_inflight
        self.reads_file = fd is not None  # chunks may be sent as a Span of file ``fd``
        self.inflight: list[int] = []  # slots, oldest first
        self.ready = False
        self.failed: str | None = None
        self._expect = str(Path(__file__).resolve())
        self._results: queue.Queue = queue.Queue()
        self._outbox: queue.Queue = queue.Queue()
        self._spool = tempfile.mkdtemp(prefix="tracedx-chunks-")
        try:
            self._p = subprocess.Popen(
                [sys.executable, "-m", "tracedx.trace.parallel", self._spool]
                + ([str(fd)] if fd is not None else []),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                bufsize=0,
                pass_fds=() if fd is None else (fd,),
            )
        except BaseException:
            shutil.rmtree(self._spool, ignore_errors=True)
            raise
        self._rx = threading.Thread(target=self._receive, daemon=True)
        self._rx.start()
        self._tx = None
        if not self.reads_file:  # (one writer: the order of the chunks is kept)
            self._tx = threading.Thread(target=self._send, daemon=True)
            self._tx.start()

    # -- threads ------------------------------------------------------------------------------
    def _receive(self) -> None:
        f = self._p.stdout
        try:
            hello = f.readline()
            path = f.readline().decode(errors="replace").strip()
            if hello != _HELLO or path != self._expect:
                self._results.put(("dead", "the worker is another tracedx or did not start"))
                return
            self._results.put(("hello", None))
            while True:
                head = _read_exact(f, _HEADER.size)
                if head is None:
                    self._results.put(("dead", "the worker exited"))
                    return
                blob = _read_exact(f, _HEADER.unpack(head)[0])
                if blob is None:
                    self._results.put(("dead", "the worker exited mid-result"))
                    return
                self._results.put(pickle.loads(blob))
        except Exception as e:
            self._results.put(("dead", f"{type(e).__name__}: {e}"))

    def _send(self) -> None:
        while (payload := self._outbox.get()) is not None:
            if not self._write(payload):
                return
            del payload
        self._close_input()

    def _write(self, payload: bytes | Span) -> bool:
        f = self._p.stdin
        try:
            if isinstance(payload, Span):
                offset, length, head, tail = payload
                write_all(f, _CHUNK.pack(offset, length, len(head)) + head + tail)
            else:
                write_all(f, _CHUNK.pack(-1, len(payload), 0))
                write_all(f, payload)
            return True
        except Exception as e:  # the worker died (or its pipe broke): the parent stops waiting
            self._results.put(("dead", f"sending a chunk: {type(e).__name__}: {e}"))
            return False

    def _close_input(self) -> None:
        with contextlib.suppress(OSError):  # a broken pipe: the worker is gone already
            self._p.stdin.close()

    # -- the parent's side ----------------------------------------------------------------------
    def _take(self, block: bool):
        """One message from the worker: None when none is there (and not blocking)."""
        while True:
            try:
                kind, value = self._results.get(
                    block=block, timeout=self.timeout_s if block else None
                )
            except queue.Empty:
                if block:
                    self.failed = f"no result from the worker in {self.timeout_s:g} s"
                    raise WorkerError(self.failed) from None
                return None
            if kind == "hello":
                self.ready = True
                continue
            if kind == "dead":
                self.failed = value
                raise WorkerError(value)
            if kind == "error":
                raise WorkerError(value)
            if kind == "file":
                try:
                    with open(value, "rb") as f:
                        value = pickle.load(f)
                    os.unlink(f.name)
                except Exception as e:  # noqa: BLE001 (any failure: the reference path)
                    raise WorkerError(f"result file: {type(e).__name__}: {e}") from None
            return value

    def can_take(self) -> bool:
        """Whether a chunk may be submitted now (started, and fewer than max_inflight out)."""
        if not self.ready and self.failed is None:
            self._poll_hello()
        return self.ready and len(self.inflight) < self.max_inflight

    def _poll_hello(self) -> None:
        try:
            kind, value = self._results.get_nowait()
        except queue.Empty:
            return
        if kind == "hello":
            self.ready = True
        else:
            self.failed = value if kind == "dead" else str(value)
            raise WorkerError(self.failed)

    def submit(self, slot: int, payload: bytes | Span) -> None:
        """Hand the worker a chunk: its bytes, or (``reads_file``) where it lies in the file."""
        self.inflight.append(slot)
        if self._tx is None:
            self._write(payload)
        else:
            self._outbox.put(payload)

    def poll(self, block: bool = False):
        """``(slot, columns)`` of the oldest chunk out if it is done (or when ``block``)."""
        if not self.inflight:
            return None
        value = self._take(block)
        if value is None:
            return None
        return self.inflight.pop(0), value

    def close(self, abandon: bool = False) -> None:
        """Stop the worker: let it finish (it has nothing left), or kill it when ``abandon``."""
        if abandon or self.inflight:
            self._p.kill()
        if self._tx is None:
            self._close_input()
        else:
            self._outbox.put(None)
        try:
            self._p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._p.kill()
            self._p.wait()
        shutil.rmtree(self._spool, ignore_errors=True)


def _main(spool: str, fd: int | None) -> int:
    # the parent closes stdin only after taking every result, or kills this process: either
    # way nothing in the spool is needed once the loop ends (a parent killed outright leaves
    # its worker at end of input, and the spool goes with it)
    try:
        return worker_main(spool, fd)
    finally:
        shutil.rmtree(spool, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None))
