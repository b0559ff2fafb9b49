"""A job's diagnosis from its ranks' summaries: ``diagnose_job(job) -> JobDiagnosis``.

Flow: summaries (sorted by rank) -> collectives matched across ranks (:mod:`.match`) -> clock
offsets (:mod:`.clock`) -> per-collective and per-rank-step metrics (:mod:`.metrics`) -> the
straggler test (:mod:`.straggler`) -> job fixes (:mod:`.findings`) -> one verdict.

The verdict keeps the single-rank regimes (compute-, bandwidth- or overhead-bound) and adds the
bottleneck ``load imbalance``. It is decided on the typical rank (per-rank medians over the
steps, then the median over ranks), with waiting split from transfer:

1. a named straggler: ``load imbalance``; the regime is the straggler's (overhead-bound for a
   host-side cause, else what its own compute is bound by);
2. else, GPU idle plus exposed wait >= 50 % of the step: overhead-bound, bottleneck from the
   idle causes (the single-rank rule with waiting counted as idle);
3. else exposed communication (transfer + wait + the part that could not be split) >= half of
   compute + exposed communication: bandwidth-bound, ``communication`` (without a straggler,
   the ranks' waiting is synchronisation cost of communicating, not compute);
4. else the ranks' device verdict (their single-rank verdict when it is not about
   communication, else their kernel kinds);
and when no straggler is named but the exposed wait is >= 2 % of the step with load balance
under 0.9, the bottleneck is ``load imbalance`` (diffuse). Every rank gets the job's verdict
(ranks doing the same work cannot contradict each other), except a straggler, which gets its
cause, and in a job with a straggler the others' bottleneck is waiting for it.

The regimes describe a GPU: a job with no GPU activity in any rank (CPU ranks on gloo) gets no
regime, as one CPU-only trace gets none; its bottleneck comes from the same rules on the host
timelines (rule 4 becomes ``CPU compute``).

Scopes: the job's step T is, per step, the median over ranks, then the median over steps; every
other typical figure is the median rank's: the median over ranks of each rank's median over its
steps (the ``ranks`` table); with an even number of ranks that median is the mean of the middle
two (of both, with 2 ranks), which the report says where it defines the median rank and where a
fix quotes it. T can lie outside the ranks' own median steps (a median of per-step medians);
the report says so when it does. Ranks that never ran at the same time
(:attr:`tracedx.job.clock.ClockEstimate.runs_apart`) share no step: no shares of T and no job
fixes (Amdahl against T) are given.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import polars as pl

from tracedx.analysis.findings import Finding
from tracedx.analysis.kernels import kind_expr
from tracedx.job import findings as jf
from tracedx.job.clock import ClockEstimate, estimate_offsets
from tracedx.job.discover import check_one_job
from tracedx.job.match import match_collectives
from tracedx.job.metrics import collective_metrics, load_balance, rank_step_metrics
from tracedx.job.straggler import MIN_EFFECT, Straggler, StragglerResult, find_straggler
from tracedx.results import Presentable

LB_DIFFUSE = 0.9
IDLE_BOUND = 0.5


@dataclass(repr=False, eq=False)
class Job:
    """A job: its ranks' summaries (sorted by rank) and the notes of discovery and loading.

    ``summaries``: :class:`tracedx.job.summary.HeldSummary` objects as :func:`tracedx.load_job`
    gives them (or :class:`~tracedx.job.summary.RankSummary` objects built in Python: both have
    ``meta`` with ``rank`` and the tables ``steps``, ``colls``, ``kernels``, ``opsig``); no raw
    events. ``unreadable``: ``(path, reason)`` of each file that could not be read (left out;
    each is also one of the ``notes``).
    """

    summaries: list
    notes: list[str] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.summaries = sorted(self.summaries, key=lambda s: int(s.meta["rank"]))

    @property
    def ranks(self) -> list[int]:
        return [int(s.meta["rank"]) for s in self.summaries]

    def __repr__(self) -> str:
        r, n = self.ranks, len(self.notes)
        span = f" ({r[0]}..{r[-1]})" if r else ""
        return (
            f"<Job: {len(r)} rank{'s' if len(r) != 1 else ''}{span}, {n} note{'s' if n != 1 else ''}"
            "; tracedx.diagnose(job) for its verdict>"
        )


@dataclass(repr=False, eq=False)
class JobDiagnosis(Presentable):
    """What binds a job and what each fix is worth.

    Tables (polars; times in us):
        ranks: one row per rank: ``rank``, ``host``, ``device_name``, ``steps``, medians over
            its steps of ``step_time_us``, ``compute_us``, ``comm_us``, ``exposed_comm_us``,
            ``exposed_wait_us``, ``exposed_transfer_us``, ``exposed_unsplit_us``, ``overlap_ratio``,
            ``idle_us``, ``transfer_us``, ``outside_comm_us`` (the step less its exposed
            communication, at least 0: compute, GPU idle and other host time); totals over
            the steps ``wait_total_us``, ``collectives``, ``unsplit``, ``last_arrivals``; its
            verdict ``regime``, ``bottleneck`` and the one-rank ``single_rank_regime``,
            ``single_rank_bottleneck``.
        steps: one row per (rank, step) (:func:`tracedx.job.metrics.rank_step_metrics`).
        collectives: one row per matched collective
            (:func:`tracedx.job.metrics.collective_metrics`).
        members: one row per (collective, rank) with ``wait_us`` and ``last``.
        groups: the process groups (name, ranks, size, match key).

    Verdict: ``regime``, ``bottleneck``, ``evidence``; ``straggler`` (None or
    :class:`~tracedx.job.straggler.Straggler`); ``findings`` (best first); ``notes``.
    ``typical``: the typical rank's step (us): ``step_us`` (T), ``compute_us`` (U),
    ``exposed_wait_us`` (E), ``exposed_transfer_us``, ``exposed_unsplit_us`` (exposed time of
    collectives not fully matched: not split), ``idle_us``, ``transfer_us`` (M),
    ``load_balance``, ``communication_efficiency``, ``parallel_efficiency`` (POP's, over the
    ranks' median compute U_r: mean U / max U, max U / T, mean U / T), ``outside_comm_us`` and
    ``load_balance_outside_comm`` (the same mean / max over the ranks' median time outside
    exposed communication W_r, which holds host work that U leaves out).
    """

    job: Job
    ranks: pl.DataFrame
    steps: pl.DataFrame
    collectives: pl.DataFrame
    members: pl.DataFrame
    groups: pl.DataFrame
    clock: ClockEstimate
    regime: str | None
    bottleneck: str | None
    evidence: list[str]
    straggler: Straggler | None
    straggler_test: StragglerResult | None
    findings: list[Finding]
    typical: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    # a short repr and a notebook verdict card (tracedx.results.Presentable)
    _present = {
        "repr": "tracedx.report.card:job_repr",
        "card": "tracedx.report.card:job_card",
        "text": "tracedx.report.job:render_text",
        "md": "tracedx.report.job:render_markdown",
        "html": "tracedx.report.job_html:render_job_html",
        "json": "tracedx.report.job:render_json",
        "figures": "tracedx.report.job_html:job_figures",
    }

    def to_dict(self) -> dict[str, Any]:
        """The ``tracedx.job/1`` JSON document as a dict."""
        from tracedx.report.job import job_dict

        return job_dict(self)

    def to_html(self) -> str:
        """The job's HTML report (per-rank table, rank-by-step wait heatmap): one document."""
        from tracedx.report.job_html import render_job_html

        return render_job_html(self)

    def write_html(self, path) -> Any:
        """Write :meth:`to_html` to ``path``; returns the Path."""
        from tracedx.report.job_html import write_job_html

        return write_job_html(self, path)


def _med(xs) -> float | None:
    v = [float(x) for x in xs if x is not None]
    return median(v) if v else None


def _device_verdict(s) -> tuple[str, str]:
    """What a rank's own device work is bound by, communication left out."""
    sr = (s.meta or {}).get("single_rank") or {}
    reg, bott = sr.get("regime"), sr.get("bottleneck")
    if reg in ("compute-bound", "bandwidth-bound") and bott not in (None, "communication"):
        return reg, bott
    k = s.kernels
    if k is not None and k.height:
        by = dict(
            k.with_columns(kind=kind_expr("name"))
            .filter(pl.col("kind") != "communication")
            .group_by("kind")
            .agg(pl.col("total_us").sum())
            .iter_rows()
        )
        comp = sum(by.get(x, 0.0) for x in ("gemm", "convolution", "attention"))
        mem = sum(by.get(x, 0.0) for x in ("elementwise", "reduction", "normalization", "copy"))
        if comp or mem:
            return (
                ("compute-bound", "tensor-core math")
                if comp >= mem
                else (
                    "bandwidth-bound",
                    "device memory",
                )
            )
    if k is None or k.height == 0:
        return "compute-bound", "CPU compute"  # no GPU kernels: the ranks compute on the host
    return "compute-bound", "tensor-core math"


def _idle_bottleneck(idle: dict[str, float]) -> str:
    cand = {
        "host synchronization": idle.get("idle_host_sync_us", 0.0),
        "kernel launch": sum(
            idle.get(c, 0.0)
            for c in ("idle_kernel_launch_us", "idle_python_us", "idle_kernel_wait_us")
        ),
        "host work": idle.get("idle_dataloader_us", 0.0) + idle.get("idle_host_work_us", 0.0),
    }
    best = max(cand, key=cand.get)
    return best if cand[best] > 0 else "load imbalance"


def _ranks_table(job: Job, steps: pl.DataFrame, clock: ClockEstimate) -> pl.DataFrame:
    cols = [
        "step_time_us",
        "compute_us",
        "comm_us",
        "exposed_comm_us",
        "exposed_wait_us",
        "exposed_transfer_us",
        "exposed_unsplit_us",
        "overlap_ratio",
        "idle_us",
        "other_us",
        "transfer_us",
    ]
    have = [c for c in cols if c in steps.columns]
    agg = (
        steps.group_by("rank")
        .agg(
            pl.len().alias("steps"),
            *[pl.col(c).drop_nulls().median() for c in have],
            *(
                [
                    (pl.col("step_time_us") - pl.col("exposed_comm_us").fill_null(0.0))
                    .clip(lower_bound=0.0)
                    .drop_nulls()
                    .median()
                    .alias("outside_comm_us")
                ]
                if {"step_time_us", "exposed_comm_us"} <= set(steps.columns)
                else []
            ),
            pl.col("wait_us").sum().alias("wait_total_us"),
            pl.col("collectives").sum(),
            pl.col("unsplit").sum(),
            pl.col("last_arrivals").sum(),
        )
        .sort("rank")
        if steps.height
        else pl.DataFrame(schema={"rank": pl.Int64})
    )
    meta = pl.DataFrame(
        {
            "rank": [int(s.meta["rank"]) for s in job.summaries],
            "host": [clock.host_of.get(int(s.meta["rank"])) for s in job.summaries],
            "device_name": [s.meta.get("device_name") for s in job.summaries],
            "single_rank_regime": [
                ((s.meta.get("single_rank") or {}).get("regime")) for s in job.summaries
            ],
            "single_rank_bottleneck": [
                ((s.meta.get("single_rank") or {}).get("bottleneck")) for s in job.summaries
            ],
        },
        schema={
            "rank": pl.Int64,
            "host": pl.Utf8,
            "device_name": pl.Utf8,
            "single_rank_regime": pl.Utf8,
            "single_rank_bottleneck": pl.Utf8,
        },
    )
    return meta.join(agg, on="rank", how="left")


def diagnose_job(job: Job) -> JobDiagnosis:
    """Diagnose a job from its ranks' summaries (module docstring).

    The result does not depend on the order of ``job.summaries``. A job of one rank gets the
    same tables, with waits unknown (null): one trace cannot split waiting from transfer.

    Raises :class:`~tracedx.errors.TraceError` when the summaries are not one job
    (:func:`tracedx.job.discover.check_one_job`: single-rank traces that share no collective
    and no ``distributedInfo``, several jobs, or single traces beside a job).
    """
    if not isinstance(job, Job):
        job = Job(list(job))
    ss = job.summaries
    _check_one_job(ss)
    notes = list(job.notes)
    matched = match_collectives(ss)
    clock = estimate_offsets(matched.members, matched.collectives, ss)
    colls, members = collective_metrics(matched, clock, ss)
    steps = rank_step_metrics(ss, members)
    notes += _rank_notes(ss) + matched.notes + clock.notes + _past_window_notes(steps)
    ranks = _ranks_table(job, steps, clock)
    typical = _typical(steps, ranks, clock.runs_apart)
    T = typical["step_us"]
    st = (
        find_straggler(colls, members, steps, ss, T, clock.runs_apart)
        if colls.height and T
        else StragglerResult(None, pl.DataFrame(), None, "no matched collectives")
    )
    strag = st.straggler
    # ranks that never ran at the same time share no step T: no Amdahl estimate against it
    found = [] if clock.runs_apart else _job_findings(typical, ranks, colls, strag)
    regime, bott, ev = _verdict(job, ranks, typical, strag, st, matched.groups, clock)
    ranks = _with_rank_verdicts(ranks, job, regime, bott, strag)
    notes += _single_rank_notes(ss, ranks)
    return JobDiagnosis(
        job=job,
        ranks=ranks,
        steps=steps,
        collectives=colls,
        members=members,
        groups=matched.groups,
        clock=clock,
        regime=regime,
        bottleneck=bott,
        evidence=ev,
        straggler=strag,
        straggler_test=st,
        findings=found,
        typical=typical,
        notes=notes,
    )


def _typical(steps: pl.DataFrame, ranks: pl.DataFrame, apart: bool = False) -> dict[str, Any]:
    """The typical rank's step (:attr:`JobDiagnosis.typical`, us). T: per step the median
    over ranks, then the median over steps; the other figures: the median over ranks of each
    rank's median over its steps (:func:`_ranks_table`). ``apart``: the ranks never ran at the
    same time, so the efficiencies (shares of T) are None."""
    T = None
    if steps.height:
        per_step = steps.group_by("step").agg(pl.col("step_time_us").median())
        T = _med(per_step["step_time_us"].to_list())

    def typ(c: str) -> float | None:
        return _med(ranks[c].to_list()) if c in ranks.columns else None

    us = ranks["compute_us"].to_list() if "compute_us" in ranks.columns else []
    lb = load_balance(us)
    umax = max((u for u in us if u is not None), default=None)
    ws = ranks["outside_comm_us"].to_list() if "outside_comm_us" in ranks.columns else []
    T_share = None if apart else T
    return {
        "step_us": T,
        "compute_us": typ("compute_us"),
        "exposed_wait_us": typ("exposed_wait_us"),
        "exposed_transfer_us": typ("exposed_transfer_us"),
        "exposed_unsplit_us": typ("exposed_unsplit_us"),
        "idle_us": typ("idle_us"),
        "other_us": typ("other_us"),
        "transfer_us": typ("transfer_us"),
        "load_balance": lb,
        "outside_comm_us": typ("outside_comm_us"),
        "load_balance_outside_comm": load_balance(ws),
        "communication_efficiency": umax / T_share if umax is not None and T_share else None,
        "parallel_efficiency": (
            lb * umax / T_share if lb is not None and umax is not None and T_share else None
        ),
    }


def _job_findings(
    typical: dict[str, Any], ranks: pl.DataFrame, colls: pl.DataFrame, strag: Straggler | None
) -> list[Finding]:
    """``balance-ranks`` (with a straggler) and ``overlap-communication`` (with exposed
    transfer), best first."""
    T, X = typical["step_us"], typical["exposed_transfer_us"]
    U, E = typical["compute_us"], typical["exposed_wait_us"]
    M, Z = typical["transfer_us"], typical["exposed_unsplit_us"]
    found: list[Finding] = []
    if T and strag is not None:
        peer_w = _med(
            [
                w
                for r, w in zip(ranks["rank"], ranks["exposed_wait_us"], strict=True)
                if r != strag.rank
            ]
        )
        f = jf.balance_ranks(
            T, strag.rank, strag.cause, strag.excess_us, peer_w or 0.0, strag.host_side
        )
        if f:
            found.append(f)
    if T and X:
        n_unsplit = int(colls.filter(pl.col("status") != "ok").height) if colls.height else 0
        f = jf.overlap_communication(
            T,
            X,
            U or 0.0,
            M or 0.0,
            E or 0.0,
            unsplit=n_unsplit,
            unsplit_us=Z or 0.0,
            who=typical_rank(ranks.height),
        )
        if f:
            found.append(f)
    found.sort(key=lambda f: -f.estimated_speedup)
    return found


def _with_rank_verdicts(
    ranks: pl.DataFrame, job: Job, regime: str | None, bott: str | None, strag: Straggler | None
) -> pl.DataFrame:
    """``ranks`` with each rank's ``regime`` and ``bottleneck``: the job's, except the
    straggler's (its cause) and, with a straggler, the others' bottleneck (waiting for it)."""
    per_regime, per_bott = [], []
    for r in ranks["rank"].to_list():
        if strag is not None and r == strag.rank:
            per_regime.append(_cause_regime(strag, job))
            per_bott.append(strag.cause)
        elif strag is not None:
            per_regime.append(regime)
            per_bott.append(f"load imbalance (waits for rank {strag.rank})")
        else:
            per_regime.append(regime)
            per_bott.append(bott)
    return ranks.with_columns(
        regime=pl.Series(per_regime, dtype=pl.Utf8), bottleneck=pl.Series(per_bott, dtype=pl.Utf8)
    )


def _past_window_notes(steps: pl.DataFrame) -> list[str]:
    """A note for the rank-steps whose communication outlasts the step: a collective belongs to
    the step that launched it, so one that runs past the step's window (the last profiled step's
    collectives after the profiler stopped, or a collective of step k still running in step
    k + 1) makes that step's ``comm_us`` and ``exposed_comm_us`` longer than its
    ``step_time_us``. The job's figures are medians over steps; this says which steps are odd."""
    if not steps.height or "exposed_comm_us" not in steps.columns:
        return []
    odd = steps.filter(pl.col("exposed_comm_us") > pl.col("step_time_us")).sort("rank", "step")
    if not odd.height:
        return []
    shown = "; ".join(
        f"rank {r} step {k}: {x / 1e3:.3f} ms exposed in a {t / 1e3:.3f} ms step"
        for r, k, x, t in odd.select("rank", "step", "exposed_comm_us", "step_time_us")
        .head(3)
        .iter_rows()
    )
    more = f" and {odd.height - 3} more" if odd.height > 3 else ""
    n = odd.height
    return [
        f"{n} rank-step{'s' if n != 1 else ''} with more exposed communication than step time "
        f"({shown}{more}): a collective counts in the step that launched it, and the collectives ran past "
        "the step's window; the job's figures are medians over steps"
    ]


def _single_rank_notes(ss: list, ranks: pl.DataFrame) -> list[str]:
    """A note when the ranks' one-rank verdicts differ (each is read from one trace), and for
    a job of one rank of a larger job, that its communication includes waiting."""
    notes = []
    singles = {
        (a, b)
        for a, b in zip(ranks["single_rank_regime"], ranks["single_rank_bottleneck"], strict=True)
        if a
    }
    if len(ss) > 1 and len(singles) > 1:
        shown = "; ".join(
            f"rank {r}: {a} ({b})"
            for r, a, b in ranks.select("rank", "single_rank_regime", "single_rank_bottleneck")
            .head(4)
            .iter_rows()
            if a
        )
        notes.append(
            f"single-rank verdicts ({shown}) are each read from one rank's trace, where waiting "
            "for peers counts as communication; the job verdict is one for all ranks, with "
            "waiting split from transfer"
        )
    if len(ss) == 1:
        ws = ss[0].meta.get("world_size")
        if ws and int(ws) > 1:
            notes.append(
                f"one rank of {article(ws)} {ws}-rank job: its communication time includes "
                "waiting for peers; the other ranks' traces are needed to split waiting from "
                "transfer"
            )
    return notes


def article(n) -> str:
    """'a' or 'an' before the number ``n`` read aloud (an 8-rank, an 11-rank, an 18-rank, a
    16-rank)."""
    d = str(n)
    return "an" if d.startswith("8") or (d[:2] in ("11", "18") and len(d) % 3 == 2) else "a"


def _check_one_job(ss: list) -> None:
    """The check of :func:`tracedx.job.discover.check_one_job` on the summaries (a Job built
    in Python, not by ``load_job``, which makes it already)."""
    check_one_job(
        [(str(s.meta.get("path") or f"rank{s.meta['rank']}"), s.meta) for s in ss],
        [s.colls.height if s.colls is not None else None for s in ss],
    )


def _rank_notes(ss: list) -> list[str]:
    """The ranks' own (single-rank) load warnings and notes, each text once with the ranks it
    applies to (the one-rank note that peers' traces are needed is left out of a job)."""
    by: dict[str, list[int]] = {}
    for x in ss:
        texts = [str(w.get("message")) for w in x.meta.get("warnings") or []]
        for n in texts + [str(n) for n in x.meta.get("notes") or []]:
            if "include waiting for the other ranks" in n:
                continue  # the one-rank note: the job has the other ranks, or says it itself
            by.setdefault(n, []).append(int(x.meta["rank"]))
    out = []
    for text, ranks in by.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_span(ranks)}"
        out.append(f"{who}: {text}")
    return out


