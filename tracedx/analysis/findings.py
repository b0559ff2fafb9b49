"""Findings: one rule per fix id, each returning the fraction of the step it acts on (f), the
local speedup (s), its evidence, and the whole-step Amdahl estimate.

Amdahl's law (G. Amdahl, AFIPS 1967): a part taking fraction f of the
time, made s times faster, speeds the whole up ``1 / ((1 - f) + f / s)``.

The estimates respect what else binds the step. They are computed on a two-sided model of
the typical step (:class:`StepModel`):

- ``H`` host time that is not waiting on the GPU (CPU window minus blocking calls: host syncs,
  pageable copies, and launch calls held by a full launch queue),
- ``G`` GPU-side time (busy time plus GPU-side gaps between queued kernels),
- ``E`` serialization the trace shows beyond max(H, G) (host syncs, blocking copies),

so that ``T ~ max(H, G) + E``. A fix changes H, G or E; the new step time is recomputed from
the same formula. Removing launch gaps can never make a step faster than its GPU busy time,
and a faster GEMM does not help a step whose GPU waits on the host. All times are
microseconds per step.

The profiler slows the host (:data:`PROFILER_SLOWDOWN`), by a roughly fixed cost per recorded host event
(op or runtime call). Without an unprofiled timing, estimates are against the traced step
time. When the trace carries the unprofiled step time (``tracedx capture --time-unprofiled``),
that cost per event is solved from the two (``tax_us``) and taken out of the host side, so
estimates are against the unprofiled step: a fix that removes host events also removes their
profiler cost, never more than their traced time (:func:`profiled_events`). Where the GPU side
binds the traced step (it is longer than the host's, or the launch queue held the host), both
timings are the GPU's and the cost is assumed instead (``tax_assumed``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

FIX_IDS = (
    "cuda-graphs",
    "torch-compile",
    "tf32",
    "bf16-autocast",
    "remove-host-sync",
    "dataloader-workers",
    "pinned-memory",
    "fused-attention",
    "larger-batch",
    "overlap-communication",
    "balance-ranks",
)

MIN_RECOMMENDED_SPEEDUP = 1.05
# Checking estimates (tracedx diff): an estimate within this factor of the achieved speedup
# (either way) is "on target"; evidence for an inferred fix scoring under MIN_SCORE is listed
# but does not name the applied fix. Here, not in analysis.diff, so that the diff report reads
# them without importing the module that renders through it.
ON_TARGET = 1.25
MIN_SCORE = 0.5
PROFILER_SLOWDOWN = (
    "host-bound steps ran 1.1x to 3.7x slower traced than unprofiled on tracedx's H200 "
    "sample_traces"
)
"""How much the profiler slows a host-bound step: the traced over the unprofiled median step of
the overhead-bound sample traces (``tracedx capture --time-unprofiled``, PyTorch 2.11, H200)."""
# Host cost of one cudaGraphLaunch, per kernel in the graph, as measured in profiled H200 traces:
# 1.41 us (add_loop-cudagraph, 500 kernels), 1.42 us (mlp_train-cudagraph, 29 kernels) in
# sample_traces/.
GRAPH_HOST_US_PER_KERNEL = 1.4
# What a kernel costs inside a graph replay beyond its reported eager duration, unprofiled (the
# estimates are against unprofiled steps): median 0.46 us over the H200 measurements of kernels
# of more than one element (sample_traces/graph_node_cost-sweep-h200.json, add_, sum, cumsum:
# 0.37 to 0.73 us; profiler_inflation-h200.json, add_ of 128 to 1M elements: 0.44 to 0.53 us).
# Under the profiler the same replays cost 0.5 to 0.9 us more per kernel (CUPTI records every
# kernel of the graph; profiler_inflation-h200.json), so the gap read off profiled graph traces,
# (step - busy) / kernels (0.62 us add_loop, 0.48 decode, 0.59 mlp_train), is not the one to use.
GRAPH_GPU_GAP_US_PER_KERNEL = 0.46
# A fused attention kernel reaches about half the dense peak (FlashAttention-2, Dao 2023,
# reports 50-73% of peak on A100 forward).
FUSED_ATTENTION_EFFICIENCY = 0.5


@dataclass
class StepModel:
    """The typical analysed step of one device (us).

    Times that make up the step (``step_us``, ``busy_us``, ``cpu_us``, ``sync_us``,
    ``pageable_block_us`` and ``idle_us`` per cause) are medians over the analysed steps, so a
    fix's estimate for the median step never falls below that step's GPU busy time; counts and
    per-fix inputs (kernels, events, DataLoader time) are means. ``mean_step_us`` is for display.
    """

    step_us: float
    mean_step_us: float
    busy_us: float
    cpu_us: float
    sync_us: float  # host blocked in synchronize calls / synchronous DtoH copies
    pageable_block_us: float  # host blocked in pageable memcpy calls
    idle_us: dict[str, float]
    kernels: float
    host_no_gpu_us: float  # host time in ops that launch nothing + DataLoader
    dataloader_us: float
    graph_replays: float  # cudaGraphLaunch calls per step
    per_kernel_host_us: float | None
    host_events: float = 0.0  # recorded host events (ops + runtime calls) per step
    dataloader_events: float = 0.0  # of which inside the DataLoader
    no_gpu_events: float = 0.0  # of which in ops that launch nothing (+ DataLoader)
    events_per_kernel: float = 0.0  # host events in GPU-launching ops per kernel
    tax_us: float = 0.0  # profiler cost per host event (0 without an unprofiled timing)
    sync_calls: float = 0.0  # blocking sync calls per step (not pageable copies)
    sync_ops_host_us: float = (
        0.0  # host time of the top-level ops that issued them (waits included)
    )
    # of the blocking syncs, those not part of a pageable copy's own synchronization
    own_sync_us: float = 0.0
    own_sync_calls: float = 0.0
    unprofiled_step_us: float | None = None
    # the DataLoader runs worker processes (_MultiProcessingDataLoaderIter in its annotation)
    dataloader_multiprocess: bool = False
    # launch calls held by a full launch queue (the GPU far behind: timeline.launch_queue_waits)
    launch_held_us: float = 0.0
    # tax_us is assumed (diagnosis.TAX_ASSUMED_US), not solved: the GPU side binds the traced step
    tax_assumed: bool = False
    # the program syncs the host with the GPU several times per step (an .item() per loop
    # iteration): unprofiled, the GPU work between two syncs cannot overlap the host's, so the
    # step is H + G (see :attr:`serial_us`)
    sync_serial: bool = False

    @property
    def host_us(self) -> float:
        return max(self.cpu_us - self.sync_us - self.pageable_block_us - self.launch_held_us, 0.0)

    @property
    def host_effective_us(self) -> float:
        """Host time without the profiler's cost (equals host_us without an unprofiled timing)."""
        return max(self.host_us - self.tax_us * self.host_events, 0.0)

    @property
    def gpu_us(self) -> float:
        return self.busy_us + self.idle_us.get("kernel wait", 0.0)

    @property
    def serial_us(self) -> float:
        """E: the serialization beyond max(H, G). Traced: what the step shows beyond it. With
        ``sync_serial`` (several of the program's own syncs per step, unprofiled timing known):
        min(H without the profiler's cost, G), so that the step is H + G: the GPU idles while
        the host launches, the host waits while the GPU runs. Under the profiler the host is
        slow enough that the GPU finishes before each sync, which hides this in the trace
        (item_loop-big-sync: traced 11.68 ms = H 10.93 + E 0.75; unprofiled 6.21 ms)."""
        if self.sync_serial:
            return min(self.host_effective_us, self.gpu_us)
        return max(self.step_us - max(self.host_us, self.gpu_us), 0.0)

    def predict(
        self,
        *,
        host_us: float | None = None,
        gpu_us: float | None = None,
        serial_us: float | None = None,
        host_events: float | None = None,
        floor_us: float = 0.0,
    ) -> float:
        """Step time after a change: max(max(H' - tax x events', G') + E', floor) (current
        parts by default; ``floor_us``: a rate set outside the step, such as DataLoader
        workers delivering a batch every D / W)."""
        h = self.host_us if host_us is None else max(host_us, 0.0)
        ev = self.host_events if host_events is None else max(host_events, 0.0)
        h = max(h - self.tax_us * ev, 0.0)
        g = self.gpu_us if gpu_us is None else max(gpu_us, 0.0)
        e = self.serial_us if serial_us is None else max(serial_us, 0.0)
        return max(max(h, g) + e, floor_us)

    @property
    def reference_step_us(self) -> float:
        """The step time estimates are against: unprofiled when known, else the traced median."""
        return self.unprofiled_step_us if self.unprofiled_step_us else self.step_us


