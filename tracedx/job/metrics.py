"""Cross-rank metrics: per collective (transfer time, waits, last arriver, bytes, algbw,
busbw) and per rank and step (compute, exposed communication split into waiting and
transfer, overlap ratio), plus POP load balance.

Per collective c with members R_c (durations d_r on each rank's own clock, so clock-free):

- transfer time ``tau_c = min_r d_r`` (TraceLens ``comm_latency``, the TensorBoard plugin's
  data-transfer time): the member that waited least was moving bytes all along;
- wait ``w_r = d_r - tau_c`` (the TensorBoard plugin's "synchronizing" time);
- last arriver: ``argmax_r s_r`` on corrected clocks when the job's timestamps can be compared
  (one host, or host offsets estimated: :mod:`.clock`), else ``argmin_r d_r``; with several
  hosts whose small offsets were not applied, ``argmax_r s_r`` only when the arrival skew is
  above ``ClockEstimate.arrival_margin_us`` (3 x (|theta| + u)), else ``argmin_r d_r``; none
  when the two latest are within ``TIE_US``;
- algbw ``= S / tau`` and busbw ``= algbw * F(n)`` in GB/s (1e9 bytes/s), with nccl-tests'
  factors (``doc/PERFORMANCE.md`` and ``src/*.cu``): all-reduce ``2(n-1)/n``; reduce-scatter,
  all-gather, all-to-all, gather, scatter ``(n-1)/n``; broadcast, reduce, send/recv 1;
  compared with the link's datasheet bandwidth per direction (:meth:`DeviceSpec.link_gbs`).

Per rank r and step k (``Comp`` = merged compute kernels, ``Comm`` = merged comm kernels):

- exposed communication ``X = |Comm minus Comp|`` (from the rank's summary);
- wait intervals: the first ``w`` us of each of the rank's comm kernels; exposed wait
  ``E = |wait intervals minus Comp|``, from each kernel's ``free_us`` segments (its parts not
  covered by compute), unioned over the rank's kernels of the step;
- communication alone ``M = |union of [end - tau_c, end]|`` over the rank's kernels (concurrent
  collectives count once);
- exposed transfer ``X - E - Z``, only from fully matched (``ok``) collectives: ``Z`` is the
  exposed part of the mismatched, unmatched or partial ones' kernels (``exposed_unsplit_us``),
  which mixes waiting and transfer and is not split; overlap ratio ``|Comp ∩ Comm| / |Comm|`` (HolisticTraceAnalysis's
  ``comp_comm_overlap_pctg`` / 100);
- POP load balance ``LB = mean_r U_r / max_r U_r`` with ``U = |Comp|`` (POP Centre of
  Excellence metrics, https://co-design.pop-coe.eu/metrics/).
"""

from __future__ import annotations

import polars as pl

from tracedx.devices import match_device
from tracedx.job.clock import ClockEstimate
from tracedx.job.match import USABLE, Matched

TIE_US = 1.0

_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}


def bus_factor(coll_type: str | None, n: int | None) -> float | None:
    """nccl-tests' bus-bandwidth factor F(n) for a collective type (None when undefined:
    all-to-all-v, barrier, coalesced, unknown, or no group size)."""
    f = _FACTOR.get(coll_type or "")
    if f is None or not n or n < 1:
        return None
    return f(n)


