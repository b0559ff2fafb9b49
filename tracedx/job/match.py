"""Matching collectives across ranks: process groups keyed by (name, ranks), then one row per
collective instance with its members, validated.

Process groups are keyed by ``(pg_name, pg_ranks)``, never by the name alone: with
``split_group`` (used by ``DeviceMesh``) several subgroups can share one name (PyTorch's Flight
Recorder analyser keys groups by name and the ranks for the same reason,
``torch/distributed/flight_recorder/components/builder.py``).

Within a process group the match key is the first one that every row of the group carries:
``Comms Id`` (the same value on every rank of one operation, pytorch PR #176810), else ``Seq``
(the group's sequence number), else ``(step, ordinal)`` (the order of the collective within the
group and step on each rank). A key repeated on one rank (one operation launching two kernels)
is matched in start order. Each collective is validated over its members: same type, same
message size (all-to-all-v excepted), same dtype, same group size, one row per rank. A row
with neither group size nor group ranks (gloo, older traces) belongs to the default group: its
group size is the rank's ``meta.world_size`` (ranks 0 .. world_size - 1), so one rank of a
larger job has its collectives unmatched, never ``ok``. A
collective whose members disagree is kept with a mismatch status and left out of every metric;
one that lacks members is kept with status ``partial`` and its missing ranks (its transfer
time is then an upper bound and its waits lower bounds). Send/recv are point-to-point: their
two sides have different types and sequence counters, so they are not matched here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from tracedx.job.summary import COLL_COLUMNS, FREE_DTYPE
from tracedx.trace.collectives import parse_ranks

P2P = ("send", "recv")
# Statuses whose members give usable durations (transfer time and waits).
USABLE = ("ok", "partial")

# the colls columns the matching reads (types from the summary's schema)
_MEMBER_COLS = {
    k: COLL_COLUMNS[k]
    for k in (
        "step", "stream", "coll_type", "pg_name", "pg_desc", "pg_ranks", "group_size", "seq",
        "comms_id", "ordinal", "start_us", "end_us", "duration_us", "dtype", "msg_bytes",
    )
}  # fmt: skip


def pg_key_expr(ranks: pl.Expr | None = None) -> pl.Expr:
    """The process-group key ``"<name>:<ranks>"`` (name and the ranks string as written;
    ``ranks``: that string's expression, default ``pg_ranks``)."""
    ranks = pl.col("pg_ranks") if ranks is None else ranks
    return pl.concat_str([pl.col("pg_name").fill_null("?"), pl.lit(":"), ranks.fill_null("")])


@dataclass
class Matched:
    """Collectives matched across ranks.

    Attributes:
        members: one row per (collective, rank): ``coll_id``, ``rank`` and the rank's ``colls``
            columns (``step``, ``start_us``, ``end_us``, ``duration_us`` on the rank's own
            clock, ``free_us``, ``free_total_us``, ...), plus ``abs_start_us``/``abs_end_us`` (the rank's times on
            the job's common base: ``(base_time_ns - min base) / 1000 + t``); its ``pg_key``
            and ``pg_ranks`` are Categorical (a group's text held once).
        collectives: one row per collective instance: ``coll_id``, ``pg_key``, ``pg_name``,
            ``pg_desc``, ``pg_ranks``, ``coll_type``, ``step``, ``seq``, ``match_key``
            (``comms_id``, ``seq`` or ``ordinal``), ``group_size``, ``members``, ``status``
            (``ok``, ``partial``, ``type mismatch``, ``size mismatch``, ``dtype mismatch``,
            ``group mismatch``, ``duplicate member``, ``unmatched``), ``missing_ranks`` (str),
            ``msg_bytes``.
        groups: one row per process group: ``pg_key``, ``pg_name``, ``pg_desc``, ``pg_ranks``,
            ``group_size``, ``ranks_seen`` (ranks of the job with collectives in it, as text),
            ``collectives``, ``match_key``.
        p2p: send/recv rows (not matched), with ``rank``.
        notes: what could not be matched and why.
    """

    members: pl.DataFrame
    collectives: pl.DataFrame
    groups: pl.DataFrame
    p2p: pl.DataFrame
    notes: list[str] = field(default_factory=list)


COLLECTIVE_SCHEMA = {
    "pg_key": pl.Utf8,
    "step": pl.Int64,
    "seq": pl.Int64,
    "match_key": pl.Utf8,
    "pg_name": pl.Utf8,
    "pg_desc": pl.Utf8,
    "pg_ranks": pl.Utf8,
    "coll_type": pl.Utf8,
    "group_size": pl.Int64,
    "msg_bytes": pl.Int64,
    "members": pl.UInt32,
    "coll_id": pl.Int64,
    "status": pl.Utf8,
    "missing_ranks": pl.Utf8,
}


def _colls(s, columns: list[str]) -> pl.DataFrame | None:
    """The rank's ``colls`` rows, only ``columns`` of them where the summary can decode some
    (``HeldSummary.table``); None without collectives."""
    table = getattr(s, "table", None)
    c = table("colls", columns) if table is not None else s.colls
    if c is None or c.height == 0:
        return None
    # a group's ranks as written ("[0, 1, ..., 1023]"): one text per group, not one per row
    # (per row it would grow with ranks x collectives x group size)
    return c.select(
        pl.col(k).cast(pl.Utf8).cast(pl.Categorical) if k == "pg_ranks" else pl.col(k)
        for k in columns
        if k in c.columns
    )


def _world_size(meta: dict) -> int | None:
    ws = meta.get("world_size")
    return int(ws) if isinstance(ws, int) or (isinstance(ws, str) and ws.isdigit()) else None


def _all_rows(summaries: list) -> pl.DataFrame | None:
    """Every rank's collective rows in one table (the ranks in the given order): ``rank``,
    ``_base_ns``, the columns the matching reads (null where a summary lacks one), ``free_us``,
    ``free_total_us``, ``_world`` (the row belongs to the default group of ``meta.world_size``
    ranks: no group size, no group ranks), ``group_size`` filled from the world size there.
    Each rank's table is decoded once, only those columns; the rest is one pass over all."""
    wanted = [*_MEMBER_COLS, "free_us", "free_total_us"]
    parts, per_rank = [], []
    for s in summaries:
        c = _colls(s, wanted)
        if c is None:
            continue
        parts.append(c)
        meta = s.meta
        per_rank.append(
            (c.height, int(meta["rank"]), int(meta.get("base_time_ns") or 0), _world_size(meta))
        )
    if not parts:
        return None
    same = all(p.columns == wanted for p in parts)
    rows = pl.concat(parts, how="vertical_relaxed" if same else "diagonal_relaxed")
    n, rank, base, ws = (np.array(x) for x in zip(*per_rank, strict=True))
    ws_known = np.array([w is not None for w in ws])
    rows = rows.with_columns(
        rank=pl.Series(np.repeat(rank.astype(np.int64), n), dtype=pl.Int64),
        _base_ns=pl.Series(np.repeat(base.astype(np.int64), n), dtype=pl.Int64),
        _ws=pl.Series(np.repeat(np.where(ws_known, ws, 0).astype(np.int64), n), dtype=pl.Int64),
        _ws_known=pl.Series(np.repeat(ws_known, n), dtype=pl.Boolean),
    ).with_columns(_ws=pl.when(pl.col("_ws_known")).then(pl.col("_ws")).otherwise(None))
    types = {**_MEMBER_COLS, "free_us": FREE_DTYPE, "free_total_us": pl.Float64}
    types["pg_ranks"] = pl.Categorical
    cols = [
        pl.col(k).cast(t) if k in rows.columns else pl.lit(None, dtype=t).alias(k)
        for k, t in types.items()
    ]
    # no group size (gloo, older traces) on a row without group ranks: the default group,
    # which spans the job's world (meta.world_size)
    no_group = pl.col("pg_ranks").is_null() | (pl.col("pg_ranks") == "")
    return (
        rows.select("rank", "_base_ns", *cols, "_ws")
        .with_columns(
            _world=pl.col("group_size").is_null() & no_group & pl.col("_ws").is_not_null()
        )
        .with_columns(
            group_size=pl.when(pl.col("_world"))
            .then(pl.col("_ws"))
            .otherwise(pl.col("group_size")),
        )
        .drop("_ws")
    )


def match_collectives(summaries: list) -> Matched:
    """Match the ``colls`` tables of the ranks' summaries (see the module docstring).

    ``summaries``: objects with ``meta`` (``rank`` required, ``base_time_ns``) and a ``colls``
    polars table as docs/multirank.md defines it. Order does not matter: rows are sorted by
    rank and time, and collective ids follow (step, ordinal, group, key).
    """
    rows = _all_rows(summaries)
    notes: list[str] = []
    if rows is None:
        empty = pl.DataFrame(
            schema={"coll_id": pl.Int64, "rank": pl.Int64, "abs_start_us": pl.Float64,
                    "abs_end_us": pl.Float64, **_MEMBER_COLS, "free_us": FREE_DTYPE,
                    "free_total_us": pl.Float64, "pg_key": pl.Utf8}
        )  # fmt: skip
        colls = pl.DataFrame(schema=COLLECTIVE_SCHEMA)
        groups = pl.DataFrame(schema={"pg_key": pl.Utf8, "pg_name": pl.Utf8, "pg_desc": pl.Utf8,
                                      "pg_ranks": pl.Utf8, "group_size": pl.Int64})  # fmt: skip
        return Matched(empty, colls, groups, empty)
    # the process groups, each once: "_pg" numbers them in the order of their key text, so
    # that sorting by it is sorting by the key; rows carry the number, not the ranks' text
    pgs = (
        rows.select("pg_name", "pg_ranks")
        .unique()
        .with_columns(pg_key=pg_key_expr(pl.col("pg_ranks").cast(pl.Utf8)))
        .with_columns(_pg=pl.col("pg_key").rank("dense").cast(pl.Int64))
    )
    rows = rows.join(pgs, on=["pg_name", "pg_ranks"], how="left", nulls_equal=True).drop("pg_key")
    pgs = pgs.group_by("_pg").agg(pl.col("pg_key").first()).sort("_pg")
    ref = rows["_base_ns"].min()
    rows = (
        rows.with_columns(
            _off=(pl.col("_base_ns") - ref).cast(pl.Float64) / 1e3,
        )
        .with_columns(
            abs_start_us=pl.col("start_us") + pl.col("_off"),
            abs_end_us=pl.col("end_us") + pl.col("_off"),
        )
        .drop("_off", "_base_ns")
        .sort("rank", "start_us", "end_us")
    )
    p2p = _with_group_text(rows.filter(pl.col("coll_type").is_in(P2P)).drop("_world"), pgs)
    rows = rows.filter(~pl.col("coll_type").is_in(P2P) | pl.col("coll_type").is_null())
    if p2p.height:
        notes.append(
            f"{p2p.height} send/recv kernels are point-to-point: not matched as collectives "
            "(their waits are not split)"
        )
    job_ranks = sorted({int(s.meta["rank"]) for s in summaries})

    # the match key: the best one every row of the process group carries
    level = rows.group_by("_pg").agg(
        has_id=(pl.col("comms_id").is_not_null() & (pl.col("comms_id") != "")).all(),
        has_seq=pl.col("seq").is_not_null().all(),
    )
    level = level.with_columns(
        match_key=pl.when(pl.col("has_id"))
        .then(pl.lit("comms_id"))
        .when(pl.col("has_seq"))
        .then(pl.lit("seq"))
        .otherwise(pl.lit("ordinal"))
    ).select("_pg", "match_key")
    rows = rows.join(level, on="_pg", how="left")
    key = (
        pl.when(pl.col("match_key") == "comms_id")
        .then(pl.concat_str([pl.lit("id:"), pl.col("comms_id")]))
        .when(pl.col("match_key") == "seq")
        .then(pl.concat_str([pl.lit("seq:"), pl.col("seq").cast(pl.Utf8)]))
        .otherwise(
            pl.concat_str(
                [
                    pl.lit("ord:"),
                    pl.col("step").cast(pl.Utf8).fill_null("?"),
                    pl.lit(":"),
                    pl.col("ordinal").cast(pl.Utf8).fill_null("?"),
                ]
            )
        )
    )
    rows = rows.with_columns(_key=key).with_columns(
        _dup=pl.int_range(pl.len()).over("rank", "_pg", "_key")
    )

    ident = ["_pg", "_key", "_dup"]
    colls = rows.group_by(ident).agg(
        step=pl.col("step").min(),
        _ord=pl.col("ordinal").min(),
        seq=pl.col("seq").min(),
        match_key=pl.col("match_key").first(),
        pg_name=pl.col("pg_name").first(),
        pg_desc=pl.col("pg_desc").drop_nulls().first(),
        pg_ranks=pl.col("pg_ranks").first(),
        coll_type=pl.col("coll_type").first(),
        group_size=pl.col("group_size").max(),
        msg_bytes=pl.col("msg_bytes").max(),
        members=pl.col("rank").n_unique(),
        _rows=pl.len(),
        _types=pl.col("coll_type").n_unique(),
        _sizes=pl.col("msg_bytes").n_unique(),
        _dtypes=pl.col("dtype").n_unique(),
        _gsizes=pl.col("group_size").n_unique(),
        _ranks=pl.col("rank").unique().sort(),
        _world=pl.col("_world").any(),
    )
    colls = colls.sort(
        pl.col("step").fill_null(-1), pl.col("_ord").fill_null(-1), "_pg", "_key", "_dup"
    ).with_columns(
        coll_id=pl.int_range(pl.len(), dtype=pl.Int64), pg_ranks=pl.col("pg_ranks").cast(pl.Utf8)
    )
    colls = colls.join(pgs, on="_pg", how="left")

    statuses, missing = [], []
    parsed: dict = {}  # a group's ranks, parsed once per (text, size)
    for r in colls.iter_rows(named=True):
        present = set(r["_ranks"])
        pk = (r["pg_ranks"], r["group_size"])
        if pk not in parsed:
            parsed[pk] = parse_ranks(*pk)
        expected = parsed[pk] or (
            list(range(r["group_size"])) if r["_world"] and r["group_size"] else []
        )
        n = r["group_size"] or (len(expected) or None)
        miss = sorted(set(expected) - present)
        if r["_types"] > 1:
            st = "type mismatch"
        elif r["_gsizes"] > 1:
            st = "group mismatch"
        elif r["_dtypes"] > 1:
            st = "dtype mismatch"
        elif r["_sizes"] > 1 and r["coll_type"] != "all_to_allv":
            st = "size mismatch"
        elif r["_rows"] > r["members"]:
            st = "duplicate member"
        elif n is not None and n > 1 and len(present) == 1:
            st = "unmatched"
        elif miss or (n is not None and len(present) < n):
            st = "partial"
        else:
            st = "ok"
        statuses.append(st)
        missing.append(", ".join(str(x) for x in miss))
    colls = colls.with_columns(
        status=pl.Series(statuses, dtype=pl.Utf8), missing_ranks=pl.Series(missing, dtype=pl.Utf8)
    )
    members = rows.join(colls.select(*ident, "coll_id"), on=ident, how="left").drop(
        "_key", "_dup", "match_key", "_world"
    )
    members = _with_group_text(members.sort("coll_id", "rank"), pgs)

    groups = (
        rows.group_by("_pg")
        .agg(
            pg_name=pl.col("pg_name").first(),
            pg_desc=pl.col("pg_desc").drop_nulls().first(),
            pg_ranks=pl.col("pg_ranks").first().cast(pl.Utf8),
            group_size=pl.col("group_size").max(),
            ranks_seen=pl.col("rank").unique().sort().cast(pl.Utf8).str.join(", "),
            match_key=pl.col("match_key").first(),
        )
        .join(colls.group_by("_pg").agg(collectives=pl.len()), on="_pg")
        .join(pgs, on="_pg", how="left")
        .sort("_pg")
        .select("pg_key", "pg_name", "pg_desc", "pg_ranks", "group_size", "ranks_seen",
                "match_key", "collectives")
    )  # fmt: skip
    colls = colls.select(*COLLECTIVE_SCHEMA, "_ranks")
    notes += _match_notes(colls, groups, job_ranks)
    return Matched(members, colls.drop("_ranks"), groups, p2p, notes)


def _with_group_text(rows: pl.DataFrame, pgs: pl.DataFrame) -> pl.DataFrame:
    """``rows`` (member or send/recv rows) with ``pg_key`` in place of the group number; their
    ``pg_key`` and ``pg_ranks`` are Categorical: each group's text is held once."""
    key = pgs.with_columns(pl.col("pg_key").cast(pl.Categorical))
    cols = [c if c != "_pg" else "pg_key" for c in rows.columns]
    return rows.join(key, on="_pg", how="left").select(cols)


def _match_notes(colls: pl.DataFrame, groups: pl.DataFrame, job_ranks: list[int]) -> list[str]:
    out = []
    named = groups.group_by("pg_name").agg(pl.len(), pl.col("pg_ranks")).filter(pl.col("len") > 1)
    for r in named.iter_rows(named=True):
        out.append(
            f"process group name {r['pg_name']!r} is shared by {r['len']} groups with different "
            f"ranks ({'; '.join(r['pg_ranks'])}): matched per (name, ranks)"
        )
    for st in ("type mismatch", "group mismatch", "dtype mismatch", "size mismatch"):
        bad = colls.filter(pl.col("status") == st)
        if bad.height:
            ex = bad.row(0, named=True)
            out.append(
                f"{_n(bad.height, 'collective')} {'has' if bad.height == 1 else 'have'} a {st} "
                "between their ranks (first: "
                f"{ex['coll_type']} #{ex['coll_id']} of group {ex['pg_key']}, step {ex['step']}): "
                "left out of the metrics; the ranks' traces may cover different operations"
            )
    dup = colls.filter(pl.col("status") == "duplicate member")
    if dup.height:
        out.append(
            f"{_n(dup.height, 'collective')} {'matches' if dup.height == 1 else 'match'} two "
            "kernels of one rank: left out"
        )
    part = colls.filter(pl.col("status") == "partial")
    if part.height:
        miss = sorted({int(x) for m in part["missing_ranks"].to_list() if m for x in m.split(", ")})
        absent = [m for m in miss if m not in job_ranks]
        present = [m for m in miss if m in job_ranks]
        parts = []
        if absent:
            parts.append(f"ranks without a trace in the job: {_short(absent)}")
        if present:
            parts.append(f"ranks whose trace has no matching kernel: {_short(present)}")
        what = f" ({'; '.join(parts)})" if parts else ""
        out.append(
            f"{part.height} of {colls.height} collectives {'is' if part.height == 1 else 'are'} "
            "matched on only some of their "
            f"members{what}: their transfer time is an upper bound and their waits lower bounds"
        )
    un = colls.filter(pl.col("status") == "unmatched")
    if un.height:
        miss = sorted({int(x) for m in un["missing_ranks"].to_list() if m for x in m.split(", ")})
        absent = [m for m in miss if m not in job_ranks]
        why = f" (their peers without a trace: {_short(absent)})" if absent else ""
        out.append(
            f"{_n(un.height, 'collective')} {'was' if un.height == 1 else 'were'} found on one "
            f"rank only{why}: no wait can be split "
            "from them"
        )
    return out


def _n(k: int, word: str) -> str:
    return f"{k} {word}" + ("" if k == 1 else "s")


def _short(xs: list[int], n: int = 12) -> str:
    s = ", ".join(str(x) for x in xs[:n])
    return s + (f", ... ({len(xs)} in all)" if len(xs) > n else "")
