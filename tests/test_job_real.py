"""The job verdict on real multi-rank traces, read as a performance engineer would read it."""

from __future__ import annotations

import pytest
from conftest import CASES, DATA, PUBLIC, ROOT

from tracedx.job.diagnosis import diagnose_job
from tracedx.job.load import load_job


def test_gloo_cpu_ddp_pair_is_communication_bound():
    """A tiny MLP under CPU DDP on gloo: each step's gradient all-reduce (5.9 ms) dwarfs its
    0.5 ms of compute, and neither rank waits for the other: communication binds, no straggler,
    one verdict for both ranks."""
    files = sorted(str(p) for p in (DATA / "gloo_ddp_cpu").glob("vm_*.pt.trace.json.gz"))
    assert len(files) == 2
    jd = diagnose_job(load_job(files, progress=False))
    assert jd.job.ranks == [0, 1] and jd.typical["step_us"] > 0
    # CPU only: no regime (the regimes describe a GPU), communication the bottleneck
    assert jd.regime is None and jd.bottleneck == "communication"
    assert jd.straggler is None
    assert jd.ranks["regime"].n_unique() == 1 and jd.ranks["bottleneck"].n_unique() == 1
    t = jd.typical
    assert t["exposed_transfer_us"] > 5 * t["compute_us"]
    assert t["exposed_wait_us"] < 0.05 * t["step_us"]
    assert set(jd.collectives["status"]) == {"ok"}
    assert not any("has 2 files" in n or "different ProfilerStep" in n for n in jd.notes)


def test_gloo_balanced_sample_is_bound_by_cpu_compute():
    """sample_traces' balanced CPU gloo DDP pair (captured on an idle 16-core CPU): both ranks
    compute about as long (median per step 1.756 and 1.817 ms: load balance = mean / max =
    1.7865 / 1.817 = 0.983), no rank paces the other, and the median rank's compute (1.787
    ms) is longer than its exposed communication (0.282 transfer + 0.043 wait): CPU compute
    binds. No GPU activity: no regime and no device line."""
    jd = diagnose_job(
        load_job([str(ROOT / "sample_traces" / "ddp_mlp-gloo-balanced")], progress=False)
    )
    t = jd.typical
    compute = dict(zip(jd.ranks["rank"], jd.ranks["compute_us"], strict=True))
    assert compute == {0: pytest.approx(1755.7, abs=0.05), 1: pytest.approx(1817.3, abs=0.05)}
    assert t["load_balance"] == pytest.approx((compute[0] + compute[1]) / 2 / compute[1])
    assert t["compute_us"] == pytest.approx((compute[0] + compute[1]) / 2)  # median of two
    exposed = t["exposed_transfer_us"] + t["exposed_wait_us"] + t["exposed_unsplit_us"]
    assert exposed == pytest.approx(325.45, abs=0.05) and exposed < t["compute_us"]
    assert jd.straggler is None
    assert jd.regime is None and jd.bottleneck == "CPU compute"
    assert jd.evidence[0].startswith("no GPU activity in the ranks' traces")
    assert not any("device work" in e for e in jd.evidence)
    # the job step (2.935 ms: per step the mean of the 2 ranks, then the median over 10 steps)
    # is below both ranks' own median steps (2.937 and 2.956 ms): the line says it can be
    assert round(t["step_us"] / 1e3, 3) == 2.935
    assert jd.ranks["step_time_us"].round(0).to_list() == [2956.0, 2937.0]
    assert jd.evidence[2].endswith(
        "the ranks' own median steps 2.937 to 2.956 ms (spread 0.6% of the step; the job step is "
        "below them: a median of per-step medians need not lie between the ranks' own medians)"
    )