def _span(ranks: list[int]) -> str:
    """0-3, 5 for [0, 1, 2, 3, 5]."""
    parts, start = [], ranks[0]
    for a, b in zip(ranks, [*ranks[1:], None], strict=True):
        if b != a + 1:
            parts.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ", ".join(parts)


def _cause_regime(s: Straggler, job: Job) -> str | None:
    """The straggler's regime: that of its cause; none without GPU activity."""
    if not has_gpu_activity(job.summaries):
        return None
    if s.host_side:
        return "overhead-bound"
    if s.cause == "link":
        return "bandwidth-bound"
    sm = next(x for x in job.summaries if int(x.meta["rank"]) == s.rank)
    return _device_verdict(sm)[0]


def _part(v: float | None, t: float | None, apart: bool = False) -> str:
    """A part ``v`` (us) of the step ``t`` (us) as its share (``84%``), or in ms (``15.714
    ms``) when the ranks never ran together (``apart``: they share no step to divide)."""
    if v is None or (not apart and not t):
        return "n/a"
    return f"{v / 1e3:.3f} ms" if apart else f"{v / t:.0%}"


def _verdict(job, ranks, typ, strag, st, groups, clock) -> tuple[str | None, str | None, list[str]]:
    T = typ["step_us"]
    if not T or not job.summaries:
        return None, None, ["no analysed steps: no verdict"]
    gpu = has_gpu_activity(job.summaries)
    apart = clock.runs_apart
    ev = [_layout_line(job, groups, clock), *_step_lines(ranks, typ, gpu, apart)]
    if not gpu:
        ev.insert(0, NO_GPU_EVIDENCE)
    if strag is not None:
        ev += strag.evidence
        return _cause_regime(strag, job), "load imbalance", ev
    if st.reason and len(job.summaries) > 1:
        ev.append(f"no straggler: {st.reason}")
    regime, bott, line = _rule(job, typ, gpu, apart)
    ev.append(line)
    E, lb = typ["exposed_wait_us"], typ["load_balance"]
    if E is not None and E / T >= MIN_EFFECT and lb is not None and lb < LB_DIFFUSE:
        bott = "load imbalance"
        ev.append(
            f"diffuse imbalance: exposed wait {_of_step(E, T, apart)} and load balance "
            f"{lb:.2f} < {LB_DIFFUSE}, but no single rank paces the others"
        )
    return regime, bott, ev


