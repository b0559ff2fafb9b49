"""The cross-rank half of the job diagnosis, on hand-made per-rank summaries.

Every expected figure is computed by hand in the test from the summaries it builds.
"""

from __future__ import annotations

import json
import math
import random

import polars as pl
import pytest
import summarybuilder as sb

import tracedx
from tracedx.job.clock import estimate_offsets
from tracedx.job.diagnosis import Job, JobDiagnosis, diagnose_job
from tracedx.job.match import match_collectives
from tracedx.job.metrics import bus_factor
from tracedx.job.straggler import binomial_sf


def two_rank(nsteps: int = 25) -> list:
    """Rank 1 computes 1400 us, rank 0 1150 us (of which 150 us on another stream under its
    all-reduce); the all-reduce (100 MB, one host of H200s) ends at 1600 us on both.

    Rank 0's kernel: [1000, 1600], compute under it at [1100, 1300) -> free [100, 300] and
    [350, 600] (offsets); rank 1's kernel: [1400, 1600].
    """
    r0s, r1s, c0, c1 = [], [], [], []
    for k in range(nsteps):
        t0 = k * 2000.0
        r0s.append(sb.step(k, start=t0, time=1600, compute=1150, comm=600, overlap=150))
        r1s.append(sb.step(k, start=t0, time=1600, compute=1400, comm=200))
        c0.append(sb.coll(k, t0 + 1000, 600, free=[(100, 300), (350, 600)], seq=k))
        c1.append(sb.coll(k, t0 + 1400, 200, seq=k))
    return [sb.summary(0, r0s, c0), sb.summary(1, r1s, c1)]


def lateness_job(late: list[list[float]], *, base: float = 1000.0, tau: float = 200.0, **kw):
    """One all-reduce per step over all ranks; rank r computes ``base + late[k][r]`` then
    joins; all end together at ``base + max(late[k]) + tau``. No compute under the kernel."""
    n = len(late[0])
    ranks = f"[{', '.join(str(i) for i in range(n))}]"
    steps = [[] for _ in range(n)]
    colls = [[] for _ in range(n)]
    for k, row in enumerate(late):
        t0 = k * 10_000.0
        end = base + max(row) + tau
        for r in range(n):
            d = end - (base + row[r])
            steps[r].append(sb.step(k, start=t0, time=end, compute=base + row[r], comm=d))
            colls[r].append(sb.coll(k, t0 + base + row[r], d, seq=k, ranks=ranks, n=n))
    return [sb.summary(r, steps[r], colls[r], **kw) for r in range(n)]


# --- per collective, per rank-step, verdict and fixes: every figure by hand -------------------


def test_two_rank_figures():
    jd = diagnose_job(Job(two_rank()))
    c = jd.collectives.row(0, named=True)
    assert c["status"] == "ok" and c["match_key"] == "seq" and c["members"] == 2
    assert c["transfer_us"] == 200.0  # tau = min(600, 200)
    assert c["max_wait_us"] == 400.0  # rank 0: 600 - 200
    assert c["last_rank"] == 1  # one host: latest start (1400 > 1000)
    assert c["algbw_gbs"] == pytest.approx(1e8 / 200e-6 / 1e9)  # 500 GB/s
    assert c["busbw_gbs"] == pytest.approx(500.0 * 2 * (2 - 1) / 2)
    assert c["link"] == "NVLink 4" and c["link_gbs"] == 450.0  # 900 GB/s bidirectional / 2
    assert c["busbw_fraction"] == pytest.approx(500 / 450)
    m = jd.members.filter(pl.col("coll_id") == 0).sort("rank")
    assert m["wait_us"].to_list() == [400.0, 0.0]

    s = jd.steps.filter(pl.col("step") == 3).sort("rank")
    # rank 0: wait interval [0, 400] of its kernel, free at [100, 300] and [350, 600]:
    # exposed wait = 200 + 50 = 250; exposed comm = 600 - 150 = 450 -> transfer 200
    assert s["exposed_wait_us"].to_list() == [250.0, 0.0]
    assert s["exposed_comm_us"].to_list() == [450.0, 200.0]
    assert s["exposed_transfer_us"].to_list() == [200.0, 200.0]
    assert s["overlap_ratio"].to_list() == [150 / 600, 0.0]
    assert s["last_arrivals"].to_list() == [0, 1]

    t = jd.typical
    assert t["step_us"] == 1600.0
    assert t["load_balance"] == pytest.approx(((1150 + 1400) / 2) / 1400)
    assert t["communication_efficiency"] == pytest.approx(1400 / 1600)

    st = jd.straggler
    assert st is not None and st.rank == 1 and st.cause == "GPU compute"
    assert st.p_value == pytest.approx(0.5**25)  # last in 25 of 25, chance 1/2
    assert st.effect == pytest.approx(250 / 1600)  # rank 0's exposed wait / T
    assert st.consistency == 1.0
    assert st.excess_us == 250.0  # (1400 + 0) - (1150 + 0)
    assert jd.bottleneck == "load imbalance"

    f = {x.fix: x for x in jd.findings}
    # balance-ranks: G = min(250, 250); S = 1600 / 1350
    assert f["balance-ranks"].estimated_speedup == pytest.approx(1600 / 1350)
    assert f["balance-ranks"].fraction == pytest.approx(250 / 1600)
    assert math.isinf(f["balance-ranks"].local_speedup)
    # overlap: H = median(200, 200); U = median(1150, 1400) = 1275; M = 200
    # T' = max(1600 - 200, 1275, 200) = 1400
    assert f["overlap-communication"].estimated_speedup == pytest.approx(1600 / 1400)
    assert f["overlap-communication"].fraction == pytest.approx(200 / 1600)
    assert [x.fix for x in jd.findings] == ["balance-ranks", "overlap-communication"]
    r = jd.ranks.sort("rank")
    assert r["bottleneck"].to_list() == ["load imbalance (waits for rank 1)", "GPU compute"]


def test_overlap_bounded_by_compute_alone():
    """H = 300 exposed transfer, but compute alone is 1500 of a 1600 step: T' = 1500."""
    ss = []
    for r in (0, 1):
        st = [sb.step(k, time=1600, compute=1500, comm=400, overlap=100) for k in range(3)]
        cl = [sb.coll(k, k * 5000.0 + 1200 + r, 400, seq=k) for k in range(3)]
        ss.append(sb.summary(r, st, cl))
    jd = diagnose_job(Job(ss))
    f = {x.fix: x for x in jd.findings}["overlap-communication"]
    # durations equal: tau = 400, waits 0, exposed transfer = 300, M = 400
    assert jd.typical["exposed_transfer_us"] == 300.0
    assert f.estimated_speedup == pytest.approx(1600 / 1500)
    assert "compute alone" in f.derivation


