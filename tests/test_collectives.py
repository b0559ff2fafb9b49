"""The reader's collective metadata (events.CommArgs, tables' side table) and Trace.collectives."""

from __future__ import annotations

import polars as pl
import pytest
from tracebuilder import T0, TraceBuilder

import tracedx
from tracedx.job.summary import summarize
from tracedx.trace.collectives import parse_ranks


def _one(b: TraceBuilder, tmp_path, name="t.json"):
    return tracedx.load(b.write(tmp_path / name))


def test_arg_value_forms(tmp_path):
    """Comms Id beyond int64, negative (a signed writer) or text; Seq as text; PG name an int."""
    b = TraceBuilder()
    b.step(1, T0, 500)
    b.collective(T0 + 10, 5, T0 + 20, 10, comms_id=2**64 - 1, seq=1)
    b.collective(T0 + 40, 5, T0 + 50, 10, comms_id=-1, seq=2)
    e = b.collective(T0 + 70, 5, T0 + 80, 10)
    for ev in b.events:  # the third one's op and kernel (same External id): other forms
        a = ev.get("args", {})
        if a.get("External id") == e:
            a.update({"Comms Id": "12345", "Seq": "3", "Process Group Name": 7})
    c = _one(b, tmp_path).collectives
    assert c["comms_id"].to_list() == [str(2**64 - 1), str(2**64 - 1), "12345"]
    assert c["seq"].to_list() == [1, 2, 3]
    assert c["pg_name"].to_list() == ["0", "0", "7"]


def test_fields_come_from_the_op_when_the_kernel_lacks_them(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 500)
    b.collective(
        T0 + 10, 5, T0 + 20, 10, rank=1, **{"Global rank start": 0, "Global rank stride": 2}
    )
    r = _one(b, tmp_path).collectives.row(0, named=True)
    assert r["meta_source"] == "kernel"
    # Rank and the global layout are written on the op only
    assert (r["rank"], r["rank_start"], r["rank_stride"]) == (1, 0, 2)
    assert r["seq"] is None and r["comms_id"] is None  # missing Seq: null, never a guess


def test_kernel_without_any_metadata(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 500)
    b.launched_kernel("aten::foo", T0 + 5, 10, T0 + 30, 10, kname="ncclDevKernel_Generic", stream=0)
    c = _one(b, tmp_path).collectives
    assert c.height == 1
    assert c["coll_type"][0] == "unknown" and c["meta_source"][0] is None


def test_rccl_generic_kernel_gets_its_type_from_the_op(tmp_path):
    b = TraceBuilder(hip=True)
    b.step(1, T0, 500)
    b.collective(
        T0 + 10, 5, T0 + 20, 10, collective="_allgather_base", on_kernel=False,
        kname="ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", stream=0,
        in_nelems=10, out_nelems=20,
    )  # fmt: skip
    r = _one(b, tmp_path).collectives.row(0, named=True)
    assert (r["coll_type"], r["meta_source"], r["out_nelems"]) == (
        "all_gather",
        "record_param_comms",
        20,
    )


def test_rank_ignores_p2p_and_other_groups(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 500)
    # a send writes the peer's group rank; a subgroup writes the rank in the subgroup
    b.collective(T0 + 10, 5, T0 + 20, 10, collective="send", rank=1, **{"Dst Rank": 1})
    b.collective(T0 + 40, 5, T0 + 50, 10, rank=0, pg_name="3", pg_desc="mesh_tp")
    b.collective(T0 + 70, 5, T0 + 80, 10, rank=2, group_size=4, pg_ranks="[0, 1, 2, 3]")
    t = _one(b, tmp_path)
    s = summarize(t)
    assert (s.meta["rank"], s.meta["rank_source"]) == (2, "record_param_comms")
    c = t.collectives
    assert c["coll_type"].to_list() == ["send", "all_reduce", "all_reduce"]
    assert c["dst_rank"].to_list() == [1, None, None]


@pytest.mark.parametrize(
    "dtype, size",
    [("long", 8), ("int", 4), ("short", 2), ("bool", 1), ("double", 8), ("half", 2),
     ("long int", 8), ("float", 4)],
)  # fmt: skip
def test_input_type_spellings_have_sizes(tmp_path, dtype, size):
    """``Input type`` spellings of a gloo annotation's tensor: 256 elements x the size."""
    b = TraceBuilder(device_name=None)
    b.op("aten::addmm", T0, 100)
    b.gloo("gloo:all_reduce", T0 + 50, 200, dims=[[256]], dtype=dtype)
    s = summarize(_one(b, tmp_path))
    assert s.colls["msg_bytes"].to_list() == [256 * size]


