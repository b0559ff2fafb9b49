"""The fast reader's chunked and two-process paths give exactly the reference reader's tables.

Traces under ``CHUNK_BYTES`` (8 MB) are decoded in one piece, so these tests shrink the chunk
and block sizes to cut a real H200 trace (4.7 MB of JSON) into a hundred chunks, and force the
worker process (normally only for traces of 256 MB and more, on an idle core).
"""

from __future__ import annotations

import gzip
import os
import tempfile
import time
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

import tracedx.trace.source as source
from tracedx.trace import parallel
from tracedx.trace.tables import RawTables, TableBuilder, build_tables

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces/resnet_train-bf16-cl.json.gz"
TABLES = ("kernels", "memcpys", "memsets", "launches", "ops", "annotations", "syncs", "comm_args")


def _reference(path: Path) -> RawTables:
    doc, _ = source.read_document(path)
    return build_tables(doc.traceEvents or [])


def _fast(path: Path) -> tuple[RawTables, int]:
    builder = TableBuilder()
    source.read_into(path, builder)
    chunks = len(builder._chunks)
    return builder.finish(), chunks


def _same(a: RawTables, b: RawTables) -> None:
    for name in TABLES:
        assert_frame_equal(getattr(a, name), getattr(b, name), check_row_order=True)
    assert a.process_names == b.process_names
    assert a.thread_names == b.thread_names


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(source, "CHUNK_BYTES", 48 << 10)
    monkeypatch.setattr(source, "_READ_BYTES", 16 << 10)


@pytest.mark.parametrize("gzipped", [True, False])
def test_many_chunks_equal_the_reference(small_chunks, tmp_path, gzipped):
    path = SAMPLE
    if not gzipped:
        path = tmp_path / "plain.json"
        path.write_bytes(gzip.decompress(SAMPLE.read_bytes()))
    ref = _reference(path)
    fast, chunks = _fast(path)
    assert chunks > 50  # really cut: the chunk-boundary code ran
    assert ref.kernels.height > 1000
    _same(ref, fast)