def test_bus_factors_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    for t in ("reduce_scatter", "all_gather", "all_to_all"):
        assert bus_factor(t, 8) == pytest.approx(7 / 8)
    for t in ("broadcast", "reduce", "send", "recv"):
        assert bus_factor(t, 8) == 1.0
    assert bus_factor("all_to_allv", 8) is None


def test_binomial_tail_exact():
    # P(X >= 16), X ~ Bin(20, 1/2) = (C(20,16)+...+C(20,20)) / 2^20
    assert binomial_sf(16, 20, 0.5) == pytest.approx(
        sum(math.comb(20, i) for i in range(16, 21)) / 2**20
    )
    assert binomial_sf(16, 20, 0.5) == pytest.approx(6196 / 2**20)
    assert binomial_sf(15, 20, 0.5) == pytest.approx(21700 / 2**20)
    assert binomial_sf(0, 5, 0.3) == 1.0 and binomial_sf(6, 5, 0.3) == 0.0


# --- thresholds: just below and just above ------------------------------------------------------


def test_straggler_needs_four_steps():
    """16 ranks, rank 15 late by 300 us every step: chance 1/16 per step. Last in 3 of 3 steps
    is significant, p = (1/16)^3 = 2.4e-4 < 0.01 / 16 = 6.25e-4, but 3 steps are under the
    gate of 4; 4 of 4 (p = 1.5e-5) names it."""
    late = lambda n: [[0.0] * 15 + [300.0]] * n  # noqa: E731
    jd = diagnose_job(Job(lateness_job(late(3))))
    a = jd.straggler_test.arrivals.filter(pl.col("rank") == 15).row(0, named=True)
    assert a["last"] == 3 and a["steps"] == 3 and a["p_value"] == pytest.approx(16.0**-3)
    assert jd.straggler is None and "too few steps" in jd.straggler_test.reason
    jd = diagnose_job(Job(lateness_job(late(4))))
    assert jd.straggler.rank == 15 and jd.straggler.p_value == pytest.approx(16.0**-4)


def test_straggler_test_is_per_step_not_per_collective():
    """Two ranks, 6 steps of 5 all-reduces each, rank 1 last at all 30: per collective that
    would be p = 2^-30; per step it is 6 of 6 steps, p = 2^-6 = 0.0156 >= 0.01 / 2: not named."""
    steps, colls = [[], []], [[], []]
    for k in range(6):
        t0 = k * 10_000.0
        for r in (0, 1):
            steps[r].append(sb.step(k, start=t0, time=3000, compute=1000, comm=1500))
            for j in range(5):
                d = 300.0 if r == 0 else 200.0
                colls[r].append(sb.coll(k, t0 + 1000 + 300 * j + 300 - d, d, seq=5 * k + j))
    jd = diagnose_job(Job([sb.summary(r, steps[r], colls[r]) for r in (0, 1)]))
    a = jd.straggler_test.arrivals.filter(pl.col("rank") == 1).row(0, named=True)
    assert a["last_collectives"] == 30 and a["last"] == 6 and a["steps"] == 6
    assert a["p_value"] == pytest.approx(2.0**-6)
    assert jd.straggler is None and "chance" in jd.straggler_test.reason


def test_straggler_arrival_threshold():
    """20 steps; rank 1 late (300 us) in k of them, rank 0 late in the others; Bonferroni over
    2 ranks: threshold 0.005. p(16 of 20) = 6196 / 2^20 = 0.0059 (>= 0.005, though < 0.01);
    p(17 of 20) = 1351 / 2^20 = 0.0013."""
    for k, named in ((16, False), (17, True)):
        late = [[0.0, 300.0]] * k + [[300.0, 0.0]] * (20 - k)
        jd = diagnose_job(Job(lateness_job(late)))
        a = jd.straggler_test.arrivals.filter(pl.col("rank") == 1).row(0, named=True)
        assert a["last"] == k and a["steps"] == 20
        assert a["p_value"] == pytest.approx(sum(math.comb(20, i) for i in range(k, 21)) / 2**20)
        assert jd.straggler_test.threshold == pytest.approx(0.01 / 2)
        assert (jd.straggler is not None) is named


def test_straggler_effect_threshold():
    """Rank 0 waits L per step; T = 1000 + L + 200: 24/1224 = 1.96 % < 2 % <= 25/1225."""
    for lat, named in ((24.0, False), (25.0, True)):
        jd = diagnose_job(Job(lateness_job([[0.0, lat]] * 30)))
        assert jd.straggler_test.effect == pytest.approx(lat / (1200 + lat))
        assert (jd.straggler is not None) is named
    jd = diagnose_job(Job(lateness_job([[0.0, 24.0]] * 30)))
    assert "no material effect" in jd.straggler_test.reason
    assert jd.bottleneck != "load imbalance"


def test_straggler_consistency_threshold():
    """4 ranks, chance 1/4; rank 3 last in 19 (then 20) of 40 steps, the others share the rest:
    significant either way (p < 0.01 / 4), but last in 47.5 % of steps (< 50 %) vs 50 %."""
    for k, named in ((19, False), (20, True)):
        late = []
        for i in range(40):
            if i < k:
                late.append([0.0, 0.0, 0.0, 300.0])
            else:
                row = [0.0, 0.0, 0.0, 0.0]
                row[i % 3] = 300.0
                late.append(row)
        jd = diagnose_job(Job(lateness_job(late)))
        a = jd.straggler_test.arrivals.filter(pl.col("rank") == 3).row(0, named=True)
        p = sum(math.comb(40, i) * 0.25**i * 0.75 ** (40 - i) for i in range(k, 41))
        assert a["p_value"] == pytest.approx(p) and p < 0.01 / 4
        assert a["consistency"] == pytest.approx(k / 40)
        assert (jd.straggler is not None) is named


