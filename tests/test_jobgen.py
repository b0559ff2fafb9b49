"""The job generator itself: loadable traces that hold exactly the numbers it says it built."""

from __future__ import annotations

import json

import polars as pl
import pytest
from jobgen import NCCL_KERNEL, JobSpec, comms_id, generate

import tracedx
from tracedx.job.discover import rank_from_filename
from tracedx.job.summary import TB_NAME_RE


def _events(path):
    return json.loads(open(path).read())


def _kernels(doc, nccl: bool):
    return [
        e
        for e in doc["traceEvents"]
        if e.get("cat") == "kernel" and (e["name"] == NCCL_KERNEL) == nccl
    ]


def _steps(doc):
    return sorted(
        int(e["name"].split("#")[1])
        for e in doc["traceEvents"]
        if str(e.get("name", "")).startswith("ProfilerStep#")
    )


def test_dp_tp_job_truth_is_self_consistent_and_in_the_files(tmp_path):
    spec = JobSpec(world=4, tp=2, straggler=1, straggler_kind="host", straggler_pct=300)
    job = generate(spec, tmp_path)
    assert job.straggler == 1 and job.cause == "host"
    colls = job.collectives
    # every member of one collective ends together; the last arriver waits 0
    per_op = colls.group_by("comms_id").agg(
        pl.col("end_us").n_unique().alias("ends"),
        pl.col("rank").len().alias("n"),
        (pl.col("wait_us").min()).alias("min_wait"),
        (pl.col("rank") == pl.col("last_arriver")).sum().alias("last"),
    )
    assert per_op["ends"].to_list() == [1] * len(per_op)
    assert set(per_op["n"]) == {2} and set(per_op["min_wait"]) == {0.0}
    # the host straggler (300% of 100 us more host work) makes its TP peer wait 300 us at the
    # first TP all-reduce of each step, and the other DP replica 300 us at the DP all-reduce
    s11 = job.rank_steps.filter(pl.col("step") == 11).sort("rank")
    assert s11["host_us"].to_list() == [100.0, 400.0, 100.0, 100.0]
    assert s11["wait_us"].to_list() == [300.0, 0.0, 300.0, 300.0]
    assert s11["transfer_us"].to_list() == [4 * 40.0 + 300.0] * 4
    assert s11["compute_us"].to_list() == [1250.0] * 4
    for r, path in job.paths.items():
        doc = _events(path)
        assert doc["distributedInfo"]["rank"] == r
        assert doc["distributedInfo"]["world_size"] == 4
        assert {pg["pg_desc"] for pg in doc["distributedInfo"]["pg_config"]} == {
            "default_pg", "mesh_tp", "mesh_dp"
        }  # fmt: skip
        assert _steps(doc) == [10, 11, 12, 13]
        nccl = _kernels(doc, True)
        assert len(nccl) == 4 * (2 * 2 + 1)  # per step: 4 TP + 1 DP all-reduce
        k = nccl[0]["args"]
        assert k["Collective name"] == "allreduce" and k["dtype"] == "BFloat16"
        assert k["Group size"] == 2 and k["In msg nelems"] == spec.tp_nelems
        mine = colls.filter(pl.col("rank") == r).sort("start_us")
        assert [e["args"]["Comms Id"] for e in nccl] == [int(c) for c in mine["comms_id"]]
        assert [e["dur"] for e in nccl] == (mine["end_us"] - mine["start_us"]).to_list()
        compute = sum(e["dur"] for e in _kernels(doc, False))
        truth = job.rank_steps.filter(pl.col("rank") == r)["compute_us"].sum()
        assert compute == pytest.approx(truth)
        waits = [
            e for e in doc["traceEvents"] if e.get("args", {}).get("Collective name") == "wait"
        ]
        assert len(waits) == 4 and all(e["cat"] == "cpu_op" for e in waits)


def test_traces_load_and_diagnose(tmp_path):
    job = generate(JobSpec(world=2), tmp_path)
    for path in job.paths.values():
        diag = tracedx.diagnose(tracedx.load(path))
        assert diag.regime  # a verdict on every rank
        assert len(tracedx.load(path).steps) == 4


