"""Per-host clock offsets from collective end times, with their uncertainty.

Ranks on one host share its wall clock (Kineto puts CPU and GPU events on it); across hosts
the clocks differ by whatever NTP/PTP leaves. An implicit-sync collective (all-reduce,
all-gather, reduce-scatter, all-to-all, barrier) delivers its last byte to every member at
nearly the same instant, so its members' kernel end times coincide up to a small spread. Per
host h, over the collectives whose members span two hosts or more:

1. ``d_{c,h} = median_{r in R_c on h} e_r - median_{r in R_c} e_r``;
   ``theta_h = median_c d_{c,h}``; the host of the lowest rank is the reference (theta = 0);
   the estimate is repeated once on the corrected end times and the residual added.
2. Spread ``sigma_h = 1.4826 * MAD`` over the collectives of the corrected differences
   between host h and the reference host (the normal-consistent median absolute deviation:
   the spread of one collective's reading of the offset), and the offset's uncertainty
   ``u_h = 1.2533 * sigma_h / sqrt(N)``, the standard error of a median of N readings
   (asymptotic efficiency of the median under normal noise, sqrt(pi / 2) = 1.2533).
3. An offset is applied only when ``|theta_h| > 3 u_h`` and ``|theta_h| > 50 us``.
4. Validation: the median end skew (``max e - min e``) of the cross-host collectives must drop
   once the offsets are applied; if it does not, no offset is applied and the job's
   cross-rank timestamps are not used (clock-free metrics only).

Hosts come from the summaries' ``meta.hostname``, else ``rank // meta.gpus_per_node``, else
all ranks are taken to be on one host (then the raw end skew is still checked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

import polars as pl

SYNC_TYPES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier", "coalesced")
MIN_OFFSET_US = 50.0
MAD_SIGMA = 1.4826
MEDIAN_SE = 1.2533  # sqrt(pi / 2): standard error of the median = 1.2533 * sigma / sqrt(N)
# Uncorrected hosts: raw timestamps pick the last arriver only when a collective's arrival skew
# exceeds this many times the largest |theta| + u (else the clock-free arriver is used).
ARRIVAL_MARGIN = 3.0
# End skew above which timestamps of ranks said to share a host are not trusted: on one node,
# implicit-sync collectives end within 4-566 us of each other (TraceLens' reference
# nccl_summary_implicit_sync.csv, "skew in end time"; TraceLens docs, NCCL analyser).
MAX_END_SKEW_US = 500.0
EndGroup = list[tuple[int, str, float]]  # one collective: (rank, host, end time us) per member


@dataclass
class ClockEstimate:
    """The job's clock handling.

    Attributes:
        hosts: one row per host: ``host``, ``ranks`` (text), ``theta_us`` (offset of the host's
            clock from the reference host's, us; later means the host's clock reads late),
            ``uncertainty_us`` (standard error of theta), ``spread_us`` (one collective's
            spread, 1.4826 MAD), ``collectives`` (used), ``applied``.
        host_of: rank -> host label.
        offsets_us: rank -> the offset applied to its timestamps (0 when not applied).
        mode: ``one host`` (shared clock), ``consistent`` (offsets below their thresholds),
            ``corrected`` (offsets applied), ``clock-free`` (timestamps across ranks unusable).
        end_skew_before_us, end_skew_after_us: median end skew of the cross-host collectives
            (before and after correction), None when there are none.
        source: where hosts came from: ``hostname``, ``gpus_per_node`` or ``assumed``.
        notes: what was done and why.
        runs_apart: whether ranks on one host's clock never ran at the same time (the traces
            are probably of different runs, not one job; a note says which ranks and how far).
    """

    hosts: pl.DataFrame
    host_of: dict[int, str]
    offsets_us: dict[int, float]
    mode: str
    end_skew_before_us: float | None
    end_skew_after_us: float | None
    source: str
    notes: list[str] = field(default_factory=list)
    runs_apart: bool = False

    @property
    def timestamps_usable(self) -> bool:
        """Whether cross-rank timestamps (arrival order, skews) may be compared."""
        return self.mode != "clock-free"

    @property
    def arrival_margin_us(self) -> float:
        """Arrival skew (us) above which raw timestamps may name a collective's last arriver:
        0 when the timestamps share a clock or are corrected; with several hosts left
        uncorrected (``consistent``), ``ARRIVAL_MARGIN * max_h (|theta_h| + u_h)``; infinite
        when timestamps cannot be compared."""
        if self.mode == "clock-free":
            return float("inf")
        if self.mode != "consistent" or self.hosts.height < 2:
            return 0.0
        t = self.hosts.select(
            (pl.col("theta_us").abs() + pl.col("uncertainty_us").fill_null(0.0)).max()
        ).item()
        return ARRIVAL_MARGIN * float(t or 0.0)


def host_map(summaries: list) -> tuple[dict[int, str], str]:
    """rank -> host label, and where it came from (``hostname``, ``gpus_per_node``, ``assumed``)."""
    metas = [s.meta for s in summaries]
    if metas and all(m.get("hostname") for m in metas):
        return {int(m["rank"]): str(m["hostname"]) for m in metas}, "hostname"
    g = next((m.get("gpus_per_node") for m in metas if m.get("gpus_per_node")), None)
    if g:
        return {int(m["rank"]): f"node{int(m['rank']) // int(g)}" for m in metas}, "gpus_per_node"
    return {int(m["rank"]): "host0" for m in metas}, "assumed"


def _mad(xs: list[float]) -> float:
    if not xs:
        return 0.0
    m = median(xs)
    return MAD_SIGMA * median(abs(x - m) for x in xs)


def _end_skews(groups: list[EndGroup], off: dict[str, float]) -> list[float]:
    out = []
    for g in groups:
        e = [t - off.get(h, 0.0) for _, h, t in g]
        out.append(max(e) - min(e))
    return out


def _diffs(groups: list[EndGroup], off: dict[str, float]) -> dict[str, list[float]]:
    """d_{c,h} per host over the collectives (end times corrected by ``off``)."""
    out: dict[str, list[float]] = {}
    for g in groups:
        m = median(t - off.get(h, 0.0) for _, h, t in g)
        by: dict[str, list[float]] = {}
        for _, h, t in g:
            by.setdefault(h, []).append(t - off.get(h, 0.0))
        for h, ts in by.items():
            out.setdefault(h, []).append(median(ts) - m)
    return out


def _end_groups(
    members: pl.DataFrame, collectives: pl.DataFrame, host_of: dict[int, str]
) -> list[EndGroup]:
    """Per usable implicit-sync collective (ok or partial, >= 2 members), its members' end
    times, in the members table's order."""
    ok = collectives.filter(
        pl.col("status").is_in(["ok", "partial"])
        & pl.col("coll_type").is_in(SYNC_TYPES)
        & (pl.col("members") >= 2)
    )["coll_id"]
    m = members.filter(pl.col("coll_id").is_in(ok.implode())).select(
        "coll_id", "rank", "abs_end_us"
    )
    return [
        [(r, host_of.get(r, "?"), e) for r, e in zip(g["rank"], g["abs_end_us"], strict=True)]
        for _, g in m.group_by(["coll_id"], maintain_order=True)
    ]


