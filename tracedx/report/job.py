"""Rendering a :class:`tracedx.job.diagnosis.JobDiagnosis`: the ``tracedx.job/1`` JSON document,
the terminal text and Markdown. Nothing here computes a figure the diagnosis does not hold;
times are converted from us to ms. Non-finite numbers are written as null.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from tracedx.console import plural
from tracedx.report.json import _clean
from tracedx.report.safe import md_prose, md_text, safe_strings
from tracedx.report.text import speedup_label

SCHEMA = "tracedx.job/1"


OTHER_SHOWN = 0.05
"""The RANKS table shows the "other" column when some rank's other time is this share of its
step or more."""


def _ms(v) -> float | None:
    return None if v is None else round(v / 1e3, 6)


def _rows(df: pl.DataFrame) -> list[dict]:
    """Rows with ``*_us`` columns written as ``*_ms``."""
    out = []
    for r in df.to_dicts():
        out.append(
            {
                (k[:-3] + "_ms" if k.endswith("_us") else k): (
                    _ms(v) if k.endswith("_us") and isinstance(v, (int, float)) else v
                )
                for k, v in r.items()
            }
        )
    return out


def group_label(g: dict) -> str:
    """A process group as a reader knows it: its description and its ranks
    (``default_pg [0, 1]``), the name where there is no description."""
    who = g.get("pg_desc") or (f"group {g['pg_name']}" if g.get("pg_name") else "group")
    key = g.get("pg_key") or ""
    ranks = key.split(":", 1)[1] if ":" in key else ""
    return f"{who} {ranks}" if ranks else who


def collective_groups(jd) -> pl.DataFrame:
    """Per (process group, type): count, ``msg_bytes`` (median per collective),
    ``msg_bytes_total`` and ``transfer_total_us`` (in all, over the instances), median busbw
    and its share of the link, median waits (the COLLECTIVES section)."""
    c = jd.collectives
    if c.height == 0 or "transfer_us" not in c.columns:
        return pl.DataFrame()
    return (
        c.filter(pl.col("usable"))
        .group_by("pg_key", "coll_type")
        .agg(
            pg_desc=pl.col("pg_desc").first(),
            pg_name=pl.col("pg_name").first(),
            group_size=pl.col("group_size").max(),
            count=pl.len(),
            msg_bytes=pl.col("msg_bytes").median().cast(pl.Int64),
            msg_bytes_total=pl.col("msg_bytes").sum(),
            transfer_total_us=pl.col("transfer_us").sum(),
            max_wait_us=pl.col("max_wait_us").median(),
            busbw_gbs=pl.col("busbw_gbs").median(),
            link=pl.col("link").first(),
            link_gbs=pl.col("link_gbs").first(),
            busbw_fraction=pl.col("busbw_fraction").median(),
        )
        .sort(  # ties (groups of one shape) in group order: the same document every run
            "transfer_total_us", "pg_key", "coll_type", descending=[True, False, False]
        )
    )


RUNS_APART_WARNING = (
    "WARNING: these ranks never ran at the same time on their shared clock: the traces are "
    "probably of different runs, not one job, and what follows compares them as one (see the "
    "notes)"
)


APART_FIXES = (
    "the ranks never ran at the same time, so they share no job step T to price a fix against "
    "(Amdahl); each rank's trace diagnosed alone estimates its fixes against its own step"
)


def job_dict(jd) -> dict[str, Any]:
    """The ``tracedx.job/1`` document (keys: schema, ranks, steps, regime, bottleneck, evidence,
    straggler, collectives, findings, notes)."""
    t = jd.typical
    steps_nums = sorted(jd.steps["step"].unique().to_list()) if jd.steps.height else []
    status = (
        dict(jd.collectives.group_by("status").agg(pl.len()).sort("status").iter_rows())
        if jd.collectives.height
        else {}
    )
    cl = jd.clock
    doc = {
        "schema": SCHEMA,
        "ranks": _rows(jd.ranks),
        "steps": {
            "numbers": steps_nums,
            "step_time_ms": _ms(t["step_us"]),
            "compute_ms": _ms(t["compute_us"]),
            "exposed_wait_ms": _ms(t["exposed_wait_us"]),
            "exposed_transfer_ms": _ms(t["exposed_transfer_us"]),
            "idle_ms": _ms(t["idle_us"]),
            "transfer_ms": _ms(t["transfer_us"]),
            "load_balance": t["load_balance"],
            "communication_efficiency": t["communication_efficiency"],
            "parallel_efficiency": t["parallel_efficiency"],
            "outside_comm_ms": _ms(t.get("outside_comm_us")),
            "load_balance_outside_comm": t.get("load_balance_outside_comm"),
            "per_rank": _rows(jd.steps),
        },
        "regime": jd.regime,
        "bottleneck": jd.bottleneck,
        "evidence": jd.evidence,
        "straggler": None if jd.straggler is None else jd.straggler.to_dict(),
        "collectives": {
            "count": jd.collectives.height,
            "status": status,
            "process_groups": jd.groups.to_dicts() if jd.groups.height else [],
            "by_group": _rows(collective_groups(jd)),
            "clock": {
                "mode": cl.mode,
                "runs_apart": cl.runs_apart,
                "hosts_from": cl.source,
                "end_skew_before_ms": _ms(cl.end_skew_before_us),
                "end_skew_after_ms": _ms(cl.end_skew_after_us),
                "hosts": _rows(cl.hosts),
            },
        },
        "findings": [f.to_dict() for f in jd.findings],
        "notes": jd.notes,
    }
    return _clean(doc)


def render_json(jd) -> str:
    return json.dumps(job_dict(jd), indent=2, allow_nan=False, default=str) + "\n"


def _f(v, fmt: str = ".3f", unit: str = " ms") -> str:
    return "n/a" if v is None else f"{v:{fmt}}{unit}"


def verdict_line(d: dict, none: str = "no regime (see below)") -> str:
    """The job's verdict in one line from :func:`job_dict`'s document: ``REGIME, bottleneck:
    B`` (with the straggler and its cause); a job without GPU activity has a bottleneck but no
    regime; ``none`` when there is neither."""
    b, s = d["bottleneck"], d["straggler"]
    if s:
        b = f"{b}: straggler rank {s['rank']} ({s['cause']})"
    if d["regime"]:
        return f"{d['regime'].upper()}, bottleneck: {b}"
    return f"no regime (no GPU activity), bottleneck: {b}" if b else none


def _rank_verdict(r: dict) -> str:
    """A rank's verdict in the RANKS table; a waiting rank's "load imbalance (waits for rank
    N)" shortened to "waits for rank N" (the job's bottleneck says load imbalance) so that the
    row fits 100 columns."""
    regime, bott = r.get("regime"), r.get("bottleneck")
    if bott and bott.startswith("load imbalance (waits for "):
        bott = bott.removeprefix("load imbalance (").removesuffix(")")
    if regime:
        return f"{regime} ({bott or 'n/a'})"
    return bott or "n/a"


def render_text(jd, width: int | None = None) -> str:
    """The terminal report: verdict, evidence, ranks (median per step), collectives per process
    group, fixes; wrapped to ``width`` columns (default :data:`tracedx.console.WIDTH`, as one
    trace's report: :func:`tracedx.console.fit`)."""
    from tracedx.console import WIDTH, fit

    return fit(_text(jd), width or WIDTH)


def _text(jd) -> str:
    d = safe_strings(job_dict(jd))  # a trace's text (host names, paths) printed inert
    st = d["steps"]
    out: list[str] = []
    n = len(d["ranks"])
    nums = st["numbers"]
    head = f"tracedx · job of {n} rank{'s' if n != 1 else ''}"
    if nums:
        head += f" · {len(nums)} step{'s' if len(nums) != 1 else ''} ({nums[0]}..{nums[-1]})"
    out.append(head)
    out.append("")
    if d["collectives"]["clock"].get("runs_apart"):
        out += [RUNS_APART_WARNING, ""]
    out.append(f"JOB VERDICT: {verdict_line(d)}")
    for e in d["evidence"]:
        out.append(f"  - {e}")
    out.append("")
    out.append(
        "RANKS (each rank's median per step; last in: of all its collectives, those it was last at)"
    )
    shown = _shown_ranks(d)
    # the host column as wide as its longest name (4 to 12), so the verdict fits 100 columns
    hw = max([4] + [min(12, len(str(r.get("host") or ""))) for r in shown])
    # "other" (neither compute, exposed communication nor GPU idle: host time outside the ops
    # of a CPU rank) gets a column where it is 5% of a rank's step or more
    other = any(
        (r.get("other_ms") or 0) >= OTHER_SHOWN * (r.get("step_time_ms") or float("inf"))
        for r in d["ranks"]
    )
    out.append(
        f"  {'rank':>4} {'host':<{hw}} {'step ms':>9} {'compute':>8} {'exp.wait':>8} "
        f"{'exp.xfer':>8}{' ' + 'other'.rjust(6) if other else ''} {'overlap':>7} {'last in':>7}  verdict"
    )
    for r in shown:
        ov = "n/a" if r.get("overlap_ratio") is None else f"{r['overlap_ratio']:.0%}"
        last = f"{r.get('last_arrivals') or 0}/{r.get('collectives') or 0}"
        rest = f" {_f(r.get('other_ms'), '.3f', ''):>6}" if other else ""
        out.append(
            f"  {r['rank']:>4} {str(r.get('host') or '')[:12]:<{hw}} "
            f"{_f(r.get('step_time_ms'), '.3f', ''):>9} {_f(r.get('compute_ms'), '.3f', ''):>8} "
            f"{_f(r.get('exposed_wait_ms'), '.3f', ''):>8} "
            f"{_f(r.get('exposed_transfer_ms'), '.3f', ''):>8}{rest} {ov:>7} {last:>7}  "
            f"{_rank_verdict(r)}"
        )
    if len(shown) < n:
        out.append(
            f"  ... {n - len(shown)} more ranks (the ranks with the most and least exposed wait "
            "are shown; --format json lists all)"
        )
    c = d["collectives"]
    if c["count"]:
        out.append("")
        stat = ", ".join(f"{k} {v}" for k, v in c["status"].items())
        out.append(
            f"COLLECTIVES ({plural(c['count'], 'collective')}: {stat}; clock: {c['clock']['mode']})"
        )
        for g in c["by_group"][:8]:
            bw = "n/a" if g["busbw_gbs"] is None else f"{g['busbw_gbs']:.1f} GB/s"
            ref = ""
            if g.get("link_gbs") and g.get("busbw_fraction") is not None:
                ref = f" ({g['busbw_fraction']:.0%} of {g['link']} {g['link_gbs']:.0f} GB/s)"
            n_txt = f", n={g['group_size']}" if g["group_size"] else ""
            out.append(
                f"  {group_label(g)} {g['coll_type']} x{g['count']}{n_txt}: "
                f"{int(g['msg_bytes'] or 0):,} bytes each (median; "
                f"{int(g['msg_bytes_total'] or 0):,} in all), transfer "
                f"{_f(g['transfer_total_ms'])} in all, busbw {bw}{ref} and max wait "
                f"{_f(g['max_wait_ms'])} per collective (median)"
            )
        for h in c["clock"]["hosts"]:
            if h.get("theta_ms") is not None:
                out.append(
                    f"  clock {h['host']}: offset {h['theta_ms'] * 1e3:.1f} us "
                    f"(+/- {h['uncertainty_ms'] * 1e3:.1f} standard error, spread "
                    f"{(h.get('spread_ms') or 0) * 1e3:.1f} per collective)"
                    f"{' applied' if h['applied'] else ''}"
                )
    out.append("")
    if d["collectives"]["clock"].get("runs_apart"):
        out.append(f"FIXES: none estimated: {APART_FIXES}")
    else:
        out.append(f"FIXES (Amdahl against the job's step T = {_f(st['step_time_ms'])})")
        if not d["findings"]:
            out.append("  none")
    for i, f in enumerate(d["findings"], 1):
        s = "∞" if f["local_speedup"] is None else f"{f['local_speedup']:.1f}x"  # as one trace's
        rec = "" if f["recommended"] else "  [not recommended: < 5%]"
        out.append(
            f"  {i}. {f['fix']}: {speedup_label(f)} -> {f['estimated_step_ms']:.3f} ms "
            f"(f = {f['fraction']:.0%}, s = {s}){rec}"
        )
        out.append(f"     {f['title']}")
        for e in f["evidence"]:
            out.append(f"     - {e}")
        out.append(f"     = {f['derivation']}")
    if d["notes"]:
        out.append("")
        out.append("NOTES")
        for x in d["notes"]:
            out.append(f"  - {x}")
    return "\n".join(out) + "\n"


MAX_RANK_ROWS = 16


def _shown_ranks(d: dict) -> list[dict]:
    """All ranks up to MAX_RANK_ROWS; above, the straggler and the ranks with the most and the
    least exposed wait, in rank order."""
    ranks = d["ranks"]
    if len(ranks) <= MAX_RANK_ROWS:
        return ranks
    by = sorted(ranks, key=lambda r: (-(r.get("exposed_wait_ms") or 0.0), r["rank"]))
    keep = {r["rank"] for r in by[:5] + by[-5:]}
    if d["straggler"]:
        keep.add(d["straggler"]["rank"])
    return [r for r in ranks if r["rank"] in keep]


def render_markdown(jd) -> str:
    """The job report as Markdown: verdict, a per-rank table, fixes, notes."""
    d = safe_strings(job_dict(jd))
    out = [f"# tracedx job report ({len(d['ranks'])} ranks)", ""]
    if d["collectives"]["clock"].get("runs_apart"):
        out += [f"> **{md_prose(RUNS_APART_WARNING)}**", ""]
    out.append(f"**Verdict:** {md_prose(verdict_line(d, 'none'))}")
    out.append("")
    out += [f"- {md_prose(e)}" for e in d["evidence"]]
    out += [
        "",
        "| rank | host | step ms | compute ms | exposed wait ms | exposed transfer ms | other ms | verdict |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in d["ranks"]:
        out.append(
            f"| {r['rank']} | {md_text(r.get('host') or '')} | {_f(r.get('step_time_ms'), '.3f', '')} | "
            f"{_f(r.get('compute_ms'), '.3f', '')} | {_f(r.get('exposed_wait_ms'), '.3f', '')} | "
            f"{_f(r.get('exposed_transfer_ms'), '.3f', '')} | {_f(r.get('other_ms'), '.3f', '')} | "
            f"{md_text(_rank_verdict(r))} |"
        )
    out += ["", "## Fixes", ""]
    for f in d["findings"] or []:
        out.append(
            f"- **{md_text(f['fix'])}** {speedup_label(f)} (f = {f['fraction']:.0%})"
            f"{'' if f['recommended'] else ' (not recommended: < 5%)'}: "
            f"{md_prose(f['title'])}; {md_prose(f['derivation'])}"
        )
    if d["collectives"]["clock"].get("runs_apart"):
        out.append(f"none estimated: {md_prose(APART_FIXES)}")
    elif not d["findings"]:
        out.append("none")
    if d["notes"]:
        out += ["", "## Notes", ""] + [f"- {md_prose(x)}" for x in d["notes"]]
    return "\n".join(out) + "\n"
