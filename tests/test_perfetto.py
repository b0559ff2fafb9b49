"""``tracedx annotate``: the trace with tracedx's findings on extra tracks, for Perfetto.

A small hand-made trace (2 steps of mm -> add -> mul -> .item() sync, with Python stacks) has
every added slice computed by hand below. Every trace must come back from tracedx's own reader
with the original events' tables unchanged, be valid Chrome Trace Event Format JSON with
nested slices on every thread, and, where the Perfetto trace processor can run (the `perfetto`
package downloads ``trace_processor_shell`` on first use; offline it cannot), load in it.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

import tracedx
from tests.conftest import SAMPLES
from tests.tracebuilder import T0, TraceBuilder
from tracedx.analysis.diagnosis import diagnose
from tracedx.cli import main
from tracedx.report.perfetto import PROCESS_NAME, annotate, annotation_events, free_ids

ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float> >()"
MUL = "void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float> >()"
SITE = "train.py(12): main"


def small_trace(path: Path) -> Path:
    """2 steps of 1000 us. Per step (offsets from its start): mm op 10..40 launches a 100 us
    gemm at 50; add op 60..70 and mul op 75..85 launch 20 us elementwise kernels at 150 and 170
    (back to back: one fusable chain of 2, 40 us, saving 20 us); aten::item 100..600 holds a
    cudaStreamSynchronize 110..600 (490 us) called from ``train.py(12): main``."""
    b = TraceBuilder()
    for i in range(2):
        t = T0 + i * 1000
        b.step(i + 1, t, 1000)
        b.x("python_function", SITE, t + 1, 998, b.pid, b.tid, **{"Python id": 10 * i + 1})
        b.x("python_function", "<built-in method item of Tensor object at 0x7f00>", t + 99,
            502, b.pid, b.tid, **{"Python id": 10 * i + 2, "Python parent id": 10 * i + 1})  # fmt: skip
        b.launched_kernel("aten::mm", t + 10, 30, t + 50, 100,
                          kname="sm90_xmma_gemm_f32f32_f32f32_f32_tn_n")  # fmt: skip
        b.launched_kernel("aten::add", t + 60, 10, t + 150, 20, kname=ELEMENTWISE)
        b.launched_kernel("aten::mul", t + 75, 10, t + 170, 20, kname=MUL)
        ext = b.op("aten::item", t + 100, 500)
        b.sync(t + 110, 490, ext=ext)
    return b.write(path)


def added(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "tracedx"]


def read(path: Path) -> dict:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def thread_names(doc: dict) -> dict[tuple, str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("ann")
    src = small_trace(d / "t.json")
    out = annotate(src, d / "t.annotated.json.gz").path
    return src, out


def test_hand_made_trace_tracks_and_values(small):
    src, out = small
    doc = read(out)
    names = thread_names(doc)
    ours = added(doc)
    pid = ours[0]["pid"]
    assert pid == 4243  # one above the trace's largest pid (4242)
    assert {e["pid"] for e in ours} == {pid}
    assert any(e["name"] == "process_name" and e["args"]["name"] == PROCESS_NAME for e in ours)
    by_track: dict[str, list[dict]] = {}
    for e in ours:
        if e["ph"] in ("X", "i"):
            by_track.setdefault(names[(e["pid"], e["tid"])], []).append(e)
    assert set(by_track) == {
        "steps",
        "GPU 0 idle",
        "host syncs · thread 4242",
        "fusable chains · GPU 0 stream 7",
    }
    # steps: one slice per step over [min(host, GPU start), max(host, GPU end)] = 1000 us
    steps = [e for e in by_track["steps"] if e["ph"] == "X"]
    assert [(s["ts"], s["dur"]) for s in steps] == [(T0, 1000), (T0 + 1000, 1000)]
    assert steps[0]["name"].startswith("step 1: 1.000 ms, GPU idle 86%")  # busy 140 of 1000 us
    assert steps[0]["args"]["gpu_busy_us"] == 140.0
    verdict = [e for e in by_track["steps"] if e["ph"] == "i"]
    assert len(verdict) == 1 and verdict[0]["ts"] == T0 and verdict[0]["s"] == "t"
    assert verdict[0]["name"].startswith("tracedx verdict: ")
    # host syncs: 490 us each, with the Python line
    syncs = [e for e in by_track["host syncs · thread 4242"] if e["ph"] == "X"]
    assert [(s["ts"], s["dur"]) for s in syncs] == [(T0 + 110, 490), (T0 + 1110, 490)]
    assert syncs[0]["name"] == (
        f"host sync: aten::item · cudaStreamSynchronize · {SITE} -> "
        "<built-in method item of Tensor object>"
    )
    assert syncs[0]["args"]["blocked_us"] == 490.0
    sites = [e for e in by_track["host syncs · thread 4242"] if e["ph"] == "i"]
    assert [e["ts"] for e in sites] == [T0 + 110, T0 + 1110]
    # fusable chains: add + mul, 150..190, 40 us of kernels, fusing saves 20
    chains = by_track["fusable chains · GPU 0 stream 7"]
    assert [(c["ts"], c["dur"]) for c in chains] == [(T0 + 150, 40), (T0 + 1150, 40)]
    assert chains[0]["args"]["kernels"] == 2 and chains[0]["args"]["saved_device_us"] == 20.0
    assert chains[0]["args"]["kernel_names"] == [ELEMENTWISE, MUL]
    # idle gaps: exactly the diagnosis' gaps, by cause
    diag = diagnose(tracedx.load(src))
    gaps = by_track["GPU 0 idle"]
    assert [(g["ts"], g["dur"], g["name"]) for g in gaps] == [
        (r["start_us"], r["duration_us"], f"idle: {r['cause']}")
        for r in diag.gaps.sort("start_us").iter_rows(named=True)
    ]
    assert any(g["name"] == "idle: host sync" for g in gaps)


def test_original_events_are_copied_through_unaltered(small):
    src, out = small
    before, after = json.loads(src.read_text()), read(out)
    n = len(before["traceEvents"])
    assert after["traceEvents"][:n] == before["traceEvents"]
    assert not any(e.get("cat") == "tracedx" for e in after["traceEvents"][:n])
    assert {k: v for k, v in after.items() if k != "traceEvents"} == {
        k: v for k, v in before.items() if k != "traceEvents"
    }


def _tables(t) -> dict[str, pl.DataFrame]:
    return {
        k: getattr(t, k)
        for k in (
            "kernels",
            "memcpys",
            "memsets",
            "syncs",
            "launches",
            "ops",
            "annotations",
            "steps",
            "python_frames",
        )  # fmt: skip
    }


def _same_reading(src: Path, out: Path) -> None:
    a, b = tracedx.load(src), tracedx.load(out)
    for k, t in _tables(a).items():
        assert t.equals(_tables(b)[k]), k
    ma = {k: v for k, v in a.metadata.items() if k != "path"}
    mb = {k: v for k, v in b.metadata.items() if k != "path"}
    assert ma == mb
    assert [w.message for w in a.warnings] == [w.message for w in b.warnings]
    # the verdict and estimates too (the op table's order among equal times and the last bits
    # of float sums are not fixed from one run to the next, so those are not compared)
    da, db = diagnose(a), diagnose(b)
    assert (da.regime, da.bottleneck, da.evidence) == (db.regime, db.bottleneck, db.evidence)
    assert [(f.fix, round(f.estimated_speedup, 9)) for f in da.findings] == [
        (f.fix, round(f.estimated_speedup, 9)) for f in db.findings
    ]


def test_tracedx_reads_the_annotated_trace_as_the_original(small):
    _same_reading(*small)


def check_chrome_trace(doc: dict) -> None:
    """What the Trace Event Format and Perfetto's JSON importer need of the added events:
    known phases, integer pid/tid on a process no original event uses, finite times, named
    threads, ids inside the uint32 range it keeps, and on every thread slices that nest (none
    starts inside another and ends after it), also once in the importer's integer nanoseconds
    (``CoerceToTs``: ts and dur each truncated from ``double * 1000``)."""
    events = doc["traceEvents"]
    ours = added(doc)
    pid = ours[0]["pid"]
    assert all(e.get("pid") != pid for e in events if e.get("cat") != "tracedx")
    # Perfetto's importer names a thread by its tid alone: our tids are new to the whole trace
    theirs = {e.get("tid") for e in events if e.get("cat") != "tracedx"}
    assert not theirs & {e["tid"] for e in ours if e["name"] == "thread_name"}
    names = thread_names(doc)
    per_thread: dict[tuple, list] = {}
    per_thread_ns: dict[tuple, list] = {}
    for e in ours:
        assert e["ph"] in ("X", "i", "M") and isinstance(e["pid"], int)
        assert isinstance(e["tid"], int) and isinstance(e["name"], str)
        assert None not in e.get("args", {}).values()
        if e["ph"] == "M":
            continue
        assert math.isfinite(e["ts"]) and (e["pid"], e["tid"]) in names
        assert 0 <= e["pid"] <= 2**32 - 1 and 0 <= e["tid"] <= 2**32 - 1
        if e["ph"] == "X":
            assert math.isfinite(e["dur"]) and e["dur"] >= 0
            per_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
            ns = int(e["ts"] * 1000.0), int(e["ts"] * 1000.0) + int(e["dur"] * 1000.0)
            per_thread_ns.setdefault((e["pid"], e["tid"]), []).append(ns)
        else:
            assert e["s"] == "t"
    for spans in [*per_thread.values(), *per_thread_ns.values()]:
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end  # our tracks hold no nested slices: each lane is disjoint
    json.dumps(doc, allow_nan=False)


def test_added_events_are_valid_chrome_trace_events(small):
    check_chrome_trace(read(small[1]))


def test_overlapping_slices_go_to_extra_lanes():
    from tracedx.report.perfetto import _Tracks

    t = _Tracks(pid=9)
    tids = t.track(
        "x",
        [{"ts": 0, "dur": 10, "name": "a", "args": {}}, {"ts": 5, "dur": 10, "name": "b", "args": {}},
         {"ts": 10, "dur": 2, "name": "c", "args": {}}],
    )  # fmt: skip
    assert len(tids) == 2
    lanes = {e["name"]: e["tid"] for e in t.events if e["ph"] == "X"}
    assert lanes["a"] == lanes["c"] != lanes["b"]
    assert [e["args"]["name"] for e in t.events if e["name"] == "thread_name"] == ["x", "x (2)"]


def test_free_ids_are_above_every_integer_pid_and_tid():
    evs = [{"pid": 3, "tid": 900}, {"pid": "CPU functions", "tid": "x"}, {"pid": 70}, {}]
    assert free_ids(evs) == (71, 902)
    assert free_ids([]) == (1, 2)


def test_added_ids_stay_in_the_range_perfetto_keeps(tmp_path):
    """Perfetto's JSON importer reads pid and tid as uint32 and drops one past 2^32 - 1 (the
    event goes to the thread tid = pid): above a 64-bit thread id the added tracks would all
    land on one thread, their slices no longer nested."""
    from tracedx.report.perfetto import ID_MAX, TID_ROOM

    assert free_ids([{"pid": 7, "tid": 2**40}]) == (8, 9)  # 2^40: dropped by Perfetto anyway
    # no room above the largest tid: the lowest free run of TID_ROOM ids below it
    assert free_ids([{"pid": 5, "tid": ID_MAX - 10}, {"pid": 5, "tid": 3}]) == (6, 6)
    # 3 .. 2 + TID_ROOM is the first free run long enough
    assert free_ids([{"pid": 1, "tid": v} for v in (1, 2, 3 + TID_ROOM, ID_MAX)]) == (2, 3)
    doc = read(small_trace(tmp_path / "t.json"))
    doc["traceEvents"].append(
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2**40, "args": {"name": "big"}}
    )
    (tmp_path / "big.json").write_text(json.dumps(doc))
    out = annotate(tmp_path / "big.json", tmp_path / "big.annotated.json").path
    ids = {(e["pid"], e["tid"]) for e in added(read(out))}
    assert ids and all(0 <= v <= ID_MAX for i in ids for v in i)


@pytest.mark.parametrize(
    "name", ["item_loop-sync-stack", "elementwise-eager", "convnet_dataloader-main"]
)
def test_sample_traces_round_trip(name, tmp_path):
    src = SAMPLES / f"{name}.json.gz"
    if not src.exists():
        pytest.skip(f"{src} is not in this checkout")
    out = annotate(src, tmp_path / "a.json.gz").path
    doc = read(out)
    check_chrome_trace(doc)
    tracks = set(thread_names(doc).values())
    assert "steps" in tracks and any(t.endswith(" idle") for t in tracks)
    if name == "item_loop-sync-stack":  # recorded with stacks: syncs name their Python line
        syncs = [e for e in added(doc) if e["ph"] == "X" and e["name"].startswith("host sync")]
        assert syncs and all("item_loop.py(" in e["name"] for e in syncs)
    if name == "elementwise-eager":
        assert any(t.startswith("fusable chains") for t in tracks)
    _same_reading(src, out)


def test_annotate_command(small, tmp_path):
    src, _ = small
    out = tmp_path / "a.json"
    r = CliRunner().invoke(main, ["annotate", str(src), "-o", str(out), "--no-cache"])
    assert r.exit_code == 0, r.output
    n = len(json.loads(src.read_text())["traceEvents"])
    added = len(json.loads(out.read_text())["traceEvents"]) - n
    assert r.stdout == ""  # the file written is a note on stderr, as --html's
    assert " ".join(r.stderr.split()) == (  # one message, fitted to 100 columns
        f"tracedx: wrote {out}: {n} original events, {added} added (open it in the Perfetto UI)"
    )
    q = CliRunner().invoke(main, ["annotate", str(src), "-o", str(out), "-q"])
    assert q.exit_code == 0 and q.stdout == q.stderr == ""
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": NaN}]}')
    r = CliRunner().invoke(main, ["annotate", str(bad), "-o", str(tmp_path / "b.json")])
    assert r.exit_code == 2 and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["annotate", str(src), "-o", str(tmp_path / "no" / "a.json")])
    assert r.exit_code == 2 and "cannot write" in r.output


def _trace_processor_shell() -> str:
    """A trace_processor_shell binary: $TRACE_PROCESSOR_SHELL, one on PATH, or the one the
    `perfetto` package cached; skip when there is none (it cannot be downloaded offline)."""
    pytest.importorskip("perfetto", reason="the perfetto package is not installed")
    for cand in (os.environ.get("TRACE_PROCESSOR_SHELL"), shutil.which("trace_processor_shell")):
        if cand and Path(cand).exists():
            return cand
    cache = Path.home() / ".local" / "share" / "perfetto" / "prebuilts"
    found = sorted(p for p in cache.glob("trace_processor_shell*") if not p.name.endswith(".tmp"))
    if found:
        return str(found[-1])
    pytest.skip(
        "no trace_processor_shell: the perfetto package downloads it on first use, which this "
        "machine cannot (set TRACE_PROCESSOR_SHELL to a binary)"
    )


def test_annotated_trace_loads_in_perfettos_trace_processor(small):
    pytest.importorskip("perfetto", reason="the perfetto package is not installed")
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    _, out = small
    ours = added(read(out))
    config = TraceProcessorConfig(bin_path=_trace_processor_shell())
    tp = TraceProcessor(trace=str(out), config=config)
    ours_sql = (
        "from slice join thread_track on slice.track_id = thread_track.id join thread "
        f"using (utid) join process using (upid) where process.name = '{PROCESS_NAME}'"
    )
    try:
        errors = [
            (r.name, r.value)
            for r in tp.query(
                "select name, value from stats where severity in ('error', 'data_loss') "
                "and value > 0"
            )
        ]
        assert errors == []
        n = [r.n for r in tp.query(f"select count(*) as n {ours_sql}")][0]
        assert n == sum(e["ph"] in ("X", "i") for e in ours)
        threads = {r.name for r in tp.query(f"select distinct thread.name as name {ours_sql}")}
        assert {"steps", "GPU 0 idle", "host syncs · thread 4242"} <= threads
        # the original events are there too: the trace's kernels on the GPU's process
        k = [r.n for r in tp.query("select count(*) as n from slice where name like 'sm90%'")]
        assert k == [2]
    finally:
        tp.close()


def test_job_rank_waits_inside_its_collectives(small):
    """Rank 0 of tests/test_html.py's late_job: per step k it joins the all-reduce at
    t0 + 1000 + LATE[k][0] and waits max(LATE[k]) - LATE[k][0] us, then 200 us of transfer."""
    from tests.test_html import LATE, late_job
    from tracedx.report.perfetto import collective_wait_slices

    jd = late_job()
    got = [(s["ts"], s["dur"], s["name"]) for s in collective_wait_slices(jd, 0)]
    want = []
    for k, row in enumerate(LATE):
        start, w = k * 10_000.0 + 1000 + row[0], max(row) - row[0]
        if w > 0:
            last = jd.collectives.filter(pl.col("step") == k)["last_rank"][0]
            want.append((start, w, f"all_reduce (default_pg): wait for rank {last}"))
        want.append((start + w, 200.0, "all_reduce (default_pg): transfer"))
    assert got == want
    assert [s for s in got if "wait" in s[2]][0][2].endswith("rank 1")
    # on its own track of the annotated trace
    src, _ = small
    events = annotation_events(diagnose(tracedx.load(src)), 99, jd, 0)
    tids = {e["tid"] for e in events if e["name"] == "thread_name"
            and e["args"]["name"] == "rank 0 in collectives"}  # fmt: skip
    assert len(tids) == 1
    assert sum(e["ph"] == "X" and e["tid"] in tids for e in events) == len(want)


def test_original_bytes_are_kept_verbatim(tmp_path):
    """Numbers, spacing and key order of the original events survive (1.50 stays 1.50)."""
    ev = [
        '{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, '
        '"ts": 10.50, "dur": 100.0, "args": {}}',
        '{"name":"aten::add","ph":"X","cat":"cpu_op","pid":1,"tid":1,"ts":20,"dur":5.250}',
    ]
    src = tmp_path / "t.json"
    src.write_text('{"schemaVersion": 1,\n "traceEvents": [\n' + ",\n".join(ev) + "\n]}\n")
    out = annotate(src, tmp_path / "a.json").path
    text = out.read_text()
    assert all(e in text for e in ev)
    assert text.startswith('{"schemaVersion":1,"traceEvents":[')


def test_annotate_job_writes_each_ranks_trace(tmp_path):
    """A job whose summaries name their traces: one annotated file per rank, each with its
    own rank's collective track (the traces here are the small one twice; the job's numbers
    come from the summaries)."""
    from tests.test_html import late_job
    from tracedx.report.perfetto import annotate_job

    jd = late_job()
    for r, s in enumerate(jd.job.summaries):
        s.meta["path"] = str(small_trace(tmp_path / f"r{r}.json"))
    done = annotate_job(jd, tmp_path / "out")
    assert [d.path.name for d in done] == [
        "rank0-r0.annotated.json.gz",
        "rank1-r1.annotated.json.gz",
    ]
    for r, d in enumerate(done):
        doc = read(d.path)
        check_chrome_trace(doc)
        assert f"rank {r} in collectives" in set(thread_names(doc).values())


@pytest.mark.parametrize(
    "name",
    [
        "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",  # ROCm
        "large_integer_trace__rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz",
        "nccl_parser_config__nccl_data.json.gz",  # NCCL kernels, a DDP rank
    ],
)
def test_public_traces_round_trip(name, tmp_path):
    from tests.conftest import PUBLIC

    src = PUBLIC / "hta" / name
    if not src.exists():
        pytest.skip(f"{src} is not here (../shared)")
    out = annotate(src, tmp_path / "a.json.gz").path
    check_chrome_trace(read(out))
    _same_reading(src, out)


def test_annotate_command_on_a_captured_gloo_job(tmp_path):
    """The 2-rank CPU gloo DDP capture in tests/data: one annotated trace per rank, each with
    its collectives split into wait and transfer, the split adding up to each kernel."""
    files = sorted(str(p) for p in (Path(__file__).parent / "data" / "gloo_ddp_cpu").glob("vm_*"))
    out = tmp_path / "ann"
    r = CliRunner().invoke(main, ["annotate", *files, "-o", str(out)])
    assert r.exit_code == 0, r.output
    written = sorted(out.iterdir())
    assert [p.name.split("-")[0] for p in written] == ["rank0", "rank1"]
    for rank, p in enumerate(written):
        doc = read(p)
        check_chrome_trace(doc)
        names = thread_names(doc)
        coll = [e for e in added(doc) if e["ph"] == "X"
                and names[(e["pid"], e["tid"])] == f"rank {rank} in collectives"]  # fmt: skip
        assert coll and all(("wait" in e["name"]) or e["name"].endswith("transfer") for e in coll)
        for e in coll:
            assert e["dur"] <= e["args"]["kernel_us"] + 1e-6
        src = next(f for f in files if Path(f).name.removesuffix(".json.gz") in p.name)
        _same_reading(Path(src), p)


def test_annotate_of_a_job_refuses_a_trace_file_as_its_folder(tmp_path):
    """A job's annotated traces go into a folder: an -o named like a trace is refused before
    any trace is read, and nothing is made (it made a folder named x.json.gz)."""
    job = SAMPLES / "ddp_mlp-gloo-host-straggler"
    for name in ("x.json.gz", "x.json"):
        out = tmp_path / name
        r = CliRunner().invoke(main, ["annotate", str(job), "-o", str(out)])
        assert r.exit_code == 2 and r.stdout == ""
        assert r.stderr == (
            f"tracedx: error: -o {out} names a trace file, but the 2 traces are a job: annotate "
            "writes one trace per rank into a folder (-o DIR)\n"
        )
        assert not out.exists()


def test_annotate_refuses_to_write_over_its_input(tmp_path):
    p = shutil.copy(SAMPLES / "add_loop-eager.json.gz", tmp_path / "t.json.gz")
    before = Path(p).read_bytes()
    r = CliRunner().invoke(main, ["annotate", str(p), "-o", str(p)])
    assert r.exit_code == 2
    assert r.stderr == (
        f"tracedx: error: {p}: is the trace being annotated; write the copy elsewhere (-o)\n"
    )
    assert Path(p).read_bytes() == before