def test_ranks_of_two_runs_are_said_to_be_so():
    """rank 0 of the balanced gloo run and rank 1 of the straggler run, given as files: their
    collectives match by sequence number, but on their one host's clock the two never ran at
    the same time (13.4 s apart), which the job's notes say; the balanced run's own two ranks
    get no such note."""
    runs = ROOT / "sample_traces"
    mixed = diagnose_job(
        load_job(
            [
                str(runs / "ddp_mlp-gloo-balanced" / "rank0.json.gz"),
                str(runs / "ddp_mlp-gloo-host-straggler" / "rank1.json.gz"),
            ],
            progress=False,
        )
    )
    [note] = [n for n in mixed.notes if "different runs" in n]
    assert note.startswith("rank 0's collectives all end 13.4 s before rank 1's first")
    one = diagnose_job(load_job([str(runs / "ddp_mlp-gloo-balanced")], progress=False))
    assert not any("different runs" in n for n in one.notes)
    # the reports say it before the verdict, not only in the notes at the end
    from tracedx.report.job import RUNS_APART_WARNING, render_markdown, render_text

    assert mixed.clock.runs_apart and not one.clock.runs_apart
    text = render_text(mixed)
    assert text.index("WARNING: these ranks never ran") < text.index("JOB VERDICT")
    assert RUNS_APART_WARNING in render_markdown(mixed).split("**Verdict:**")[0]
    assert "WARNING" not in render_text(one)


def test_ranks_of_two_runs_get_no_shares_of_a_step_they_never_shared():
    """rank 0 of the straggler run (31.427 ms exposed wait per step, for its own slow peer)
    and rank 1 of the balanced run: they never ran together, so the job's step (18.671 ms,
    medians over the two) is no step either ran; shares of it (wait 84%, effect 168.3% before)
    are not printed: the parts are in ms with their range over ranks, said once why, and the
    JSON's straggler effect and efficiencies are null. The balanced run keeps its shares."""
    import json

    from tracedx.report.job import render_json, render_text
    from tracedx.report.job_html import render_job_html

    runs = ROOT / "sample_traces"
    files = [
        str(runs / "ddp_mlp-gloo-host-straggler" / "rank0.json.gz"),
        str(runs / "ddp_mlp-gloo-balanced" / "rank1.json.gz"),
    ]
    mixed = diagnose_job(load_job(files, progress=False))
    assert mixed.clock.runs_apart and mixed.straggler is not None
    ev = mixed.evidence
    assert ev[2] == (
        "step 18.671 ms: per step the median over ranks, then the median over steps; the ranks' "
        "own median steps 2.937 to 34.349 ms"
    )
    assert ev[3] == (
        "the median rank's step (per figure, the median over ranks of each rank's median over "
        "its steps; with 2 ranks, their mean): compute 1.597 ms (1.377-1.817 ms over ranks), "
        "exposed wait 15.714 ms "
        "(0.001-31.427 ms over ranks), exposed transfer 0.292 ms (0.266-0.317 ms over ranks), "
        "other 0.972 ms (0.881-1.062 ms over ranks) per step; no shares of the job's step: the "
        "ranks never ran at the same time, so they share no step to divide"
    )
    assert (
        "effect: the other ranks wait 31.427 ms per step exposed (median over them of each "
        "one's median per step)"
    ) in ev
    assert not any("of the step" in x for x in ev)
    doc = json.loads(render_json(mixed))
    assert doc["straggler"]["effect"] is None
    assert doc["steps"]["parallel_efficiency"] is None
    assert doc["steps"]["communication_efficiency"] is None
    assert "168" not in render_text(mixed).split("FIXES")[0]
    # nor an Amdahl estimate against the 18.671 ms that no rank ran: the fixes are withheld
    # (before: "FIXES (Amdahl against the job's step T = 18.671 ms)" and overlap-communication
    # 1.02x against it)
    assert mixed.findings == [] and doc["findings"] == []
    text = " ".join(render_text(mixed).split())
    assert (
        "FIXES: none estimated: the ranks never ran at the same time, so they share no job step "
        "T to price a fix against (Amdahl); each rank's trace diagnosed alone estimates its "
        "fixes against its own step"
    ) in text
    assert "Amdahl against" not in text and "18.671 ms)" not in text
    assert "top fixes: none estimated (the ranks never ran at the same time" in repr(mixed)
    assert "no share of a step" in render_job_html(mixed)
    one = diagnose_job(load_job([str(runs / "ddp_mlp-gloo-balanced")], progress=False))
    assert any(x.endswith("of the step") for x in one.evidence)
    assert json.loads(render_json(one))["steps"]["parallel_efficiency"] is not None