# the single-trace diagnosis' words for a capture without a GPU (no regime can be named)
NO_GPU_EVIDENCE = (
    "no GPU activity in the ranks' traces: no regime can be named from these traces (they ran "
    "on the CPU); the bottleneck is read from the ranks' host timelines"
)


def has_gpu_activity(summaries: list) -> bool:
    """Whether any rank's trace has GPU activity: a summary of a trace without any has GPU
    columns that are all null in its ``steps`` table (docs/multirank.md)."""

    def gpu_free(s) -> bool:
        st = s.steps
        return (
            st is not None
            and st.height > 0
            and "gpu_busy_us" in st.columns
            and st["gpu_busy_us"].null_count() == st.height
        )

    return not summaries or not all(gpu_free(s) for s in summaries)


def _of_step(us: float, T: float, apart: bool) -> str:
    """``us`` as a share of the job's step T (``84% of the step``), or in ms (``15.714 ms per
    step``) when the ranks never ran together (``apart``): they share no step to divide."""
    return f"{us / 1e3:.3f} ms per step" if apart else f"{us / T:.0%} of the step"


def _rule(
    job: Job, typ: dict[str, Any], gpu: bool, apart: bool = False
) -> tuple[str | None, str, str]:
    """Rules 2-4 of the module docstring (no straggler): ``(regime, bottleneck, evidence)``;
    without GPU activity no regime, the bottleneck by the same rules on the host timeline;
    ``apart``: the evidence in ms, not shares of the step (:func:`_of_step`)."""
    T = typ["step_us"]
    U, E, X, gi = (
        typ[k] for k in ("compute_us", "exposed_wait_us", "exposed_transfer_us", "idle_us")
    )
    Z = typ.get("exposed_unsplit_us")
    who = typical_rank(len(job.summaries))
    comm_x = (X or 0.0) + (E or 0.0) + (Z or 0.0)
    wait_idle = (gi or 0.0) + (E or 0.0)
    if wait_idle / T >= IDLE_BOUND:
        what = "GPU idle or waiting for peers" if gpu else "waiting for peers"
        return (
            "overhead-bound" if gpu else None,
            _idle_bottleneck(_idle_medians(job)),
            f"{what} {_of_step(wait_idle, T, apart)}: the host side binds",
        )
    if comm_x > 0 and 0.5 * ((U or 0.0) + comm_x) <= comm_x:
        return (
            "bandwidth-bound" if gpu else None,
            "communication",
            f"exposed communication {comm_x / 1e3:.3f} ms (transfer {(X or 0) / 1e3:.3f} + wait "
            f"{(E or 0) / 1e3:.3f}"
            + (f" + not split {Z / 1e3:.3f}" if Z else "")
            + f" ms) is at least as long as compute {(U or 0) / 1e3:.3f} ms ({who})",
        )
    if not gpu:
        return (
            None,
            "CPU compute",
            f"compute on the CPU {(U or 0) / 1e3:.3f} ms is longer than the exposed "
            f"communication {comm_x / 1e3:.3f} ms ({who})",
        )
    verdicts = [_device_verdict(s) for s in job.summaries]
    (regime, bott), _ = Counter(verdicts).most_common(1)[0]
    return regime, bott, f"device work of the ranks: {regime} ({bott})"


