"""The cache of loaded traces (tracedx.cache): a cached load is the same Trace (tables,
dtypes, metadata, warnings) and gives the same diagnosis JSON; a changed file, another tracedx
version or another --repair misses; a corrupt entry is ignored and rewritten; the CLI says on
stderr when it used the cache and --no-cache bypasses it."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import SAMPLES
from polars.testing import assert_frame_equal

import tracedx
from tracedx import cache
from tracedx.cli import main
from tracedx.report import render

# a trace with ops, steps and input shapes; one with python frames; one with h2d copies
NAMES = ["add_loop-eager.json.gz", "item_loop-sync-stack.json.gz", "h2d_copy-pageable.json.gz"]


def _same(a, b) -> None:
    for f in dataclasses.fields(a):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if isinstance(va, pl.DataFrame):
            assert_frame_equal(va, vb, check_exact=True)  # also the dtypes and column order
        elif f.init:
            assert va == vb, f.name


@pytest.mark.parametrize("name", NAMES)
def test_cached_load_is_the_same_trace_and_diagnosis(name, tmp_path):
    p = shutil.copy(SAMPLES / name, tmp_path / name)
    first, hit = cache.load(p)
    assert not hit and cache.entry_path(p).is_dir()
    second, hit = cache.load(p)
    assert hit
    fresh = tracedx.load(p)
    _same(fresh, first)
    _same(fresh, second)
    first_step = fresh.steps["step"][0]
    for steps in (None, f"{first_step}..{first_step}"):
        want = render(tracedx.diagnose(fresh, steps=steps), "json")
        assert render(tracedx.diagnose(second, steps=steps), "json") == want


def test_warnings_and_metadata_survive(tmp_path):
    from tracebuilder import TraceBuilder

    tb = TraceBuilder()
    tb.step(0, 0, 100)
    tb.kernel(10, 5, None, "k")
    tb.kernel(10, 5, None, "k")  # an exact duplicate: a warning
    p = tb.write(tmp_path / "t.json")
    fresh = tracedx.load(p)
    assert fresh.warnings
    cache.load(p)
    cached, hit = cache.load(p)
    assert hit
    _same(fresh, cached)


def test_a_changed_file_misses(tmp_path):
    p = shutil.copy(SAMPLES / NAMES[0], tmp_path / "t.json.gz")
    cache.load(p)
    key = cache.file_key(p)
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched
    assert cache.file_key(p) != key and cache.read(p) is None
    # same size and mtime, other bytes at the end
    cache.load(p)
    st = os.stat(p)
    data = bytearray(Path(p).read_bytes())
    data[-1] ^= 0xFF
    Path(p).write_bytes(bytes(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.read(p) is None
    # another repair flag is another entry
    assert cache.entry_path(p, repair=True) != cache.entry_path(p)


def test_a_file_replaced_while_read_is_not_cached_as_the_new_one(tmp_path):
    """A trace replaced while it is read (a new capture written over it): what was read is of
    the old file, so nothing is stored under the new file's key, and a note says why."""
    p = tmp_path / "t.json.gz"
    shutil.copy(SAMPLES / NAMES[0], p)
    other = SAMPLES / NAMES[1]
    notes: list[str] = []

    def replace(_bytes_read):
        if not notes:
            notes.append("replaced")
            tmp = tmp_path / "new.json.gz"
            shutil.copy(other, tmp)
            os.replace(tmp, p)

    cache.load(p, progress=replace, on_note=notes.append)
    assert notes[1:] == [f"{p} changed while it was read: its tables were not cached"]
    again, hit = cache.load(p)
    assert not hit
    assert_frame_equal(again.kernels, tracedx.load(other).kernels)


def test_another_version_misses(tmp_path, monkeypatch):
    p = shutil.copy(SAMPLES / NAMES[0], tmp_path / "t.json.gz")
    cache.load(p)
    assert cache.read(p) is not None
    monkeypatch.setattr(tracedx, "__version__", tracedx.__version__ + ".post1")
    assert cache.read(p) is None


