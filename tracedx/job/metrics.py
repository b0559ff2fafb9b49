"""Cross-rank metrics: per collective (transfer time, waits, last arriver, bytes, algbw,
busbw) and per rank and step (compute, exposed communication split into waiting and
transfer, overlap ratio), plus POP load balance.

Per collective c with members R_c (durations d_r on each rank's own clock, so clock-free):

- transfer time ``tau_c = min_r d_r`` (TraceLens ``comm_latency``, the TensorBoard plugin's
  data-transfer time): the member that waited least was moving bytes all along;
- wait ``w_r = d_r - tau_c`` (the TensorBoard plugin's "synchronizing" time);
- last arriver: ``argmax_r s_r`` on corrected clocks when the job's timestamps can be compared
  (one host, or host offsets estimated: :mod:`.clock`), else ``argmin_r d_r``; none when the
  two latest are within ``TIE_US``;
- algbw ``= S / tau`` and busbw ``= algbw * F(n)`` in GB/s (1e9 bytes/s), with nccl-tests'
  factors (``doc/PERFORMANCE.md`` and ``src/*.cu``): all-reduce ``2(n-1)/n``; reduce-scatter,
  all-gather, all-to-all, gather, scatter ``(n-1)/n``; broadcast, reduce, send/recv 1;
  compared with the link's datasheet bandwidth per direction (:meth:`DeviceSpec.link_gbs`).

Per rank r and step k (``Comp`` = merged compute kernels, ``Comm`` = merged comm kernels):

- exposed communication ``X = |Comm minus Comp|`` (from the rank's summary);
- wait intervals: the first ``w`` us of each of the rank's comm kernels; exposed wait
  ``E = |wait intervals minus Comp|``, from each kernel's ``free_us`` segments (its parts not
  covered by compute), unioned over the rank's kernels of the step;
- exposed transfer ``X - E``; overlap ratio ``|Comp ∩ Comm| / |Comm|`` (HolisticTraceAnalysis's
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
        return colls, mem.with_columns(wait_us=pl.lit(None, pl.Float64), last=pl.lit(False))
    off = clock.offsets_us
    mem = mem.with_columns(
        _s=pl.col("abs_start_us")
        - pl.col("rank").replace_strict(off, default=0.0, return_dtype=pl.Float64),
        _e=pl.col("abs_end_us")
        - pl.col("rank").replace_strict(off, default=0.0, return_dtype=pl.Float64),
    )
    usable = colls.filter(pl.col("status").is_in(USABLE) & (pl.col("members") >= 1))["coll_id"]
    mem = mem.with_columns(_usable=pl.col("coll_id").is_in(usable.implode()))
    mem = mem.with_columns(
        wait_us=pl.when(pl.col("_usable"))
        .then(pl.col("duration_us") - pl.col("duration_us").min().over("coll_id"))
        .otherwise(None)
    )
    use_clock = clock.timestamps_usable
    # last arriver: latest corrected start (clock-free: the shortest kernel); a tie -> none
    key = pl.col("_s") if use_clock else -pl.col("duration_us")
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


def exposed_wait(usable: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step): ``exposed_wait_us`` = |union over the rank's kernels of (their first w
    us minus compute)|, from each kernel's free segments (offsets from its start).

    The union of intervals sorted by start is ``sum_i max(0, b_i - max(a_i, M_{i-1}))`` with
    ``M_{i-1}`` the largest end before i (vectorised per group).
    """
    seg = (
        usable.filter(pl.col("wait_us") > 0)
        .select("rank", "step", "start_us", "wait_us", "free_us")
        .explode("free_us")
        .drop_nulls("free_us")
        .with_columns(
            a=pl.col("start_us") + pl.col("free_us").struct.field("start_us"),
            b=pl.col("start_us")
            + pl.min_horizontal(pl.col("free_us").struct.field("end_us"), pl.col("wait_us")),
        )
        .filter(pl.col("b") > pl.col("a"))
        .sort("rank", "step", "a", "b")
    )
    prev = pl.col("b").cum_max().shift(1).over("rank", "step")
    return (
        seg.with_columns(
            _len=(pl.col("b") - pl.max_horizontal("a", prev.fill_null(float("-inf")))).clip(
                lower_bound=0.0
            )
        )
        .group_by("rank", "step")
        .agg(exposed_wait_us=pl.col("_len").sum())
    )


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
    "overlap_ratio",
    "wait_us",
    "transfer_us",
    "last_arrivals",
    "collectives",
    "idle_us",
)