@dataclass(frozen=True)
class Change:
    """What a fix changes in the step model (us per step): host, GPU, serialization and events
    as deltas; ``floor_us`` the least the step can take after it (0: none), the larger of two
    floors when changes add up."""

    host_us: float = 0.0
    gpu_us: float = 0.0
    serial_us: float = 0.0
    host_events: float = 0.0
    floor_us: float = 0.0

    def __add__(self, o: Change) -> Change:
        return Change(
            self.host_us + o.host_us,
            self.gpu_us + o.gpu_us,
            self.serial_us + o.serial_us,
            self.host_events + o.host_events,
            max(self.floor_us, o.floor_us),
        )


def profiled_events(m: StepModel, host_us: float, events: float) -> float:
    """The recorded events whose profiler cost goes with ``host_us`` of traced host time.

    A fix that removes (or adds) a part of the host side, ``host_us`` of traced time holding
    ``events`` recorded host events, removes (or adds) their profiler cost too:
    ``tax_us x events``. The cost per event is one average over the step's events, solved from
    its unprofiled timing; a part made of events cheaper than that average would get a
    negative unprofiled time, and removing it would make the step slower (gpt2_decode-eager:
    451 ``aten::view`` ops per step at 1.07 us traced each, against 3.61 us of cost per event).
    So a part's profiler cost is at most its traced time: the events counted are
    ``min(events, host_us / tax_us)``, and the part's unprofiled time,
    ``host_us - tax_us x events``, is never negative. Every fix that removes, adds or keeps a
    part of the host side counts its events through here (:func:`host_change`).
    """
    if m.tax_us <= 0 or events <= 0:
        return max(events, 0.0)
    return min(events, max(host_us, 0.0) / m.tax_us)


def host_change(m: StepModel, host_us: float, events: float, sign: float = -1.0) -> Change:
    """Remove (``sign`` -1) or add (+1) ``host_us`` of traced host time holding ``events``
    recorded events, with their profiler cost capped at their traced time
    (:func:`profiled_events`)."""
    return Change(host_us=sign * host_us, host_events=sign * profiled_events(m, host_us, events))