def test_a_corrupt_entry_is_ignored_and_rewritten(tmp_path):
    p = shutil.copy(SAMPLES / NAMES[0], tmp_path / "t.json.gz")
    cache.load(p)
    entry = cache.entry_path(p)
    (entry / "kernels.arrow").write_bytes(b"not arrow")
    assert cache.read(p) is None
    trace, hit = cache.load(p)
    assert not hit
    _same(tracedx.load(p), cache.read(p))
    (entry / cache.META_NAME).write_text("{")  # truncated metadata
    assert cache.read(p) is None
    assert cache.load(p)[1] is False and cache.load(p)[1] is True
    assert [x.name for x in entry.parent.iterdir() if x.name.startswith(".")] == []  # no temp


def test_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEDX_CACHE_DIR", str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("TRACEDX_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache.cache_dir() == tmp_path / "x" / "tracedx"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_dir() == Path.home() / ".cache" / "tracedx"


def test_cli_uses_the_cache_and_no_cache_bypasses_it(tmp_path):
    p = str(shutil.copy(SAMPLES / NAMES[0], tmp_path / "t.json.gz"))
    run = CliRunner().invoke
    cold = run(main, ["diagnose", p, "--format", "json", "--no-cache"])
    assert cold.exit_code == 0 and "cache" not in cold.stderr
    assert not cache.entry_path(p).exists()  # --no-cache stores nothing either
    first = run(main, ["diagnose", p, "--format", "json"])
    assert first.exit_code == 0 and "cache" not in first.stderr
    assert cache.entry_path(p).is_dir()
    second = run(main, ["diagnose", p, "--format", "json"])
    assert second.exit_code == 0
    # the notice is wrapped to 100 columns (stderr is not a terminal here)
    assert f"tracedx: reused the cached diagnosis of {p}" in " ".join(second.stderr.split())
    assert json.loads(second.stdout) == json.loads(cold.stdout)
    assert second.stdout == cold.stdout
    other = run(main, ["diagnose", p, "--steps", "4..5", "--format", "md"])
    assert other.exit_code == 0 and "using the cached tables" in other.stderr
    again = run(main, ["diagnose", p, "--format", "json", "--no-cache"])
    assert "cache" not in again.stderr and again.stdout == cold.stdout


