"""The straggler test and its cause.

A rank is named a straggler only when all three hold (each threshold traceable to a peer
tool or a textbook test):

- arrival, tested per step (the collectives of one step are not independent: one late
  rank is late for all of them): per step, the rank that waited least on average over the
  step's complete collectives (the rank that paced the step); over ``S >= 4`` such steps the rank is it
  in ``k`` of them, and ``P(X >= k)`` for ``X ~ Binomial(S, p0)`` is below ``0.01 / N``
  (Bonferroni over the N ranks tested), ``p0`` being the rank's chance per step, the mean
  over its collectives of ``1 / members``;
- effect: the median over the other ranks of their exposed wait per step, as a share of the
  job's step time, is at least 2 % (TraceLens drops findings under 2 % impact);
- consistency: the rank paced at least half of the steps
  (HolisticTraceAnalysis counts flags per iteration).

"No straggler" is an answer, with the test that failed.

The cause compares the straggler with the median peer (per-rank medians over the steps, then
the median over the other ranks): its op input shapes differ (``opsig``: data shapes); its
compute ``U`` is at least 5 % longer (GPU compute; "compute" in CPU-only traces); or its GPU
idles longer before the collectives for a host-side reason (the idle causes of the single-rank timeline: host work,
kernel launch, python, DataLoader, host syncs). Its excess, ``(U + idle)`` over the median
peer's, is what it was doing while the others waited; without a GPU timeline (CPU-only
traces) it is its time outside communication (step - comm) over the median peer's, and what
compute does not explain is host work. A rank whose arrival is even but whose
groups move the same bytes slower than the other groups is a link straggler
(:func:`_link_straggler`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median

import polars as pl

from tracedx.job.clock import SYNC_TYPES
from tracedx.trace.collectives import parse_ranks

MIN_STEPS = 4
P_VALUE = 0.01  # family-wise: each rank is tested at P_VALUE / (ranks tested), Bonferroni
MIN_EFFECT = 0.02
MIN_CONSISTENCY = 0.5
COMPUTE_RATIO = 1.05
LINK_RATIO = 1.25

# single-rank idle causes (tracedx.analysis.timeline.CAUSES) read as host-side lateness
HOST_CAUSES = {
    "idle_host_work_us": "host work",
    "idle_kernel_launch_us": "kernel launch",
    "idle_python_us": "python",
    "idle_dataloader_us": "DataLoader",
    "idle_host_sync_us": "host syncs",
}


def binomial_sf(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, p)``: the exact sum of the terms
    ``C(n, i) p^i (1-p)^(n-i)``, i = k..n (computed in logs, so large n does not overflow)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    logs = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
        for i in range(k, n + 1)
    ]
    m = max(logs)
    return min(1.0, math.exp(m) * sum(math.exp(x - m) for x in logs))


@dataclass
class Straggler:
    """The named straggler: its rank, cause, and the numbers that named it.

    ``excess_us``: per step, its compute plus GPU idle over the median peer's (what it was
    doing while the others waited); ``host_side``: the cause is host time (spread over
    profiled ops, so the profiler's own cost can be part of it).
    """

    rank: int
    cause: str
    evidence: list[str]
    steps: int
    last: int
    chance: float
    p_value: float
    effect: float | None
    consistency: float
    excess_us: float
    host_side: bool

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "cause": self.cause,
            "evidence": self.evidence,
            "steps": self.steps,
            "last_in_steps": self.last,
            "chance": self.chance,
            "p_value": self.p_value,
            "effect": self.effect,
            "consistency": self.consistency,
            "excess_ms": self.excess_us / 1e3,
        }


@dataclass
class StragglerResult:
    """The test over all ranks.

    ``arrivals``: per rank ``rank``, ``collectives`` (tested), ``last_collectives`` (those it
    arrived last at), ``steps`` (S: steps with one of its collectives tested), ``last`` (k:
    steps where it was the plurality last arriver), ``chance`` (p0 per step), ``p_value``
    (binomial over the steps), ``consistency`` (k / S); ``effect``: median peer exposed wait /
    T for the best candidate; ``threshold``: the Bonferroni-corrected p threshold;
    ``reason``: why no rank was named.
    """

    straggler: Straggler | None
    arrivals: pl.DataFrame
    effect: float | None
    reason: str | None
    evidence: list[str] = field(default_factory=list)
    threshold: float | None = None


def _per_rank_median(steps: pl.DataFrame, col: str) -> dict[int, float]:
    if col not in steps.columns:
        return {}
    g = steps.group_by("rank").agg(pl.col(col).drop_nulls().median())
    return {int(r): float(v) for r, v in g.iter_rows() if v is not None}


def arrival_table(collectives: pl.DataFrame, members: pl.DataFrame) -> pl.DataFrame:
    """Per-rank arrival statistics over the complete implicit-sync collectives."""
    ok = collectives.filter(
        (pl.col("status") == "ok")
        & pl.col("coll_type").is_in(SYNC_TYPES)
        & (pl.col("members") >= 2)
        & pl.col("last_rank").is_not_null()
    ).select("coll_id", "members")
    m = members.join(ok, on="coll_id", how="inner")
    if m.height == 0:
        return pl.DataFrame(
            schema={
                "rank": pl.Int64,
                "collectives": pl.Int64,
                "last_collectives": pl.Int64,
                "steps": pl.Int64,
                "chance": pl.Float64,
                "last": pl.Int64,
                "p_value": pl.Float64,
                "consistency": pl.Float64,
            }
        )
    per = (
        m.group_by("rank")
        .agg(
            collectives=pl.len(),
            last_collectives=pl.col("last").sum().cast(pl.Int64),
            steps=pl.col("step").n_unique().cast(pl.Int64),
            chance=(1.0 / pl.col("members")).mean(),
        )
        .sort("rank")
    )
    # Per step, the rank that paced it: the one that waited least, on average over the step's
    # collectives (clock-free: waits are durations less the shortest member's). A count of last
    # arrivals is noisier: a rank late by 20 ms for the first collective of a step is "last"
    # in only some of the step's later ones, where every rank arrives nearly together.
    paced = (
        m.filter(pl.col("wait_us").is_not_null())
        .group_by("step", "rank")
        .agg(w=pl.col("wait_us").mean())
        .group_by("step")
        .agg(
            rank=pl.col("rank").sort_by("w", "rank").first(),
            least=pl.col("w").min(),
            runner_up=pl.col("w").sort().slice(1, 1).first(),
        )
        # a step is paced by the rank that waited strictly least (a tie names no rank)
        .filter(pl.col("runner_up").is_null() | (pl.col("least") < pl.col("runner_up")))
        .group_by("rank")
        .agg(last=pl.len().cast(pl.Int64))
    )
    per = per.join(paced, on="rank", how="left").with_columns(pl.col("last").fill_null(0))
    pv = [
        binomial_sf(k, n, p)
        for k, n, p in zip(per["last"], per["steps"], per["chance"], strict=True)
    ]
    return per.with_columns(
        p_value=pl.Series(pv, dtype=pl.Float64),
    ).with_columns(
        consistency=pl.when(pl.col("steps") > 0)
        .then(pl.col("last") / pl.col("steps"))
        .otherwise(None)
    )


def find_straggler(
    collectives: pl.DataFrame,
    members: pl.DataFrame,
    steps: pl.DataFrame,
    summaries: list,
    step_us: float | None,
    runs_apart: bool = False,
) -> StragglerResult:
    """Run the three tests and, for a named rank, find its cause (module docstring).

    ``steps``: :func:`tracedx.job.metrics.rank_step_metrics`; ``step_us``: the job's step time T;
    ``runs_apart``: the ranks never ran at the same time (:class:`tracedx.job.clock.ClockEstimate`),
    so they share no step to take a share of: the evidence gives the effect in ms per step and
    a named straggler's ``effect`` is None (the test still compares it with MIN_EFFECT).
    """
    arr = arrival_table(collectives, members)
    alpha = P_VALUE / max(arr.height, 1)
    if arr.height == 0:
        link = _link_straggler(collectives, steps, step_us, runs_apart)
        if link is not None:
            return StragglerResult(link, arr, link.effect, None, link.evidence)
        return StragglerResult(None, arr, None, "no matched collective with a known last arriver")
    best = arr.sort(["p_value", "last", "rank"], descending=[False, True, False]).row(0, named=True)
    r = int(best["rank"])
    wait = _per_rank_median(steps, "exposed_wait_us")
    peers = [w for q, w in wait.items() if q != r]
    effect = median(peers) / step_us if peers and step_us else None
    wait_text = (
        f"{median(peers) / 1e3:.3f} ms per step"
        if runs_apart and effect is not None
        else f"{0 if effect is None else effect:.1%} of the step"
    )
    # the evidence of a named straggler, one line each: who and how often with the p-value,
    # the effect, then (from _cause) the cause
    ev = [
        f"rank {r} paced {best['last']} of {best['steps']} steps (it waited least in each): "
        f"binomial p = {best['p_value']:.2g} against a {best['chance']:.0%} chance per step, "
        f"under {P_VALUE:g} / {arr.height} ranks"
    ]
    if effect is not None:
        ev.append(
            f"effect: the other ranks wait {wait_text} exposed (median over them of "
            "each one's median per step)"
        )
    reason = None
    if best["steps"] < MIN_STEPS:
        reason = (
            f"too few steps with matched collectives ({best['steps']} < {MIN_STEPS}) to test "
            "arrival against chance"
        )
    elif best["p_value"] >= alpha and best["last"] == best["steps"] and 0 < best["chance"] < 1:
        # pacing every step is not enough: too few steps for the test to tell it from chance
        need = math.floor(math.log(alpha) / math.log(best["chance"])) + 1
        reason = (
            f"rank {r} paced all {best['steps']} steps, but over {best['steps']} steps even that "
            f"could be chance (p = {best['p_value']:.2g} >= {P_VALUE:g} / {arr.height} ranks): "
            f"the test needs at least {need} steps with matched collectives (record or analyse "
            "more steps)"
        )
    elif best["p_value"] >= alpha:
        reason = (
            f"no rank paces the steps more often than chance (best: rank {r}, paced "
            f"{best['last']} of {best['steps']} steps, p = {best['p_value']:.2g} >= "
            f"{P_VALUE:g} / {arr.height} ranks)"
        )
    elif effect is None or effect < MIN_EFFECT:
        reason = (
            f"rank {r} paces the steps more often than chance, but the others' exposed wait is "
            f"{wait_text} (< {MIN_EFFECT:.0%} of the step): no material effect"
        )
    elif best["consistency"] is None or best["consistency"] < MIN_CONSISTENCY:
        reason = (
            f"rank {r} paces the steps more often than chance but paces only "
            f"{best['last']} of {best['steps']} steps (< {MIN_CONSISTENCY:.0%})"
        )
    if reason is not None:
        link = _link_straggler(collectives, steps, step_us, runs_apart)
        if link is not None:
            return StragglerResult(link, arr, link.effect, None, link.evidence, alpha)
        return StragglerResult(None, arr, effect, reason, ev, alpha)
    cause, cev, excess, host_side = _cause(r, steps, summaries)
    s = Straggler(
        rank=r,
        cause=cause,
        evidence=ev + cev,
        steps=int(best["steps"]),
        last=int(best["last"]),
        chance=float(best["chance"]),
        p_value=float(best["p_value"]),
        effect=None if runs_apart else float(effect),
        consistency=float(best["consistency"]),
        excess_us=excess,
        host_side=host_side,
    )
    return StragglerResult(s, arr, effect, None, ev, alpha)


def _link_straggler(
    collectives: pl.DataFrame,
    steps: pl.DataFrame,
    step_us: float | None,
    runs_apart: bool = False,
) -> Straggler | None:
    """A rank on a slow link: arrival is even, but collectives of the groups it is in move the
    same bytes slower than the same collectives of groups without it.

    Groups are compared within one signature (type, bytes, group size, description); a group
    is slow when its median transfer time is >= ``LINK_RATIO`` times the median of the other
    groups'. The rank in every slow group and in no fast one is named when its groups' extra
    transfer time per step is >= 2 % of the step. ``runs_apart``: the ranks never ran at the
    same time, so T is no step of theirs: the test still compares with 2 % of it, but the
    evidence gives the extra time in ms only and ``effect`` is None (as :func:`find_straggler`).
    """
    if not step_us or collectives.height == 0 or "transfer_us" not in collectives.columns:
        return None
    c = collectives.filter((pl.col("status") == "ok") & pl.col("transfer_us").is_not_null())
    sig = ["coll_type", "msg_bytes", "group_size", "pg_desc"]
    per = c.group_by([*sig, "pg_key", "pg_ranks"]).agg(
        tau=pl.col("transfer_us").median(), n=pl.len(), steps=pl.col("step").n_unique()
    )
    slow, fast, extra = [], [], 0.0
    for _, g in per.group_by(sig):
        if g.height < 2:
            continue
        rows = g.to_dicts()
        for row in rows:
            others = median(x["tau"] for x in rows if x is not row)
            ranks = set(parse_ranks(row["pg_ranks"], row["group_size"]) or [])
            if others > 0 and row["tau"] >= LINK_RATIO * others:
                slow.append(ranks)
                extra += (row["tau"] - others) * row["n"] / max(row["steps"], 1)
            else:
                fast.append(ranks)
    if not slow:
        return None
    cand = set.intersection(*slow) - set().union(*fast) if fast else set.intersection(*slow)
    if len(cand) != 1 or extra / step_us < MIN_EFFECT:
        return None
    r = cand.pop()
    ev = [
        f"arrival is even, but the collectives of the {len(slow)} group(s) with rank {r} take "
        f"{extra / 1e3:.3f} ms longer per step than the same collectives of the other groups "
        f"(>= {LINK_RATIO}x their median transfer time)"
        + ("" if runs_apart else f": {extra / step_us:.1%} of the step")
    ]
    return Straggler(
        rank=r,
        cause="link",
        evidence=ev,
        steps=0,
        last=0,
        chance=0.0,
        p_value=1.0,
        effect=None if runs_apart else extra / step_us,
        consistency=1.0,
        excess_us=extra,
        host_side=False,
    )


def _shape_diffs(r: int, summaries: list) -> list[str]:
    """Ops whose input shapes on rank r differ from the ones most peers agree on."""
    by_rank = {int(s.meta["rank"]): s.opsig for s in summaries if s.opsig is not None}
    if r not in by_rank or len(by_rank) < 2:
        return []

    def dims(df: pl.DataFrame) -> dict[str, frozenset]:
        if df.height == 0:
            return {}
        g = df.group_by("name").agg(pl.col("input_dims").unique())
        return {n: frozenset(d) for n, d in g.iter_rows()}

    mine = dims(by_rank[r])
    peers = [dims(df) for q, df in by_rank.items() if q != r]
    out = []
    for name, d in sorted(mine.items()):
        seen = [p[name] for p in peers if name in p]
        if not seen:
            continue
        mode = max(set(seen), key=lambda x: (seen.count(x), sorted(x)))
        if seen.count(mode) * 2 >= len(peers) and d != mode:
            extra = sorted(d - mode)
            out.append(f"{name} {', '.join(extra[:2]) if extra else '(fewer shapes)'}")
    return out


def _cause(r: int, steps: pl.DataFrame, summaries: list) -> tuple[str, list[str], float, bool]:
    steps = steps.with_columns(_outside=pl.col("step_time_us") - pl.col("comm_us").fill_null(0.0))
    cols = ("compute_us", "idle_us", "_outside", *HOST_CAUSES)
    med = {c: _per_rank_median(steps, c) for c in cols}

    def peer(c: str) -> float:
        v = [x for q, x in med[c].items() if q != r]
        return median(v) if v else 0.0

    u_s, u_p = med["compute_us"].get(r, 0.0), peer("compute_us")
    gpu = r in med["idle_us"]
    if gpu:
        i_s, i_p = med["idle_us"][r], peer("idle_us")
        excess = max((u_s + i_s) - (u_p + i_p), 0.0)
    else:
        # no GPU timeline (CPU-only traces): the time outside communication, step minus comm
        i_s = i_p = 0.0
        excess = max(med["_outside"].get(r, 0.0) - peer("_outside"), 0.0)
    ratio = u_s / u_p if u_p > 0 else math.inf if u_s > 0 else 1.0
    host = {name: med[c].get(r, 0.0) - peer(c) for c, name in HOST_CAUSES.items() if med[c]}
    top_host = max(host, key=host.get) if host else None
    top_dh = host.get(top_host, 0.0) if top_host else 0.0
    shapes = _shape_diffs(r, summaries)
    work = u_s - u_p
    peer_ms = f"{u_s / 1e3:.3f} vs {u_p / 1e3:.3f} ms on the median peer"
    if shapes and work > 0:
        return (
            "data shapes",
            [
                "cause data shapes: its op input shapes differ from its peers' ("
                + "; ".join(shapes[:3])
                + f"); its compute per step is {peer_ms}"
            ],
            excess,
            False,
        )
    if not gpu and excess > 0 and excess - max(work, 0.0) >= max(work, 0.0):
        return (
            "host work",
            [
                f"cause host work: per step its time outside communication is "
                f"{excess / 1e3:.3f} ms longer than the median peer's, "
                f"{(excess - max(work, 0.0)) / 1e3:.3f} ms of it outside compute (host time "
                "before the collectives)"
            ],
            excess,
            True,
        )
    # (without GPU activity the compute is the host's: ops on the CPU)
    compute = "GPU compute" if gpu else "compute"
    gpu_compute = f"cause {compute}: its compute per step is {peer_ms} ({ratio:.2f}x)"
    if ratio >= COMPUTE_RATIO and work >= top_dh:
        kernel = _kernel_excess(r, summaries)
        return compute, [gpu_compute + (f"; {kernel}" if kernel else "")], excess, False
    if top_host and top_dh > 0 and top_dh >= 0.5 * excess:
        line = (
            f"cause {top_host}: per step its GPU idles {top_dh / 1e3:.3f} ms longer than the "
            "median peer's, in gaps the single-rank timeline puts down to that cause"
        )
        return top_host, [line], excess, True
    if ratio >= COMPUTE_RATIO:
        return compute, [gpu_compute], excess, False
    idle = f"GPU idle {i_s / 1e3:.3f} vs {i_p / 1e3:.3f} ms" if gpu else "no GPU timeline"
    line = (
        f"cause unknown: per step it spends {excess / 1e3:.3f} ms more than the median peer "
        f"(compute {peer_ms}, {idle}), none of the causes tested explains it"
    )
    return "unknown", [line], excess, False


def _kernel_excess(r: int, summaries: list) -> str:
    """The kernel whose time grew most on rank r against the median peer (a kernel a peer
    does not run counts 0 for it)."""
    tabs = [
        s.kernels.select("name", "total_us").with_columns(rank=pl.lit(int(s.meta["rank"])))
        for s in summaries
        if s.kernels is not None and s.kernels.height
    ]
    if len(tabs) < 2:
        return ""
    k = pl.concat(tabs, how="vertical_relaxed")
    mine = k.filter(pl.col("rank") == r).group_by("name").agg(pl.col("total_us").sum())
    peers = k.filter(pl.col("rank") != r)
    n_peers = peers["rank"].n_unique()
    if mine.height == 0 or n_peers == 0:
        return ""
    # median over the peers with zeros for the peers without the kernel
    per = peers.group_by("name").agg(pl.col("total_us"))
    med = {name: median([*v, *([0.0] * (n_peers - len(v)))]) for name, v in per.iter_rows()}
    best, dmax = None, 0.0
    for name, t in mine.iter_rows():
        d = t - med.get(name, 0.0)
        if d > dmax:
            best, dmax = name, d
    if best is None:
        return ""
    n = max(len(summaries[0].meta.get("steps") or [1]), 1)
    return f"largest kernel excess: {best} +{dmax / n / 1e3:.3f} ms per step"