def test_a_plain_file_under_two_chunks_is_decoded_whole(tmp_path, monkeypatch):
    """Between one and two chunks, a plain file is decoded in one piece (read at once), and
    so is a gzip file's document (gunzipped at once); both give the reference tables."""
    plain = tmp_path / "plain.json"
    plain.write_bytes(gzip.decompress(SAMPLE.read_bytes()))
    size = plain.stat().st_size
    monkeypatch.setattr(source, "CHUNK_BYTES", size * 2 // 3)
    monkeypatch.setattr(source, "_READ_BYTES", 64 << 10)
    ref = _reference(plain)
    fast, chunks = _fast(plain)
    assert chunks == 1
    _same(ref, fast)
    fast_gz, chunks_gz = _fast(SAMPLE)
    assert chunks_gz == 1
    _same(ref, fast_gz)
    monkeypatch.setattr(source, "CHUNK_BYTES", size // 2)  # exactly two chunks: cut
    assert _fast(plain)[1] == 2


def _outcome(path: Path):
    """The tables of ``path`` read by the fast reader, or its error's message."""
    try:
        return _fast(path)[0]
    except source.TraceFormatError as e:
        return str(e)


@pytest.mark.parametrize("case", ["one member", "two members", "trailing bytes", "truncated"])
def test_a_small_gzip_gunzipped_at_once_equals_the_chunked_read(tmp_path, monkeypatch, case):
    """A gzip file whose document is under two chunks is gunzipped at once; whatever the
    stream (members one after the other, bytes after it, cut short) the tables or the error
    are the chunked reader's."""
    doc = gzip.decompress(SAMPLE.read_bytes())
    half = doc.index(b"},", len(doc) // 2) + 2  # two members cut between events' bytes
    data = {
        "one member": gzip.compress(doc),
        "two members": gzip.compress(doc[:half]) + gzip.compress(doc[half:]),
        "trailing bytes": gzip.compress(doc) + b"garbage",
        "truncated": gzip.compress(doc)[:-1000],
    }[case]
    path = tmp_path / "t.json.gz"
    path.write_bytes(data)
    whole = _outcome(path)
    monkeypatch.setattr(source, "_gunzip_small", lambda f, limit: None)
    chunked = _outcome(path)
    if isinstance(chunked, str):
        assert whole == chunked
    else:
        _same(chunked, whole)
    if case in ("one member", "two members"):
        _same(_reference(path), whole)


@pytest.fixture
def forced_worker(small_chunks, monkeypatch):
    """The worker starts whatever the size and load, and is ready before the read begins (the
    read of 4.7 MB would otherwise be over before the worker has imported polars)."""
    monkeypatch.setattr(source, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(source, "_idle_cpu", lambda: True)
    start = source._start_worker

    def started(p):
        w = start(p)
        deadline = time.monotonic() + 60
        while not w.can_take() and time.monotonic() < deadline:
            time.sleep(0.05)
        return w

    monkeypatch.setattr(source, "_start_worker", started)


def _plain(tmp_path: Path) -> Path:
    path = tmp_path / "plain.json"
    path.write_bytes(gzip.decompress(SAMPLE.read_bytes()))
    return path


@pytest.mark.parametrize("gzipped", [True, False])
def test_worker_process_equals_the_reference(forced_worker, monkeypatch, tmp_path, gzipped):
    # the spool folder goes in a temporary folder of this test's own: another process's
    # reader (a second test run beside this one) must not count as a folder left behind
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = SAMPLE if gzipped else _plain(tmp_path)
    handed = []
    submit = parallel.Worker.submit

    def counting(self, slot, payload):
        handed.append(type(payload))
        return submit(self, slot, payload)

    monkeypatch.setattr(parallel.Worker, "submit", counting)
    fast, chunks = _fast(path)
    assert handed, "the worker converted no chunk"
    assert len(handed) < chunks
    # a plain file's chunks are handed as spans the worker reads itself; gzip's bytes are piped
    assert set(handed) == ({bytes} if gzipped else {parallel.Span})
    _same(_reference(path), fast)
    # the worker's spool folder is gone with it
    assert not list(tmp_path.glob("tracedx-chunks-*"))


@pytest.mark.parametrize("gzipped", [True, False])
def test_a_dead_worker_falls_back_to_the_same_tables(forced_worker, monkeypatch, tmp_path, gzipped):
    path = SAMPLE if gzipped else _plain(tmp_path)
    killed = []

    def broken(self, slot, payload):
        self.inflight.append(slot)
        self._p.kill()
        killed.append(slot)

    monkeypatch.setattr(parallel.Worker, "submit", broken)
    fast, chunks = _fast(path)
    assert killed
    assert chunks == 1  # the reference path: one sink.add of every event
    _same(_reference(path), fast)


def _collective_trace(path: Path) -> Path:
    """Stretches of compute with no collective (their chunks decode without the collective
    fields) between bursts of NCCL collectives and gloo annotations."""
    from tracebuilder import T0, TraceBuilder

    b = TraceBuilder()
    t = T0
    for step in range(40):
        b.step(step, t, 1000)
        for i in range(60):
            b.launched_kernel("aten::mm", t + i * 10, 5, t + i * 10 + 3, 4)
        if step % 4 == 0:
            for j in range(8):
                b.collective(
                    t + 700 + j * 30, 10, t + 720 + j * 30, 20, seq=step * 8 + j,
                    comms_id=2**63 + step * 8 + j, rank=1,
                )  # fmt: skip
            b.gloo("gloo:all_reduce", t + 950, 20, dims=[[128]])
        t += 1000
    return b.write(path)


def test_collectives_in_some_chunks_equal_the_reference(small_chunks, tmp_path):
    path = _collective_trace(tmp_path / "colls.json")
    ref = _reference(path)
    fast, chunks = _fast(path)
    assert chunks > 20
    assert ref.comm_args.height == 10 * 8 * 2 + 10  # op and kernel of each, the gloo labels
    _same(ref, fast)


def test_collectives_through_the_worker_equal_the_reference(forced_worker, tmp_path):
    path = _collective_trace(tmp_path / "colls.json")
    fast, _ = _fast(path)
    _same(_reference(path), fast)


def test_cpu_times_count_only_this_process_cpus():
    mine = os.sched_getaffinity(0)
    b0, i0 = source._cpu_times(mine)
    sum(range(2_000_000))  # some busy time on this process's CPUs
    b1, i1 = source._cpu_times(mine)
    assert b1 > b0 and i1 >= i0
    one = source._cpu_times({min(mine)})
    assert sum(one) < sum(source._cpu_times(mine)) or len(mine) == 1
    with pytest.raises(ValueError):
        source._cpu_times({10**6})  # a CPU /proc/stat does not list


class _ShortWrites:
    """A pipe end whose ``write`` takes at most ``most`` bytes per call (as an unbuffered pipe
    may)."""

    def __init__(self, f, most: int):
        self._f = f
        self.most = most
        self.calls = 0

    def write(self, data):
        self.calls += 1
        return self._f.write(memoryview(data)[: self.most])

    def close(self):
        self._f.close()


def test_write_all_finishes_short_writes():
    import io

    class Short(io.RawIOBase):
        def __init__(self):
            self.got = bytearray()

        def writable(self):
            return True

        def write(self, b):
            self.got += bytes(b[:3])
            return min(3, len(b))

    f = Short()
    parallel.write_all(f, b"0123456789" * 5)
    assert bytes(f.got) == b"0123456789" * 5


@pytest.mark.parametrize("gzipped", [True, False])
def test_worker_with_short_writes_equals_the_reference(
    forced_worker, monkeypatch, tmp_path, gzipped
):
    # gzip: chunks' bytes, 4 KiB per write; plain: spans of a few hundred bytes, 64 per write
    path = SAMPLE if gzipped else _plain(tmp_path)
    popen = parallel.subprocess.Popen
    pipes = []

    def short_popen(*a, **k):
        p = popen(*a, **k)
        p.stdin = _ShortWrites(p.stdin, 4096 if gzipped else 64)
        pipes.append(p.stdin)
        return p

    monkeypatch.setattr(parallel.subprocess, "Popen", short_popen)
    handed = []
    submit = parallel.Worker.submit

    def counting(self, slot, payload):
        handed.append(slot)
        return submit(self, slot, payload)

    monkeypatch.setattr(parallel.Worker, "submit", counting)
    fast, chunks = _fast(path)
    assert handed and pipes and pipes[0].calls > 5 * len(handed)  # short writes happened
    assert chunks > 1  # the worker's chunks were used, not the fallback
    _same(_reference(path), fast)


@pytest.mark.parametrize("gzipped", [True, False])
def test_a_stuck_worker_times_out_to_the_one_process_reader(
    forced_worker, monkeypatch, tmp_path, gzipped
):
    path = SAMPLE if gzipped else _plain(tmp_path)

    def stuck(self, slot, payload):  # the chunk never reaches the worker: no result comes
        self.inflight.append(slot)

    monkeypatch.setattr(parallel.Worker, "submit", stuck)
    monkeypatch.setattr(parallel.Worker, "timeout_s", 0.5)
    t0 = time.monotonic()
    fast, chunks = _fast(path)
    assert time.monotonic() - t0 < 30
    assert chunks == 1  # the reference path
    _same(_reference(path), fast)


def test_read_span_reads_the_bytes_the_parent_cut(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(b'[{"ph":"X"},{"ph":"i","name":"a"},{"ph":"X"}]')
    span = parallel.Span(12, 22, b'{"ph"', b'"a"},')
    with open(path, "rb") as f:
        buf = source.read_span(f.fileno(), span)
        assert bytes(buf) == b'[{"ph":"i","name":"a"},' + source._SENTINEL + b"]"
        assert [e.name for e in source.decode_middle_chunk(buf)] == ["a"]
        for changed in (span._replace(head=b'{"pH"'), span._replace(tail=b'"b"},')):
            with pytest.raises(source._NotFast, match="changed while it was read"):
                source.read_span(f.fileno(), changed)
        with pytest.raises(source._NotFast, match="changed"):  # past the end: a shorter file
            source.read_span(f.fileno(), span._replace(offset=40))


def test_a_file_changed_under_the_worker_falls_back_to_the_reference(
    forced_worker, monkeypatch, tmp_path
):
    path = _plain(tmp_path)
    submit = parallel.Worker.submit
    changed = []

    def other_bytes(self, slot, payload):  # as if the file no longer held what the parent read
        changed.append(slot)
        return submit(self, slot, payload._replace(head=b"x" + payload.head[1:]))

    monkeypatch.setattr(parallel.Worker, "submit", other_bytes)
    fast, chunks = _fast(path)
    assert changed
    assert chunks == 1  # the reference path
    _same(_reference(path), fast)