def test_an_unwritable_cache_is_a_note_not_a_failure(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("TRACEDX_CACHE_DIR", str(blocker / "sub"))  # under a file: cannot exist
    p = str(shutil.copy(SAMPLES / NAMES[0], tmp_path / "t.json.gz"))
    r = CliRunner().invoke(main, ["diagnose", p, "--format", "json"])
    assert r.exit_code == 0 and "cannot write the cache" in r.stderr
    json.loads(r.stdout)


def test_an_error_after_a_cached_load_is_still_one_line(tmp_path):
    p = str(shutil.copy(SAMPLES / NAMES[0], tmp_path / "t.json.gz"))
    run = CliRunner().invoke
    assert run(main, ["diagnose", p, "--format", "json"]).exit_code == 0
    r = run(main, ["diff", p, str(tmp_path / "missing.json")])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "using the cached" not in r.stderr
    ok = run(main, ["diff", p, p, "--format", "json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)
    # one note for the command, however many traces it read from the cache
    assert ok.stderr.count("tracedx:") == 1 and ok.stderr.count("the cached tables") == 1
    q = str(shutil.copy(p, tmp_path / "u.json.gz"))
    assert run(main, ["diagnose", q, "--format", "json"]).exit_code == 0
    two = run(main, ["diff", p, q, "--format", "json"])
    assert " ".join(two.stderr.split()) == (
        f"tracedx: using the cached tables of {p} and {q} (in {cache.cache_dir()}; --no-cache "
        "reads the files)"
    )


def _fake_entry(root: Path, name: str, size: int, mtime: float) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "kernels.arrow").write_bytes(b"x" * size)
    os.utime(d, (mtime, mtime))
    return d


def test_prune_removes_the_least_recently_used_entries_down_to_the_cap(monkeypatch):
    root = cache.cache_dir()
    old = _fake_entry(root, "a" * 32, 4000, 1_000)
    mid = _fake_entry(root, "b" * 32, 4000, 2_000)
    new = _fake_entry(root, "c" * 32, 4000, 3_000)
    kept = _fake_entry(root, "d" * 32, 4000, 500)  # the oldest, but the one just stored
    stale = _fake_entry(root, ".e.tmp", 10, 0)  # a killed write's temporary folder
    fresh_tmp = _fake_entry(root, ".f.tmp", 10, os.stat(root).st_mtime)  # one being written
    # 16000 bytes in entries, cap 9000: the oldest two not kept go, 8000 are left
    assert cache.prune(keep=kept, limit=9000) == 8000
    assert not old.exists() and not mid.exists() and not stale.exists()
    assert new.exists() and kept.exists() and fresh_tmp.exists()
    assert cache.prune(keep=kept, limit=9000) == 0


def test_the_cap_comes_from_the_environment(monkeypatch):
    for value, cap in (("3", 3 * 1024**2), ("0.5", 512 * 1024), (" 0 ", 0), ("", None)):
        monkeypatch.setenv(cache.MAX_ENV, value)
        assert cache.max_bytes() == (cache.DEFAULT_MAX_BYTES if cap is None else cap)
    for bad in ("-1", "lots", "inf", "nan"):
        monkeypatch.setenv(cache.MAX_ENV, bad)
        with pytest.raises(ValueError, match="is not a size in MiB"):
            cache.max_bytes()


def test_a_cap_of_zero_stores_nothing_and_a_bad_one_is_a_note(tmp_path, monkeypatch):
    p = shutil.copy(SAMPLES / NAMES[0], tmp_path / NAMES[0])
    monkeypatch.setenv(cache.MAX_ENV, "0")
    assert not cache.load(p)[1] and not cache.load(p)[1]
    assert not cache.entry_path(p).exists()
    monkeypatch.setenv(cache.MAX_ENV, "lots")
    notes = []
    cache.load(p, on_note=notes.append)
    assert notes == [
        "TRACEDX_CACHE_MAX_MB='lots' is not a size in MiB (a number >= 0): the cache is kept "
        "under 5 GiB"
    ]
    assert cache.load(p)[1]  # stored under the default cap


def test_an_entry_alone_over_the_cap_is_not_kept(tmp_path, monkeypatch):
    p = shutil.copy(SAMPLES / NAMES[0], tmp_path / NAMES[0])
    others = [_fake_entry(cache.cache_dir(), c * 32, 400, 1_000) for c in "ab"]
    monkeypatch.setattr(cache, "max_bytes", lambda: 1000)  # smaller than any real entry
    notes = []
    trace, hit = cache.load(p, on_note=notes.append)
    assert not hit and not cache.entry_path(p).exists()
    assert all(o.is_dir() for o in others)  # the entries that fit are not evicted for it
    [note] = notes
    assert note.startswith(f"the cached tables of {p} (") and note.endswith(
        " MiB) are over the cache's cap (0.0 MiB, TRACEDX_CACHE_MAX_MB): not kept"
    )
    r = CliRunner().invoke(main, ["diagnose", str(p)])  # the result is not stored either
    assert r.exit_code == 0 and not cache.entry_path(p).exists()


def test_storing_an_entry_evicts_the_unused_ones_and_a_hit_counts_as_use(tmp_path, monkeypatch):
    a, b, c = (shutil.copy(SAMPLES / NAMES[0], tmp_path / f"{n}.json.gz") for n in "abc")
    cache.load(a)
    cache.load(b)
    ea, eb = cache.entry_path(a), cache.entry_path(b)
    os.utime(ea, (1_000, 1_000))
    os.utime(eb, (2_000, 2_000))
    assert cache.load(a)[1]  # a hit: a is now the most recently used
    assert os.stat(ea).st_mtime > 2_000
    one = sum(f.stat().st_size for f in eb.iterdir())
    monkeypatch.setattr(cache, "max_bytes", lambda: 2 * one + one // 2)
    cache.load(c)  # three entries over a cap of two and a half: b, least recently used, goes
    assert ea.is_dir() and cache.entry_path(c).is_dir() and not eb.exists()
    assert not cache.load(b)[1]  # a miss now: read again and stored
