"""Correct timing of PyTorch code: synchronized wall clock and CUDA-event device time.

The method (PyTorch docs, "CUDA semantics: asynchronous execution", and ``torch.cuda.Event``):
GPU work is asynchronous, so a timer around a PyTorch call measures the enqueue, not the work.

- :func:`wall`: synchronize, start the clock, run, synchronize, stop. What a user experiences,
  host overheads included. Warm up first; report the median with min and max.
- :func:`device_time`: two CUDA events recorded on the current stream around the work; the
  GPU's own elapsed time, host gaps excluded.
- :class:`StepTimer`: synchronized wall clock between consecutive step markers (what
  ``tracedx capture --time-unprofiled`` uses to time a script's steps).

torch is imported only when a function needs it; everything returns plain numbers in
milliseconds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "StepTimer",
    "Timing",
    "device_time",
    "summarize",
    "synchronize",
    "wall",
    "warm_gpu_clocks",
]


@dataclass(frozen=True)
class Timing:
    """A distribution of timings, all in milliseconds.

    ``median_ms``, ``min_ms``, ``max_ms`` and ``mean_ms`` summarise ``samples`` measurements.
    The mean is the throughput figure (total time / samples) where steps come in bursts, as
    with DataLoader workers whose prefetched batches serve most steps fast and a few slowly;
    the median is the typical step.
    """

    median_ms: float
    min_ms: float
    max_ms: float
    samples: int
    mean_ms: float | None = None

    def as_dict(self) -> dict:
        """The keys ``median``, ``mean``, ``min``, ``max`` (ms) and ``n``, as written in trace
        metadata (``mean`` only when known)."""
        d = {"median": self.median_ms}
        if self.mean_ms is not None:
            d["mean"] = self.mean_ms
        return d | {"min": self.min_ms, "max": self.max_ms, "n": self.samples}


def summarize(times_ms: list[float]) -> Timing:
    """Median, mean, min and max of ``times_ms`` (milliseconds).

    Raises ``ValueError`` when ``times_ms`` is empty.
    """
    if not times_ms:
        raise ValueError("no timings to summarize")
    return Timing(
        median_ms=float(statistics.median(times_ms)),
        min_ms=float(min(times_ms)),
        max_ms=float(max(times_ms)),
        samples=len(times_ms),
        mean_ms=float(statistics.fmean(times_ms)),
    )


def _torch_cuda_ready() -> bool:
    """True when torch is already imported and has an initialised CUDA context.

    Never imports torch and never creates a CUDA context: timing code must not change what it
    times.
    """
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:  # pragma: no cover - broken torch builds
        return False


def synchronize(cuda: bool | None = None) -> None:
    """Wait until all queued GPU work of the current device is done.

    ``cuda=None`` synchronizes only when torch is imported and has initialised CUDA (so a CPU
    program is never made to create a CUDA context); ``True`` always calls
    ``torch.cuda.synchronize()``; ``False`` does nothing.
    """
    if cuda is None:
        cuda = _torch_cuda_ready()
    if cuda:
        import torch

        torch.cuda.synchronize()


def warm_gpu_clocks(seconds: float = 0.3) -> bool:
    """Keep the current CUDA device busy with bf16 matmuls for ``seconds`` (wall clock).

    An idle GPU runs at low clocks (an idle H200 read 345 MHz against 1980 MHz under load) and
    needs a moment of work to reach them; timing before that reports a slow GPU (so: warm
    up before timing). Runs only when torch has already initialised CUDA (so it never creates
    a context a CPU program did not ask for). Returns True when it ran.
    """
    if seconds <= 0 or not _torch_cuda_ready():
        return False
    import torch

    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            torch.matmul(a, a, out=out)
        torch.cuda.synchronize()
    return True


def wall(
    fn: Callable[[], object],
    samples: int = 10,
    warmup: int = 3,
    cuda: bool | None = None,
) -> Timing:
    """Synchronized wall-clock time of ``fn()`` in milliseconds: median, min, max.

    Runs ``fn`` ``warmup`` times untimed, then ``samples`` times, each between two
    ``torch.cuda.synchronize()`` calls so queued work is neither excluded nor borrowed
    (PyTorch docs, "CUDA semantics: asynchronous execution"). ``cuda=None`` synchronizes when torch has an
    initialised CUDA context after the warm-up; ``False`` times the host only.

    Raises ``ValueError`` when ``samples < 1`` or ``warmup < 0``.
    """
    if samples < 1 or warmup < 0:
        raise ValueError("samples must be >= 1 and warmup >= 0")
    for _ in range(warmup):
        fn()
    if cuda is None:
        cuda = _torch_cuda_ready()
    times = []
    for _ in range(samples):
        synchronize(cuda)
        t0 = time.perf_counter()
        fn()
        synchronize(cuda)
        times.append((time.perf_counter() - t0) * 1e3)
    return summarize(times)


def device_time(
    fn: Callable[[], object],
    samples: int = 20,
    warmup: int = 5,
    repeats: int = 1,
) -> Timing:
    """GPU-side time of ``fn()`` in milliseconds from CUDA events (median, min, max).

    Each sample records a start and an end ``torch.cuda.Event(enable_timing=True)`` on the
    current stream around ``repeats`` calls and divides the elapsed time by ``repeats``
    (PyTorch docs, ``torch.cuda.Event.elapsed_time``).
    Host gaps are excluded, so a launch-bound ``fn`` looks faster than it is to a user: use
    :func:`wall` for that.

    Raises ``RuntimeError`` when no CUDA device is available, ``ValueError`` on bad counts.
    """
    if samples < 1 or warmup < 0 or repeats < 1:
        raise ValueError("samples and repeats must be >= 1 and warmup >= 0")
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("device_time needs a CUDA device; use tracedx.measure.wall on CPU")
    return summarize(event_times_ms(fn, samples=samples, warmup=warmup, repeats=repeats))


def event_times_ms(fn, *, samples: int, warmup: int, repeats: int) -> list[float]:
    """Per-call device milliseconds of ``fn`` from CUDA events around ``repeats`` calls, taken
    ``samples`` times after ``warmup`` calls and a synchronize (asynchronous GPU
    work is timed with device events, after warm-up)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / repeats)
    return times


class StepTimer:
    """Synchronized wall clock between consecutive step markers.

    Call :meth:`mark` at each step boundary. The first ``skip`` intervals are warm-up and are
    dropped; the next ``count`` intervals (milliseconds) are kept. Each mark synchronizes the
    GPU first (when torch has initialised CUDA), so an interval is the time the step really took
    (synchronize before starting and after stopping the clock).
    """

    def __init__(self, count: int, skip: int = 2, cuda: bool | None = None):
        if count < 1 or skip < 0:
            raise ValueError("count must be >= 1 and skip >= 0")
        self.count = count
        self.skip = skip
        self._cuda = cuda
        self._last: float | None = None
        self.marks = 0
        self.intervals_ms: list[float] = []

    @property
    def done(self) -> bool:
        """True once ``count`` intervals have been kept."""
        return len(self.intervals_ms) >= self.count

    def mark(self) -> None:
        """Record a step boundary (synchronizing the GPU first)."""
        if self.done:
            return
        synchronize(self._cuda)
        now = time.perf_counter()
        if self._last is not None:
            interval = (now - self._last) * 1e3
            if self.marks - 1 >= self.skip:
                self.intervals_ms.append(interval)
        self._last = now
        self.marks += 1

    def summary(self) -> Timing | None:
        """The kept intervals as a :class:`Timing`, or ``None`` when none were kept."""
        return summarize(self.intervals_ms) if self.intervals_ms else None