def _hosts_table(
    hosts: list[str],
    host_of: dict[int, str],
    theta: dict[str, float],
    unc: dict[str, float],
    spread: dict[str, float],
    used: dict[str, int],
    applied: dict[str, bool],
) -> pl.DataFrame:
    """:attr:`ClockEstimate.hosts`: one row per host, in ``hosts`` order."""
    return pl.DataFrame(
        {
            "host": hosts,
            "ranks": [
                ", ".join(str(r) for r in sorted(r for r, x in host_of.items() if x == h))
                for h in hosts
            ],
            "theta_us": [theta.get(h) for h in hosts],
            "uncertainty_us": [unc.get(h) for h in hosts],
            "spread_us": [spread.get(h) for h in hosts],
            "collectives": [used.get(h, 0) for h in hosts],
            "applied": [applied.get(h, False) for h in hosts],
        },
        schema={
            "host": pl.Utf8,
            "ranks": pl.Utf8,
            "theta_us": pl.Float64,
            "uncertainty_us": pl.Float64,
            "spread_us": pl.Float64,
            "collectives": pl.Int64,
            "applied": pl.Boolean,
        },
    )


def _offsets(cross: list[EndGroup], ref: str) -> tuple[dict[str, float], dict[str, list[float]]]:
    """theta_h (step 1 of the module docstring): the median over the collectives of host h's
    end-time difference, relative to the reference host, refined once on the corrected end
    times; and the corrected differences (d_{c,h} after the first pass)."""
    d1 = _diffs(cross, {})
    theta = {h: median(v) for h, v in d1.items()}
    base = theta.get(ref, 0.0)
    theta = {h: v - base for h, v in theta.items()}
    d2 = _diffs(cross, theta)
    resid = {h: median(v) for h, v in d2.items()}
    base = resid.get(ref, 0.0)
    return {h: theta[h] + resid[h] - base for h in theta}, d2