def test_c16_nccl_pair_one_verdict():
    """C16a/b: two ranks of one NCCL job whose single-rank verdicts differ (compute-bound on
    rank 0, bandwidth-bound on rank 1): the job gets one, compute-bound, and the all-reduce is
    matched on both ranks."""
    a, b = CASES / "C16a_rank0_nccl_overlap.json", CASES / "C16b_rank1_nccl_overlap.json"
    if not a.exists():
        pytest.skip("../shared/cases is not present")
    jd = diagnose_job(load_job([str(a), str(b)], progress=False))
    assert jd.regime == "compute-bound"
    assert jd.ranks["regime"].n_unique() == 1
    c = jd.collectives.row(0, named=True)
    assert c["status"] == "ok" and c["members"] == 2 and c["coll_type"] == "all_reduce"
    assert any("single-rank verdicts" in n for n in jd.notes)


def test_hta_sampled_ranks_mismatches_are_flagged():
    """Two ranks of a 128-rank 2023 job with no process-group metadata: matched by order within
    the step, the collectives that disagree in type, dtype or size are flagged and left out,
    never paired silently; the 126 missing ranks are a note."""
    p = PUBLIC / "hta"
    files = [p / "trace_filter__sampled_rank-0.json.gz", p / "trace_filter__sampled_rank-1.json.gz"]
    if not files[0].exists():
        pytest.skip("../shared/public_traces is not present")
    jd = diagnose_job(load_job([str(f) for f in files], progress=False))
    st = set(jd.collectives["status"])
    # no group metadata: the default group spans the world of 128 ranks, 2 present: partial
    assert "partial" in st and "ok" not in st
    assert st & {"type mismatch", "dtype mismatch", "size mismatch"}
    assert set(jd.collectives["group_size"]) == {128}
    bad = jd.collectives.filter(~jd.collectives["usable"])
    assert bad["transfer_us"].null_count() == bad.height
    assert any("mismatch between their ranks" in n for n in jd.notes)
    assert any("126 ranks" in n for n in jd.notes)
    assert jd.regime == "overhead-bound"


def test_gloo_host_straggler_sample_names_rank_1_for_host_work():
    """sample_traces' CPU gloo DDP pair: rank 1 spins 30 ms of Python before each forward. Over
    its 10 steps rank 1 waits least in every one (paces them): p = 2^-10 = 0.00098, below
    0.01 / 2 ranks (Bonferroni); the cause is host work, and balance-ranks saves at most the
    others' exposed wait."""
    s = ROOT / "sample_traces"
    jd = diagnose_job(load_job([str(s / "ddp_mlp-gloo-host-straggler")], progress=False))
    a = jd.straggler_test.arrivals.filter(jd.straggler_test.arrivals["rank"] == 1).row(
        0, named=True
    )
    assert a["last"] == 10 and a["steps"] == 10 and a["p_value"] == pytest.approx(2.0**-10)
    assert jd.straggler is not None and jd.straggler.rank == 1
    assert jd.straggler.cause == "host work"
    bal = next(f for f in jd.findings if f.fix == "balance-ranks")
    assert bal.estimated_speedup > 1.5
    # the 30 ms spin is host time outside ops and collectives: "other", per rank-step the step
    # less compute and exposed communication (no GPU: no idle)
    s = jd.steps
    assert s["other_us"].to_list() == pytest.approx(
        (s["step_time_us"] - s["compute_us"] - s["exposed_comm_us"]).clip(0).to_list()
    )
    other = dict(zip(jd.ranks["rank"], jd.ranks["other_us"], strict=True))
    assert other[1] > 30_000 > 2_000 > other[0]
    assert "other 47% (3-92% over ranks)" in " ".join(jd.evidence)
    # POP's load balance over compute reads mild (0.79 = 1.881 / 2.385 ms) while 30 of rank 1's
    # 31 ms excess is outside compute: beside it, the same ratio over the step less exposed
    # communication (per rank the median over steps: 18.167 / 33.921 ms mean / max = 0.54)
    w = dict(zip(jd.ranks["rank"], jd.ranks["outside_comm_us"], strict=True))
    assert jd.typical["load_balance_outside_comm"] == (w[0] + w[1]) / 2 / w[1]
    doc = jd.to_dict()
    assert doc["steps"]["load_balance_outside_comm"] == jd.typical["load_balance_outside_comm"]
    assert doc["steps"]["outside_comm_ms"] == round((w[0] + w[1]) / 2 / 1e3, 6)
    assert [r["outside_comm_ms"] for r in doc["ranks"]] == [
        round(w[0] / 1e3, 6),
        round(w[1] / 1e3, 6),
    ]
    assert round(w[0] / 1e3, 3) == 2.412 and round(w[1] / 1e3, 3) == 33.921
    assert (
        "load balance 0.79 of compute (POP's: mean / max over ranks of each rank's median per "
        "step, 1.881 / 2.385 ms); 0.54 of step time less exposed communication (the same ratio, "
        "18.167 / 33.921 ms)"
    ) in jd.evidence
    assert (
        "parallel efficiency 0.05 (POP's: load balance x communication efficiency = mean compute "
        "/ T = 1.881 / 34.322 ms)"
    ) in jd.evidence
    # with 2 ranks the 'median rank' figures are the mean of both: the repr and the overlap fix
    # say so, and the repr's parallel efficiency (1.881 / 34.322 = 5%) says what it is
    assert (
        "compute 1.881 ms (mean of the 2 ranks); exposed wait 15.583 ms, transfer 0.597 ms (mean "
        "of the 2 ranks); parallel efficiency 5% (POP's: mean compute over ranks / step)"
    ) in " ".join(repr(jd).split())
    ov = next(f for f in jd.findings if f.fix == "overlap-communication")
    assert ov.evidence[0] == (
        "exposed transfer 0.597 ms per step (mean of the 2 ranks); exposed waiting 15.583 ms is "
        "not transfer and stays"
    )


