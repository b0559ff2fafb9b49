"""Per-host clock offsets from collective end times, with their uncertainty.

Ranks on one host share its wall clock (Kineto puts CPU and GPU events on it); across hosts
the clocks differ by whatever NTP/PTP leaves. An implicit-sync collective (all-reduce,
all-gather, reduce-scatter, all-to-all, barrier) delivers its last byte to every member at
nearly the same instant, so its members' kernel end times coincide up to a small spread. Per
host h, over the collectives whose members span two hosts or more:

1. ``d_{c,h} = median_{r in R_c on h} e_r - median_{r in R_c} e_r``;
   ``theta_h = median_c d_{c,h}``; the host of the lowest rank is the reference (theta = 0);
   the estimate is repeated once on the corrected end times and the residual added.
2. Uncertainty ``u_h = 1.4826 * MAD`` over the collectives of the corrected differences
   between host h and the reference host (the normal-consistent median absolute deviation:
   the spread of one collective's reading of the offset).
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
# End skew above which timestamps of ranks said to share a host are not trusted (MULTIRANK
# reference: implicit-sync end skew <= 0.5 ms on one node, TraceLens reference data).
MAX_END_SKEW_US = 500.0


@dataclass
class ClockEstimate:
    """The job's clock handling.

    Attributes:
        hosts: one row per host: ``host``, ``ranks`` (text), ``theta_us`` (offset of the host's
            clock from the reference host's, us; later means the host's clock reads late),
            ``uncertainty_us``, ``collectives`` (used), ``applied``.
        host_of: rank -> host label.
        offsets_us: rank -> the offset applied to its timestamps (0 when not applied).
        mode: ``one host`` (shared clock), ``consistent`` (offsets below their thresholds),
            ``corrected`` (offsets applied), ``clock-free`` (timestamps across ranks unusable).
        end_skew_before_us, end_skew_after_us: median end skew of the cross-host collectives
            (before and after correction), None when there are none.
        source: where hosts came from: ``hostname``, ``gpus_per_node`` or ``assumed``.
        notes: what was done and why.
    """

    hosts: pl.DataFrame
    host_of: dict[int, str]
    offsets_us: dict[int, float]
    mode: str
    end_skew_before_us: float | None
    end_skew_after_us: float | None
    source: str
    notes: list[str] = field(default_factory=list)

    @property
    def timestamps_usable(self) -> bool:
        """Whether cross-rank timestamps (arrival order, skews) may be compared."""
        return self.mode != "clock-free"


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


def _end_skews(groups: list[list[tuple[int, str, float]]], off: dict[str, float]) -> list[float]:
    out = []
    for g in groups:
        e = [t - off.get(h, 0.0) for _, h, t in g]
        out.append(max(e) - min(e))
    return out


def _diffs(
    groups: list[list[tuple[int, str, float]]], off: dict[str, float]
) -> dict[str, list[float]]:
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
    notes: list[str] = []
    ok = collectives.filter(
        pl.col("status").is_in(["ok", "partial"])
        & pl.col("coll_type").is_in(SYNC_TYPES)
        & (pl.col("members") >= 2)
    )["coll_id"]
    m = members.filter(pl.col("coll_id").is_in(ok.implode())).select(
        "coll_id", "rank", "abs_end_us"
    )
    groups: list[list[tuple[int, str, float]]] = []
    for (_cid,), g in m.group_by(["coll_id"], maintain_order=True):
        groups.append(
            [(r, host_of.get(r, "?"), e) for r, e in zip(g["rank"], g["abs_end_us"], strict=True)]
        )
    cross = [g for g in groups if len({h for _, h, _ in g}) >= 2]

    def table(theta, unc, used, applied) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "host": hosts,
                "ranks": [
                    ", ".join(str(r) for r in sorted(r for r, x in host_of.items() if x == h))
                    for h in hosts
                ],
                "theta_us": [theta.get(h) for h in hosts],
                "uncertainty_us": [unc.get(h) for h in hosts],
                "collectives": [used.get(h, 0) for h in hosts],
                "applied": [applied.get(h, False) for h in hosts],
            },
            schema={
                "host": pl.Utf8,
                "ranks": pl.Utf8,
                "theta_us": pl.Float64,
                "uncertainty_us": pl.Float64,
                "collectives": pl.Int64,
                "applied": pl.Boolean,
            },
        )

    zero = {r: 0.0 for r in host_of}
    if len(hosts) == 1:
        skews = _end_skews(groups, {})
        med = median(skews) if skews else None
        if source == "assumed" and med is not None and med > MAX_END_SKEW_US and len(host_of) > 1:
            per = estimate_offsets(
                members, collectives, summaries, {r: f"rank {r}" for r in host_of}
            )
            per.source = "per rank"
            per.host_of = host_of
            per.notes.insert(
                0,
                f"no hostnames, and the median end skew of the ranks' collectives is {med:.0f} us "
                f"(> {MAX_END_SKEW_US:.0f} us): their clocks differ, so each rank's clock offset "
                "is estimated on its own",
            )
            return per
        if source == "assumed" and len(host_of) > 1:
            notes.append(
                "no hostnames in the file names: the ranks are taken to share one host's clock"
                + (f" (median end skew {med:.1f} us)" if med is not None else "")
            )
        return ClockEstimate(
            table({}, {}, {}, {}), host_of, zero, "one host", med, med, source, notes
        )

    if not cross:
        notes.append(
            f"{len(hosts)} hosts but no collective spans two of them: clock offsets cannot be "
            "estimated; timestamps across hosts are not compared"
        )
        return ClockEstimate(
            table({}, {}, {}, {}), host_of, zero, "clock-free", None, None, source, notes
        )

    ref = hosts[0]
    d1 = _diffs(cross, {})
    theta = {h: median(v) for h, v in d1.items()}
    base = theta.get(ref, 0.0)
    theta = {h: v - base for h, v in theta.items()}
    d2 = _diffs(cross, theta)
    resid = {h: median(v) for h, v in d2.items()}
    base = resid.get(ref, 0.0)
    theta = {h: theta[h] + resid[h] - base for h in theta}
    # uncertainty: spread of one collective's reading of (host - reference), corrected clocks
    unc: dict[str, float] = {}
    used: dict[str, int] = {}
    for h in theta:
        rel = []
        for g in cross:
            th = [t - theta[h] for _, x, t in g if x == h]
            tr = [t - theta[ref] for _, x, t in g if x == ref]
            if th and tr:
                rel.append(median(th) - median(tr))
        if h == ref:
            unc[h], used[h] = 0.0, sum(1 for g in cross if any(x == ref for _, x, _ in g))
        elif rel:
            unc[h], used[h] = _mad(rel), len(rel)
        else:
            unc[h], used[h] = _mad(d2[h]), len(d2[h])
    applied = {
        h: h != ref and abs(theta[h]) > 3 * unc[h] and abs(theta[h]) > MIN_OFFSET_US for h in theta
    }
    off = {h: theta[h] for h in theta if applied[h]}
    before = median(_end_skews(cross, {}))
    after = median(_end_skews(cross, off)) if off else before
    worst = max(theta, key=lambda h: abs(theta[h]))
    desc = f"largest {abs(theta[worst]):.0f} us on {worst} (+/- {unc[worst]:.0f})"
    if not off:
        if any(abs(theta[h]) > MIN_OFFSET_US for h in theta):
            notes.append(
                f"host clock offsets are uncertain ({desc}): below 3 times their uncertainty, "
                "not applied; timestamps across hosts are not compared (clock-free metrics only)"
            )
            mode = "clock-free"
        else:
            notes.append(f"host clock offsets under {MIN_OFFSET_US:.0f} us ({desc}): not applied")
            mode = "consistent"
        return ClockEstimate(
            table(theta, unc, used, {}), host_of, zero, mode, before, before, source, notes
        )
    if after >= before:
        notes.append(
            f"host clock offsets ({desc}) do not reduce the median end skew of cross-host "
            f"collectives ({before:.0f} -> {after:.0f} us): not applied, clock-free metrics only"
        )
        return ClockEstimate(
            table(theta, unc, used, {}), host_of, zero, "clock-free", before, before, source, notes
        )
    notes.append(
        f"host clock offsets corrected on {len(off)} of {len(hosts)} hosts ({desc}); median "
        f"end skew of cross-host collectives {before:.0f} -> {after:.0f} us"
    )
    offsets = {r: off.get(h, 0.0) for r, h in host_of.items()}
    return ClockEstimate(
        table(theta, unc, used, applied),
        host_of,
        offsets,
        "corrected",
        before,
        after,
        source,
        notes,
    )