def test_compute_straggler_and_its_removal(tmp_path):
    spec = JobSpec(world=4, straggler=2, straggler_kind="compute", straggler_pct=20)
    job = generate(spec, tmp_path / "a")
    s = job.rank_steps.filter(pl.col("step") == 11).sort("rank")
    assert s["compute_us"].to_list() == [1250.0, 1250.0, 1500.0, 1250.0]
    # the others wait for the straggler's extra 240 us of forward and backward at the DP
    # all-reduce (its longer optimizer kernel runs under the next step's host work)
    assert s["wait_us"].to_list() == [240.0, 240.0, 0.0, 240.0]
    fixed = generate(spec.without_straggler(), tmp_path / "b")
    assert fixed.straggler is None and fixed.cause is None
    f = fixed.rank_steps.filter(pl.col("step") == 11)
    assert set(f["wait_us"]) == {0.0} and set(f["compute_us"]) == {1250.0}
    # the straggler's excess is exactly what the step loses
    assert s["cpu_step_us"][0] - f["cpu_step_us"][0] == pytest.approx(240.0)


def test_clock_offset_moves_every_event_of_a_host(tmp_path):
    job = generate(JobSpec(world=4, ranks_per_host=2, theta_us=(0.0, 1234.5)), tmp_path)
    assert job.theta_us == {"node0": 0.0, "node1": 1234.5}
    assert job.hosts == {0: "node0", 1: "node0", 2: "node1", 3: "node1"}
    # a DP all-reduce ends at one simulated time on all ranks: the files differ by theta
    ends = {
        r: [e["ts"] + e["dur"] for e in _kernels(_events(p), True)] for r, p in job.paths.items()
    }
    assert ends[1] == ends[0]
    assert [b - a for a, b in zip(ends[0], ends[2], strict=True)] == pytest.approx([1234.5] * 4)


def test_windows_missing_rank_and_file_names(tmp_path):
    spec = JobSpec(world=4, windows={1: (11, 13), 3: (10, 12)}, missing=(2,), names="tensorboard")
    job = generate(spec, tmp_path)
    assert sorted(job.paths) == [0, 1, 3]
    assert job.steps == {0: [10, 11, 12, 13], 1: [11, 12, 13], 3: [10, 11, 12]}
    assert _steps(_events(job.paths[1])) == [11, 12, 13]
    for r, p in job.paths.items():
        assert TB_NAME_RE.match(p.name)["host"] == "node0" and rank_from_filename(p) is None
        assert _events(p)["distributedInfo"]["rank"] == r
    assert rank_from_filename(generate(JobSpec(world=2, names="hta"), tmp_path / "h").paths[1]) == 1


def test_without_seq_comms_id_or_kernel_args(tmp_path):
    job = generate(JobSpec(world=2, seq=False, comms_id=False, kernel_args=False), tmp_path)
    doc = _events(job.paths[0])
    k = _kernels(doc, True)[0]["args"]
    assert "Collective name" not in k and "Seq" not in k and "Comms Id" not in k
    rpc = [
        e
        for e in doc["traceEvents"]
        if e.get("name") == "record_param_comms" and e["args"]["Collective name"] == "allreduce"
    ]
    assert rpc[0]["args"]["External id"] == _kernels(doc, True)[0]["args"]["External id"]
    assert "Seq" not in rpc[0]["args"] and rpc[0]["args"]["Rank"] == 0


def test_shared_pg_name_between_subgroups(tmp_path):
    job = generate(JobSpec(world=4, tp=2, shared_pg_name=True), tmp_path)
    tp = job.collectives.filter(pl.col("group") == "tp")
    assert tp["pg_name"].unique().to_list() == ["1"]
    assert sorted(tp["pg_ranks"].unique()) == ["[0, 1]", "[2, 3]"]
    # Comms Id still tells the two groups' operations apart
    assert tp.group_by("comms_id").len()["len"].to_list() == [2] * (len(tp) // 2)


def test_deterministic_and_unsigned_ids(tmp_path):
    a = generate(JobSpec(world=2), tmp_path / "a")
    b = generate(JobSpec(world=2), tmp_path / "b")
    assert a.paths[0].read_bytes() == b.paths[0].read_bytes()
    ids = [comms_id("0", [0, 1], s) for s in range(1, 200)]
    assert max(ids) >= 2**63  # values above int64 exist, as in real traces


def test_long_group_ranks_are_truncated_like_pytorch(tmp_path):
    job = generate(JobSpec(world=32, steps=1, layers=1), tmp_path)
    pg = job.collectives["pg_ranks"][0]
    assert pg.endswith(", 29, ...]") and pg.startswith("[0, 1, 2")