def test_folder_of_two_jobs_and_a_single_trace_is_refused(tmp_path, monkeypatch):
    """sample_traces/ in small: the two gloo job folders beside a single-GPU trace were read as
    one job of 3 ranks (two of them duplicates); now one line naming what is there, exit 2.
    The files' heads (distributedInfo before traceEvents, as Kineto writes it) already show
    the two whole rank sets: refused before any rank is summarised."""
    import shutil

    import tracedx.job.executor

    s = ROOT / "sample_traces"
    for job in ("ddp_mlp-gloo-balanced", "ddp_mlp-gloo-host-straggler"):
        shutil.copytree(s / job, tmp_path / job)
    shutil.copy(s / "matmul-bf16.json.gz", tmp_path)

    def no_map(*a, **k):
        raise AssertionError("a rank was summarised")

    monkeypatch.setattr(tracedx.job.executor, "map_ranks", no_map)
    _assert_two_jobs_refused(tmp_path, "1 other file")


def test_two_jobs_whose_heads_say_nothing_are_refused_after_reading(tmp_path):
    """The same folder with each rank's distributedInfo written after its events (a head that
    tells nothing): every trace is summarised, then the full check refuses it, naming the
    single-GPU trace as such."""
    import gzip
    import json
    import shutil

    s = ROOT / "sample_traces"
    for job in ("ddp_mlp-gloo-balanced", "ddp_mlp-gloo-host-straggler"):
        (tmp_path / job).mkdir()
        for r in (0, 1):
            doc = json.loads(gzip.decompress((s / job / f"rank{r}.json.gz").read_bytes()))
            dist = doc.pop("distributedInfo")
            (tmp_path / job / f"rank{r}.json").write_text(
                json.dumps({**doc, "distributedInfo": dist})
            )
    shutil.copy(s / "matmul-bf16.json.gz", tmp_path)
    _assert_two_jobs_refused(tmp_path, "1 single-GPU trace")


def _assert_two_jobs_refused(folder, others: str) -> None:
    """``tracedx diagnose folder`` (the two gloo jobs and matmul-bf16) exits 2 with one line."""
    from click.testing import CliRunner

    from tracedx.cli import main

    r = CliRunner().invoke(main, ["diagnose", str(folder), "--workers", "1", "--quiet"])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"tracedx: error: {folder}/ holds 2 whole rank sets, separate jobs or profiling "
        f"windows (ddp_mlp-gloo-balanced/, ddp_mlp-gloo-host-straggler/) and {others}; "
        "diagnose one of these folders, or one trace"
    ]