# --- causes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "idle, cause",
    [
        ("host_work", "host work"),
        ("dataloader", "DataLoader"),
        ("host_sync", "host syncs"),
        ("python", "python"),
        ("kernel_launch", "kernel launch"),
    ],
)
def test_host_straggler_cause_and_profiler_caveat(idle, cause):
    """Rank 1's GPU idles 400 us per step before the collective (for the given single-rank idle
    cause); equal compute."""
    ss = []
    for r in (0, 1):
        st, cl = [], []
        for k in range(25):
            t0 = k * 5000.0
            if r == 0:
                st.append(sb.step(k, start=t0, time=1600, compute=1000, comm=600))
                cl.append(sb.coll(k, t0 + 1000, 600, seq=k))
            else:
                st.append(sb.step(k, start=t0, time=1600, compute=1000, comm=200, **{idle: 400}))
                cl.append(sb.coll(k, t0 + 1400, 200, seq=k))
        ss.append(sb.summary(r, st, cl))
    jd = diagnose_job(Job(ss))
    s = jd.straggler
    assert s.rank == 1 and s.cause == cause and s.host_side
    assert s.excess_us == 400.0  # (1000 + 400) - (1000 + 0)
    assert jd.regime == "overhead-bound" and jd.bottleneck == "load imbalance"
    b = {x.fix: x for x in jd.findings}["balance-ranks"]
    assert b.estimated_speedup == pytest.approx(1600 / 1200)  # G = min(400, 400)
    assert any("unprofiled" in e for e in b.evidence)


def test_data_shape_cause():
    """Rank 1 runs a longer sequence: its op shapes differ and its compute is longer."""
    ss = two_rank()
    ss[0].opsig = pl.DataFrame(
        {
            "name": ["aten::mm"],
            "input_dims": ["[[8, 512], [512, 512]]"],
            "count": [25],
            "gpu_us": [1e4],
        }
    )
    ss[1].opsig = pl.DataFrame(
        {
            "name": ["aten::mm"],
            "input_dims": ["[[8, 640], [640, 512]]"],
            "count": [25],
            "gpu_us": [1.2e4],
        }
    )
    jd = diagnose_job(Job(ss))
    assert jd.straggler.cause == "data shapes"
    assert any("[[8, 640], [640, 512]]" in e for e in jd.straggler.evidence)


