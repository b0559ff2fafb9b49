"""The per-rank map's executor layer: local spawn pool, failures, summaries dir, sizing.

The tasks here are stand-ins (tests/rankmap.py) so that these tests check the executor alone;
the real map (summarize_path) is checked end to end in test_scale_equal.py.
"""

from __future__ import annotations

import concurrent.futures as cf
import gzip
import os
from pathlib import Path

from tests import rankmap
from tracedx.job import executor as ex

_ranks = rankmap.write_ranks


def test_local_pool_returns_every_rank_in_input_order(tmp_path):
    paths = _ranks(tmp_path, [f"r{i}" for i in range(5)])
    out = ex.map_ranks(paths, **rankmap.STANDIN, workers=2, progress=False)
    assert [r.path for r in out] == paths
    assert [r.summary for r in out] == [f"summary of r{i}".encode() for i in range(5)]
    assert all(r.note is None and not r.reused for r in out)


def test_unreadable_rank_is_a_note_and_the_rest_is_kept(tmp_path):
    paths = _ranks(tmp_path, ["a", "bad", "c"])
    out = ex.map_ranks(paths, **rankmap.STANDIN, workers=2, progress=False)
    assert [r.summary for r in out] == [b"summary of a", None, b"summary of c"]
    assert out[1].note == f"{paths[1]}: not a trace"


def test_a_worker_killed_once_is_retried_and_its_rank_kept(tmp_path):
    paths = _ranks(tmp_path, ["a", "die-once", "c", "d"])
    out = ex.map_ranks(paths, **rankmap.STANDIN, workers=2, progress=False)
    assert [r.summary for r in out] == [
        b"summary of a",
        b"summary of die-once",
        b"summary of c",
        b"summary of d",
    ]
    assert os.path.exists(paths[1] + ".tried")


def test_a_worker_killed_twice_is_a_note_and_the_others_are_kept(tmp_path):
    paths = _ranks(tmp_path, ["a", "die", "sleep 0.5", "d"])
    out = ex.map_ranks(paths, **rankmap.STANDIN, workers=2, progress=False)
    assert [r.summary for r in out] == [
        b"summary of a",
        None,
        b"summary of sleep 0.5",
        b"summary of d",
    ]
    # the exit status is named when the driver still holds the dead worker's process (a pool
    # that broke may already have dropped it: then the note names no status, never a wrong one)
    note = out[1].note
    assert note.startswith(f"{paths[1]}: its worker process died twice "), note
    assert note.endswith("(killed, out of memory or crashed); rank left out"), note
    assert "(exit status" not in note or "(exit status 3)" in note, note


def test_summaries_dir_is_written_then_reused_without_running_tasks(tmp_path, capsys):
    store = tmp_path / "summaries"
    paths = _ranks(tmp_path, ["a", "b", "bad"])
    first = ex.map_ranks(paths, **rankmap.STANDIN, workers=2, summaries_dir=store, progress=False)
    assert sorted(p.suffix for p in store.iterdir()) == [ex.SUMMARY_SUFFIX] * 2
    assert "reused" not in capsys.readouterr().err
    # a task that would fail proves the second run reads nothing but the store
    (tmp_path / "rank1.txt").write_text("b")  # same content, new mtime: a new key
    second = ex.map_ranks(paths, **rankmap.STANDIN, workers=1, summaries_dir=store, progress=False)
    err = " ".join(capsys.readouterr().err.split())  # the note is wrapped to 100 columns
    assert f"reused 1 of 3 rank summaries from {store}" in err
    assert [r.reused for r in second] == [True, False, False]
    assert [r.summary for r in second] == [r.summary for r in first]


def test_reuse_is_keyed_by_path_size_mtime_and_version(tmp_path, monkeypatch):
    p = tmp_path / "t.json"
    p.write_text("x")
    size, mtime = ex.file_identity(str(p))
    name = ex.summary_name(str(p), size, mtime)
    assert name != ex.summary_name(str(p) + "x", size, mtime)
    assert name != ex.summary_name(str(p), size + 1, mtime)
    assert name != ex.summary_name(str(p), size, mtime + 1)
    monkeypatch.setattr("tracedx.__version__", "999")
    assert name != ex.summary_name(str(p), size, mtime)