def _layout_line(job: Job, groups: pl.DataFrame, clock: ClockEstimate) -> str:
    """The ranks, their hosts and the process groups, in one line."""
    hosts = len(set(clock.host_of.values()))
    kinds = Counter(
        (r["pg_desc"] or (f"group {r['pg_name']}" if r["pg_name"] else "unnamed"), r["group_size"])
        for r in (groups.iter_rows(named=True) if groups.height else [])
    )
    pgs = ", ".join(
        "no process-group metadata"
        if desc == "unnamed" and not size
        else f"{desc} {n} x {size or '?'} ranks"
        if n > 1
        else f"{desc} of {size or '?'} ranks"
        for (desc, size), n in sorted(kinds.items(), key=lambda kv: str(kv[0]))
    )
    where = (
        f"on {hosts} host{'s' if hosts != 1 else ''}"
        if clock.source in ("hostname", "gpus_per_node")
        else "(hosts unknown: no hostnames)"
    )
    n = len(job.summaries)
    return f"{n} rank{'s' if n != 1 else ''} {where}" + (f"; process groups: {pgs}" if pgs else "")


def _step_lines(
    ranks: pl.DataFrame, typ: dict[str, Any], gpu: bool, apart: bool = False
) -> list[str]:
    """The typical step and what it is made of, each figure with its scope (over which ranks
    and steps it is a median): T is per step the median over ranks, then the median over
    steps (:func:`_typical`); the parts, the median rank: the median over ranks of each rank's
    median over its steps. ``apart``: the ranks never ran at the same time, so a step of the
    job is undefined: the parts in ms, no shares of T, and the line says why."""
    T = typ["step_us"]
    st_col = ranks["step_time_us"].drop_nulls() if "step_time_us" in ranks.columns else []
    step = f"step {T / 1e3:.3f} ms: per step the median over ranks, then the median over steps"
    if len(st_col) > 1:
        lo, hi = min(st_col), max(st_col)
        spread = "" if apart else f"spread {(hi - lo) / T:.1%} of the step"
        # the printed figures: a T that rounds into the ranks' range is not said to be outside
        t_ms, lo_ms, hi_ms = (round(x / 1e3, 3) for x in (T, lo, hi))
        if not lo_ms <= t_ms <= hi_ms:
            spread += (
                f"{'; ' if spread else ''}the job step is {'below' if t_ms < lo_ms else 'above'} "
                "them: a median of per-step medians need not lie between the ranks' own medians"
            )
        spread = f" ({spread})" if spread else ""
        step += f"; the ranks' own median steps {lo / 1e3:.3f} to {hi / 1e3:.3f} ms{spread}"
    names = {"compute_us": "compute", "exposed_wait_us": "exposed wait"}
    names |= {"exposed_transfer_us": "exposed transfer"}
    names |= {"idle_us": "GPU idle"} if gpu else {}
    names |= {"other_us": "other"}
    parts = ", ".join(
        f"{n} {_part(typ[c], T, apart)}{_spread(ranks, c, T, apart)}" for c, n in names.items()
    )
    tail = (
        " per step; no shares of the job's step: the ranks never ran at the same time, so they "
        "share no step to divide"
        if apart
        else " of the step"
    )
    out = [
        step,
        "the median rank's step (per figure, the median over ranks of each rank's median "
        f"over its steps{even_ranks_note(ranks.height)}): {parts}{tail}",
    ]
    lb = _balance_line(ranks, typ)
    if lb:
        out.append(lb)
    pe = typ.get("parallel_efficiency")
    us = [
        u for u in (ranks["compute_us"] if "compute_us" in ranks.columns else []) if u is not None
    ]
    if pe is not None and us:
        out.append(
            f"parallel efficiency {pe:.2f} (POP's: load balance x communication efficiency = "
            f"mean compute / T = {sum(us) / len(us) / 1e3:.3f} / {T / 1e3:.3f} ms)"
        )
    return out