def apply(m: StepModel, c: Change) -> float:
    """Step time of model ``m`` after change ``c`` (see :meth:`StepModel.predict`)."""
    return m.predict(
        host_us=m.host_us + c.host_us,
        gpu_us=m.gpu_us + c.gpu_us,
        serial_us=m.serial_us + c.serial_us,
        host_events=m.host_events + c.host_events,
        floor_us=c.floor_us,
    )


def combined_change(m: StepModel, findings: list) -> Change:
    """The step-model change of several fixes applied together: their changes added up, each
    part of the step removed once (with worker processes, pinned-memory's pin thread and more
    DataLoader workers both take the same main-thread DataLoader time). Findings without a
    step-model change (larger-batch) are left out."""
    total = Change()
    for f in findings:
        if f.change is not None:
            total = total + f.change
    fixes = {f.fix for f in findings if f.change is not None}
    if m.dataloader_multiprocess and {"pinned-memory", "dataloader-workers"} <= fixes:
        total = total + host_change(m, m.dataloader_us, m.dataloader_events, sign=1.0)
    return total


def combined_speedup(m: StepModel, findings: list) -> float:
    """Whole-step speedup of several fixes applied together (:func:`combined_change`)."""
    new = apply(m, combined_change(m, findings))
    return m.predict() / new if new > 0 else math.inf


@dataclass(repr=False)
class Finding:
    """One fix with its Amdahl estimate. Times in ms per step; ``fraction`` f is of the step."""

    fix: str
    title: str
    fraction: float
    local_speedup: float
    estimated_speedup: float
    estimated_step_ms: float
    derivation: str
    evidence: list[str] = field(default_factory=list)
    recommended: bool = True
    change: Change | None = None
    requires: str | None = None
    """A fix to apply first for this one to work as estimated (cuda-graphs needs the host
    syncs gone to capture the step as one graph)."""
    batch_factor: float | None = None
    """larger-batch only: the batch grows this many times, so ``estimated_step_ms`` is the time
    per sample times today's batch (ms per today's batch of samples, comparable with the step
    it is against), and the larger step itself takes ``batch_factor`` times that."""
    unclamped_speedup: float | None = None
    """T / T' when the model predicts the fix makes the step longer (below 1, e.g. 0.86:
    16% longer); ``estimated_speedup`` is then shown as 1.00 (:func:`amdahl_terms` keeps
    T' <= T). None otherwise."""

    @property
    def estimated_ms_per_batch(self) -> float:
        """ms per today's batch of samples after the fix: the step time for every fix but
        larger-batch, whose larger step holds ``batch_factor`` times the samples."""
        return self.estimated_step_ms

    def __repr__(self) -> str:
        # one short line: the derivation and evidence are long (print them on their own)
        per = " per sample" if self.batch_factor else ""
        scope = "per today's batch" if self.batch_factor else "per step"
        rec = "" if self.recommended else ", not recommended"
        return (
            f"<Finding {self.fix}: {self.estimated_speedup:.2f}x{per} -> "
            f"{self.estimated_ms_per_batch:.3f} ms {scope}, f = {self.fraction:.0%}{rec}; "
            ".derivation, .evidence>"
        )

    def to_dict(self) -> dict:
        s = self.local_speedup
        return {
            "fix": self.fix,
            "title": self.title,
            "fraction": round(self.fraction, 4),
            "local_speedup": None if math.isinf(s) else round(s, 3),
            "local_speedup_unbounded": math.isinf(s),
            "estimated_speedup": round(self.estimated_speedup, 3),
            "estimated_step_ms": round(self.estimated_step_ms, 6),
            # ms per today's batch of samples: the step time for every fix but larger-batch,
            # whose step holds batch_factor times the samples
            "estimated_ms_per_batch": round(self.estimated_ms_per_batch, 6),
            "batch_factor": self.batch_factor,
            "derivation": self.derivation,
            "evidence": self.evidence,
            "recommended": self.recommended,
            "requires": self.requires,
            "unclamped_speedup": (
                None if self.unclamped_speedup is None else round(self.unclamped_speedup, 3)
            ),
        }


def kernels_label(n: float) -> str:
    """``1 kernel`` / ``29 kernels``: a (rounded) kernel count with its noun."""
    return f"{n:.0f} kernel{'' if round(n) == 1 else 's'}"


MAX_PRACTICAL_GRAPHS = 4
"""More CUDA graphs per step than this (one per sync-free segment) is not something a person
would write and maintain; a few (forward, backward, optimizer) is common."""

CLOSE = 1.25
"""Estimates within this factor of each other are not told apart: the estimates are checked to
be within 1.25x of the measured speedups (``tracedx diff``'s on-target bound)."""

EFFORT = {
    "tf32": 0,  # one flag
    "pinned-memory": 0,  # one DataLoader argument, non_blocking copies
    "dataloader-workers": 0,  # one DataLoader argument
    "remove-host-sync": 1,  # a local change: keep the value on the GPU
    "fused-attention": 1,  # call scaled_dot_product_attention
    "bf16-autocast": 1,  # one context manager, then check accuracy
    "torch-compile": 2,  # compile time, graph breaks
    "cuda-graphs": 2,  # static shapes and buffers
    "larger-batch": 2,  # memory, and the optimizer's hyperparameters
    "overlap-communication": 3,  # bucketing, stream placement
}
"""How much work each fix is for a person, lowest first (a judgement, stated per fix)."""