def test_link_straggler():
    """2 x 2 mesh: TP groups [0, 1], [2, 3]; DP groups [0, 2], [1, 3]. Everyone arrives at once;
    the groups with rank 3 take 200 us per all-reduce, the others 100 us (same bytes)."""
    ss = []
    for r in range(4):
        tp, dp = ("[0, 1]", "[2, 3]")[r // 2], ("[0, 2]", "[1, 3]")[r % 2]
        st, cl = [], []
        for k in range(5):
            t0 = k * 5000.0
            a = 200.0 if "3" in tp else 100.0
            b = 200.0 if "3" in dp else 100.0
            cl.append(sb.coll(k, t0 + 1000, a, pg="tp", desc="mesh_tp", ranks=tp, seq=k))
            cl.append(sb.coll(k, t0 + 1000 + a, b, pg="dp", desc="mesh_dp", ranks=dp, seq=k))
            st.append(sb.step(k, start=t0, time=1400, compute=1000, comm=a + b, python=400 - a - b))
        ss.append(sb.summary(r, st, cl))
    jd = diagnose_job(Job(ss))
    s = jd.straggler
    assert s is not None and s.rank == 3 and s.cause == "link"
    # extra per step: TP [2, 3] 200 - 100 and DP [1, 3] 200 - 100
    assert s.excess_us == 200.0 and s.effect == pytest.approx(200 / 1400)
    assert jd.regime == "bandwidth-bound"
    line = (
        "arrival is even, but the collectives of the 2 group(s) with rank 3 take 0.200 ms longer "
        "per step than the same collectives of the other groups (>= 1.25x their median transfer "
        "time)"
    )
    assert s.evidence == [line + ": 14.3% of the step"]  # 200 / 1400
    # 4 ranks: the median over ranks is the mean of the middle two, and the report says so
    assert "over its steps; with 4 ranks, the mean of the middle two): " in jd.evidence[2]


def test_link_straggler_of_ranks_that_never_ran_together_has_no_share_of_a_step():
    """The same mesh, the ranks said never to have run at the same time (runs_apart): the test
    still compares 200 us with 2% of T, but T is no step of theirs, so the evidence gives the
    extra time in ms only and the effect is None (before: '14.3% of the step')."""
    from tracedx.job.straggler import _link_straggler

    ss = []
    for r in range(4):
        tp, dp = ("[0, 1]", "[2, 3]")[r // 2], ("[0, 2]", "[1, 3]")[r % 2]
        st, cl = [], []
        for k in range(5):
            t0 = k * 5000.0
            a = 200.0 if "3" in tp else 100.0
            b = 200.0 if "3" in dp else 100.0
            cl.append(sb.coll(k, t0 + 1000, a, pg="tp", desc="mesh_tp", ranks=tp, seq=k))
            cl.append(sb.coll(k, t0 + 1000 + a, b, pg="dp", desc="mesh_dp", ranks=dp, seq=k))
            st.append(sb.step(k, start=t0, time=1400, compute=1000, comm=a + b, python=400 - a - b))
        ss.append(sb.summary(r, st, cl))
    jd = diagnose_job(Job(ss))
    s = _link_straggler(jd.collectives, jd.steps, 1400.0, runs_apart=True)
    assert (s.rank, s.excess_us, s.effect) == (3, 200.0, None)
    assert s.evidence == [
        "arrival is even, but the collectives of the 2 group(s) with rank 3 take 0.200 ms longer "
        "per step than the same collectives of the other groups (>= 1.25x their median transfer "
        "time)"
    ]


@pytest.mark.parametrize(
    "n, note, who",
    [
        (1, "", "median rank"),
        (2, "; with 2 ranks, their mean", "mean of the 2 ranks"),
        (3, "", "median rank"),
        (
            8,
            "; with 8 ranks, the mean of the middle two",
            "median rank, the mean of the middle two",
        ),
    ],
)
def test_median_rank_says_what_it_is_with_an_even_count(n, note, who):
    """With an even number of ranks the median over ranks is the mean of the middle two (of
    both, with 2): a figure no rank need have, said where the median rank is defined and
    where a fix quotes it."""
    from tracedx.job.diagnosis import even_ranks_note, typical_rank

    assert (even_ranks_note(n), typical_rank(n)) == (note, who)


def test_balanced_ranks_get_one_verdict():
    """Ranks alternate being late (host launch jitter): no straggler; whatever their
    single-rank verdicts said, both ranks get the job's verdict."""
    late = [[0.0, 300.0] if k % 2 else [300.0, 0.0] for k in range(30)]
    ss = lateness_job(late)
    ss[0].meta["single_rank"] = {"regime": "bandwidth-bound", "bottleneck": "communication"}
    ss[1].meta["single_rank"] = {"regime": "overhead-bound", "bottleneck": "kernel launch"}
    jd = diagnose_job(Job(ss))
    assert jd.straggler is None
    assert "no rank paces the steps more often than chance" in jd.straggler_test.reason
    assert jd.ranks["regime"].n_unique() == 1 and jd.ranks["bottleneck"].n_unique() == 1
    assert any("single-rank verdicts" in n for n in jd.notes)


def test_order_independence():
    late = [[0.0, 50.0 * (k % 3), 300.0, 20.0] for k in range(24)]
    ss = lateness_job(late)
    ref = diagnose_job(Job(list(ss))).to_json()
    rng = random.Random(7)
    for _ in range(3):
        sh = list(ss)
        rng.shuffle(sh)
        for s in sh:  # rows of each table in another order too
            s.colls = s.colls.sample(fraction=1.0, shuffle=True, seed=rng.randrange(100))
        assert diagnose_job(Job(sh)).to_json() == ref


# --- matching --------------------------------------------------------------------------------


def test_subgroups_sharing_a_name_are_not_merged():
    """Two TP groups both named "1" ({0, 1} and {2, 3}), same Seq numbers: two collectives per
    seq, each of two members, not one of four."""
    ss = []
    for r in range(4):
        ranks = "[0, 1]" if r < 2 else "[2, 3]"
        cl = [
            sb.coll(0, 100.0 + r, 50.0, pg="1", desc="mesh_tp", ranks=ranks, seq=s, ordinal=s)
            for s in range(3)
        ]
        ss.append(sb.summary(r, [sb.step(0, time=1000, compute=500, comm=150)], cl))
    m = match_collectives(ss)
    assert m.collectives.height == 6
    assert m.collectives["members"].to_list() == [2] * 6
    assert set(m.collectives["status"]) == {"ok"}
    assert m.groups["pg_key"].to_list() == ["1:[0, 1]", "1:[2, 3]"]
    assert any("shared by 2 groups" in n for n in m.notes)


def test_match_key_ladder_and_validation():
    # Comms Id wins over Seq (the seqs here disagree: a Seq match would pair the wrong ones)
    a = sb.summary(0, [], [sb.coll(0, 0, 10, seq=5, comms_id="18446744073709551615")])
    b = sb.summary(1, [], [sb.coll(0, 0, 10, seq=9, comms_id="18446744073709551615")])
    m = match_collectives([a, b])
    assert m.collectives.height == 1 and m.collectives["match_key"][0] == "comms_id"
    # no Seq: (step, ordinal)
    a = sb.summary(0, [], [sb.coll(0, 0, 10, ordinal=0), sb.coll(0, 20, 10, ordinal=1)])
    b = sb.summary(1, [], [sb.coll(0, 5, 10, ordinal=0), sb.coll(0, 25, 10, ordinal=1)])
    m = match_collectives([a, b])
    assert m.collectives["match_key"].to_list() == ["ordinal", "ordinal"]
    assert m.collectives["members"].to_list() == [2, 2]
    # a type mismatch is kept, flagged and never measured
    a = sb.summary(0, [], [sb.coll(0, 0, 10, seq=0)])
    b = sb.summary(1, [], [sb.coll(0, 0, 30, seq=0, ctype="all_gather")])
    jd = diagnose_job(Job([a, b]))
    c = jd.collectives.row(0, named=True)
    assert c["status"] == "type mismatch" and not c["usable"] and c["transfer_us"] is None
    assert any("type mismatch" in n for n in jd.notes)
    # a size mismatch likewise
    b = sb.summary(1, [], [sb.coll(0, 0, 30, seq=0, nbytes=4)])
    assert match_collectives([a, b]).collectives["status"][0] == "size mismatch"


def test_partial_match_names_missing_rank():
    ss = []
    for r in range(3):  # rank 3 of the group [0, 1, 2, 3] has no trace
        cl = [sb.coll(0, 100.0 * r, 400.0 - 100 * r, ranks="[0, 1, 2, 3]", n=4, seq=0)]
        ss.append(sb.summary(r, [sb.step(0, time=1000, compute=500, comm=400 - 100 * r)], cl))
    jd = diagnose_job(Job(ss))
    c = jd.collectives.row(0, named=True)
    assert c["status"] == "partial" and c["missing_ranks"] == "3" and c["members"] == 3
    assert c["transfer_us"] == 200.0  # min over the members present
    assert any("ranks without a trace in the job: 3" in n for n in jd.notes)


def test_one_rank_job_cannot_split_waiting():
    s = two_rank(3)[0]
    s.meta["world_size"] = 2
    jd = diagnose_job(Job([s]))
    assert jd.steps["exposed_wait_us"].null_count() == 3
    assert jd.collectives["status"].to_list() == ["unmatched"] * 3
    assert any("one rank of a 2-rank job" in n for n in jd.notes)
    assert jd.straggler is None
    # the rank's own one-rank note and the job's are one note, not two; an 8-rank job
    s.meta["world_size"] = 8
    s.meta["notes"] = [
        "this trace is one rank of an 8-rank job: its collectives include waiting for the "
        "other ranks to arrive"
    ]
    jd = diagnose_job(Job([s]))
    assert sum("8-rank job" in n for n in jd.notes) == 1
    assert any("one rank of an 8-rank job" in n for n in jd.notes)
    # one mismatched collective: singular
    ss = two_rank(3)
    ss[1].colls = ss[1].colls.with_columns(
        dtype=pl.when(pl.col("step") == 0).then(pl.lit("Half")).otherwise(pl.col("dtype"))
    )
    jd = diagnose_job(Job(ss))
    assert any(n.startswith("1 collective has a dtype mismatch") for n in jd.notes)


# --- clocks ----------------------------------------------------------------------------------


def clock_job(theta: float, *, late_rank: int = 0, n: int = 30, hostnames: bool = True) -> list:
    """4 ranks, hosts A (0, 1) and B (2, 3); B's clock reads ``theta`` us late. True times: rank
    ``late_rank`` starts its all-reduce 300 us after the others; all end together, host B's
    ends jittered by -2, 0, +2 us in turn."""
    steps = [[] for _ in range(4)]
    colls = [[] for _ in range(4)]
    for k in range(n):
        t0 = k * 10_000.0
        jit = (-2.0, 0.0, 2.0)[k % 3]
        for r in range(4):
            start = t0 + 1000 + (300 if r == late_rank else 0)
            end = t0 + 1500
            off = theta + jit if r >= 2 else 0.0
            d = end - start + (jit if r >= 2 else 0.0)
            steps[r].append(
                sb.step(k, start=t0 + (off if r >= 2 else 0), time=1500, compute=1000, comm=d)
            )
            colls[r].append(
                sb.coll(k, start + (theta if r >= 2 else 0.0), d, ranks="[0, 1, 2, 3]", n=4, seq=k)
            )
    names = ["hostA", "hostA", "hostB", "hostB"] if hostnames else [None] * 4
    return [sb.summary(r, steps[r], colls[r], hostname=names[r]) for r in range(4)]


def test_clock_offset_recovered_with_uncertainty():
    ss = clock_job(400.0)
    m = match_collectives(ss)
    ce = estimate_offsets(m.members, m.collectives, ss)
    h = {r["host"]: r for r in ce.hosts.iter_rows(named=True)}
    # pass 1: d_B = 200 + jit/2 -> median 200, d_A = -200; B - A = 400; pass 2 residual 0
    assert h["hostB"]["theta_us"] == pytest.approx(400.0)
    assert h["hostA"]["theta_us"] == 0.0
    # corrected B - A per collective = jit in {-2, 0, 2}: MAD = 2 -> spread 1.4826 * 2, and
    # the offset (a median of 30 readings) has standard error 1.2533 * spread / sqrt(30)
    assert h["hostB"]["spread_us"] == pytest.approx(1.4826 * 2)
    assert h["hostB"]["uncertainty_us"] == pytest.approx(1.2533 * 1.4826 * 2 / math.sqrt(30))
    assert h["hostB"]["collectives"] == 30
    assert h["hostB"]["applied"] and ce.mode == "corrected"
    assert ce.offsets_us == {0: 0.0, 1: 0.0, 2: 400.0, 3: 400.0}
    assert ce.end_skew_before_us == pytest.approx(400.0)  # median of 400 + jit
    assert ce.end_skew_after_us == pytest.approx(2.0)  # median of |jit| (2, 0, 2)
    # corrected, the true last arriver (rank 0, true start 1300) is found; on the raw clocks
    # host B's ranks (raw start 1400 + jit) would look last
    jd = diagnose_job(Job(ss))
    assert jd.straggler is not None and jd.straggler.rank == 0
    raw = jd.members.filter(pl.col("coll_id") == 0).sort("abs_start_us")
    assert raw["rank"][-1] in (2, 3)


def test_clock_offsets_per_rank_without_hostnames():
    """No hostnames and a 700 us median end skew (> 500 us): the ranks cannot share a clock, so
    each rank's offset is estimated: ranks 2 and 3 read 700 us late, rank 1 0."""
    ss = clock_job(700.0, hostnames=False)
    m = match_collectives(ss)
    ce = estimate_offsets(m.members, m.collectives, ss)
    assert ce.source == "per rank" and ce.mode == "corrected"
    th = dict(zip(ce.hosts["host"], ce.hosts["theta_us"], strict=True))
    assert th == pytest.approx({"rank 0": 0.0, "rank 1": 0.0, "rank 2": 700.0, "rank 3": 700.0})
    # rank 2 against rank 0 per collective: 700 + jit, corrected jit: spread 1.4826 * 2
    u = dict(zip(ce.hosts["host"], ce.hosts["spread_us"], strict=True))
    assert u["rank 2"] == pytest.approx(1.4826 * 2)
    assert ce.offsets_us == {0: 0.0, 1: 0.0, 2: 700.0, 3: 700.0}
    assert diagnose_job(Job(ss)).straggler.rank == 0
    # at 400 us (median end skew under 500 us) the ranks are taken to share one clock
    ss = clock_job(400.0, hostnames=False)
    m = match_collectives(ss)
    assert estimate_offsets(m.members, m.collectives, ss).mode == "one host"


def test_small_clock_offset_not_applied():
    ss = clock_job(40.0)
    m = match_collectives(ss)
    ce = estimate_offsets(m.members, m.collectives, ss)
    h = {r["host"]: r for r in ce.hosts.iter_rows(named=True)}
    assert h["hostB"]["theta_us"] == pytest.approx(40.0)
    assert not h["hostB"]["applied"] and ce.mode == "consistent"
    assert ce.offsets_us == {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}


def test_uncorrected_hosts_use_the_clock_free_arriver():
    """Rank 0 on host A, rank 1 on host B whose clock reads 40 us late (under 50 us: not
    applied); both truly start at 1000 and end at 1500, host B's kernel lasting 500 + jit
    (jit -2, 0, +2 in turn). Raw starts would make rank 1 last every time (1040 > 1000); the
    arrival skew 40 + jit is under 3 x (40 + u), so the shortest kernel is the last arriver:
    rank 1 when jit = -2 (10 of 30), rank 0 when jit = +2 (10), a tie (none) when jit = 0."""
    steps, colls = [[], []], [[], []]
    for k in range(30):
        t0 = k * 10_000.0
        jit = (-2.0, 0.0, 2.0)[k % 3]
        for r in (0, 1):
            d = 500.0 + (jit if r else 0.0)
            start = t0 + 1000 + (40.0 if r else 0.0)
            steps[r].append(sb.step(k, start=t0, time=1500, compute=1000, comm=d))
            colls[r].append(sb.coll(k, start, d, seq=k))
    ss = [sb.summary(r, steps[r], colls[r], hostname=("hostA", "hostB")[r]) for r in (0, 1)]
    jd = diagnose_job(Job(ss))
    assert jd.clock.mode == "consistent"
    r = jd.ranks.sort("rank")
    assert r["last_arrivals"].to_list() == [10, 10]
    assert jd.straggler is None
    # a true 300 us late arrival on rank 0 (skew 260 us > 3 x (40 + u)) is read from timestamps
    for k in range(30):
        colls[0][k] = sb.coll(k, k * 10_000.0 + 1300, 200.0, seq=k)
    ss = [sb.summary(r, steps[r], colls[r], hostname=("hostA", "hostB")[r]) for r in (0, 1)]
    assert diagnose_job(Job(ss)).ranks.sort("rank")["last_arrivals"].to_list() == [30, 0]


# --- reports and API -------------------------------------------------------------------------


def test_json_schema_and_text():
    jd = tracedx.diagnose(Job(two_rank()))
    assert isinstance(jd, JobDiagnosis)
    d = json.loads(jd.to_json())
    assert list(d) == [
        "schema", "ranks", "steps", "regime", "bottleneck", "evidence", "straggler",
        "collectives", "findings", "notes",
    ]  # fmt: skip
    assert d["schema"] == "tracedx.job/1"
    assert d["straggler"]["rank"] == 1 and d["straggler"]["cause"] == "GPU compute"
    assert d["steps"]["step_time_ms"] == 1.6
    assert d["ranks"][0]["exposed_wait_ms"] == 0.25
    bal = d["findings"][0]
    assert bal["fix"] == "balance-ranks" and bal["local_speedup"] is None  # inf -> null
    assert bal["local_speedup_unbounded"] is True
    t = jd.to_text()
    assert "JOB VERDICT: COMPUTE-BOUND, bottleneck: load imbalance: straggler rank 1" in t
    assert "balance-ranks: 1.19x -> 1.350 ms" in t
    assert "| 1 |" in jd.to_markdown()


def test_job_without_collectives():
    """Two ranks of a 2-rank job (distributedInfo world_size 2) that never communicate: no
    collective, no straggler, a verdict all the same. Without world_size they are unrelated
    single-rank traces: refused."""
    ss = [sb.summary(r, [sb.step(0, time=1000, compute=800, python=200)], []) for r in (0, 1)]
    with pytest.raises(tracedx.TraceError, match="these 2 traces share no collective and no"):
        diagnose_job(Job(ss))
    for s in ss:
        s.meta["world_size"] = 2
    jd = diagnose_job(Job(ss))
    assert jd.collectives.height == 0 and jd.straggler is None and jd.findings == []
    assert jd.regime == "compute-bound"
    assert jd.steps["exposed_wait_us"].to_list() == [0.0, 0.0]  # no communication: 0, not null
    assert json.loads(jd.to_json())["collectives"]["count"] == 0


def test_device_table_links_per_direction():
    from tracedx.devices import DEVICES

    h = DEVICES["h100-sxm"]
    assert h.link_gbs() == (450.0, "NVLink 4")  # datasheet 900 GB/s bidirectional
    assert h.pcie_gbs == 64.0  # PCIe Gen5 x16, 128 GB/s bidirectional
    assert h.link_gbs(intra_host=False) == (None, None)  # the network: not in the table
    assert DEVICES["l4"].link_gbs() == (32.0, "PCIe")  # no NVLink: PCIe Gen4 x16
    assert "datasheet" in h.sources["gpu_link_gbs"]


def test_comm_alone_is_the_union_of_concurrent_transfers():
    """Two all-reduces run at once on each rank (gloo's two worker threads, or two NCCL
    streams): A at [1000, 1400], B at [1100, 1500], the same on both ranks, so waits are 0 and
    tau = duration. Summed tau would be 400 + 400 = 800; the union is [1000, 1500] = 500."""
    ss = []
    for r in (0, 1):
        st = [sb.step(k, start=k * 5000.0, time=1600, compute=1000, comm=500) for k in range(3)]
        cl = []
        for k in range(3):
            t0 = k * 5000.0
            cl.append(sb.coll(k, t0 + 1000, 400, seq=2 * k, ordinal=0))
            cl.append(sb.coll(k, t0 + 1100, 400, seq=2 * k + 1, ordinal=1))
        ss.append(sb.summary(r, st, cl))
    jd = diagnose_job(Job(ss))
    assert jd.steps["transfer_us"].to_list() == [500.0] * 6
    assert jd.typical["transfer_us"] == 500.0
    f = {x.fix: x for x in jd.findings}["overlap-communication"]
    # H = X - E = 500 - 0; T' = max(1600 - 500, 1000, 500) = 1100
    assert "0.500 ms)" in f.derivation
    assert f.estimated_speedup == pytest.approx(1600 / 1100)


def test_exposed_transfer_splits_only_fully_matched_collectives():
    """Per step, on both ranks: all-reduce A at [1000, 1300] (matched, waits 0, tau 300), then
    collective B at [1300, 1800] whose type differs between the ranks (type mismatch). No
    compute under either: X = 800. B's 500 us mix waiting and transfer: not split, so exposed
    transfer = 800 - 0 - 500 = 300 (never above M = 300), exposed unsplit = 500."""
    ss = []
    for r in (0, 1):
        st = [sb.step(k, start=k * 5000.0, time=2000, compute=1000, comm=800) for k in range(3)]
        cl = []
        for k in range(3):
            t0 = k * 5000.0
            cl.append(sb.coll(k, t0 + 1000, 300, seq=2 * k))
            ctype = "all_reduce" if r == 0 else "all_gather"
            cl.append(sb.coll(k, t0 + 1300, 500, seq=2 * k + 1, ctype=ctype, ordinal=1))
        ss.append(sb.summary(r, st, cl))
    jd = diagnose_job(Job(ss))
    assert jd.steps["exposed_transfer_us"].to_list() == [300.0] * 6
    assert jd.steps["exposed_unsplit_us"].to_list() == [500.0] * 6
    assert jd.typical["exposed_transfer_us"] == 300.0 == jd.typical["transfer_us"]
    assert jd.typical["exposed_unsplit_us"] == 500.0
    f = {x.fix: x for x in jd.findings}["overlap-communication"]
    # H = 300; T' = max(2000 - 300, 1000, 300) = 1700
    assert f.estimated_speedup == pytest.approx(2000 / 1700)
    assert any("3 collectives could not be split" in e and "0.500 ms" in e for e in f.evidence)


def test_merged_free_segment_is_pro_rated():
    """Rank 0's all-reduce [0, 41] (offsets) has compute at [1, 2], [3, 4], ..., [39, 40]: 21
    free gaps of 1 us (free total 21). The summary keeps 16 segments: 15 gaps then [30, 41]
    merged (11 us long, 6 us free). Rank 1's kernel lasts 1 us: rank 0 waits w = 40.
    Exposed wait = 15 (gaps before 30) + pro-rated (40 - 30) * 6 / 11, never the merged 10."""
    gaps = [(float(x), float(x + 1)) for x in range(0, 30, 2)] + [(30.0, 41.0)]
    ss = []
    for r, dur in ((0, 41.0), (1, 1.0)):
        st = [sb.step(0, time=2000, compute=1000, comm=dur, overlap=20.0 if r == 0 else 0.0)]
        cl = [
            sb.coll(0, 1000.0 + 41.0 - dur, dur, seq=0, free=gaps if r == 0 else None,
                    free_total=21.0 if r == 0 else None)
        ]  # fmt: skip
        ss.append(sb.summary(r, st, cl))
    jd = diagnose_job(Job(ss))
    s = jd.steps.sort("rank")
    assert s["exposed_wait_us"][0] == pytest.approx(15 + 10 * 6 / 11)
    assert s["exposed_wait_us"][0] <= 21.0


def test_collectives_without_group_size_use_the_world_size():
    """One rank of a 2-rank gloo job loaded alone: its collectives carry no group size and no
    group ranks, so they belong to the default group of world_size = 2 ranks; rank 1 is
    missing: the collectives are unmatched (missing rank 1) and the exposed wait is unknown
    (null), not 0."""
    cl = []
    for k in range(3):
        c = sb.coll(k, k * 5000.0 + 1000, 400, seq=k, ranks=None, n=None)
        cl.append(c)
    st = [sb.step(k, start=k * 5000.0, time=1600, compute=1000, comm=400) for k in range(3)]
    jd = diagnose_job(Job([sb.summary(0, st, cl, world_size=2)]))
    assert jd.collectives["group_size"].to_list() == [2, 2, 2]
    assert set(jd.collectives["status"]) == {"unmatched"}
    assert jd.collectives["missing_ranks"].to_list() == ["1", "1", "1"]
    assert jd.steps["exposed_wait_us"].to_list() == [None, None, None]
    # the same rows with world_size 1 (a one-rank run) are complete: waits 0
    jd = diagnose_job(Job([sb.summary(0, st, cl, world_size=1)]))
    assert set(jd.collectives["status"]) == {"ok"}
    assert jd.steps["exposed_wait_us"].to_list() == [0.0, 0.0, 0.0]


def test_exposed_wait_counts_as_communication_in_the_verdict():
    """Ranks alternate being 600 us late (no straggler), all-reduce tau = 1100 us, base compute
    1000: per rank, median compute (1000 or 1600) = 1300, exposed wait median (600 or 0) =
    300, exposed transfer 1100. Transfer alone (1100) is under half of 1300 + 1100 = 1200;
    transfer + wait (1400) is at least half of 1300 + 1400 = 1350: communication-bound."""
    late = [[0.0, 600.0] if k % 2 else [600.0, 0.0] for k in range(30)]
    jd = diagnose_job(Job(lateness_job(late, tau=1100.0)))
    t = jd.typical
    assert (t["compute_us"], t["exposed_wait_us"], t["exposed_transfer_us"]) == (
        1300.0,
        300.0,
        1100.0,
    )
    assert jd.straggler is None
    assert jd.regime == "bandwidth-bound" and jd.bottleneck == "communication"


def test_collective_groups_show_per_collective_bytes_and_totals_in_all():
    """two_rank(): 25 all-reduces of 100 MB each (transfer 200 us): the line shows 100,000,000
    bytes each and 2,500,000,000 in all, transfer 25 x 0.2 = 5 ms in all; the JSON ranks give
    the wait total (rank 0: 25 x 400 us = 10 ms) as wait_total_ms; the HTML labels the group
    with its ranks."""
    jd = diagnose_job(Job(two_rank()))
    t = " ".join(jd.to_text().split())  # the line as one, across its wrap at 100 columns
    assert (
        "default_pg [0, 1] all_reduce x25, n=2: 100,000,000 bytes each (median; "
        "2,500,000,000 in all), transfer 5.000 ms in all" in t
    )
    d = json.loads(jd.to_json())
    g = d["collectives"]["by_group"][0]
    assert g["msg_bytes"] == 100_000_000 and g["msg_bytes_total"] == 2_500_000_000
    assert g["transfer_total_ms"] == 5.0
    r0 = d["ranks"][0]
    assert r0["wait_total_ms"] == 10.0 and "wait_ms" not in r0
    assert "<td>default_pg [0, 1]</td>" in jd.to_html()


# --- every figure's scope; CPU-only jobs; the straggler block -------------------------------


def test_step_line_says_how_each_figure_is_a_median():
    """T is, per step, the median over ranks, then the median over steps: with step times
    rank 0 (1000, 1000, 4000) and rank 1 (3000, 1200, 1000) us the per-step medians (2 ranks:
    the mean) are 2000, 1100, 2500, so T = 2000 us, outside both ranks' own medians (1000 and
    1200 us): the line must say which median it is, and that it lies above them. Compute:
    rank medians 500 and 700 us, the median rank's (2 ranks: their mean) 600 us = 30% of T;
    load balance mean / max = 600 / 700 = 0.86. The step less exposed communication (100 us
    per step): rank 0 (900, 900, 3900), median 900; rank 1 (2900, 1100, 900), median 1100: the
    same ratio 1000 / 1100 = 0.91. Parallel efficiency mean compute / T = 600 / 2000 = 0.30."""
    times = {0: (1000, 1000, 4000), 1: (3000, 1200, 1000)}
    comp = {0: (500, 500, 800), 1: (600, 700, 900)}
    ss = []
    for r in (0, 1):
        st, cl = [], []
        for k in range(3):
            t0 = k * 10_000.0
            st.append(sb.step(k, start=t0, time=times[r][k], compute=comp[r][k], comm=100))
            cl.append(sb.coll(k, t0 + times[r][k] - 100, 100, seq=k))
        ss.append(sb.summary(r, st, cl))
    jd = diagnose_job(Job(ss))
    assert jd.typical["step_us"] == 2000.0
    assert jd.ranks["step_time_us"].to_list() == [1000.0, 1200.0]
    ev = jd.evidence
    assert ev[1] == (
        "step 2.000 ms: per step the median over ranks, then the median over steps; the ranks' "
        "own median steps 1.000 to 1.200 ms (spread 10.0% of the step; the job step is above "
        "them: a median of per-step medians need not lie between the ranks' own medians)"
    )
    assert ev[2].startswith(
        "the median rank's step (per figure, the median over ranks of each rank's median over "
        "its steps; with 2 ranks, their mean): compute 30% (25-35% over ranks), "  # 500, 700 of T
    )
    assert ev[3] == (
        "load balance 0.86 of compute (POP's: mean / max over ranks of each rank's median per "
        "step, 0.600 / 0.700 ms); 0.91 of step time less exposed communication (the same ratio, "
        "1.000 / 1.100 ms)"
    )
    assert jd.typical["load_balance_outside_comm"] == 1000 / 1100
    assert jd.ranks["outside_comm_us"].to_list() == [900.0, 1100.0]
    assert ev[4] == (
        "parallel efficiency 0.30 (POP's: load balance x communication efficiency = mean "
        "compute / T = 0.600 / 2.000 ms)"
    )
    assert jd.typical["parallel_efficiency"] == 600 / 2000
    assert not any("median over ranks;" in e for e in ev)
    t = jd.to_text()
    assert "RANKS (each rank's median per step; last in: of all its collectives, those it" in t
    assert "FIXES (Amdahl against the job's step T = 2.000 ms)" in t


def _cpu_only(ss: list) -> list:
    """The summaries as a trace without GPU activity has them: GPU columns null, no kernels."""
    for s in ss:
        s.steps = s.steps.with_columns(
            pl.lit(None, pl.Float64).alias(c) for c in ("gpu_busy_us", "idle_us", *sb.IDLE)
        )
        s.meta["device_name"] = None
    return ss


@pytest.mark.parametrize(
    "compute, comm, bottleneck, line",
    [
        (
            800,
            200,
            "CPU compute",
            "compute on the CPU 0.800 ms is longer than the exposed "
            "communication 0.200 ms (mean of the 2 ranks)",
        ),
        (
            300,
            700,
            "communication",
            "exposed communication 0.700 ms (transfer 0.700 + wait "
            "0.000 ms) is at least as long as compute 0.300 ms (mean of the 2 ranks)",
        ),
    ],
)
def test_cpu_only_job_gets_no_regime(compute, comm, bottleneck, line):
    """Two gloo ranks on the CPU (no GPU activity in either trace), equal work: no regime (the
    regimes describe a GPU; before, 'compute-bound' or 'bandwidth-bound' with a device line),
    the bottleneck from the host timeline, and the single-trace diagnosis' words for it."""
    ss = []
    for r in (0, 1):
        st = [sb.step(k, start=k * 5000.0, time=1000, compute=compute, comm=comm) for k in range(6)]
        cl = [sb.coll(k, k * 5000.0 + compute, comm, seq=k) for k in range(6)]
        ss.append(sb.summary(r, st, cl))
    jd = diagnose_job(Job(_cpu_only(ss)))
    assert jd.regime is None and jd.bottleneck == bottleneck
    assert jd.ranks["regime"].to_list() == [None, None]
    assert jd.evidence[0].startswith("no GPU activity in the ranks' traces: no regime can be named")
    assert jd.evidence[-1] == line
    assert not any("device work" in e or "GPU idle" in e for e in jd.evidence)
    head = jd.to_text().splitlines()[2]
    assert head == f"JOB VERDICT: no regime (no GPU activity), bottleneck: {bottleneck}"
    assert f"bottleneck: {bottleneck}" in repr(jd).splitlines()[1]


def test_cpu_only_straggler_block_is_who_how_often_effect_cause():
    """Rank 1 (CPU, no GPU) spends 600 us more per step outside communication than rank 0, of
    which 100 us is compute, over 10 steps: it waits least in all 10 (p = 2^-10 < 0.01 / 2);
    rank 0 waits 600 us of a 2000 us step exposed (30.0%). The block is four lines (who and
    how often with p, effect, cause); the 'last at' count (the RANKS table's 'last in') and the
    compute comparison are gone from it."""
    ss = []
    for r in (0, 1):
        st, cl = [], []
        for k in range(10):
            t0 = k * 5000.0
            if r == 0:  # 900 compute + 300 host, then 600 wait + 200 transfer
                st.append(sb.step(k, start=t0, time=2000, compute=900, comm=800))
                cl.append(sb.coll(k, t0 + 1200, 800, seq=k))
            else:  # 1000 compute + 800 host, then 200 transfer
                st.append(sb.step(k, start=t0, time=2000, compute=1000, comm=200))
                cl.append(sb.coll(k, t0 + 1800, 200, seq=k))
        ss.append(sb.summary(r, st, cl))
    jd = diagnose_job(Job(_cpu_only(ss)))
    s = jd.straggler
    assert (s.rank, s.cause, s.excess_us) == (1, "host work", 600.0)  # (2000-200) - (2000-800)
    assert jd.regime is None and jd.bottleneck == "load imbalance"
    assert s.evidence == [
        "rank 1 paced 10 of 10 steps (it waited least in each): binomial p = 0.00098 against a "
        "50% chance per step, under 0.01 / 2 ranks",
        "effect: the other ranks wait 30.0% of the step exposed (median over them of each one's "
        "median per step)",
        "cause host work: per step its time outside communication is 0.600 ms longer than the "
        "median peer's, 0.500 ms of it outside compute (host time before the collectives)",
    ]
    assert jd.evidence[-3:] == s.evidence
    assert jd.ranks["bottleneck"].to_list() == ["load imbalance (waits for rank 1)", "host work"]


def test_a_step_with_more_exposed_communication_than_its_length_is_noted():
    """A collective belongs to the step that launched it; one that ran past the step's window
    (rank 1's last step of the gloo balanced job: 17.586 ms exposed in a 6.137 ms step) is
    named in a note rather than passing silently."""
    from tracedx.job.diagnosis import _past_window_notes

    steps = pl.DataFrame(
        {
            "rank": [0, 1, 1],
            "step": [12, 11, 12],
            "step_time_us": [6000.0, 9371.5, 6136.9],
            "exposed_comm_us": [500.0, 7054.3, 17586.4],
        }
    )
    (note,) = _past_window_notes(steps)
    assert note.startswith(
        "1 rank-step with more exposed communication than step time (rank 1 step 12: "
        "17.586 ms exposed in a 6.137 ms step)"
    ), note
    assert _past_window_notes(steps.filter(pl.col("step") == 11)) == []


def test_too_few_steps_for_the_straggler_test_says_how_many_it_needs():
    """Rank 1 is last in all 5 steps of a 2-rank job: 2^-5 = 0.031 is not under 0.01 / 2, so
    the test cannot tell it from chance, and says that 8 steps would (2^-8 = 0.0039)."""
    jd = diagnose_job(Job(lateness_job([[0.0, 300.0]] * 5)))
    assert jd.straggler is None
    assert jd.straggler_test.reason == (
        "rank 1 paced all 5 steps, but over 5 steps even that could be chance (p = 0.031 >= "
        "0.01 / 2 ranks): the test needs at least 8 steps with matched collectives (record or "
        "analyse more steps)"
    )


def test_cpu_only_compute_straggler_is_not_called_gpu_compute():
    # two real CPU-only (gloo) ranks of different runs: rank 1's longer compute paces rank 0;
    # with no GPU activity the cause is the host's compute, not "GPU compute"
    from tests.conftest import SAMPLES

    a = SAMPLES / "ddp_mlp-gloo-host-straggler" / "rank0.json.gz"
    b = SAMPLES / "ddp_mlp-gloo-balanced" / "rank1.json.gz"
    if not (a.exists() and b.exists()):
        pytest.skip("sample jobs missing")
    import tracedx

    jd = diagnose_job(tracedx.load_job([a, b]))
    assert jd.straggler is not None and jd.straggler.rank == 1
    assert jd.straggler.cause == "compute", jd.straggler