def even_ranks_note(n: int) -> str:
    """What "the median over ranks" is with an even number ``n`` of ranks (the mean of the
    middle two; with 2 ranks, of both: a figure no rank need have), for the line that defines
    the median rank; ``""`` for an odd number."""
    if n == 2:
        return "; with 2 ranks, their mean"
    return f"; with {n} ranks, the mean of the middle two" if n and n % 2 == 0 else ""


def typical_rank(n: int) -> str:
    """The scope of a typical figure of a job of ``n`` ranks, as the fixes and the verdict's
    evidence name it: ``median rank``, with an even count what that median is
    (:func:`even_ranks_note`)."""
    if n == 2:
        return "mean of the 2 ranks"
    return "median rank, the mean of the middle two" if n and n % 2 == 0 else "median rank"


def _balance_line(ranks: pl.DataFrame, typ: dict[str, Any]) -> str | None:
    """POP's load balance over compute, and the same ratio over the time outside exposed
    communication, with the mean and max each is the ratio of (ms, so the line checks by
    hand): a rank that is late for host work outside its ops (a CPU-side straggler) leaves
    compute balanced but not the rest of its step."""
    lb, lbw = typ["load_balance"], typ.get("load_balance_outside_comm")
    if lb is None:
        return None

    def mm(c: str) -> str:
        v = [x for x in (ranks[c] if c in ranks.columns else []) if x is not None]
        return f"{sum(v) / len(v) / 1e3:.3f} / {max(v) / 1e3:.3f} ms"

    line = (
        f"load balance {lb:.2f} of compute (POP's: mean / max over ranks of each rank's median "
        f"per step, {mm('compute_us')})"
    )
    if lbw is not None:
        line += (
            f"; {lbw:.2f} of step time less exposed communication (the same ratio, "
            f"{mm('outside_comm_us')})"
        )
    return line