def order_findings(found: list[Finding]) -> list[Finding]:
    """The order a person would apply the fixes in: recommended ones first; among the fixes
    whose estimates are within :data:`CLOSE` of the best remaining one, the least work first
    (:data:`EFFORT`; then the larger estimate); a fix that ``requires`` another comes right
    after it. Fixes not worth 5% follow, largest estimate first."""
    rest = sorted(found, key=lambda f: -f.estimated_speedup)
    rec = [f for f in rest if f.recommended]
    out: list[Finding] = []
    while rec:
        best = rec[0].estimated_speedup
        pick = min(
            (f for f in rec if f.estimated_speedup * CLOSE >= best),
            key=lambda f: (EFFORT.get(f.fix, 2), -f.estimated_speedup),
        )
        rec.remove(pick)
        out.append(pick)
    for f in list(out):
        if f.requires:
            first = next((g for g in out if g.fix == f.requires), None)
            if first is not None and out.index(first) > out.index(f):
                out.remove(first)
                out.insert(out.index(f), first)
    return out + [f for f in rest if not f.recommended]


def amdahl(f: float, s: float) -> float:
    """Whole-step speedup 1/((1-f)+f/s) (Amdahl 1967). ``s`` may be inf."""
    if f <= 0:
        return 1.0
    return 1.0 / ((1.0 - f) + (0.0 if math.isinf(s) else f / s))


SLOWDOWN_SHOWN = 0.005
"""A predicted step longer than now by more than this share is said to be a slowdown (the
estimate itself is clamped at 1.00x)."""


def amdahl_terms(t_us: float, new_us: float, region_us: float) -> tuple[float, float, float]:
    """Amdahl's (f, s) for a step of ``t_us`` predicted to take ``new_us`` after a fix acting
    on ``region_us`` of it, and the whole-step speedup T / T'.

    T' is kept within [1e-3 T, T]; the region is widened to the saving when the saving is
    larger; f = region / T, s = region / (region - saved) (inf when all of it goes), so that
    1 / ((1 - f) + f / s) = T / T'.
    """
    t = t_us
    new_us = min(max(new_us, 1e-3 * t), t)
    saved = t - new_us
    region = min(max(region_us, saved), t)
    f = region / t if t > 0 else 0.0
    rest = region - saved
    s = math.inf if rest <= 1e-9 * max(region, 1.0) else region / rest
    return f, s, (t / new_us if new_us > 0 else 1.0)


def make_finding(
    model: StepModel,
    fix: str,
    title: str,
    region_us: float,
    change: Change | float,
    derivation: str,
    evidence: list[str],
) -> Finding:
    """Express a predicted new step time as Amdahl's (f, s) over the region the fix acts on.

    T is the traced median step (or, with an unprofiled timing, the model's own step with the
    profiler cost removed) and T' the model's step after the change (never above T);
    f = region / T; s = region / (region - saved), so that 1/((1-f)+f/s) = T / T'. The region
    is widened to the saving when the model saves more than the named region. The estimated
    step time is the reference step (unprofiled when known, else the traced median) / speedup.
    """
    new_us = apply(model, change) if isinstance(change, Change) else change
    # Traced reference: T is the traced median step and T' the model's new step, in the same
    # units. Unprofiled reference: the model (profiler cost removed) gives the ratio T'/T on its
    # own scale, applied to the measured unprofiled step.
    t = model.predict() if model.unprofiled_step_us else model.reference_step_us
    return amdahl_finding(
        fix,
        title,
        t,
        new_us,
        region_us,
        derivation,
        evidence,
        reference_us=model.reference_step_us,
        change=change if isinstance(change, Change) else None,
    )


def amdahl_finding(
    fix: str,
    title: str,
    t_us: float,
    new_us: float,
    region_us: float,
    derivation: str,
    evidence: list[str],
    reference_us: float | None = None,
    change: Change | None = None,
) -> Finding:
    """The Finding of a fix that takes the step from ``t_us`` to ``new_us`` by acting on
    ``region_us`` of it (:func:`amdahl_terms`), recommended at a speedup of
    :data:`MIN_RECOMMENDED_SPEEDUP` or more; its estimated step is ``reference_us`` (``t_us``
    when None) over the speedup, in ms."""
    f, s, sp = amdahl_terms(t_us, new_us, region_us)
    ref = t_us if reference_us is None else reference_us
    slowdown = None
    if t_us > 0 and new_us > t_us * (1 + SLOWDOWN_SHOWN):
        slowdown = t_us / new_us
        evidence = [
            *evidence,
            f"the model predicts a slowdown ({slowdown:.2f}x: the step "
            f"{new_us / t_us - 1:.0%} longer), shown as 1.00x",
        ]
    return Finding(
        fix,
        title,
        f,
        s,
        sp,
        ref / sp / 1e3,
        derivation,
        evidence,
        recommended=sp >= MIN_RECOMMENDED_SPEEDUP,
        change=change,
        unclamped_speedup=slowdown,
    )


def _ms(us: float) -> str:
    return f"{us / 1e3:.3f} ms"


# --- one rule per fix ------------------------------------------------------------------------