def test_gloo_without_steps(tmp_path):
    b = TraceBuilder(device_name=None)
    b.op("aten::addmm", T0, 100)
    b.gloo("gloo:all_reduce", T0 + 50, 200, dims=[[256]], dtype="float")
    b.gloo("gloo:barrier", T0 + 300, 10)
    t = _one(b, tmp_path)
    c = t.collectives
    assert c["coll_type"].to_list() == ["all_reduce", "barrier"]
    assert c["host_side"].all() and c["step"].to_list() == [0, 0]
    s = summarize(t)
    row = s.steps.row(0, named=True)
    # host compute: aten::addmm [0, 100]; comm [50, 250] u [300, 310] = 210; overlap 50
    assert (row["compute_us"], row["comm_us"], row["comm_overlap_us"], row["exposed_comm_us"]) == (
        100.0,
        210.0,
        50.0,
        160.0,
    )
    assert s.colls["msg_bytes"].to_list() == [1024, None]
    assert s.colls["free_us"].to_list()[0] == [{"start_us": 50.0, "end_us": 200.0}]


def test_parse_ranks():
    assert parse_ranks("[0, 1]") == [0, 1]
    assert parse_ranks("[]") == []
    head = ", ".join(str(2 * i) for i in range(30))
    cut = f"[{head}, ...]"
    assert parse_ranks(cut) is None  # truncated, nothing to complete it from
    assert parse_ranks(cut, 40, 0, 2) == list(range(0, 80, 2))
    assert parse_ranks(cut, 40, 1, 2) is None  # the layout disagrees with the listed prefix
    assert parse_ranks("not a list") is None and parse_ranks(None) is None


def test_no_collectives_no_side_rows(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 100)
    b.launched_kernel("aten::mm", T0 + 5, 10, T0 + 20, 30)
    t = _one(b, tmp_path)
    assert t.comm_args.height == 0 and t.collectives.height == 0
    assert t.collectives.schema["comms_id"] == pl.Utf8


def _peer_notes(t) -> list[str]:
    return [n for n in tracedx.diagnose(t).notes if "waiting for the other ranks" in n]


def test_one_rank_of_a_job_note(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 500)
    b.launched_kernel("aten::mm", T0 + 5, 10, T0 + 20, 100)
    b.collective(T0 + 30, 5, T0 + 130, 200, group_size=1, pg_ranks="[0]")
    assert _peer_notes(_one(b, tmp_path, "one.json")) == []  # a group of one: nobody to wait for
    b.top["distributedInfo"] = {"backend": "nccl", "rank": 1, "world_size": 4}
    (note,) = _peer_notes(_one(b, tmp_path, "four.json"))
    # one step: the NCCL kernel's 200 us
    assert note.startswith(
        "this trace is one rank of a 4-rank job: its communication kernels (0.200 ms per step)"
    )
    del b.top["distributedInfo"]
    b.collective(T0 + 300, 5, T0 + 400, 50)  # group size 2
    (note,) = _peer_notes(_one(b, tmp_path, "two.json"))
    assert note.startswith(
        "this trace is one rank of a multi-rank job: its communication kernels (0.250 ms"
    )


def test_one_rank_of_a_gloo_job_note():
    from conftest import DATA

    (f, _) = sorted((DATA / "gloo_ddp_cpu").glob("*.pt.trace.json.gz"))
    (note,) = _peer_notes(tracedx.load(f))
    assert note.startswith("this trace is one rank of a 2-rank job: its collectives include")


def test_distributed_info_as_text(tmp_path):
    """Kineto's on-demand path writes distributedInfo values as text."""
    b = TraceBuilder()
    b.step(1, T0, 500)
    b.collective(T0 + 10, 5, T0 + 20, 10, rank=0)
    b.top["distributedInfo"] = {"backend": "nccl", "rank": "3", "world_size": "8"}
    s = summarize(_one(b, tmp_path))
    assert (s.meta["rank"], s.meta["rank_source"], s.meta["world_size"]) == (
        3,
        "distributedInfo",
        8,
    )