SPREAD_SHOWN = 0.10
"""A part of the typical step whose ranks' medians span at least this share of the step gets
its range over ranks beside it: with two ranks, a straggler's 0% wait and its peer's 91% have
a median of 45% that no rank has."""


def _spread(ranks: pl.DataFrame, c: str, T: float | None, apart: bool = False) -> str:
    """`` (A-B% over ranks)`` when column ``c``'s medians span at least SPREAD_SHOWN of ``T``;
    when the ranks never ran together (``apart``: T is no step of theirs to measure a span
    by), `` (A-B ms over ranks)`` whenever the medians differ."""
    v = ranks[c].drop_nulls().to_list() if c in ranks.columns else []
    if apart and len(v) > 1 and max(v) > min(v):
        return f" ({min(v) / 1e3:.3f}-{max(v) / 1e3:.3f} ms over ranks)"
    if apart or len(v) < 2 or not T or (max(v) - min(v)) / T < SPREAD_SHOWN:
        return ""
    return f" ({100 * min(v) / T:.0f}-{100 * max(v) / T:.0f}% over ranks)"


def _idle_medians(job: Job) -> dict[str, float]:
    """Per idle cause, the median over ranks of the rank's median over its steps."""
    out: dict[str, float] = {}
    cols = {c for s in job.summaries if s.steps is not None for c in s.steps.columns}
    for c in sorted(x for x in cols if x.startswith("idle_") and x != "idle_us"):
        v = [
            s.steps[c].drop_nulls().median()
            for s in job.summaries
            if s.steps is not None and c in s.steps.columns and s.steps.height
        ]
        m = _med(v)
        if m is not None:
            out[c] = m
    return out
