"""The cache of finished diagnoses (tracedx.cache): a second run answers byte for byte what the
first and --no-cache answer, in every format, without reading the trace or diagnosing again;
another --steps, --device or calibration runs the diagnosis again over the cached tables; a
damaged result is a miss; a cached Diagnosis reads its Trace's tables only when used."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from tracebuilder import T0, TraceBuilder

import tracedx
from tracedx import cache
from tracedx.cli import main
from tracedx.errors import TraceFormatError

CALIBRATION = {
    "schema": "tracedx.calibration/1",
    "device_name": "NVIDIA H100 80GB HBM3",
    "copy_bandwidth_gbs": 3000.0,
    "matmul_tflops": {"bf16": 700.0},
}


@pytest.fixture
def trace(tmp_path) -> str:
    """4 steps of: an mm (bf16 4096^3: on the roofline) and a relu, each launching a kernel,
    a pageable host-to-device copy and a host sync."""
    b = TraceBuilder()
    for i in range(4):
        t = T0 + i * 1000
        b.step(i + 1, t, 900)
        ext = b.op("aten::mm", t + 10, 30, input_dims=[[4096, 4096]] * 2,
                   input_type=["c10::BFloat16"] * 2)  # fmt: skip
        b.kernel(t + 40, 300, b.launch(t + 15, 10, ext=ext), "sm90_xmma_gemm_bf16bf16", ext=ext)
        ext = b.op("aten::relu", t + 60, 30, input_dims=[[4096, 4096]],
                   input_type=["c10::BFloat16"])  # fmt: skip
        corr = b.launch(t + 65, 10, ext=ext)
        b.kernel(t + 345, 40, corr, "vectorized_elementwise_kernel", ext=ext)
        ext = b.op("aten::copy_", t + 100, 20)
        b.memcpy(t + 400, 50, b.launch(t + 105, 10, "cudaMemcpyAsync", ext=ext), 1 << 20)
        b.sync(t + 130, 600)
    return str(b.write(tmp_path / "t.json"))


def _run(*args: str):
    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == 0, r.output
    return r


def _note(r) -> str:
    return " ".join(r.stderr.split())


def _no_file_read(monkeypatch):
    """Reading a trace file (tracedx.trace.load) fails the test from here on."""
    import tracedx.trace

    def refuse(*a, **k):
        raise AssertionError("the trace file was read")

    monkeypatch.setattr(tracedx.trace, "load", refuse)


def _no_diagnosis(monkeypatch):
    """Running the diagnosis fails the test from here on."""
    import tracedx.analysis.diagnosis

    def refuse(*a, **k):
        raise AssertionError("diagnosed again")

    monkeypatch.setattr(tracedx.analysis.diagnosis, "diagnose", refuse)


FORMATS = ("json", "text", "md")


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_second_run_is_byte_identical_without_reading_or_diagnosing(trace, fmt, monkeypatch):
    cold = {f: _run("diagnose", trace, "--format", f, "--no-cache").stdout for f in FORMATS}
    assert not cache.entry_path(trace).exists()  # --no-cache stores nothing
    first = _run("diagnose", trace, "--format", fmt)
    assert "cache" not in first.stderr and first.stdout == cold[fmt]
    _no_file_read(monkeypatch)
    _no_diagnosis(monkeypatch)
    # the format is not part of the key: every format renders from the one cached result
    for f in (fmt, *(x for x in FORMATS if x != fmt)):
        second = _run("diagnose", trace, "--format", f)
        assert second.stdout == cold[f], f
        assert _note(second) == (
            f"tracedx: reused the cached diagnosis of {trace} (in {cache.cache_dir()}; "
            "--no-cache reads the file)"
        )
    assert len(list(cache.entry_path(trace).glob("result-*.json"))) == 1
    quiet = _run("diagnose", trace, "--format", fmt, "-q")  # --quiet: the same, no note
    assert quiet.stdout == cold[fmt] and quiet.stderr == ""


@pytest.mark.parametrize(
    "option",
    [["--steps", "2..3"], ["--device", "A100"]],  # and the others' keys: below
)
def test_other_options_diagnose_again_over_the_cached_tables(trace, option, monkeypatch):
    want = _run("diagnose", trace, "--format", "json", "--no-cache", *option).stdout
    base = _run("diagnose", trace, "--format", "json").stdout  # fills the cache
    assert want != base
    _no_file_read(monkeypatch)
    other = _run("diagnose", trace, "--format", "json", *option)
    assert other.stdout == want
    assert "using the cached tables" in _note(other) and "reused" not in other.stderr
    _no_diagnosis(monkeypatch)  # both results are kept now
    again = _run("diagnose", trace, "--format", "json", *option)
    assert again.stdout == want and "reused the cached diagnosis" in _note(again)
    assert _run("diagnose", trace, "--format", "json").stdout == base


def test_a_changed_calibration_file_misses(trace, tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(CALIBRATION))
    args = ("diagnose", trace, "--format", "json", "--calibration", str(cal))
    first = _run(*args)
    assert "calibration cal.json" in first.stdout  # the calibration was applied
    assert "reused the cached diagnosis" in _note(_run(*args))
    st = os.stat(cal)
    cal.write_text(json.dumps({**CALIBRATION, "copy_bandwidth_gbs": 1500.0}))  # same size
    os.utime(cal, ns=(st.st_atime_ns, st.st_mtime_ns))  # and mtime: the content decides
    changed = _run(*args)
    assert "reused" not in changed.stderr and changed.stdout != first.stdout
    assert changed.stdout == _run(*args, "--no-cache").stdout
    cal.unlink()  # an unusable calibration is never served from the cache: one line, exit 2
    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "cal.json" in r.stderr


def _result_files(trace) -> tuple[Path, Path]:
    [doc] = cache.entry_path(trace).glob("result-*.json")
    return doc, doc.with_suffix(".pickle")


def _nonce_free(page: str) -> str:
    """An HTML report without its per-page CSP nonce (random on every render)."""
    nonces = set(re.findall(r"nonce-([A-Za-z0-9_-]+)", page))
    assert len(nonces) == 1
    return page.replace(nonces.pop(), "NONCE")


@pytest.mark.parametrize("damage", ["truncated", "not json", "another key's result"])
def test_a_damaged_result_is_a_miss(trace, damage, tmp_path):
    want = _run("diagnose", trace, "--format", "json", "--no-cache").stdout
    _run("diagnose", trace, "--format", "json", "--steps", "2..2")
    other_doc, _ = _result_files(trace)
    _run("diagnose", trace, "--format", "json")
    [doc] = [p for p in cache.entry_path(trace).glob("result-*.json") if p != other_doc]
    if damage == "truncated":
        doc.write_bytes(doc.read_bytes()[:200])
    elif damage == "not json":
        doc.write_bytes(b"\x00\xff" * 50)
    else:  # a well-formed result stored under the wrong name answers nothing
        doc.write_bytes(other_doc.read_bytes())
    r = _run("diagnose", trace, "--format", "json")
    assert r.stdout == want and "reused" not in r.stderr and "cached tables" in r.stderr
    assert "reused the cached diagnosis" in _note(_run("diagnose", trace, "--format", "json"))


def test_html_report_and_gate_from_a_cached_result_equal_the_uncached(trace, tmp_path):
    gate = ("diagnose", trace, "--format", "json", "--max-step-ms", "0.5")
    cold = CliRunner().invoke(main, [*gate, "--no-cache", "--html", str(tmp_path / "cold.html")])
    assert cold.exit_code == 1 and "FAIL" in cold.stderr
    _run("diagnose", trace)  # fills the cache
    hit = _run("report", trace, "-o", str(tmp_path / "hit.html"))
    assert "reused the cached diagnosis" in _note(hit)
    page = _nonce_free((tmp_path / "hit.html").read_text())
    assert page == _nonce_free((tmp_path / "cold.html").read_text())
    r = CliRunner().invoke(main, list(gate))
    assert r.exit_code == 1 and r.stdout == cold.stdout
    assert "reused the cached diagnosis" in _note(r)
    fail = [x for x in r.stderr.splitlines() if "FAIL" in x]
    assert fail == [x for x in cold.stderr.splitlines() if "FAIL" in x] and len(fail) == 1
    # a damaged pickle is a miss: the HTML report is made again, the same
    _, pickled = _result_files(trace)
    pickled.write_bytes(pickled.read_bytes()[:-40])
    miss = _run("report", trace, "-o", str(tmp_path / "miss.html"))
    assert "reused" not in miss.stderr and "cached tables" in miss.stderr
    assert _nonce_free((tmp_path / "miss.html").read_text()) == page


OPTIONS = {"device": None, "peak_tflops": None, "bandwidth_gbs": None, "calibration": None}


def test_a_cached_diagnosis_reads_its_tables_only_when_used(trace):
    from tracedx.trace.lazy import LazyTrace

    fresh = tracedx.diagnose(tracedx.load(trace))
    _run("diagnose", trace)  # stores the result
    key = cache.result_key(trace, {**OPTIONS, "steps": None})
    diag = cache.read_result(trace, key)
    tables = set(diag.trace.__dict__["_unread"])
    assert isinstance(diag.trace, LazyTrace) and {"kernels", "ops", "steps"} <= tables
    assert not tables & set(diag.trace.__dict__)  # nothing read yet
    assert diag.step_time == fresh.step_time and diag.steps == fresh.steps
    assert not tables & set(diag.trace.__dict__)
    assert diag.to_dict() == fresh.to_dict()
    assert diag.to_text() == fresh.to_text() and diag.to_markdown() == fresh.to_markdown()
    assert repr(diag) == repr(fresh) and diag._repr_html_() == fresh._repr_html_()
    figs, want = diag.figures(), fresh.figures()
    assert figs.keys() == want.keys()
    assert all(figs[k].to_json() == want[k].to_json() for k in figs)
    # a table removed from the cache since is read from the trace file again
    again = cache.read_result(trace, key)
    (cache.entry_path(trace) / "ops.arrow").unlink()
    assert again.trace.ops.equals(fresh.trace.ops) and again.trace.kernels.equals(
        fresh.trace.kernels
    )
    # ... but not from a trace file that changed since: its tables are not the diagnosis's
    stale = cache.read_result(trace, key)
    (cache.entry_path(trace) / "kernels.arrow").unlink()
    st = os.stat(trace)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(TraceFormatError, match="changed or gone since its diagnosis was cached"):
        stale.trace.kernels  # noqa: B018 (the attribute read is the test)


def test_a_pickle_in_a_folder_others_may_write_is_not_read(trace):
    _run("diagnose", trace)
    key = cache.result_key(trace, {**OPTIONS, "steps": None})
    assert cache.read_result(trace, key) is not None
    assert oct(cache.cache_dir().stat().st_mode & 0o777) == oct(0o700)
    os.chmod(cache.cache_dir(), 0o777)
    try:
        notes = []
        assert cache.read_result(trace, key, on_note=notes.append) is None
        assert notes == [
            f"{cache.cache_dir()} is not this user's alone (others can write to it): cached "
            f"diagnoses are not read from it (chmod 700 {cache.cache_dir()} to reuse them)"
        ]
        assert cache.read_result_doc(trace, key) is not None  # plain JSON: still used
        # the command line says it, with the answer all the same
        r = _run("diagnose", trace, "--max-step-ms", "1000")
        assert "is not this user's alone" in _note(r)
    finally:
        os.chmod(cache.cache_dir(), 0o700)


def test_the_result_key_holds_every_analysis_option(trace, tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(CALIBRATION))
    base = {**OPTIONS, "steps": None}
    variants = [
        {**base, "device": "A100"},
        {**base, "peak_tflops": 300.0},
        {**base, "bandwidth_gbs": 900.0},
        {**base, "steps": "2..3"},
        {**base, "calibration": str(cal)},
    ]
    keys = [cache.result_key(trace, o) for o in [base, *variants]]
    assert len(set(keys)) == len(keys)
    assert cache.result_key(trace, dict(reversed(base.items()))) == keys[0]  # order-free
    # the path as given is printed in the report: another spelling is another result
    assert cache.result_key("./" + os.path.relpath(trace), base) != keys[0] or (
        str(Path("./" + os.path.relpath(trace))) == str(Path(trace))
    )
    assert cache.result_key(trace, {**base, "calibration": str(tmp_path / "none")}) is None


def test_a_calibration_that_is_not_a_regular_file_is_not_opened_for_the_key(trace, tmp_path):
    import signal

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def hung(signum, frame):  # opening a FIFO blocks until a writer comes
        raise AssertionError("the key opened the FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        assert cache.result_key(trace, {**OPTIONS, "steps": None, "calibration": str(fifo)}) is None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_quiet_leaves_out_the_notes_of_every_command(trace, tmp_path):
    """--quiet on diff, report and diagnose --html: the same stdout, and nothing on stderr (the
    cache's note, "wrote FILE"); without it both notes are there."""
    _run("diagnose", trace, "--format", "json")  # fills the cache
    loud = _run("diff", trace, trace, "--html", str(tmp_path / "d.html"))
    assert "using the cached tables" in _note(loud) and f"wrote {tmp_path}" in _note(loud)
    quiet = _run("diff", trace, trace, "--html", str(tmp_path / "d.html"), "-q")
    assert quiet.stdout == loud.stdout and quiet.stderr == ""
    r = _run("report", trace, "-o", str(tmp_path / "r.html"), "--quiet")
    assert r.stdout == "" and r.stderr == "" and (tmp_path / "r.html").stat().st_size
    r = _run("report", trace, "-o", str(tmp_path / "r.html"))  # the file said on stderr
    assert r.stdout == "" and r.stderr.startswith(f"tracedx: wrote {tmp_path / 'r.html'}\n")
    r = _run("diagnose", trace, "--html", str(tmp_path / "x.html"), "-q")
    assert r.stderr == "" and (tmp_path / "x.html").stat().st_size