def cuda_graphs(m: StepModel) -> Finding | None:
    """Replay the step's kernels as one CUDA graph: launch gaps and Python between ops go away.

    H' = host time of ops that launch nothing (+ DataLoader) + 1.4 us x kernels (graph replay
    host cost); G' = busy + 0.46 us x kernels (in-graph gaps); both measured on an H200
    (see the constants). Syncs stay.
    """
    if m.kernels < 2 or m.graph_replays >= 1:
        return None
    launch_idle = sum(m.idle_us.get(c, 0.0) for c in ("kernel launch", "python", "kernel wait"))
    h2 = m.host_no_gpu_us + GRAPH_HOST_US_PER_KERNEL * m.kernels
    events = m.no_gpu_events + 1
    title = "Capture the step in a CUDA graph"
    if m.sync_calls >= 1:
        # A sync cannot be captured: the step splits into sync-free segments, one graph each,
        # and the Python between them (the loop around the syncs) stays on the host.
        segments = m.sync_calls + 1
        h2 += m.idle_us.get("python", 0.0) + max(m.sync_ops_host_us - m.sync_us, 0.0)
        events = m.no_gpu_events + segments
        title = (
            f"Capture the sync-free segments of the step in CUDA graphs ({segments:.0f} per step)"
        )
        if segments > MAX_PRACTICAL_GRAPHS:
            title += ": impractical as such; remove the host syncs first, then capture one graph"
    g2 = m.busy_us + GRAPH_GPU_GAP_US_PER_KERNEL * m.kernels
    # H' is the ops that launch nothing (and the DataLoader), kept with their events but
    # never more profiler cost than their traced time, plus the graph replays
    kept_events = profiled_events(m, m.host_no_gpu_us, m.no_gpu_events)
    events += kept_events - m.no_gpu_events
    new = Change(host_us=h2 - m.host_us, gpu_us=g2 - m.gpu_us, host_events=events - m.host_events)
    launching = min(m.per_kernel_host_us * m.kernels, max(m.host_us - m.host_no_gpu_us, 0.0))
    between = max(m.host_us - m.host_no_gpu_us - launching, 0.0)
    ev = [
        f"{kernels_label(m.kernels)} per step, GPU busy {_ms(m.busy_us)} of a {_ms(m.step_us)} step",
        f"host time a replay skips: the launching ops' {_ms(launching)} and the rest outside "
        f"the ops that launch nothing (Python between ops) {_ms(between)} per step; the GPU "
        f"idles {_ms(launch_idle)} of the step on launches, Python between ops and queued kernels",
    ]
    if m.per_kernel_host_us:
        ev.append(f"host time per kernel launched: {m.per_kernel_host_us:.1f} us")
    if m.sync_calls >= 1:
        ev.insert(
            0,
            f"{m.sync_calls:.0f} host syncs per step ({_ms(m.sync_us)}) cannot be captured and stay: "
            "remove them first (remove-host-sync) to capture the whole step",
        )
    deriv = (
        f"launching ops replayed: host {_ms(m.host_us)} -> {_ms(h2)} (the ops that launch "
        f"nothing stay; replay costs ~{GRAPH_HOST_US_PER_KERNEL} us/kernel), GPU time (busy + queued gaps) "
        f"{_ms(m.gpu_us)} -> {_ms(g2)} (busy + {GRAPH_GPU_GAP_US_PER_KERNEL} us/kernel in-graph gaps); "
        "the step cannot get faster than its GPU busy time"
    )
    if m.unprofiled_step_us and m.tax_us:
        deriv += (
            f"; host times as traced: the estimate then takes {m.tax_us:.1f} us of profiler "
            "cost out per host event left"
        )
    f = make_finding(m, "cuda-graphs", title, launch_idle, new, deriv, ev)
    f.requires = "remove-host-sync" if m.sync_calls >= 1 else None
    return f


def remove_host_sync(m: StepModel, sync_ops: list[str]) -> Finding | None:
    """Drop the host syncs: the serialization they add (E) goes; H and G stay.

    Only syncs of the program's own (``own_sync_us``): a sync made by the op that also made a
    pageable copy is that copy's, and goes with pinned-memory. The GPU idle after syncs counts
    in proportion to the program's own share of the sync calls.
    """
    if m.own_sync_us <= 0 or m.own_sync_calls <= 0:
        return None
    share = m.own_sync_calls / m.sync_calls if m.sync_calls else 1.0
    idle_after = share * m.idle_us.get("host sync", 0.0)
    e_sync = min(m.serial_us, m.own_sync_us + idle_after)
    new = Change(serial_us=-e_sync)
    ev = [
        f"host blocked in syncs {_ms(m.own_sync_us)} per step; GPU idle after syncs {_ms(idle_after)}"
    ]
    if m.own_sync_calls < m.sync_calls:
        ev.append(
            f"{m.sync_calls - m.own_sync_calls:.0f} more sync calls per step belong to pageable "
            "copies (pinned-memory removes them)"
        )
    if sync_ops:
        ev.append("issued by: " + ", ".join(sync_ops[:5]))
    ev.append(
        f"without the sync the step is still bound by max(host {_ms(m.host_effective_us)}, "
        f"GPU {_ms(m.gpu_us)})"
    )
    deriv = "overlap: host and GPU no longer wait for each other; step -> max(host work, GPU time)"
    return make_finding(
        m,
        "remove-host-sync",
        "Remove host syncs (.item(), .cpu(), printing tensors) from the step",
        m.own_sync_us + idle_after,
        new,
        deriv,
        ev,
    )