def test_rank_disagreements_are_notes(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 500)
    b.collective(T0 + 10, 5, T0 + 20, 10, rank=1, group_size=4, pg_ranks="[0, 1, 2, 3]")
    b.top["distributedInfo"] = {"backend": "nccl", "rank": 2, "world_size": 8}
    s = summarize(_one(b, tmp_path))
    assert s.meta["rank"] == 2
    assert (
        "the default group's record_param_comms give rank 1, distributedInfo rank 2"
        in s.meta["notes"]
    )
    assert (
        "the default group's record_param_comms give group size 4, distributedInfo world size 8"
        in s.meta["notes"]
    )


def test_what_gloo_writes_for_each_collective():
    """tests/data/gloo_ddp_cpu/README.md lists the calls of this capture (torch 2.13, CPU)."""
    from conftest import DATA

    c = tracedx.load(DATA / "gloo_ddp_cpu" / "collective_kinds_rank0.json.gz").collectives
    assert c["host_side"].all()
    got = c.select("coll_type", "in_nelems", "out_nelems").rows()
    assert sorted(got, key=str) == sorted(
        [
            ("all_gather", 8, None),  # the output's size (8 x group size) is not in the label
            ("all_gather", 8, None),
            ("all_reduce", 8, 8),  # reduce_scatter (a list): two all-reduces
            ("all_reduce", 8, 8),
            ("all_reduce", 16, 16),  # reduce_scatter_tensor: its input
            ("all_reduce", 7, 7),  # all_reduce_coalesced: [[4], [3]]
            ("all_to_all", 8, 8),
            ("all_to_all", 8, 8),
            ("reduce", 8, 8),
            ("gather", 8, None),
            ("scatter", 8, None),
            ("send", 8, None),
            ("send", 8, None),
            ("recv", 8, None),
        ],
        key=str,
    )
    s = summarize(tracedx.load(DATA / "gloo_ddp_cpu" / "collective_kinds_rank0.json.gz"))
    assert s.colls.filter(pl.col("coll_type") == "all_gather")["msg_bytes"].to_list() == [32, 32]


def test_kernel_args_without_device_and_stream(tmp_path):
    """Device and stream from pid/tid, as for the kernels table: the kernel's own args still
    join it."""
    b = TraceBuilder()
    b.step(1, T0, 500)
    b.collective(T0 + 10, 5, T0 + 20, 10, seq=9, stream=20)
    for ev in b.events:
        if ev.get("cat") == "kernel":
            del ev["args"]["device"], ev["args"]["stream"]
    r = _one(b, tmp_path).collectives.row(0, named=True)
    assert (r["device"], r["stream"], r["meta_source"], r["seq"]) == (0, 20, "kernel", 9)


def test_collectives_and_memory_events_stay_on_the_fast_reader(tmp_path, monkeypatch):
    """A chunk with collective metadata and [memory] instant events is read by the fast reader
    (it had no instant event type with collective args, so the whole trace went to the
    reference reader), with the same tables."""
    from tracedx.trace import source
    from tracedx.trace.tables import TableBuilder

    b = TraceBuilder()
    b.step(1, T0, 500)
    b.collective(T0 + 10, 5, T0 + 20, 10, seq=9)
    mem = {"Total Reserved": 4096, "Total Allocated": 512, "Bytes": 512, "Device Id": 0}
    b.events.append(
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": T0 + 12,
         "args": {**mem, "Device Type": 1}}
    )  # fmt: skip
    p = b.write(tmp_path / "t.json")
    fast = tracedx.load(p)

    def refuse(*a, **k):
        raise source._NotFast("the reference reader, for comparison")

    monkeypatch.setattr(source, "_read_fast", refuse)
    ref = tracedx.load(p)
    monkeypatch.undo()
    assert source.has_comms(p.read_bytes())
    source._read_fast(p, TableBuilder())  # no _NotFast: no fall-back
    assert fast.memory.height == ref.memory.height == 1
    assert fast.memory["reserved_bytes"].to_list() == [4096]
    assert fast.comm_args.height == ref.comm_args.height > 0
    for t in ("kernels", "ops", "memory", "comm_args", "launches"):
        assert getattr(fast, t).equals(getattr(ref, t), null_equal=True), t