def test_any_concurrent_futures_executor_runs_the_map(tmp_path):
    paths = _ranks(tmp_path, ["a", "bad", "c"])
    with cf.ThreadPoolExecutor(2) as pool:
        out = ex.map_ranks(paths, executor=pool, **rankmap.STANDIN, progress=False)
    assert [r.summary for r in out] == [b"summary of a", None, b"summary of c"]
    assert "not a trace" in out[1].note


def test_polars_threads_are_capped_in_each_local_worker(tmp_path, monkeypatch):
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    monkeypatch.setattr(ex, "cpu_count", lambda: 4)
    paths = _ranks(tmp_path, ["a", "b"])
    out = ex.map_ranks(
        paths, fn=rankmap.polars_threads_task, decode=bytes, workers=2, progress=False
    )
    assert [r.summary for r in out] == [b"2 2", b"2 2"]  # 4 CPUs / 2 workers
    assert "POLARS_MAX_THREADS" not in os.environ  # the driver's own environment is restored


def test_plan_workers_from_memory_and_cpus():
    gb = 1_000_000_000
    # 1 GB traces plan 1.5 GB each: 0.8 x 8 GB / 1.5 GB = 4.27 -> 4
    assert ex.plan_workers([gb] * 10, cpus=16, available_bytes=8 * gb) == 4
    assert ex.plan_workers([gb] * 10, cpus=2, available_bytes=8 * gb) == 2
    assert ex.plan_workers([gb] * 3, cpus=16, available_bytes=80 * gb) == 3
    assert ex.plan_workers([10 * gb], cpus=16, available_bytes=4 * gb) == 1  # never 0
    assert ex.task_peak_bytes(gb) == 1_500_000_000


def test_json_size_reads_the_gzip_trailer(tmp_path):
    body = b'{"traceEvents": []}' * 1000
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(body))
    assert ex.json_size(str(p)) == len(body)
    q = tmp_path / "t.json"
    q.write_bytes(body)
    assert ex.json_size(str(q)) == len(body)
    assert ex.json_size(str(tmp_path / "missing.json")) == 0


def test_is_url():
    assert ex.is_url("s3://bucket/rank0.json.gz") and ex.is_url("file:///tmp/x.json")
    assert not ex.is_url("/tmp/x.json") and not ex.is_url("C:/x.json")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_ctrl_c_stops_the_workers_and_counts_no_partial_summary(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    store = tmp_path / "summaries"
    paths = _ranks(tmp_path, ["a", "sleep 60", "sleep 60"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.rankmap", str(store), *paths],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    pidfiles = [p + ".pid" for p in paths[1:]]
    deadline = time.monotonic() + 60
    while not all(os.path.exists(p) and Path(p).read_text() for p in pidfiles):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    pids = [int(Path(p).read_text()) for p in pidfiles]
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130 and out.strip() == "interrupted"
    assert time.monotonic() - start < 20  # not the 60 s the tasks sleep
    time.sleep(0.5)
    assert not any(_alive(pid) for pid in pids)
    done = sorted(p.name for p in store.iterdir() if not p.name.startswith("."))
    assert len(done) <= 1  # at most rank 0's summary; the sleeping ranks have none
    # a second run reuses only complete summaries: the sleeping ranks run again
    for p in paths[1:]:
        Path(p).write_text("b")
    (store / ("." + ex.summary_name(paths[1], 1, 0.0) + ".123.tmp")).write_bytes(b"partial")
    again = ex.map_ranks(paths, **rankmap.STANDIN, workers=2, summaries_dir=store, progress=False)
    assert [r.summary for r in again] == [b"summary of a", b"summary of b", b"summary of b"]
    assert [r.reused for r in again][1:] == [False, False]


def test_an_fsspec_url_is_sized_from_its_gzip_trailer_without_reading_it_all():
    fsspec = __import__("pytest").importorskip("fsspec")
    body = b'{"traceEvents": []}' * 100
    url = "memory://job/rank0.json.gz"
    with fsspec.open(url, "wb") as f:
        f.write(gzip.compress(body))
    assert ex.json_size(url) == len(body)
    size, _ = ex.file_identity(url)
    assert size == len(gzip.compress(body))


def test_no_progress_output_when_stderr_is_not_a_terminal(tmp_path, capfd):
    paths = _ranks(tmp_path, ["a", "b"])
    ex.map_ranks(paths, **rankmap.STANDIN, workers=1)  # progress=None: only on a TTY
    assert capfd.readouterr().err == ""
