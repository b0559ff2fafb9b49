"""The per-rank summary (tracedx.job.summary) and the collectives it reads (Trace.collectives).

Every figure of the hand-made trace is computed by hand in the comments next to it.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest
from conftest import DATA, PUBLIC, SAMPLES, case
from tracebuilder import T0, TraceBuilder

import tracedx
from tracedx.job import summary as summ
from tracedx.job.summary import RankSummary, summarize, summarize_path
from tracedx.trace.collectives import coll_type

BIG_ID = 2**64 - 1  # a Comms Id beyond int64


def two_steps() -> TraceBuilder:
    """Two steps of 200 us (CPU windows: the GPU windows add up to less).

    step 1 [T0, T0+200):
      gemm        stream 7   [10, 70]    (aten::mm)
      all_reduce  stream 20  [50, 110]   args on the kernel, Seq 1, Comms Id 2^64-1, Rank 3
      add         stream 7   [125, 130]  (aten::add)
      broadcast   stream 20  [120, 140]  args only on its record_param_comms (External id)
      reduce_scatter (pg 5)  stream 21 [150, 160], kernel named AllReduce
      wait        host-side Work.wait(): no kernel
    step 2 [T0+200, T0+400):
      gemm        stream 7   [210, 260]
      all_gather  stream 20  [300, 330]
    after the steps: one all_reduce [460, 470] (left out of the summary)
    """
    b = TraceBuilder()
    b.step(1, T0, 200)
    b.step(2, T0 + 200, 200)
    mm = b.op("aten::mm", T0 + 2, 6, input_dims=[[64, 64], [64, 64]], input_type=["float"] * 2)
    b.kernel(T0 + 10, 60, b.launch(T0 + 3, 2, ext=mm), ext=mm)
    b.collective(
        T0 + 20, 8, T0 + 50, 60, in_nelems=1000, seq=1, comms_id=BIG_ID, rank=3,
    )  # fmt: skip
    add = b.op("aten::add", T0 + 30, 5)
    b.kernel(T0 + 125, 5, b.launch(T0 + 31, 2, ext=add), "vectorized_elementwise_kernel", ext=add)
    b.collective(
        T0 + 40, 6, T0 + 120, 20, collective="broadcast", dtype="Long", in_nelems=256,
        on_kernel=False, kname="ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    )  # fmt: skip
    b.collective(T0 + 50, 4, None, collective="wait", in_nelems=0)
    b.collective(
        T0 + 60, 6, T0 + 150, 10, collective="reduce_scatter_tensor_coalesced", dtype="Half",
        in_nelems=4000, out_nelems=100, group_size=40, pg_name="5", pg_desc="mesh_dp",
        pg_ranks="[0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, "
        "40, 42, 44, 46, 48, 50, 52, 54, 56, 58, ...]", stream=21,
    )  # fmt: skip
    mm2 = b.op("aten::mm", T0 + 202, 6, input_dims=[[64, 64], [64, 64]], input_type=["float"] * 2)
    b.kernel(T0 + 210, 50, b.launch(T0 + 203, 2, ext=mm2), ext=mm2)
    b.collective(
        T0 + 220, 6, T0 + 300, 30, collective="_allgather_base", dtype="BFloat16",
        in_nelems=500, out_nelems=1000,
    )  # fmt: skip
    b.collective(T0 + 450, 6, T0 + 460, 10, in_nelems=8)
    return b


@pytest.fixture
def hand(tmp_path) -> Path:
    # a tensorboard_trace_handler name: {host}_{pid}.{ns}.pt.trace.json
    return two_steps().write(tmp_path / "node7_1234.1700000000000000000.pt.trace.json")


def test_coll_type_normalisation():
    assert coll_type("allreduce") == "all_reduce"
    assert coll_type("allreduce_coalesced") == "all_reduce"
    assert coll_type("_allgather_base") == "all_gather"
    assert coll_type("all_gather_into_tensor_coalesced") == "all_gather"
    assert coll_type("_reduce_scatter_base") == "reduce_scatter"
    assert coll_type("reduce_scatter_tensor_coalesced") == "reduce_scatter"
    assert coll_type("all_to_all") == "all_to_all"
    assert coll_type("all_to_allv") == "all_to_allv"
    assert coll_type("_broadcast_oop") == "broadcast"
    assert coll_type("coalesced") == "coalesced"
    assert coll_type("send") == "send" and coll_type("recv") == "recv"
    assert coll_type("barrier") == "barrier"
    assert coll_type("frobnicate") == "unknown" and coll_type(None) == "unknown"


def test_trace_collectives_hand_made(hand):
    t = tracedx.load(hand)
    c = t.collectives
    # 5 kernels; the wait has no kernel and is never a row
    assert c.height == 5
    assert c["coll_type"].to_list() == [
        "all_reduce",
        "broadcast",
        "reduce_scatter",  # from Collective name, though the kernel is named AllReduce
        "all_gather",
        "all_reduce",
    ]
    assert c["meta_source"].to_list() == [
        "kernel",
        "record_param_comms",
        "kernel",
        "kernel",
        "kernel",
    ]
    first = c.row(0, named=True)
    assert first["comms_id"] == str(BIG_ID)
    assert first["seq"] == 1 and first["rank"] == 3 and first["group_size"] == 2
    assert first["in_nelems"] == first["out_nelems"] == 1000
    assert c["step"].to_list() == [1, 1, 1, 2, None]
    assert not c["host_side"].any()
    assert t.distributed_info is None


def test_summary_hand_made(hand):
    s = summarize_path(hand)
    st = s.steps
    assert st["step"].to_list() == [1, 2]
    assert st["step_time_us"].to_list() == [200.0, 200.0]
    # compute: step 1 [10,70] u [125,130] = 65; step 2 [210,260] = 50
    assert st["compute_us"].to_list() == [65.0, 50.0]
    # comm: [50,110] + [120,140] + [150,160] = 90; step 2 [300,330] = 30
    assert st["comm_us"].to_list() == [90.0, 30.0]
    # overlap: [50,70] + [125,130] = 25; step 2 none
    assert st["comm_overlap_us"].to_list() == [25.0, 0.0]
    assert st["exposed_comm_us"].to_list() == [65.0, 30.0]
    # busy: [10,110] u [120,140] u [150,160] = 130; [210,260] u [300,330] = 80
    assert st["gpu_busy_us"].to_list() == [130.0, 80.0]
    assert st["idle_us"].to_list() == [70.0, 120.0]
    assert st["kernels"].to_list() == [5, 2]
    idle_cols = [c for c in st.columns if c.startswith("idle_") and c != "idle_us"]
    assert len(idle_cols) == 6
    assert st.select(pl.sum_horizontal(idle_cols).alias("s"))["s"].to_list() == [70.0, 120.0]

    co = s.colls
    assert co.height == 4  # the all_reduce after the steps is left out
    assert co["coll_type"].to_list() == ["all_reduce", "broadcast", "reduce_scatter", "all_gather"]
    assert co["collective_name"].to_list() == [
        "allreduce",
        "broadcast",
        "reduce_scatter_tensor_coalesced",
        "_allgather_base",
    ]
    # ordinal by start within (pg, step): pg 0 step 1 -> 0, 1; pg 5 -> 0; pg 0 step 2 -> 0
    assert co["ordinal"].to_list() == [0, 1, 0, 0]
    # bytes: 1000 Float = 4000; broadcast 256 Long = 2048 (In);
    # reduce-scatter max(4000, 100) Half = 8000; all-gather max(500, 1000) BFloat16 = 2000
    assert co["msg_bytes"].to_list() == [4000, 2048, 8000, 2000]
    assert co["duration_us"].to_list() == [60.0, 20.0, 10.0, 30.0]
    assert co["start_us"].to_list() == [T0 + 50, T0 + 120, T0 + 150, T0 + 300]
    assert co["stream"].to_list() == [20, 20, 21, 20]
    assert co["group_size"].to_list() == [2, 2, 40, 2]
    assert co["pg_ranks"][2].endswith("...]")
    assert co["seq"].to_list() == [1, None, None, None]
    assert co["comms_id"].to_list() == [str(BIG_ID), None, None, None]
    assert co["group_rank"].to_list() == [3, None, None, None]
    # free: all_reduce [50,110] minus gemm [10,70] -> [70,110] = offsets [20, 60];
    # broadcast [120,140] minus add [125,130] -> [0,5], [10,20]; the others are uncovered
    free = [[(x["start_us"], x["end_us"]) for x in row] for row in co["free_us"].to_list()]
    assert free == [[(20.0, 60.0)], [(0.0, 5.0), (10.0, 20.0)], [(0.0, 10.0)], [(0.0, 30.0)]]

    m = s.meta
    assert m["schema"] == "tracedx.rank-summary/1"
    assert m["rank"] == 3 and m["rank_source"] == "record_param_comms"
    assert m["world_size"] is None and m["backend"] is None
    assert m["hostname"] == "node7"
    assert m["steps"] == [1, 2] and m["steps_synthetic"] is False
    assert m["device"] == 0
    assert m["file_size_bytes"] == os.path.getsize(hand)
    assert "1 collective(s) outside the analysed steps left out of the summary" in m["notes"]
    assert any("include waiting for the other ranks" in n for n in m["notes"])

    k = s.kernels
    assert k["name"].to_list() == ["ampere_sgemm_128x64_nn", "vectorized_elementwise_kernel"]
    assert k["count"].to_list() == [2, 1]
    assert k["total_us"].to_list() == [110.0, 5.0]
    assert k["median_us"].to_list() == [55.0, 5.0]

    o = s.opsig
    # record_param_comms: 5 ops in the steps (the wait included), their kernels 60+20+10+30
    assert o.rows() == [
        ("record_param_comms", "", 5, 120.0),
        ("aten::mm", "[[64,64],[64,64]]", 2, 110.0),
        ("aten::add", "", 1, 5.0),
    ]


def test_summarize_a_loaded_trace(hand):
    t = tracedx.load(hand)
    d = tracedx.diagnose(t)
    s = summarize(t, d)
    assert s == summarize(t) == summarize_path(hand)
    assert s.meta["single_rank"]["regime"] == d.regime
    assert [f["id"] for f in s.meta["single_rank"]["findings"]] == [f.fix for f in d.findings]


def test_free_segments_capped():
    import numpy as np

    from tracedx.analysis.comm import free_segments

    # compute covers [1,2], [3,4], ... [39,40]: 20 gaps in [0, 41]
    cs = np.arange(1.0, 40.0, 2.0)
    comp = (cs, cs + 1.0)
    (segs,) = free_segments(np.array([0.0]), np.array([41.0]), comp, max_segments=16)
    assert len(segs) == 16
    assert segs[0] == {"start_us": 0.0, "end_us": 1.0}
    assert segs[14] == {"start_us": 28.0, "end_us": 29.0}
    # the 16th and later merged: from the 16th gap's start (30) to the last one's end (41)
    assert segs[15] == {"start_us": 30.0, "end_us": 41.0}


def test_hostname_from_file_names():
    m = summ.TB_NAME_RE.match
    assert m("node7_1234.1700000000000000000.pt.trace.json").group("host") == "node7"
    assert m("gpu-a_b.example.com_99.1700000000123.pt.trace.json.gz").group("host") == (
        "gpu-a_b.example.com"
    )
    # a custom worker name with a short counter (HTA's rank-34.Jul_15_10_52_41.1074...)
    assert m("rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz") is None
    assert m("rank0_trace.json") is None


def test_round_trips_and_determinism(hand, tmp_path):
    s = summarize_path(hand)
    b = s.to_bytes()
    assert RankSummary.from_bytes(b) == s
    assert summarize_path(hand).to_bytes() == b  # byte-identical for identical input
    d = s.write(tmp_path / "sum")
    assert sorted(p.name for p in d.iterdir()) == [
        "colls.parquet",
        "kernels.parquet",
        "meta.json",
        "opsig.parquet",
        "steps.parquet",
    ]
    r = summ.read(d)
    assert r == s
    assert r.colls.schema == s.colls.schema
    d2 = summarize_path(hand).write(tmp_path / "sum2")
    for p in d.iterdir():
        assert (d2 / p.name).read_bytes() == p.read_bytes()
    # overwriting an existing summary replaces it whole
    s.write(d)
    assert summ.read(d) == s
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    with pytest.raises(ValueError, match="not a tracedx.rank-summary/1"):
        RankSummary.from_bytes(b"\x80")


def test_write_is_atomic(hand, tmp_path, monkeypatch):
    s = summarize_path(hand)
    target = tmp_path / "sum"
    real = pl.DataFrame.write_parquet

    def boom(self, path, *a, **k):
        if str(path).endswith("colls.parquet"):
            raise OSError("disk full")
        return real(self, path, *a, **k)

    monkeypatch.setattr(pl.DataFrame, "write_parquet", boom)
    with pytest.raises(OSError):
        s.write(target)
    assert not target.exists()
    assert list(tmp_path.iterdir()) == [hand]  # no temporary directory left
    monkeypatch.setattr(pl.DataFrame, "write_parquet", real)
    s.write(target)
    monkeypatch.setattr(pl.DataFrame, "write_parquet", boom)
    with pytest.raises(OSError):
        s.write(target)
    assert summ.read(target) == s  # the complete old summary is still there


def test_summarize_path_options_and_url(hand):
    with pytest.raises(TypeError, match="unknown option"):
        summarize_path(hand, colour="red")
    one = summarize_path(hand, steps="2")
    assert one.meta["steps"] == [2] and one.colls.height == 1
    pytest.importorskip("fsspec")
    url = summarize_path("file://" + str(hand))
    assert url.meta["path"] == "file://" + str(hand)
    mem = summarize_path(hand)
    import fsspec

    with fsspec.open("memory://traces/node7_1234.1700000000000000000.pt.trace.json", "wb") as f:
        f.write(Path(hand).read_bytes())
    m = summarize_path("memory://traces/node7_1234.1700000000000000000.pt.trace.json")
    assert m.meta["path"].startswith("memory://")
    assert m.meta["hostname"] == "node7"
    assert m.meta["file_size_bytes"] == os.path.getsize(hand)
    for t in summ.TABLES:
        assert getattr(m, t).equals(getattr(mem, t))
    assert m.meta["notes"] == mem.meta["notes"]


def test_gloo_cpu_job_colls():
    """A 2-process CPU DDP job on gloo, captured with torch 2.13.0 under torchrun
    (tests/data/gloo_ddp_cpu/README.md): no record_param_comms, no kernels; one gloo:* host
    annotation per collective on the gloo worker threads."""
    files = sorted((DATA / "gloo_ddp_cpu").glob("*.pt.trace.json.gz"))
    assert len(files) == 2
    for r, f in enumerate(files):
        s = summarize_path(f)
        m = s.meta
        assert (m["rank"], m["rank_source"], m["world_size"], m["backend"]) == (
            r,
            "distributedInfo",
            2,
            "gloo",
        )
        assert m["hostname"] == "vm" and m["device"] is None
        assert [p["pg_desc"] for p in m["pg_config"]] == ["default_pg", "undefined"]
        c = s.colls
        assert c["host_side"].all() and c.height == 14
        # per step: DDP's gradient all-reduce and the script's all_reduce, broadcast, barrier
        # (step 1 also the two DDP construction broadcasts)
        by = c.group_by("step", "coll_type").len().sort("step", "coll_type").rows()
        assert by == [
            (1, "all_reduce", 2),
            (1, "barrier", 1),
            (1, "broadcast", 3),
            (2, "all_reduce", 2),
            (2, "barrier", 1),
            (2, "broadcast", 1),
            (3, "all_reduce", 2),
            (3, "barrier", 1),
            (3, "broadcast", 1),
        ]
        grads = c.filter(pl.col("in_nelems") == 18696)
        assert grads.height == 3 and grads["msg_bytes"].to_list() == [18696 * 4] * 3
        st = s.steps
        assert st["comm_us"].is_not_null().all() and st["gpu_busy_us"].is_null().all()
        assert (st["exposed_comm_us"] <= st["comm_us"]).all()


@pytest.mark.parametrize(
    "name, rank, compute, comm, overlap, exposed",
    [
        ("C16a_rank0_nccl_overlap.json", 0, 80.0, 50.0, 30.0, 20.0),
        ("C16b_rank1_nccl_overlap.json", 1, 75.0, 40.0, 5.0, 35.0),
        ("C16c_no_rank_old_nccl_name.json", 0, 80.0, 50.0, 30.0, 20.0),
    ],
)
def test_c16_cases(name, rank, compute, comm, overlap, exposed):
    s = summarize_path(case(name))
    row = s.steps.row(0, named=True)
    assert (row["compute_us"], row["comm_us"], row["comm_overlap_us"], row["exposed_comm_us"]) == (
        compute,
        comm,
        overlap,
        exposed,
    )
    c = s.colls
    assert c.height == 1 and c["coll_type"][0] == "all_reduce"
    # the kernel's External id is the enclosing nccl:all_reduce op's: the metadata comes from
    # the record_param_comms open on the thread at the launch
    assert c["meta_source"][0] == "record_param_comms open"
    assert c["msg_bytes"][0] == 1048576 * 4
    assert s.meta["rank"] == rank
    # C16c has no distributedInfo: the rank is the default group's Rank
    assert s.meta["rank_source"] == ("record_param_comms" if "C16c" in name else "distributedInfo")


def _public(name: str) -> Path:
    p = PUBLIC / "hta" / name
    if not p.exists():
        pytest.skip(f"../shared/public_traces/hta/{name} is not present")
    return p


def test_hta_nccl_data():
    s = summarize_path(_public("nccl_parser_config__nccl_data.json.gz"))
    m = s.meta
    assert (m["rank"], m["world_size"], m["backend"], m["steps"]) == (0, 2, "nccl", [4, 5, 6])
    assert m["base_time_ns"] == 1711964646000000000
    c = s.colls
    # 21 NCCL kernels (15 all-reduce, 6 broadcast), all with their own args; the 6 waits dropped
    assert c.height == 21
    assert c.group_by("coll_type").len().sort("coll_type").rows() == [
        ("all_reduce", 15),
        ("broadcast", 6),
    ]
    assert (c["meta_source"] == "kernel").all() and (c["stream"] == 40).all()
    assert c.group_by("step").len().sort("step").rows() == [(4, 7), (5, 7), (6, 7)]
    assert c["ordinal"].to_list() == list(range(7)) * 3
    st = s.steps
    assert (st["exposed_comm_us"] + st["comm_overlap_us"] - st["comm_us"]).abs().max() < 1e-6
    assert (st["comm_us"] > 0).all() and (st["compute_us"] > 0).all()


@pytest.mark.parametrize("rank", [0, 1])
def test_hta_trace_filter_ranks(rank):
    s = summarize_path(_public(f"trace_filter__sampled_rank-{rank}.json.gz"))
    m = s.meta
    assert (m["rank"], m["world_size"], m["base_time_ns"]) == (rank, 128, 0)
    c = s.colls
    # 2023 traces: no collective args anywhere; type and size from the nccl:* annotations
    assert (c["meta_source"] == "annotation").all()
    assert c.group_by("step", "coll_type").len().sort("step", "coll_type").rows() == [
        (551, "all_gather", 1),
        (551, "all_reduce", 2),
        (551, "all_to_all", 2),
        (552, "all_gather", 1),
        (552, "all_reduce", 2),
        (552, "all_to_all", 2),
    ]
    assert c["pg_name"].is_null().all()


def test_summary_of_a_large_trace_is_small(tmp_path):
    p = SAMPLES / "convnet_dataloader-main.json.gz"
    import gzip

    assert len(gzip.decompress(p.read_bytes())) > 10_000_000
    s = summarize_path(p)
    assert s.steps.height == len(s.meta["steps"]) >= 1
    assert len(s.to_bytes()) < 100_000
    # no collectives: the empty tables keep their schema through both forms
    assert s.colls.height == 0
    assert RankSummary.from_bytes(s.to_bytes()) == s
    r = summ.read(s.write(tmp_path / "big"))
    assert r == s and r.colls.schema == s.colls.schema


def test_bytes_do_not_depend_on_polars_threads_or_hash_seed(tmp_path):
    """The scale-out compares job outputs byte for byte across executors, whose workers set
    POLARS_MAX_THREADS differently: float sums, chunking and string layout must not leak."""
    import subprocess
    import sys

    files = [
        two_steps().write(tmp_path / "node7_1234.1700000000000000000.pt.trace.json"),
        SAMPLES / "convnet_dataloader-main.json.gz",
        *sorted((DATA / "gloo_ddp_cpu").glob("*.pt.trace.json.gz")),
    ]
    out = {}
    for n in (1, 3):
        code = (
            "import sys\nfrom tracedx.job.summary import summarize_path\n"
            f"for i, f in enumerate({[str(f) for f in files]!r}):\n"
            "    s = summarize_path(f)\n"
            f"    open(f'{tmp_path}/b{{i}}_{n}', 'wb').write(s.to_bytes())\n"
            f"    s.write(f'{tmp_path}/d{{i}}_{n}')\n"
        )
        # and another str hash seed: no set or dict order may leak either
        env = {**os.environ, "POLARS_MAX_THREADS": str(n), "PYTHONHASHSEED": str(n)}
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        out[n] = [(tmp_path / f"b{i}_{n}").read_bytes() for i in range(len(files))]
        for i in range(len(files)):
            d = tmp_path / f"d{i}_{n}"
            out[n] += [(d / p).read_bytes() for p in sorted(os.listdir(d))]
    assert out[1] == out[3]


def test_gloo_pair_orders_agree():
    """Without process-group fields, gloo collectives can only be matched by (step, ordinal):
    the two ranks of the captured job list the same operations in the same order."""
    a, b = (summarize_path(f) for f in sorted((DATA / "gloo_ddp_cpu").glob("*.pt.trace.json.gz")))
    key = ["step", "ordinal", "coll_type", "in_nelems", "dtype"]
    assert a.colls.select(key).rows() == b.colls.select(key).rows()
