"""Job fixes with Amdahl estimates: ``balance-ranks`` and ``overlap-communication``.

Both are :class:`tracedx.analysis.findings.Finding` objects, their (f, s) from
:func:`tracedx.analysis.findings.amdahl_terms` on the job's step time T (the median over steps
of the median over ranks of the step's window): f = region / T, s = region / (region - saved),
speedup ``1 / ((1 - f) + f / s) = T / T'`` (Amdahl, AFIPS 1967).

- ``balance-ranks``: removing the straggler's excess (POP Centre of Excellence's load
  balance, https://co-design.pop-coe.eu/metrics/, priced as an Amdahl region) saves
  ``G = min(excess, median_{peers} E)``: what the straggler was doing before the late
  collectives (its compute plus GPU idle over the median peer's), capped by the exposed wait it
  causes on the others (the excess only helps where it is on the critical path);
  ``T' = T - G``, s = inf.
- ``overlap-communication`` acts on exposed *transfer* only, never on waiting (the
  TensorBoard plugin's split of communication into "synchronizing" and data transfer;
  HolisticTraceAnalysis' ``comp_comm_overlap_pctg`` measures the overlap it raises):
  ``X - E``, the median over ranks of each rank's exposed communication less its exposed
  wait; the new step cannot beat compute alone nor communication alone:
  ``T' = max(T - (X - E), U, M)`` with ``U`` the median rank's compute and ``M`` its communication
  alone per step: the union of its kernels' transfer parts ``[end - tau_c, end]`` (collectives
  running concurrently count once).

Neither is estimated for ranks that never ran at the same time (``runs_apart``): T is then no
step of theirs (:func:`tracedx.job.diagnosis.diagnose_job`).
"""

from __future__ import annotations

from tracedx.analysis.findings import Finding, amdahl_finding


def _ms(us: float) -> str:
    return f"{us / 1e3:.3f} ms"


def balance_ranks(
    t_us: float, rank: int, cause: str, excess_us: float, peer_wait_us: float, host_side: bool
) -> Finding | None:
    """Remove straggler ``rank``'s excess (see the module docstring); None when nothing is saved.

    ``excess_us``: per step, its compute + GPU idle over the median peer's; ``peer_wait_us``:
    the median over the other ranks of their exposed wait per step.
    """
    gain = min(excess_us, peer_wait_us)
    if gain <= 0 or t_us <= 0:
        return None
    ev = [
        f"rank {rank} ({cause}) spends {_ms(excess_us)} more per step than the median peer "
        f"before the collectives; the other ranks wait {_ms(peer_wait_us)} per step exposed "
        "(median over them)",
        f"saving min(excess, wait) = {_ms(gain)} per step",
    ]
    if host_side:
        ev.append(
            f"the excess is host time spread over profiled ops: the profiler's per-event cost "
            f"can slow ranks unequally, so time rank {rank} and a peer unprofiled "
            "(a plain torchrun run with the script's own step timer: tracedx capture does not time "
            "a torchrun job unprofiled) to settle how much of it is real"
        )
    deriv = f"balance: T' = T - min(excess, median peer exposed wait) = {_ms(t_us)} - {_ms(gain)}"
    return amdahl_finding(
        "balance-ranks",
        f"Remove rank {rank}'s excess ({cause}) so that it stops pacing the others",
        t_us,
        t_us - gain,
        gain,
        deriv,
        ev,
    )


def overlap_communication(
    t_us: float,
    hideable_us: float,
    compute_us: float,
    comm_alone_us: float,
    wait_us: float,
    *,
    unsplit: int = 0,
    unsplit_us: float = 0.0,
    who: str = "median rank",
) -> Finding | None:
    """Hide the exposed transfer under compute (bucketing, FSDP prefetch, async TP).

    ``hideable_us`` X - E (median exposed transfer), ``compute_us`` U, ``comm_alone_us`` M (median
    rank's union of transfer parts), ``wait_us`` (median exposed wait, which this fix cannot
    remove); ``unsplit``: how many collectives are not fully matched (their exposed time ``unsplit_us``, median rank per step,
    mixes waiting and transfer and is not counted in X - E); ``who``: the scope of the typical
    figures as the evidence names it (:func:`tracedx.job.diagnosis.typical_rank`: with 2
    ranks, their mean).
    """
    if hideable_us <= 0 or t_us <= 0:
        return None
    new = max(t_us - hideable_us, compute_us, comm_alone_us)
    bound = (
        "compute alone"
        if new == compute_us and compute_us > t_us - hideable_us
        else "communication alone"
        if new == comm_alone_us and comm_alone_us > t_us - hideable_us
        else "the exposed transfer"
    )
    ev = [
        f"exposed transfer {_ms(hideable_us)} per step ({who}); exposed waiting "
        f"{_ms(wait_us)} is not transfer and stays",
        f"bounded by compute alone {_ms(compute_us)} and communication alone "
        f"{_ms(comm_alone_us)} per step",
    ]
    if unsplit:
        ev.append(
            f"{unsplit} collective{'s' if unsplit != 1 else ''} could not be split into waiting "
            f"and transfer (mismatched, unmatched or partial): their exposed "
            f"{_ms(unsplit_us)} per step ({who}) is not counted in X - E; the part of it "
            "that is transfer would add to this estimate"
        )
    deriv = (
        f"overlap: T' = max(T - (X - E), U, M) = max({_ms(t_us - hideable_us)}, "
        f"{_ms(compute_us)}, {_ms(comm_alone_us)}), set by {bound} (T the job step, X - E the "
        "exposed transfer: the median over ranks of each one's exposed communication less its "
        "waiting, U compute alone, M communication alone, all per step)"
    )
    return amdahl_finding(
        "overlap-communication",
        "Overlap the exposed communication transfer with compute",
        t_us,
        new,
        hideable_us,
        deriv,
        ev,
    )