def _uncertainty(
    cross: list[EndGroup], theta: dict[str, float], ref: str, d2: dict[str, list[float]]
) -> tuple[dict[str, float], dict[str, int], dict[str, float]]:
    """Per host (step 2 of the module docstring): the spread of one collective's reading of
    (host - reference) on corrected clocks (1.4826 MAD), the collectives read, and the
    standard error of theta; returns ``(spread, used, unc)``."""
    spread: dict[str, float] = {}
    used: dict[str, int] = {}
    unc: dict[str, float] = {}
    for h in theta:
        rel = []
        for g in cross:
            th = [t - theta[h] for _, x, t in g if x == h]
            tr = [t - theta[ref] for _, x, t in g if x == ref]
            if th and tr:
                rel.append(median(th) - median(tr))
        if h == ref:
            spread[h], used[h] = 0.0, sum(1 for g in cross if any(x == ref for _, x, _ in g))
        elif rel:
            spread[h], used[h] = _mad(rel), len(rel)
        else:
            spread[h], used[h] = _mad(d2[h]), len(d2[h])
        unc[h] = MEDIAN_SE * spread[h] / used[h] ** 0.5 if used[h] else 0.0
    return spread, used, unc


def estimate_offsets(
    members: pl.DataFrame,
    collectives: pl.DataFrame,
    summaries: list,
    host_of: dict[int, str] | None = None,
) -> ClockEstimate:
    """Estimate the per-host clock offsets (module docstring).

    ``members``/``collectives`` are :class:`tracedx.job.match.Matched` tables; only usable
    implicit-sync collectives are read (their ``abs_end_us``). ``host_of`` overrides
    :func:`host_map`. When no summary names its host and the ranks' end times disagree by
    more than ``MAX_END_SKEW_US``, each rank is taken as its own clock (``source`` ``per
    rank``) and the same estimate is made per rank.
    """
    source = "given"
    if host_of is None:
        host_of, source = host_map(summaries)
    hosts = sorted(
        set(host_of.values()), key=lambda h: min(r for r, x in host_of.items() if x == h)
    )
    groups = _end_groups(members, collectives, host_of)
    zero = {r: 0.0 for r in host_of}
    if len(hosts) == 1:
        return _one_host(members, collectives, summaries, host_of, hosts, groups, source)
    cross = [g for g in groups if len({h for _, h, _ in g}) >= 2]
    empty = _hosts_table(hosts, host_of, {}, {}, {}, {}, {})
    if not cross:
        note = (
            f"{len(hosts)} hosts but no collective spans two of them: clock offsets cannot be "
            "estimated; timestamps across hosts are not compared"
        )
        return ClockEstimate(empty, host_of, zero, "clock-free", None, None, source, [note])

    ref = hosts[0]
    theta, d2 = _offsets(cross, ref)
    spread, used, unc = _uncertainty(cross, theta, ref, d2)

    mode, off, before, after, note = _decide(cross, theta, unc, spread, ref, len(hosts))
    applied = {h: h in off for h in theta} if mode == "corrected" else {}
    offsets = {r: off.get(h, 0.0) for r, h in host_of.items()} if off else zero
    table = _hosts_table(hosts, host_of, theta, unc, spread, used, applied)
    return ClockEstimate(table, host_of, offsets, mode, before, after, source, [note])