def collective_metrics(
    matched: Matched, clock: ClockEstimate, summaries: list
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per-collective metrics and the members' waits.

    Returns ``(collectives, members)``: ``matched.collectives`` plus ``transfer_us``,
    ``max_wait_us``, ``mean_wait_us``, ``last_rank`` (i64 or null), ``arrival_skew_us`` and
    ``end_skew_us`` (null when timestamps cannot be compared), ``algbw_gbs``, ``busbw_gbs``,
    ``link``, ``link_gbs``, ``busbw_fraction``, ``usable``; and ``matched.members`` plus
    ``wait_us`` (null for unusable collectives) and ``last`` (bool).
    """
    colls = matched.collectives
    mem = matched.members
    if colls.height == 0:
        return colls, mem.with_columns(
            wait_us=pl.lit(None, pl.Float64), last=pl.lit(False), split=pl.lit(False)
        )
    off = clock.offsets_us
    mem = mem.with_columns(
        _s=pl.col("abs_start_us")
        - pl.col("rank").replace_strict(off, default=0.0, return_dtype=pl.Float64),
        _e=pl.col("abs_end_us")
        - pl.col("rank").replace_strict(off, default=0.0, return_dtype=pl.Float64),
    )
    usable = colls.filter(pl.col("status").is_in(USABLE) & (pl.col("members") >= 1))["coll_id"]
    split = colls.filter(pl.col("status") == "ok")["coll_id"]
    mem = mem.with_columns(
        _usable=pl.col("coll_id").is_in(usable.implode()),
        split=pl.col("coll_id").is_in(split.implode()),
    )
    mem = mem.with_columns(
        wait_us=pl.when(pl.col("_usable"))
        .then(pl.col("duration_us") - pl.col("duration_us").min().over("coll_id"))
        .otherwise(None)
    )
    use_clock = clock.timestamps_usable
    # last arriver: latest corrected start (clock-free: the shortest kernel); a tie -> none.
    # Hosts left uncorrected: the timestamps only when the arrival skew is well above the
    # offsets (ClockEstimate.arrival_margin_us)
    margin = clock.arrival_margin_us
    skew = pl.col("_s").max().over("coll_id") - pl.col("_s").min().over("coll_id")
    key = (
        pl.when(skew > margin).then(pl.col("_s")).otherwise(-pl.col("duration_us"))
        if margin > 0 and use_clock
        else pl.col("_s")
        if use_clock
        else -pl.col("duration_us")
    )
    ranked = (
        mem.filter(
            pl.col("_usable")
            & pl.col("coll_id").is_in(colls.filter(pl.col("members") >= 2)["coll_id"].implode())
        )
        .with_columns(_k=key)
        .sort(["coll_id", "_k", "rank"], descending=[False, True, False])
    )
    top = ranked.group_by("coll_id", maintain_order=True).agg(
        _r=pl.col("rank").first(), _k1=pl.col("_k").first(), _k2=pl.col("_k").slice(1, 1).first()
    )
    top = top.with_columns(
        last_rank=pl.when((pl.col("_k1") - pl.col("_k2")).abs() >= TIE_US)
        .then(pl.col("_r"))
        .otherwise(None)
    ).select("coll_id", "last_rank")
    mem = (
        mem.join(top, on="coll_id", how="left")
        .with_columns(last=(pl.col("rank") == pl.col("last_rank")).fill_null(False))
        .drop("last_rank")
    )

    agg = (
        mem.filter(pl.col("_usable"))
        .group_by("coll_id")
        .agg(
            transfer_us=pl.col("duration_us").min(),
            max_wait_us=pl.col("wait_us").max(),
            mean_wait_us=pl.col("wait_us").mean(),
            _smax=pl.col("_s").max(),
            _smin=pl.col("_s").min(),
            _emax=pl.col("_e").max(),
            _emin=pl.col("_e").min(),
            _hosts=pl.col("rank")
            .replace_strict(clock.host_of, default="?", return_dtype=pl.Utf8)
            .n_unique(),
        )
    )
    out = colls.join(agg, on="coll_id", how="left").join(top, on="coll_id", how="left")
    skew_ok = pl.lit(use_clock) & (pl.col("members") >= 2)
    out = out.with_columns(
        usable=pl.col("status").is_in(USABLE),
        arrival_skew_us=pl.when(skew_ok).then(pl.col("_smax") - pl.col("_smin")).otherwise(None),
        end_skew_us=pl.when(skew_ok).then(pl.col("_emax") - pl.col("_emin")).otherwise(None),
        algbw_gbs=pl.when(pl.col("transfer_us") > 0)
        .then(pl.col("msg_bytes").cast(pl.Float64) / pl.col("transfer_us") / 1e3)
        .otherwise(None),
    )
    factors = [bus_factor(t, n) for t, n in zip(out["coll_type"], out["group_size"], strict=True)]
    out = out.with_columns(busbw_gbs=pl.col("algbw_gbs") * pl.Series(factors, dtype=pl.Float64))
    # the link: one host -> the GPU link of the device (else PCIe); several -> the network
    spec = _device(summaries)
    links, gbs = [], []
    for h in out["_hosts"].to_list():
        if spec is None or h is None:
            links.append(None if h is None or h <= 1 else "network")
            gbs.append(None)
            continue
        g, name = spec.link_gbs(intra_host=h <= 1)
        links.append(name or ("network" if h > 1 else None))
        gbs.append(g)
    out = out.with_columns(
        link=pl.Series(links, dtype=pl.Utf8), link_gbs=pl.Series(gbs, dtype=pl.Float64)
    ).with_columns(busbw_fraction=pl.col("busbw_gbs") / pl.col("link_gbs"))
    out = out.drop("_smax", "_smin", "_emax", "_emin", "_hosts").sort("coll_id")
    mem = mem.drop("_s", "_e", "_usable")
    return out, mem


def _device(summaries: list):
    names = {s.meta.get("device_name") for s in summaries if s.meta.get("device_name")}
    if len(names) != 1:
        return None
    spec, _ = match_device(next(iter(names)))
    return spec


def union_length(seg: pl.DataFrame, by: list[str], name: str) -> pl.DataFrame:
    """Per ``by`` group, the length of the union of the intervals ``[a, b]`` of ``seg``.

    The union of intervals sorted by start is ``sum_i max(0, b_i - max(a_i, M_{i-1}))`` with
    ``M_{i-1}`` the largest end before i (vectorised per group).
    """
    seg = seg.filter(pl.col("b") > pl.col("a")).sort(*by, "a", "b")
    prev = pl.col("b").cum_max().shift(1).over(by)
    return (
        seg.with_columns(
            _len=(pl.col("b") - pl.max_horizontal("a", prev.fill_null(float("-inf")))).clip(
                lower_bound=0.0
            )
        )
        .group_by(by)
        .agg(pl.col("_len").sum().alias(name))
    )


def free_parts(kernels: pl.DataFrame, cap: pl.Expr) -> pl.DataFrame:
    """The free (not under compute) parts of each kernel up to ``cap`` us after its start, as
    intervals ``a``, ``b`` on the rank's clock, with ``rank``, ``step``.

    A summary keeps at most 16 segments per kernel and merges the rest into the last, which then
    spans covered time too; ``free_total_us`` (the kernel's true free time) bounds it: inside
    the merged last segment the free time is pro-rated (its true free time over its length), so
    no more free time is ever counted than exists. Without ``free_total_us`` (older summaries)
    the segments are taken as they are.
    """
    k = kernels.with_columns(_cap=cap).with_row_index("_kid")
    if "free_total_us" not in k.columns:
        k = k.with_columns(free_total_us=pl.lit(None, dtype=pl.Float64))
    seg = (
        k.select("_kid", "rank", "step", "start_us", "_cap", "free_total_us", "free_us")
        .explode("free_us")
        .drop_nulls("free_us")
        .with_columns(
            _s=pl.col("free_us").struct.field("start_us"),
            _e=pl.col("free_us").struct.field("end_us"),
        )
        .with_columns(_len=pl.col("_e") - pl.col("_s"))
        .with_columns(
            _last=pl.int_range(pl.len()).over("_kid") == pl.len().over("_kid") - 1,
            _over=(pl.col("_len").sum().over("_kid") - pl.col("free_total_us"))
            .fill_null(0.0)
            .clip(lower_bound=0.0),
        )
        .with_columns(
            _rho=pl.when(pl.col("_last") & (pl.col("_over") > 0) & (pl.col("_len") > 0))
            .then(((pl.col("_len") - pl.col("_over")) / pl.col("_len")).clip(0.0, 1.0))
            .otherwise(1.0),
            a=pl.col("start_us") + pl.col("_s"),
        )
    )
    b_cap = pl.col("start_us") + pl.min_horizontal("_e", "_cap")
    return seg.with_columns(b=pl.col("a") + pl.col("_rho") * (b_cap - pl.col("a"))).select(
        "rank", "step", "a", "b"
    )


def exposed_wait(usable: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step): ``exposed_wait_us`` = |union over the rank's kernels of (their first w
    us minus compute)|, from each kernel's free segments (:func:`free_parts`)."""
    seg = free_parts(usable.filter(pl.col("wait_us") > 0), pl.col("wait_us"))
    return union_length(seg, ["rank", "step"], "exposed_wait_us")


def exposed_unsplit(members: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step): ``exposed_unsplit_us`` = |union of the free segments (parts not under
    compute) of the rank's kernels whose collective is not fully matched|: exposed time that
    cannot be split into waiting and transfer; ``unsplit`` = how many such kernels."""
    rest = members.filter(~pl.col("split"))
    seg = free_parts(rest, pl.col("duration_us"))
    n = rest.group_by("rank", "step").agg(unsplit=pl.len().cast(pl.Int64))
    return n.join(
        union_length(seg, ["rank", "step"], "exposed_unsplit_us"), on=["rank", "step"], how="left"
    ).with_columns(pl.col("exposed_unsplit_us").fill_null(0.0))


def transfer_union(usable: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step): ``transfer_us`` (communication alone, M) = |union over the rank's
    usable kernels of their transfer part ``[end - tau, end]``|: collectives that run at the same
    time (gloo's worker threads, NCCL on several streams) count once."""
    seg = usable.select(
        "rank",
        "step",
        a=pl.col("end_us") - (pl.col("duration_us") - pl.col("wait_us")),
        b=pl.col("end_us"),
    )
    return union_length(seg, ["rank", "step"], "transfer_us")


STEP_COLUMNS = (
    "rank",
    "step",
    "step_time_us",
    "compute_us",
    "comm_us",
    "comm_overlap_us",
    "exposed_comm_us",
    "exposed_wait_us",
    "exposed_transfer_us",
    "exposed_unsplit_us",
    "overlap_ratio",
    "wait_us",
    "transfer_us",
    "last_arrivals",
    "collectives",
    "idle_us",
    "other_us",
)


def rank_step_metrics(summaries: list, members: pl.DataFrame) -> pl.DataFrame:
    """One row per (rank, step): the summary's step figures plus the cross-rank split.

    Columns (us unless named): ``rank``, ``step``, ``step_time_us``, ``compute_us`` (U),
    ``comm_us``, ``comm_overlap_us``, ``exposed_comm_us`` (X), ``exposed_wait_us`` (E, from
    fully matched collectives only), ``exposed_unsplit_us`` (exposed time of the kernels whose
    collective is mismatched, unmatched or partial: not split), ``exposed_transfer_us``
    (X - E - unsplit, at least 0), ``unsplit`` (count of those kernels), ``overlap_ratio`` (null without
    communication), ``wait_us`` (sum of the rank's waits), ``transfer_us`` (communication
    alone, M: the union of its kernels' transfer parts ``[end - tau, end]``, so concurrent
    collectives count once), ``last_arrivals``,
    ``collectives`` (fully matched), the ``idle_*`` columns of the summary, ``other_us`` (the
    rest of the step: step time - U - X - GPU idle, at least 0; on a CPU-only rank the host time
    outside its ops and collectives, such as Python between them; on a GPU rank the copies and
    memsets, which U leaves out).
    E and the exposed transfer are null (and unsplit = X) where the rank-step has communication
    but no fully matched collective (waiting cannot be split from one rank's trace).
    """
    frames = []
    usable = members.filter(pl.col("split"))
    per = (
        usable.group_by("rank", "step")
        .agg(
            wait_us=pl.col("wait_us").sum(),
            last_arrivals=pl.col("last").sum().cast(pl.Int64),
            collectives=pl.len().cast(pl.Int64),
        )
        .join(transfer_union(usable), on=["rank", "step"], how="left")
        .join(exposed_wait(usable), on=["rank", "step"], how="left")
        .with_columns(pl.col("exposed_wait_us").fill_null(0.0))
    )
    rest = exposed_unsplit(members)
    base = ("step_time_us", "compute_us", "comm_us", "comm_overlap_us", "exposed_comm_us")
    for s in summaries:  # each rank's step table as it is (the joins are made once, on all)
        st = s.steps
        if st is None or st.height == 0:
            continue
        idle_cols = [c for c in st.columns if c.startswith("idle_")]
        frames.append(
            st.select(
                pl.lit(int(s.meta["rank"]), dtype=pl.Int64).alias("rank"),
                pl.col("step").cast(pl.Int64),
                *[pl.col(c).cast(pl.Float64) for c in (*base, *idle_cols)],
            )
        )
    if frames:
        f = pl.concat(frames, how="diagonal_relaxed").join(per, on=["rank", "step"], how="left")
        f = f.join(rest, on=["rank", "step"], how="left").with_columns(
            pl.col("last_arrivals").fill_null(0),
            pl.col("collectives").fill_null(0),
            pl.col("unsplit").fill_null(0),
        )
        no_comm = pl.col("comm_us").fill_null(0) <= 0
        f = (
            f.with_columns(
                exposed_wait_us=pl.when(no_comm)
                .then(0.0)
                .when(pl.col("exposed_wait_us").is_null())
                .then(None)
                .otherwise(pl.min_horizontal("exposed_wait_us", "exposed_comm_us")),
            )
            .with_columns(
                exposed_unsplit_us=pl.when(no_comm)
                .then(0.0)
                .when(pl.col("exposed_wait_us").is_null())
                .then(pl.col("exposed_comm_us"))
                .otherwise(
                    pl.min_horizontal(
                        pl.col("exposed_unsplit_us").fill_null(0.0),
                        pl.col("exposed_comm_us") - pl.col("exposed_wait_us"),
                    )
                ),
            )
            .with_columns(
                exposed_transfer_us=(
                    pl.col("exposed_comm_us")
                    - pl.col("exposed_wait_us")
                    - pl.col("exposed_unsplit_us")
                ).clip(lower_bound=0.0),
                overlap_ratio=pl.when(pl.col("comm_us") > 0)
                .then(pl.col("comm_overlap_us") / pl.col("comm_us"))
                .otherwise(None),
                other_us=(
                    pl.col("step_time_us")
                    - pl.col("compute_us").fill_null(0.0)
                    - pl.col("exposed_comm_us").fill_null(0.0)
                    - (pl.col("idle_us") if "idle_us" in f.columns else pl.lit(None)).fill_null(0.0)
                ).clip(lower_bound=0.0),
            )
        )
        frames = [f]
    if not frames:
        return pl.DataFrame(schema={c: pl.Float64 for c in STEP_COLUMNS})
    df = frames[0]
    front = [c for c in STEP_COLUMNS if c in df.columns]
    return df.select(*front, *[c for c in df.columns if c not in front]).sort("rank", "step")


def load_balance(u: list[float]) -> float | None:
    """POP load balance mean(U) / max(U) (None without compute)."""
    u = [x for x in u if x is not None]
    if not u or max(u) <= 0:
        return None
    return (sum(u) / len(u)) / max(u)
