"""The reader's collective metadata (events.CommArgs, tables' side table) and Trace.collectives."""

from __future__ import annotations

import polars as pl
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