DATALOADER_WORKERS = 8
"""Worker processes the dataloader-workers estimate assumes (``num_workers=8``, each on a free
CPU core): a common setting, and the one of the sample pair. The trace records neither the
cores nor what the user would choose, so the finding states it and the workers needed."""


def dataloader_workers(m: StepModel, workers: int = DATALOADER_WORKERS) -> Finding | None:
    """Load batches in ``workers`` worker processes instead of the main process.

    The main process's DataLoader time per step D (profiler cost removed: D_u) is the time to
    make one batch. W workers make W batches at once, so in steady state a batch is ready every
    D_u / W; the main thread waits for one when that is longer than the rest of its step
    (queueing: throughput of W parallel servers). So the step becomes max(T_rest, D_u / W),
    T_rest the step without the DataLoader (its host work, GPU waits and blocking copies all
    overlap the workers). Assumed: each worker makes a batch as fast as the main process did
    (PyTorch runs each worker with one intra-op thread; transforms that the main process ran on
    several threads are slower there), and W free cores. With workers already running
    (``dataloader_multiprocess``), the main thread's remaining DataLoader time is what goes.
    """
    if m.dataloader_us <= 0.05 * m.step_us:
        return None
    share = m.dataloader_us / m.step_us
    ev = [
        f"DataLoader __next__ on the main thread: {_ms(m.dataloader_us)} per step "
        f"({share:.0%} of the step; the TensorBoard plugin's rule flags > 5%)"
    ]
    title = "Use DataLoader workers (num_workers > 0, persistent_workers)"
    gone = host_change(m, m.dataloader_us, m.dataloader_events)
    if m.dataloader_multiprocess:
        new = gone
        deriv = "overlap: batches prepared by workers while the step runs; host time minus DataLoader time"
        # workers already run: the main thread waits for batches, or rebuilds them from the
        # workers' shared memory (pin_memory=True hands that to its own thread)
        title = "Add DataLoader workers, or pin_memory=True (workers already run)"
        ev.append(
            "the DataLoader already has worker processes: the main thread waits for batches "
            "(too few workers) or rebuilds them from shared memory (pin_memory=True moves that "
            "to its own thread)"
        )
        return make_finding(m, "dataloader-workers", title, m.dataloader_us, new, deriv, ev)
    # unprofiled: the DataLoader's time; the workers deliver a batch every D / W whatever the
    # main thread does meanwhile (host work, GPU waits, blocking copies)
    d_u = m.dataloader_us + gone.host_events * m.tax_us
    rest = apply(m, gone)
    per_batch = d_u / workers
    new = gone + Change(floor_us=per_batch)
    need = math.ceil(d_u / rest) if rest > 0 else workers
    ev += [
        f"one batch takes the main process {_ms(d_u)}"
        + (" (profiler cost removed)" if m.tax_us else "")
        + f"; {workers} workers make one every {_ms(per_batch)}, the rest of the step takes "
        f"{_ms(rest)}",
        f"hiding the DataLoader completely needs ~{need} workers (and as many free cores); "
        f"with {workers} the step is ~{_ms(apply(m, new))}",
    ]
    deriv = (
        f"throughput: {workers} workers (assumed, on {workers} free cores) each make a batch in "
        "the main process's DataLoader time per step, so one is ready every D / "
        f"{workers}; the step -> max(the rest of the step, D / {workers}); "
        "assumes a one-thread worker (PyTorch's default) makes a batch as fast as the main "
        "process did"
    )
    return make_finding(m, "dataloader-workers", title, m.dataloader_us, new, deriv, ev)


def pinned_memory(
    m: StepModel,
    pageable_copy_us: float,
    pageable_bytes: float,
    pinned_gbs: float,
    pinned_source: str,
) -> Finding | None:
    """Copy from pinned memory with non_blocking=True: the host stops blocking, copies run at
    pinned bandwidth.

    With a multi-process DataLoader, ``pin_memory=True`` also starts its pin-memory thread, which
    takes each batch from the workers' queue (rebuilding its tensors from shared memory) and
    pins it while the step runs; the main thread's ``__next__`` then only takes a ready batch.
    So the DataLoader time left on the main thread goes too (PyTorch, ``torch.utils.data``
    documentation, "Memory Pinning", and ``_MultiProcessingDataLoaderIter``). With
    ``num_workers=0`` the pinning would run on the main thread instead: nothing is removed.
    """
    if pageable_copy_us <= 0 or pageable_bytes <= 0:
        return None
    new_copy_us = pageable_bytes / (pinned_gbs * 1e3)
    saved_gpu = max(pageable_copy_us - new_copy_us, 0.0)
    e_page = min(m.serial_us, m.pageable_block_us)
    dl_moved = m.dataloader_us if m.dataloader_multiprocess else 0.0
    dl_events = m.dataloader_events if m.dataloader_multiprocess else 0.0
    new = Change(gpu_us=-saved_gpu, serial_us=-e_page) + host_change(m, dl_moved, dl_events)
    ach = pageable_bytes / pageable_copy_us / 1e3
    ev = [
        f"pageable copies: {pageable_bytes / 2**20:.1f} MiB in {_ms(pageable_copy_us)} per step ({ach:.1f} GB/s)",
        f"host blocked in pageable memcpy calls: {_ms(m.pageable_block_us)} per step",
    ]
    deriv = (
        f"roofline of the copy engine: pinned copies at {pinned_gbs:.0f} GB/s ({pinned_source}) -> "
        f"{_ms(new_copy_us)}; non_blocking lets the host run ahead"
    )
    if dl_moved > 0:
        ev.append(
            f"DataLoader with worker processes: {_ms(dl_moved)} per step of __next__ on the main "
            "thread moves to the pin-memory thread"
        )
        deriv += "; the pin-memory thread takes the batches off the main thread"
    return make_finding(
        m,
        "pinned-memory",
        "Pin host memory (pin_memory=True) and copy with non_blocking=True",
        pageable_copy_us + e_page + dl_moved,
        new,
        deriv,
        ev,
    )