def rank_step_metrics(summaries: list, members: pl.DataFrame) -> pl.DataFrame:
    """One row per (rank, step): the summary's step figures plus the cross-rank split.

    Columns (us unless named): ``rank``, ``step``, ``step_time_us``, ``compute_us`` (U),
    ``comm_us``, ``comm_overlap_us``, ``exposed_comm_us`` (X), ``exposed_wait_us`` (E),
    ``exposed_transfer_us`` (X - E, at least 0), ``overlap_ratio`` (null without
    communication), ``wait_us`` (sum of the rank's waits), ``transfer_us`` (sum of the
    transfer times of its collectives: communication alone, M), ``last_arrivals``,
    ``collectives`` (matched, usable), the ``idle_*`` columns of the summary.
    E and X - E are null where the rank-step has communication but no usable matched
    collective (waiting cannot be split from one rank's trace).
    """
    frames = []
    usable = members.filter(pl.col("wait_us").is_not_null())
    per = (
        usable.group_by("rank", "step")
        .agg(
            wait_us=pl.col("wait_us").sum(),
            transfer_us=(pl.col("duration_us") - pl.col("wait_us")).sum(),
            last_arrivals=pl.col("last").sum().cast(pl.Int64),
            collectives=pl.len().cast(pl.Int64),
        )
        .join(exposed_wait(usable), on=["rank", "step"], how="left")
        .with_columns(pl.col("exposed_wait_us").fill_null(0.0))
    )
    for s in summaries:
        st = s.steps
        if st is None or st.height == 0:
            continue
        idle_cols = [c for c in st.columns if c.startswith("idle_")]
        f = st.select(
            pl.lit(int(s.meta["rank"]), dtype=pl.Int64).alias("rank"),
            pl.col("step").cast(pl.Int64),
            *[
                pl.col(c).cast(pl.Float64)
                for c in (
                    "step_time_us",
                    "compute_us",
                    "comm_us",
                    "comm_overlap_us",
                    "exposed_comm_us",
                )
            ],
            *[pl.col(c).cast(pl.Float64) for c in idle_cols],
        ).join(per, on=["rank", "step"], how="left")
        f = f.with_columns(pl.col("last_arrivals").fill_null(0), pl.col("collectives").fill_null(0))
        no_comm = pl.col("comm_us").fill_null(0) <= 0
        f = f.with_columns(
            exposed_wait_us=pl.when(no_comm)
            .then(0.0)
            .when(pl.col("exposed_wait_us").is_null())
            .then(None)
            .otherwise(pl.min_horizontal("exposed_wait_us", "exposed_comm_us")),
        ).with_columns(
            exposed_transfer_us=(pl.col("exposed_comm_us") - pl.col("exposed_wait_us")).clip(
                lower_bound=0.0
            ),
            overlap_ratio=pl.when(pl.col("comm_us") > 0)
            .then(pl.col("comm_overlap_us") / pl.col("comm_us"))
            .otherwise(None),
        )
        frames.append(f)
    if not frames:
        return pl.DataFrame(schema={c: pl.Float64 for c in STEP_COLUMNS})
    df = pl.concat(frames, how="diagonal_relaxed")
    front = [c for c in STEP_COLUMNS if c in df.columns]
    return df.select(*front, *[c for c in df.columns if c not in front]).sort("rank", "step")


def load_balance(u: list[float]) -> float | None:
    """POP load balance mean(U) / max(U) (None without compute)."""
    u = [x for x in u if x is not None]
    if not u or max(u) <= 0:
        return None
    return (sum(u) / len(u)) / max(u)