def _decide(
    cross: list[EndGroup],
    theta: dict[str, float],
    unc: dict[str, float],
    spread: dict[str, float],
    ref: str,
    n_hosts: int,
) -> tuple[str, dict[str, float], float, float, str]:
    """Steps 3 and 4 of the module docstring: which offsets to apply, checked against the end
    skew. Returns ``(mode, offsets applied per host, end skew before, after, note)``."""
    applied = {
        h: h != ref and abs(theta[h]) > 3 * unc[h] and abs(theta[h]) > MIN_OFFSET_US for h in theta
    }
    off = {h: theta[h] for h in theta if applied[h]}
    before = median(_end_skews(cross, {}))
    after = median(_end_skews(cross, off)) if off else before
    worst = max(theta, key=lambda h: abs(theta[h]))
    desc = (
        f"largest {abs(theta[worst]):.0f} us on {worst} (+/- {unc[worst]:.1f} standard error; "
        f"spread {spread[worst]:.1f} us per collective)"
    )
    if not off and any(abs(theta[h]) > MIN_OFFSET_US for h in theta):
        note = (
            f"host clock offsets are uncertain ({desc}): below 3 times their uncertainty, "
            "not applied; timestamps across hosts are not compared (clock-free metrics only)"
        )
        return "clock-free", {}, before, before, note
    if not off:
        note = (
            f"host clock offsets under {MIN_OFFSET_US:.0f} us ({desc}): not applied; a "
            "collective's last arriver is read from its timestamps only when its arrival "
            f"skew exceeds {ARRIVAL_MARGIN:g} x (|offset| + uncertainty), else from the "
            "shortest kernel (clock-free)"
        )
        return "consistent", {}, before, before, note
    if after >= before:
        note = (
            f"host clock offsets ({desc}) do not reduce the median end skew of cross-host "
            f"collectives ({before:.0f} -> {after:.0f} us): not applied, clock-free metrics only"
        )
        return "clock-free", {}, before, before, note
    note = (
        f"host clock offsets corrected on {len(off)} of {n_hosts} hosts ({desc}); median "
        f"end skew of cross-host collectives {before:.0f} -> {after:.0f} us"
    )
    return "corrected", off, before, after, note


def _runs_apart(members: pl.DataFrame) -> list[str]:
    """A note when ranks said to share one host's clock never run at the same time: the span of
    one rank's collective ends lies wholly before another's. A job's ranks run together (their
    collectives end within microseconds to milliseconds of each other), so such traces are of
    different runs, matched only by their collectives' sequence numbers."""
    if members.height == 0:
        return []
    span = members.group_by("rank").agg(
        first=pl.col("abs_end_us").min(), last=pl.col("abs_end_us").max()
    )
    early = span.sort("last").row(0, named=True)
    late = span.sort("first", descending=True).row(0, named=True)
    gap_s = (late["first"] - early["last"]) / 1e6
    if not gap_s > 0:
        return []
    return [
        f"rank {early['rank']}'s collectives all end {gap_s:.1f} s before rank {late['rank']}'s "
        "first on their host's shared clock: the ranks never ran at the same time, so these "
        "traces are probably of different runs, not one job"
    ]


def _one_host(
    members: pl.DataFrame,
    collectives: pl.DataFrame,
    summaries: list,
    host_of: dict[int, str],
    hosts: list[str],
    groups: list[EndGroup],
    source: str,
) -> ClockEstimate:
    """The estimate when every rank is on one host: no offset, the raw end skew checked; with
    hosts only assumed and a median end skew over ``MAX_END_SKEW_US``, one clock per rank."""
    skews = _end_skews(groups, {})
    med = median(skews) if skews else None
    if source == "assumed" and med is not None and med > MAX_END_SKEW_US and len(host_of) > 1:
        per = estimate_offsets(members, collectives, summaries, {r: f"rank {r}" for r in host_of})
        per.source = "per rank"
        per.host_of = host_of
        per.notes.insert(
            0,
            f"no hostnames, and the median end skew of the ranks' collectives is {med:.0f} us "
            f"(> {MAX_END_SKEW_US:.0f} us): their clocks differ, so each rank's clock offset "
            "is estimated on its own",
        )
        return per
    notes = [] if source == "assumed" else _runs_apart(members)
    apart = bool(notes)
    if source == "assumed" and len(host_of) > 1:
        notes.append(
            "no hostnames in the file names: the ranks are taken to share one host's clock"
            + (f" (median end skew {med:.1f} us)" if med is not None else "")
        )
    zero = {r: 0.0 for r in host_of}
    empty = _hosts_table(hosts, host_of, {}, {}, {}, {}, {})
    return ClockEstimate(empty, host_of, zero, "one host", med, med, source, notes, apart)