def faster_math(
    m: StepModel,
    fix: str,
    title: str,
    op_time_us: float,
    new_op_time_us: float,
    derivation: str,
    evidence: list[str],
    added_kernels: float = 0.0,
) -> Finding | None:
    """A change that makes some device work faster (TF32, bf16, fused attention, fusion).

    ``added_kernels`` kernels per step that the change adds (bf16 autocast's weight casts; their
    device time is in ``new_op_time_us``) each cost the host what a kernel of the step costs
    it now (``per_kernel_host_us``, with ``events_per_kernel`` recorded events)."""
    if op_time_us <= 0:
        return None
    saved = max(op_time_us - new_op_time_us, 0.0)
    new = Change(gpu_us=-saved)
    if added_kernels > 0 and m.per_kernel_host_us:
        new = new + host_change(
            m,
            added_kernels * m.per_kernel_host_us,
            added_kernels * m.events_per_kernel,
            sign=1.0,
        )
    if m.host_effective_us >= m.gpu_us:
        evidence = [
            *evidence,
            f"the GPU waits on the host (host {_ms(m.host_effective_us)} >= GPU {_ms(m.gpu_us)} per step): "
            "faster kernels only add idle time",
        ]
    return make_finding(m, fix, title, op_time_us, new, derivation, evidence)


def fusion_applies(chains: float, kernels_removed: float) -> bool:
    """Whether :func:`torch_compile` has chains to fuse (per step: some chain, a kernel or
    more removed); the diagnosis measures the compiled region's host time only then."""
    return chains > 0 and kernels_removed >= 1


def torch_compile(
    m: StepModel,
    chain_us: float,
    chain_saved_us: float,
    kernels_removed: float,
    chains: float,
    removed_host_us: float | None = None,
    python_us: float = 0.0,
    no_gpu_us: float = 0.0,
    no_gpu_events: float = 0.0,
) -> Finding | None:
    """Fuse chains of elementwise/reduction/normalization kernels (torch.compile / Inductor).

    What compile changes, from the eager trace:

    - Device: a fused chain moves about as many bytes as its largest single pass, so it takes
      about the time of its longest kernel (saving sum - max per chain). GEMMs, attention and
      the kernels outside chains stay.
    - Launches: each fused-away kernel saves its eager dispatch and launch cost:
      ``removed_host_us`` per step (the host time per kernel of the ops that launched the
      chains, each at most the step's mean; see diagnosis._fusable_chains), else the step's
      mean host time per kernel; its recorded host events (and their profiler cost) go too.
    - Python: the model's host time outside any op (``python_us``: module calls, framework
      code between ops; the step less the optimizer and the DataLoader, see
      diagnosis.compile_region_host) goes in the share of the kernels that fuse away (kernels
      removed / kernels). Not all of it: Inductor's Python wrapper launches the kernels that
      stay at about the cost the eager step paid for them, Python included (gpt2_decode,
      unprofiled: 21.2 us per kernel eager, 20.6 us compiled). None in a step replayed from
      CUDA graphs: a replay runs none of the model's Python per op (add_loop-cudagraph's 0.816
      ms of Python between ops is the loop around one replay of 500 kernels).
    - Ops that launch nothing inside the model and the autograd engine's own time per backward
      node (``no_gpu_us``, with ``no_gpu_events`` recorded events): one compiled forward and one
      compiled backward replace them, so they go (their events' profiler cost at most their
      traced time).
    """
    if not fusion_applies(chains, kernels_removed):
        return None
    if removed_host_us is None:
        removed_host_us = kernels_removed * (m.per_kernel_host_us or 0.0)
    per_k = removed_host_us / kernels_removed
    # a step replayed from CUDA graphs runs none of the model's code per op: its Python between
    # ops is the loop around the replays, which fusing the graph's kernels does not remove
    replayed = m.graph_replays >= 1
    py_removed = (
        python_us * min(kernels_removed / m.kernels, 1.0) if m.kernels and not replayed else 0.0
    )
    # kernels on several streams overlap: the saving cannot exceed what the busy union allows
    chain_saved_us = min(chain_saved_us, 0.9 * m.busy_us)
    # each part goes with its recorded events (Python between ops has none)
    new = (
        host_change(m, removed_host_us, kernels_removed * m.events_per_kernel)
        + host_change(m, py_removed, 0.0)
        + host_change(m, no_gpu_us, no_gpu_events)
        + Change(gpu_us=-chain_saved_us)
    )
    removed_host_us += py_removed + no_gpu_us
    ev = [
        f"{chains:.0f} chain{'' if round(chains) == 1 else 's'} of back-to-back elementwise/reduction/normalization kernels per step, "
        f"{_ms(chain_us)} of device time; fusion removes ~{kernels_label(kernels_removed)} per step"
    ]
    deriv = (
        f"roofline: a fused chain moves about as many bytes as its largest pass (device "
        f"{_ms(chain_us)} -> {_ms(chain_us - chain_saved_us)}); host saves {per_k:.1f} us per "
        f"fused-away kernel, {_ms(py_removed)} of the model's {_ms(python_us)} of Python between "
        f"ops (its share of the kernels removed) and {_ms(no_gpu_us)} of ops that launch nothing "
        "and of the autograd engine's own time per backward node (one compiled forward and "
        "backward replace them)"
        + "; GEMMs, attention and the optimizer (its kernels launched in Optimizer.step#) "
        "stay; assumes the kernels left cost the compiled wrapper what they cost eager"
    )
    region = chain_us + removed_host_us
    return make_finding(
        m, "torch-compile", "Fuse elementwise chains with torch.compile", region, new, deriv, ev
    )


def larger_batch(
    m: StepModel, idle_fraction: float, growth=None, memory=None, factor: float = 2.0
) -> Finding | None:
    """Grow the batch k-fold (k = ``factor``, 2 by default): per-sample time = step(kB) / k.

    step(kB) = max(H', G') + E' on the step model, where H' is the host time per step, which
    stays (launches and Python do not grow with the batch) but for the DataLoader's main-thread
    time and the blocking pageable copies, which grow k-fold; and G' = G x ``growth(k)``, the
    GPU time grown by kernel kind and roofline position (:mod:`tracedx.analysis.batch`: weight-
    sized and optimizer kernels fixed, compute-bound GEMMs k-fold, under-filled ones less,
    elementwise by bytes above a launch floor). ``growth`` is a callable k -> G'/G (None: G
    grows k-fold). ``memory`` is a :class:`~tracedx.analysis.batch.StepMemory` or None: with
    it the evidence gives the bytes the batch needs and the largest k that fits (and a batch
    that does not fit is not proposed); without it the headroom is unknown.
    """
    if m.busy_us <= 0:
        return None
    k = factor
    grow = (lambda x: x) if growth is None else growth

    def per_sample(x: float) -> float:
        e_page = min(m.serial_us, m.pageable_block_us)
        more = host_change(m, (x - 1) * m.dataloader_us, (x - 1) * m.dataloader_events, 1.0)
        step = m.predict(
            gpu_us=grow(x) * m.gpu_us,
            host_us=m.host_us + more.host_us,
            serial_us=m.serial_us + (x - 1) * e_page,
            host_events=m.host_events + more.host_events,
        )
        return step / x

    new_per_batch = per_sample(k)
    new_step = new_per_batch * k
    ev = [
        f"GPU idle {idle_fraction:.0%} of the step; at {k:g}x the batch the GPU time grows "
        f"{grow(k):.2f}x and the step {new_step / m.predict():.2f}x for {k:g}x the samples",
    ]
    if memory is None:
        ev.append("memory headroom unknown: no [memory] events (tracedx capture --profile-memory)")
    else:
        need = memory.bytes_at(k)
        ev.append(
            f"memory: peak {memory.peak_allocated_bytes / 2**30:.2f} GiB allocated "
            f"({memory.peak_reserved_bytes / 2**30:.2f} GiB reserved), of which "
            f"{memory.batch_bytes / 2**30:.2f} GiB grows with the batch; {k:g}x needs "
            f"~{need / 2**30:.2f} GiB"
        )
        km = memory.max_factor
        if km is not None:
            if km >= 2 and km != k:
                ev.append(
                    f"the largest batch that fits is ~{km}x: ~{m.predict() / per_sample(km):.2f}x "
                    "per sample"
                )
            if km < k:
                ev.append(f"{k:g}x does not fit in the device's memory (at most {km}x)")
                new_per_batch = m.predict()
    if m.dataloader_us > 0:
        ev.append(
            f"the DataLoader's {_ms(m.dataloader_us)} per step on the main thread grows with the batch"
        )
    deriv = (
        f"per-sample time = max(host + {k:g} x DataLoader, GPU x growth({k:g})) / {k:g}: host "
        "time per step stays; GPU time grows by kernel kind (optimizer and weight-sized kernels "
        "fixed, GEMMs by roofline position, the rest by bytes above a launch floor)"
    )
    f = make_finding(
        m,
        "larger-batch",
        f"Increase the batch size ({k:g}x) to fill the idle GPU",
        m.predict(),  # the whole step serves more samples: f = 100%, s the per-sample speedup
        new_per_batch,
        deriv,
        ev,
    )
    f.batch_factor = k
    return f


def overlap_communication(m: StepModel, exposed_comm_us: float, comm_us: float) -> Finding | None:
    """Overlap collectives with compute (bucketed all-reduce, FSDP prefetch)."""
    if exposed_comm_us <= 0:
        return None
    g2 = max(m.gpu_us - exposed_comm_us, comm_us)
    new = Change(gpu_us=g2 - m.gpu_us)
    ev = [
        f"communication kernels {_ms(comm_us)} per step, {_ms(exposed_comm_us)} not overlapped with compute"
    ]
    deriv = "overlap: exposed communication hidden under compute, bounded by the communication time itself"
    return make_finding(
        m,
        "overlap-communication",
        "Overlap communication with compute",
        exposed_comm_us,
        new,
        deriv,
        ev,
    )
