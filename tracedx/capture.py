"""Capture: run a script under torch.profiler and write a trace that is never lost.

``tracedx capture script.py -- args`` calls :func:`capture_script`; scripts and notebooks use
:func:`step` (a step marker, a no-op when nothing is capturing) and :func:`profile` (a context
manager that profiles a block with the same schedule and writing).

How a capture goes (PyTorch docs, ``torch.profiler``):

- Steps come from the script's own loop: an optimizer ``step()`` post hook
  (``torch.optim.optimizer.register_optimizer_step_post_hook``) marks the end of each
  training step; an explicit :func:`step` call marks it in decode and other loops. Once an
  explicit call is seen, optimizer steps stop counting, so no step is counted twice. Only the
  first optimizer seen counts (a GAN's two optimizers make one step, not two).
- tracedx drives the profiler itself rather than handing torch a ``schedule`` that the script
  would have to ``step()`` (C20): from the start until the warm-up the profiler records
  (a fallback trace of the setup and the first steps, kept only if the script never reaches
  the active window); ``warmup`` steps with the profiler prepared but not recording; then
  ``active`` steps recorded, each inside a ``ProfilerStep#N`` range, and written at once.
- The trace is written whatever happens: when the script raises, calls ``sys.exit``, gets
  Ctrl-C or SIGTERM, the profiler is stopped in ``finally``, what was collected is exported
  to a temporary file, gzipped and renamed into place (atomic), and the script's exit status
  is passed on. SIGKILL and out-of-memory kills leave no trace (nothing can run then).
- Beside the events the trace gets a top-level ``"tracedx"`` key: versions, GPU, schedule,
  step marker, script and argv, and with ``time_unprofiled=K`` the median/mean/min/max of K steps
  timed without the profiler (synchronized wall clock, :class:`tracedx.measure.StepTimer`) in a
  first, unprofiled run of the same script in a subprocess.

torch is imported only inside functions that need it: ``import tracedx.capture`` works without
torch.
"""

from __future__ import annotations

import _thread
import contextlib
import datetime as _dt
import gzip
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tracedx.errors import TraceError

__all__ = [
    "CaptureError",
    "CaptureResult",
    "Schedule",
    "capture_script",
    "profile",
    "step",
]

_TIMING_ENV = "TRACEDX_TIMING_CHILD"


class CaptureError(TraceError):
    """Bad capture usage (no such script, bad schedule, torch missing): one line, exit 2."""


@dataclass(frozen=True)
class Schedule:
    """Steps skipped (``wait``), warmed up (``warmup``) and recorded (``active``)."""

    wait: int = 1
    warmup: int = 1
    active: int = 5

    def __post_init__(self):
        if self.wait < 0 or self.warmup < 0:
            raise CaptureError("--wait and --warmup must be 0 or more")
        if self.active < 1:
            raise CaptureError("--steps must be 1 or more")

    @property
    def start_active(self) -> int:
        """The step boundary at which recording starts.

        The first step (setup included) is never recorded in the active window, so with
        ``wait = warmup = 0`` recording starts at the first boundary.
        """
        return max(self.wait + self.warmup, 1)

    @property
    def needed(self) -> int:
        """Steps the script must run for the active window to be complete."""
        return self.start_active + self.active

    def as_dict(self) -> dict:
        return {"wait": self.wait, "warmup": self.warmup, "active": self.active}


@dataclass
class CaptureResult:
    """What a capture produced.

    ``path`` is the trace written (``None`` when nothing could be written); ``exit_code`` is the
    script's own exit status, or 1 when it succeeded but no trace was written; ``steps`` counts the step markers seen; ``active_steps`` the
    steps recorded in the active window; ``messages`` the notes printed on stderr.
    """

    path: Path | None
    exit_code: int
    steps: int
    active_steps: int
    step_marker: str
    unprofiled: dict | None = None
    messages: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Step markers
# --------------------------------------------------------------------------------------------


class _Markers:
    """Turns optimizer steps and explicit :func:`step` calls into one stream of boundaries.

    ``on_boundary()`` is called once per step boundary. Explicit calls win once seen: from the
    first explicit call on, optimizer steps are ignored, and if the boundary just before came
    from the optimizer in the same iteration the explicit call is taken as that same boundary.
    """

    MODES = ("auto", "optimizer", "explicit")

    def __init__(self, on_boundary: Callable[[], None], mode: str = "auto"):
        if mode not in self.MODES:
            raise CaptureError(f"--marker must be one of {', '.join(self.MODES)}, not {mode!r}")
        self._on_boundary = on_boundary
        self.mode = mode
        self.source = "none"  # "optimizer" | "tracedx.step" | "none"
        self.count = 0
        self._explicit_seen = False
        self._last_was_optimizer = False
        self._optimizer_ref: weakref.ref | None = None
        self._hook_handle = None
        self._lock = threading.Lock()

    def install(self) -> None:
        """Register the optimizer post hook (when torch is importable and mode allows)."""
        if self.mode == "explicit":
            return
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except Exception:  # torch missing or too old: explicit markers still work
            return
        self._hook_handle = register_optimizer_step_post_hook(self._optimizer_hook)

    def remove(self) -> None:
        if self._hook_handle is not None:
            self._hook_handle.remove()
            self._hook_handle = None

    def _optimizer_hook(self, optimizer, args, kwargs) -> None:
        if _capturing_cuda_graph():
            return  # recording a CUDA graph is setup; its replays never call step()
        with self._lock:
            if self._explicit_seen:
                return
            first = self._optimizer_ref() if self._optimizer_ref is not None else None
            if first is None:
                self._optimizer_ref = weakref.ref(optimizer)
            elif first is not optimizer:
                return
            self.source = "optimizer"
            self._last_was_optimizer = True
            self.count += 1
        self._on_boundary()

    def explicit(self) -> None:
        if self.mode == "optimizer":
            return
        with self._lock:
            if not self._explicit_seen:
                self._explicit_seen = True
                self.source = "tracedx.step"
                if self._last_was_optimizer:
                    # The optimizer already marked this iteration's end: same boundary.
                    self._last_was_optimizer = False
                    return
            self._last_was_optimizer = False
            self.count += 1
        self._on_boundary()


_active_markers: _Markers | None = None


def _capturing_cuda_graph() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:
        return False


def step() -> None:
    """Mark the end of one step (one decode token, one loop iteration).

    Under ``tracedx capture`` or :func:`profile` this advances the capture's schedule; once
    called, it is the only step source (optimizer steps stop counting). Anywhere else it does
    nothing and costs a function call, so scripts can call it unconditionally.
    """
    markers = _active_markers
    if markers is not None:
        markers.explicit()


@contextlib.contextmanager
def _markers_installed(markers: _Markers) -> Iterator[_Markers]:
    global _active_markers
    previous = _active_markers
    _active_markers = markers
    markers.install()
    try:
        yield markers
    finally:
        markers.remove()
        _active_markers = previous


# --------------------------------------------------------------------------------------------
# The profiling session
# --------------------------------------------------------------------------------------------


def _import_torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise CaptureError(
            f"capture needs PyTorch ({e}); install it (pip install torch) and try again"
        ) from None
    return torch


def _experimental_config(torch):
    """``_ExperimentalConfig(enable_cuda_sync_events=True)`` where this torch has it, else None.

    With it each host sync appears as a ``cuda_sync`` event on the GPU's track.
    """
    try:
        return torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    except Exception:
        return None


KINETO_NOISE = re.compile(rb"^USDT:.*\] profiler_(start|stop)\s*$")
"""Lines Kineto (PyTorch 2.13's profiler) prints on stderr at every profiler start and stop."""


def _without_kineto_noise(call: Callable[[], object]) -> object:
    """Run ``call`` (a profiler start or stop) with file descriptor 2 sent to a temporary
    file, then pass on to stderr every line except Kineto's ``USDT: ... profiler_start`` and
    ``profiler_stop`` notices. Where fd 2 cannot be redirected, runs ``call`` as it is."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        return call()
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            return call()
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = b"".join(ln for ln in tmp.read().splitlines(True) if not KINETO_NOISE.match(ln))
            with contextlib.suppress(OSError):
                while kept:  # os.write may write part of it
                    kept = kept[os.write(2, kept) :]


# The fallback profile (setup and the first steps, or the whole run of a script without step
# markers) stops recording after this many seconds, or once the process has grown by this many
# bytes while it records, whichever comes first: a script without step markers once grew it past
# 9 GB. What it recorded until then is kept and written; the script runs on unprofiled.
FALLBACK_SECONDS = 30.0
FALLBACK_GROWTH_BYTES = 2 << 30
# The signal whose Python handler stops the fallback in the main thread (torch.profiler must be
# stopped by the thread that started it: stopping it from another thread crashes). A watchdog
# thread raises it with ``_thread.interrupt_main``, which sends no OS signal (no EINTR in the
# script's system calls); SIGURG is ignored by default, so one from elsewhere is harmless.
_LIMIT_SIGNAL = getattr(signal, "SIGURG", None)


def _rss_bytes() -> int | None:
    """This process's resident memory (Linux ``/proc/self/statm``); None where unknown."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class _Session:
    """Drives torch.profiler through pre/wait, warm-up and active phases on step boundaries.

    Phases by the number ``m`` of boundaries seen (step 0 is the setup and the first
    iteration, ended by boundary 1): until the warm-up a fallback profiler ``A`` records (setup
    and the ``wait`` steps); at ``m == start_active - warmup`` it stops (kept in memory) and
    profiler ``B`` is prepared; at ``m == start_active`` (``max(wait + warmup, 1)``) ``B``
    starts recording, each step inside a ``ProfilerStep#m`` range; after ``active`` more
    boundaries ``B`` stops and the trace is written at once. ``A`` is dropped when ``B``
    starts; it is written only when the script ends before that.
    """

    def __init__(
        self,
        schedule: Schedule,
        with_stack: bool,
        write: Callable[[object, int], None],
        profile_memory: bool = False,
        fallback_seconds: float = FALLBACK_SECONDS,
        fallback_growth_bytes: int | None = None,
    ):
        self.torch = _import_torch()
        self.fallback_seconds = fallback_seconds
        self.fallback_growth_bytes = (
            FALLBACK_GROWTH_BYTES if fallback_growth_bytes is None else fallback_growth_bytes
        )
        self.fallback_limited: str | None = None  # why the fallback stopped early, once it did
        self._limit_reason: str | None = None
        self._guard: tuple | None = None  # (stop event, previous handler, our handler)
        self._busy = False
        self.schedule = schedule
        self.with_stack = with_stack
        self.profile_memory = profile_memory
        self._write = write
        self.cuda = bool(self.torch.cuda.is_available())
        act = self.torch.profiler.ProfilerActivity
        self.activities = [act.CPU, act.CUDA] if self.cuda else [act.CPU]
        self.m = 0
        self.fallback = None  # profiler A
        self.fallback_recording = False
        self.main = None  # profiler B
        self.main_recording = False
        self.active_done = 0
        self.written = False
        self._step_range = None
        self.errors: list[str] = []
        self.owner_pid = os.getpid()  # only this process writes the trace (not a forked child)
        self.user_profiler = False
        self._mine: list = []

    def own_profiler(self, prof) -> bool:
        """Whether ``prof`` is one of the profilers this session made."""
        return any(prof is p for p in self._mine)

    def _new_profiler(self):
        kwargs = dict(
            activities=self.activities,
            record_shapes=True,
            with_stack=self.with_stack,
            profile_memory=self.profile_memory,
        )
        cfg = _experimental_config(self.torch)
        if cfg is not None:
            kwargs["experimental_config"] = cfg
        try:
            prof = self.torch.profiler.profile(**kwargs)
        except TypeError:  # older torch without experimental_config
            kwargs.pop("experimental_config", None)
            prof = self.torch.profiler.profile(**kwargs)
        self._mine.append(prof)
        return prof

    # -- phases --------------------------------------------------------------------------
    def start(self) -> None:
        self.fallback = self._new_profiler()
        _without_kineto_noise(self.fallback.start)
        self.fallback_recording = True
        self._start_guard()

    # -- the fallback's bound ---------------------------------------------------------------
    def _start_guard(self) -> None:
        """Watch the fallback's time and the process's growth from a thread; past a limit, stop
        the fallback from the main thread (see :data:`_LIMIT_SIGNAL`)."""
        if _LIMIT_SIGNAL is None or threading.current_thread() is not threading.main_thread():
            return
        if not self.fallback_seconds and not self.fallback_growth_bytes:
            return
        handler = self._on_limit
        try:
            old = signal.signal(_LIMIT_SIGNAL, handler)
        except (ValueError, OSError):
            return
        stop = threading.Event()
        self._guard = (stop, old, handler)
        threading.Thread(
            target=self._watch, args=(stop, handler), name="tracedx-fallback-guard", daemon=True
        ).start()

    def _watch(self, stop: threading.Event, handler) -> None:
        t0, rss0 = time.monotonic(), _rss_bytes()
        while not stop.wait(0.05):
            if not self.fallback_recording:
                return
            if self._limit_reason is None:
                rss = _rss_bytes() if rss0 is not None and self.fallback_growth_bytes else None
                if self.fallback_seconds and time.monotonic() - t0 >= self.fallback_seconds:
                    self._limit_reason = f"after {self.fallback_seconds:g} s"
                elif rss is not None and rss - rss0 > self.fallback_growth_bytes:
                    self._limit_reason = (
                        f"once the process had grown by {(rss - rss0) / 2**30:.1f} GiB"
                    )
                else:
                    continue
            if signal.getsignal(_LIMIT_SIGNAL) != handler:
                return  # the script took the signal for itself: no bound, never its handler
            _thread.interrupt_main(_LIMIT_SIGNAL)

    def _on_limit(self, signum, frame) -> None:
        if (
            os.getpid() != self.owner_pid
            or self._busy
            or not self.fallback_recording
            or self._limit_reason is None
        ):
            return  # the watchdog asks again
        self._busy = True
        try:
            self._stop_fallback()
        except Exception as e:  # never break the user's script because of the profiler
            self.errors.append(f"profiler error while stopping the fallback profile: {e}")
            self._abandon()
            return
        finally:
            self._busy = False
        self.fallback_limited = self._limit_reason
        _print_err(
            f"tracedx: no active window yet: the profile of the setup and first steps stopped "
            f"recording {self._limit_reason} (limits: {self.fallback_seconds:g} s, "
            f"{self.fallback_growth_bytes / 2**30:g} GiB of growth; --fallback-seconds); what it "
            "recorded is kept and written, the script runs on unprofiled until the active window"
        )
        self._end_guard()

    def _end_guard(self) -> None:
        """Stop the watchdog; give the signal back (only from the main thread)."""
        if self._guard is None:
            return
        stop, old, handler = self._guard
        stop.set()
        if threading.current_thread() is threading.main_thread():
            self._guard = None
            with contextlib.suppress(ValueError, OSError, TypeError):
                if signal.getsignal(_LIMIT_SIGNAL) == handler:
                    signal.signal(_LIMIT_SIGNAL, old)

    def boundary(self) -> None:
        """One step boundary: advance the phases (in the process that started the profiler)."""
        if os.getpid() != self.owner_pid:
            return
        self._busy = True
        try:
            self._boundary()
        finally:
            self._busy = False
        if not self.fallback_recording:
            self._end_guard()

    def _boundary(self) -> None:
        self.m += 1
        m, s = self.m, self.schedule
        start_active = s.start_active
        start_warmup = start_active - s.warmup
        try:
            if self.main_recording:
                self._exit_step_range()
                self.active_done += 1
                if self.active_done >= s.active:
                    self._stop_main_and_write()
                    return
                self._enter_step_range()
                return
            if self.written:
                return
            if m == start_warmup:
                self._stop_fallback()
                self._prepare_main()
            if m == start_active:
                self._stop_fallback()
                if self.main is None:
                    self._prepare_main()
                self._drop_fallback()
                _without_kineto_noise(self.main.start_trace)
                self.main_recording = True
                self._enter_step_range()
        except Exception as e:  # never break the user's script because of the profiler
            self.errors.append(f"profiler error at step {m}: {e}")
            self._abandon()

    def _stop_fallback(self) -> None:
        if self.fallback is not None and self.fallback_recording:
            _without_kineto_noise(self.fallback.stop)
            self.fallback_recording = False

    def _drop_fallback(self) -> None:
        self.fallback = None

    def _prepare_main(self) -> None:
        self.main = self._new_profiler()
        _without_kineto_noise(self.main.prepare_trace)

    def _enter_step_range(self) -> None:
        # The same annotation torch's own schedule writes (``torch.profiler.profile.step``).
        self._step_range = self.torch.profiler.record_function(f"ProfilerStep#{self.m}")
        self._step_range.__enter__()

    def _exit_step_range(self) -> None:
        if self._step_range is not None:
            rng, self._step_range = self._step_range, None
            rng.__exit__(None, None, None)

    def _stop_main_and_write(self) -> None:
        self._exit_step_range()
        _without_kineto_noise(self.main.stop_trace)
        self.main_recording = False
        self._write(self.main, self.active_done)
        self.written = True
        self.main = None

    def _abandon(self) -> None:
        for prof, recording in (
            (self.fallback, self.fallback_recording),
            (self.main, self.main_recording),
        ):
            if prof is not None and recording:
                with contextlib.suppress(Exception):
                    prof.stop_trace()
        self.fallback_recording = self.main_recording = False
        self.fallback = self.main = None
        self.written = True  # nothing more will be recorded

    def finish(self) -> str:
        """Stop whatever runs and write what was collected. Returns which window was written.

        One of ``"active"`` (complete, already written), ``"partial"`` (the active window was
        cut short), ``"fallback"`` (setup and first steps only), ``"none"``. In a process forked
        from the one that started the profiler, nothing is written: ``"none"``.
        """
        if os.getpid() != self.owner_pid:
            self.written = True
            return "none"
        self._busy = True
        try:
            return self._finish()
        finally:
            self._busy = False
            self._end_guard()

    def _finish(self) -> str:
        if self.written:
            return "active" if self.active_done >= self.schedule.active else "none"
        if self.main is not None and self.main_recording:
            self._exit_step_range()
            _without_kineto_noise(self.main.stop_trace)
            self.main_recording = False
            self._write(self.main, self.active_done)
            self.written = True
            return "partial"
        if self.main is not None:
            # Prepared (warm-up) but never recording: torch needs start/stop to release it.
            with contextlib.suppress(Exception):
                self.main.start_trace()
                self.main.stop_trace()
            self.main = None
        if self.fallback is not None:
            self._stop_fallback()
            self._write(self.fallback, 0)
            self.written = True
            return "fallback"
        return "none"


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def _torch_metadata(torch) -> dict:
    gpu = None
    if torch.cuda.is_available():
        with contextlib.suppress(Exception):
            gpu = torch.cuda.get_device_name(torch.cuda.current_device())
    return {
        "torch_version": str(torch.__version__),
        "cuda_version": getattr(torch.version, "cuda", None),
        "cuda_available": bool(torch.cuda.is_available()),
        "gpu_name": gpu,
    }


# What the summary line counts, as Kineto writes it (``"ph": "X", "cat": "kernel"``), counted
# in the bytes while they are copied (a trace of a gigabyte is never parsed for a count).
_COUNTED = {
    "events": b'"ph": "X"',
    "kernels": b'"cat": "kernel"',
    "steps": b'"name": "ProfilerStep#',
}


class _Counter:
    """Counts the byte patterns of :data:`_COUNTED` in a stream fed piece by piece."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(_COUNTED, 0)
        self._keep = max(len(v) for v in _COUNTED.values()) - 1
        self._tail = b""

    def feed(self, data: bytes) -> None:
        buf = self._tail + data
        for k, pat in _COUNTED.items():
            # a match lying wholly in the kept tail was counted with the piece before
            self.counts[k] += buf.count(pat) - self._tail.count(pat)
        self._tail = buf[-self._keep :]


def _insert_metadata(src: Path, dst_gz: Path, metadata: dict) -> dict:
    """Copy the chrome trace ``src`` into gzip ``dst_gz`` with ``"tracedx"`` as its first key.

    The events are copied byte for byte (torch's JSON is not re-serialised, so whatever it
    wrote, even tokens a strict parser refuses, reaches the reader unchanged). Returns the
    counts of :data:`_COUNTED` (complete events, kernels, ProfilerStep ranges), counted in
    the copied bytes.
    """
    meta = json.dumps(metadata, sort_keys=False)
    counter = _Counter()
    with open(src, "rb") as f, gzip.open(dst_gz, "wb", compresslevel=6) as out:
        head = f.read(1 << 16)
        i = head.find(b"{")
        if i < 0:
            raise OSError("the profiler's export is not a JSON object")
        rest = head[i + 1 :]
        empty = rest.lstrip().startswith(b"}")
        out.write(head[: i + 1])
        out.write(b'\n  "tracedx": ' + meta.encode() + (b"" if empty else b","))
        out.write(rest)
        counter.feed(head)
        while piece := f.read(1 << 20):
            out.write(piece)
            counter.feed(piece)
    return counter.counts


def _launcher_start() -> _dt.datetime | None:
    """When this process's parent started (Linux ``/proc``), else None.

    Under torchrun the parent is the launcher agent, shared by every rank of the host, so
    ranks that start a second apart still name their traces with one time.
    """
    try:
        fields = Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of proc(5): starttime, clock ticks after boot
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                boot = int(line.split()[1])
                return _dt.datetime.fromtimestamp(boot + ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return None


def _unique_path(out_dir: Path, stem: str, rank: int | None = None) -> Path:
    """``out_dir/<stem>-<YYYYmmdd-HHMMSS>[-<k>][-rank<R>].json.gz``, a name not yet taken.

    The time is now, or for a rank of a torchrun job its launcher's start (one time for all
    the ranks of a host).
    """
    start = _launcher_start() if rank is not None else None
    stamp = (start or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    tail = "" if rank is None else f"-rank{rank}"
    path = out_dir / f"{stem}-{stamp}{tail}.json.gz"
    k = 1
    while path.exists():
        path = out_dir / f"{stem}-{stamp}-{k}{tail}.json.gz"
        k += 1
    return path


def _distributed_env() -> dict | None:
    """This process's place in a ``torchrun`` job, from the variables torchrun sets.

    ``{"rank", "world_size", "local_rank", "hostname"}`` (ints, and the host name) when ``RANK``
    holds an integer (torchrun, ``torch.distributed.launch`` and most launchers set it; PyTorch
    docs, "torchrun (Elastic Launch)", environment variables), else None.
    """
    import socket

    def _int(name: str) -> int | None:
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            return None

    rank = _int("RANK")
    if rank is None:
        return None
    return {
        "rank": rank,
        "world_size": _int("WORLD_SIZE"),
        "local_rank": _int("LOCAL_RANK"),
        "hostname": socket.gethostname(),
    }


_COUNTS: dict[Path, dict] = {}  # the counts of each trace written by this process


def _export(prof, final: Path, metadata: dict) -> Path:
    """Export ``prof`` to ``final`` atomically: chrome JSON to a temp file, gzip, rename."""
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_json = tempfile.mkstemp(prefix=".tracedx-", suffix=".json", dir=final.parent)
    os.close(fd)
    tmp_gz = Path(tmp_json + ".gz")
    try:
        prof.export_chrome_trace(tmp_json)
        counts = _insert_metadata(Path(tmp_json), tmp_gz, metadata)
        os.replace(tmp_gz, final)
        _COUNTS[final] = counts
    finally:
        for p in (Path(tmp_json), tmp_gz):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    return final


# --------------------------------------------------------------------------------------------
# Running a script
# --------------------------------------------------------------------------------------------


class _Terminated(BaseException):
    """Raised in the main thread on SIGTERM or SIGHUP (an ssh session dropping) so that
    ``finally`` blocks run and the trace is written."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signum)
        self.signum = signum


# Signals that end the script like SIGTERM: the trace is still written.
_END_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def _as_script(script: Path, args: Sequence[str]) -> Iterator[None]:
    """``sys.argv`` and ``sys.path[0]`` as ``python script.py args`` would set them."""
    old_argv, old_path0 = sys.argv, (sys.path[0] if sys.path else None)
    sys.argv = [str(script), *args]
    script_dir = str(script.resolve().parent)
    if sys.path:
        sys.path[0] = script_dir
    else:  # pragma: no cover
        sys.path.insert(0, script_dir)
    old_handlers: dict = {}
    if threading.current_thread() is threading.main_thread():

        def _on_term(signum, frame):
            raise _Terminated(signum)

        for sig in _END_SIGNALS:
            with contextlib.suppress(ValueError, OSError):
                old_handlers[sig] = signal.signal(sig, _on_term)
    try:
        yield
    finally:
        sys.argv = old_argv
        if sys.path and old_path0 is not None:
            sys.path[0] = old_path0
        for sig, old in old_handlers.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, old)


def _exit_code(exc: BaseException | None) -> int:
    if exc is None:
        return 0
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        return 1
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, _Terminated):
        return 128 + exc.signum
    return 1


def _show_script_error(exc: BaseException, script: Path) -> None:
    """Print the script's own error as Python would (tracedx and runpy frames left out)."""
    if isinstance(exc, SystemExit):
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        return
    if isinstance(exc, _Terminated):
        name = signal.Signals(exc.signum).name
        _print_err(f"tracedx: the script was terminated ({name}); the trace is kept")
        return
    tb = exc.__traceback__
    target = str(script.resolve())
    t = tb
    while t is not None and os.path.abspath(t.tb_frame.f_code.co_filename) != target:
        t = t.tb_next
    traceback.print_exception(type(exc), exc, t if t is not None else tb)


def _run_script(script: Path, args: Sequence[str]) -> BaseException | None:
    """Run ``script`` as ``__main__``; return the exception that ended it (None if it ended)."""
    with _as_script(script, args):
        try:
            runpy.run_path(str(script), run_name="__main__")
        except BaseException as e:  # noqa: BLE001 - every ending is passed on
            return e
    return None


def _check_out(out_dir: str | os.PathLike) -> Path:
    """The trace's folder, created if missing; :class:`CaptureError` (before anything runs)
    when it is a file or cannot be created or written to. The path is absolute: a script that
    changes directory must not take the trace with it."""
    out = Path(out_dir).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise CaptureError(
            f"--out {out} is a file, not a folder: the trace could not be written there"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CaptureError(f"cannot create the --out folder {out}: {e.strerror or e}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise CaptureError(f"cannot write to the --out folder {out}: permission denied")
    return out


def _check_script(script: str | os.PathLike) -> Path:
    path = Path(script)
    if not path.is_file():
        raise CaptureError(f"no such script: {script}")
    return path


def _prefix() -> str:
    """``tracedx:``, or ``tracedx (rank R):`` in a process of a torchrun job."""
    rank = os.environ.get("RANK", "")
    return f"tracedx (rank {rank}):" if rank.isdigit() else "tracedx:"


def _print_to(stream_name: str, text: str) -> None:
    """One line on ``sys.stdout``/``sys.stderr``, escaped (on stderr, a message fitted to its
    width); a stream the script closed, or one on a full disk, loses the line but never the
    capture (nor its exit status)."""
    from tracedx.console import fit_to
    from tracedx.report.safe import term

    stream = getattr(sys, stream_name)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        text = term(text, 4000)
        print(fit_to(text, stream) if stream_name == "stderr" else text, file=stream, flush=True)


def _print_err(text: str) -> None:
    _print_to("stderr", text)


def _note(messages: list[str], text: str, quiet: bool = False) -> None:
    messages.append(text)
    if not quiet:
        _print_err(f"{_prefix()} {text}")


def capture_script(
    script: str | os.PathLike,
    args: Sequence[str] = (),
    out_dir: str | os.PathLike = "traces",
    schedule: Schedule | None = None,
    with_stack: bool = False,
    time_unprofiled: int = 0,
    marker: str = "auto",
    quiet: bool = False,
    profile_memory: bool = False,
    fallback_seconds: float = FALLBACK_SECONDS,
) -> CaptureResult:
    """Run ``script`` like ``python script args`` under torch.profiler and write its trace.

    The trace goes to ``out_dir/<script stem>-<YYYYmmdd-HHMMSS>.json.gz`` (CPU and CUDA
    activity, CPU only without a GPU; ``record_shapes=True``; CUDA sync events where torch has
    them; Python stacks with ``with_stack``; allocator events (``[memory]``, torch.profiler's
    ``profile_memory=True``) with ``profile_memory``). ``schedule`` gives the wait/warm-up/active steps
    (default 1/1/5). With ``time_unprofiled=K`` the script first runs once without the profiler
    in a subprocess and K of its steps are timed (synchronized wall clock between step markers,
    the same steps as the profiled window's first ones: the setup step and ``wait + warmup - 1``
    more are skipped; the GPU's clocks are warmed up for 0.3 s at the first marker,
    see :mod:`tracedx.measure`); the median/mean/min/max go into the trace's ``"tracedx"``
    metadata as ``unprofiled_step_ms`` (the estimates use the median; the mean is the
    throughput where steps come in bursts, as DataLoader workers' batches do). Each timed
    step starts with an idle GPU: host work that a free-running loop would overlap with the
    previous step's kernels is exposed, so a step whose host and GPU times are close reads
    slower here than in the trace.

    Until the active window, a fallback profile records the setup and the first steps (it is
    written when the script ends before the active window, e.g. without step markers); it stops
    recording after ``fallback_seconds`` (0: no time limit) or once the process has grown by
    :data:`FALLBACK_GROWTH_BYTES`, and what it recorded until then is written.

    ``marker`` picks the step source: ``"auto"`` (optimizer steps until the first explicit
    :func:`step` call, then explicit calls only), ``"optimizer"`` or ``"explicit"``. Use
    ``"explicit"`` when the script runs optimizer steps outside its steady loop, e.g. the
    warm-up iterations before capturing a whole training step in a CUDA graph (optimizer steps
    made while a CUDA graph is being captured never count).

    The script's errors never escape: they are printed and their exit status returned in
    :class:`CaptureResult` (1 for an exception, the code of ``sys.exit``, 130 for Ctrl-C).

    Raises :class:`CaptureError` (exit status 2 in the CLI) when the script does not exist,
    the schedule is invalid or torch is not importable.
    """
    from tracedx import __version__

    path = _check_script(script)
    out = _check_out(out_dir)
    schedule = schedule or Schedule()
    if time_unprofiled < 0:
        raise CaptureError("--time-unprofiled must be 0 or more")
    if not fallback_seconds >= 0:
        raise CaptureError("--fallback-seconds must be 0 or more")
    _Markers(lambda: None, marker)  # validates the mode before anything runs
    torch = _import_torch()
    messages: list[str] = []

    unprofiled = None
    dist = _distributed_env()
    if time_unprofiled and dist is not None:
        raise CaptureError(
            "--time-unprofiled does not run under torchrun (a second run of the job would "
            "need its own rendezvous); time the steps in a plain torchrun run of the script"
        )
    if time_unprofiled:
        unprofiled = _time_unprofiled(
            path, args, time_unprofiled, schedule, marker, messages, quiet
        )

    final = _unique_path(out, path.stem, dist["rank"] if dist else None)
    if not torch.cuda.is_available():
        _note(
            messages,
            "no CUDA GPU visible: profiling CPU activity only (the trace has no kernels)",
            quiet,
        )

    written: dict = {}
    markers_box: list[_Markers] = []

    def write(prof, active_steps: int) -> None:
        markers = markers_box[0]
        meta = {
            "version": __version__,
            **_torch_metadata(torch),
            "schedule": schedule.as_dict(),
            "step_marker": markers.source,
            "script": str(path),
            "argv": [str(path), *args],
        }
        if dist is not None:
            meta["distributed"] = dist
        if unprofiled is not None:
            meta["unprofiled_step_ms"] = unprofiled
        meta["active_steps_recorded"] = active_steps
        _export(prof, final, meta)
        written["path"] = final

    session = _Session(schedule, with_stack, write, profile_memory, fallback_seconds)
    markers = _Markers(session.boundary, marker)
    markers_box.append(markers)
    if not quiet:
        kind = "CPU + CUDA" if session.cuda else "CPU"
        _print_err(
            f"{_prefix()} profiling {path} ({kind}); steps: wait {schedule.wait}, warm-up "
            f"{schedule.warmup}, active {schedule.active}; step markers: optimizer.step() or "
            "tracedx.step()"
        )
    exc: BaseException | None = None
    window = "none"
    with _markers_installed(markers), _guarded(session, quiet):
        session.start()
        try:
            exc = _run_script(path, args)
        finally:
            window = _finish_uninterrupted(session, quiet)
    code = _exit_code(exc)
    if os.getpid() != session.owner_pid:
        # A child the script forked, ending here: its parent writes the trace. It exits at
        # once, as multiprocessing's children do: the profiler it inherited runs no thread in
        # it, and stopping or destroying it at interpreter exit would hang.
        if exc is not None:
            _show_script_error(exc, path)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    if exc is not None:
        _show_script_error(exc, path)
    if session.user_profiler:
        _note(messages, "the trace ends where the script started its own torch.profiler", quiet)
    for err in session.errors:
        _note(messages, err, quiet)

    n = markers.count
    marker = {"optimizer": "optimizer.step()", "tracedx.step": "tracedx.step()"}.get(
        markers.source, "none"
    )
    ended = "ended" if exc is None else "stopped"
    if window == "partial":
        _note(
            messages,
            f"the script {ended} after {n} steps, inside the active window: the "
            f"trace holds {session.active_done} of {schedule.active} active steps",
            quiet,
        )
    elif window == "fallback":
        covers = "the whole run"
        if session.fallback_limited:
            covers = (
                f"the run until recording stopped {session.fallback_limited} (limits: "
                f"--fallback-seconds {fallback_seconds:g}, "
                f"{session.fallback_growth_bytes / 2**30:g} GiB of growth)"
            )
        if n == 0:
            _note(
                messages,
                "no step marker was seen (no optimizer.step(), no tracedx.step()):"
                f" the trace covers {covers}, with no ProfilerStep ranges; call "
                "tracedx.step() once per iteration to get steps",
                quiet,
            )
        elif session.fallback_limited:
            _note(messages, f"the fallback trace covers {covers}", quiet)
        else:
            _note(
                messages,
                f"the script {ended} after {n} steps (marker: {marker}), before the "
                f"active window (it needs {schedule.needed} steps: wait {schedule.wait} + "
                f"warm-up {schedule.warmup} + active {schedule.active}): the trace holds only "
                "the setup and the steps before warm-up, with no ProfilerStep ranges; lower "
                "--wait/--warmup/--steps or run more steps",
                quiet,
            )
    elif window == "none" and "path" not in written:
        _note(
            messages,
            f"the script {ended} after {n} steps (marker: {marker}); no trace "
            f"was written: the active window needs {schedule.needed} steps",
            quiet,
        )

    trace_path = written.get("path")
    if trace_path is not None and not quiet:
        counts = _COUNTS.pop(trace_path, None)
        size = trace_path.stat().st_size / 1e6
        if counts is not None:
            detail = (
                f"{counts['events']} events, {counts['kernels']} kernels, "
                f"{counts['steps']} ProfilerStep ranges, {size:.2f} MB"
            )
            if counts["events"] == 0:
                _note(messages, "the trace holds no events", quiet)
        else:
            detail = f"{size:.2f} MB"
        _print_err(f"{_prefix()} wrote {trace_path} ({detail})")
    if trace_path is not None:
        _print_to("stdout", str(trace_path))
    if trace_path is None and code == 0:
        code = 1  # the script succeeded, but there is no trace: never a silent success
    return CaptureResult(
        path=trace_path,
        exit_code=code,
        steps=n,
        active_steps=session.active_done,
        step_marker=markers.source,
        unprofiled=unprofiled,
        messages=messages,
    )


def _finish_uninterrupted(session: _Session, quiet: bool) -> str:
    """``session.finish()`` with Ctrl-C held off: a second Ctrl-C during a slow stop (torch
    gathers and exports the events) must not lose the trace. Returns the window written."""
    main = threading.current_thread() is threading.main_thread()
    old = None
    if main:

        def _held(signum, frame):
            _print_err("tracedx: still writing the trace; Ctrl-C is held until it is written")

        with contextlib.suppress(ValueError, OSError):
            old = signal.signal(signal.SIGINT, _held)
    try:
        return session.finish()
    except BaseException as e:  # noqa: BLE001 - report, keep the script's status
        reason = str(e) or type(e).__name__
        session.errors.append(f"could not write the trace: {reason}")
        return "none"
    finally:
        if old is not None:
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def _guarded(session: _Session, quiet: bool) -> Iterator[None]:
    """While the script runs: a forked child never writes the parent's trace (only the process
    that started the profiler does); ``os._exit`` in the parent first writes what was recorded;
    a ``torch.profiler`` the script starts itself makes tracedx stop its own (two profilers at
    once crash Kineto) and keep what it recorded so far."""
    owner = os.getpid()
    session.owner_pid = owner
    real_exit = os._exit
    torch = session.torch
    prof_cls = torch.profiler.profile
    real_start = prof_cls.start

    def _exit(code=0):
        if os.getpid() == owner and not session.written:
            _print_err("tracedx: the script called os._exit: writing what was recorded first")
            _finish_uninterrupted(session, quiet)
        real_exit(code)

    def _start(prof):
        if os.getpid() == owner and not session.own_profiler(prof) and not session.written:
            _print_err(
                "tracedx: the script starts its own torch.profiler: tracedx stops its profiler "
                "(two at once crash) and keeps what it recorded; the script's own trace is "
                "written as the script says"
            )
            session.user_profiler = True
            _finish_uninterrupted(session, quiet)
        return real_start(prof)

    os._exit = _exit
    prof_cls.start = _start
    try:
        yield
    finally:
        os._exit = real_exit
        prof_cls.start = real_start


# --------------------------------------------------------------------------------------------
# Unprofiled timing (a first run of the script in a subprocess, no profiler)
# --------------------------------------------------------------------------------------------


class _TimingDone(BaseException):
    """Stops the timing run once enough steps are timed (not an error)."""


def _time_unprofiled(
    script: Path,
    args: Sequence[str],
    count: int,
    schedule: Schedule,
    marker: str,
    messages: list[str],
    quiet: bool,
) -> dict | None:
    skip = schedule.start_active - 1  # the steps before the profiled window
    _note(
        messages,
        f"timing {count} steps without the profiler (a first run of the script, "
        f"the first {skip + 1} steps not timed)",
        quiet,
    )
    fd, out = tempfile.mkstemp(prefix="tracedx-timing-", suffix=".json")
    os.close(fd)
    env = dict(os.environ)
    env[_TIMING_ENV] = json.dumps({"count": count, "skip": skip, "out": out, "marker": marker})
    pkg_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable,
        "-c",
        "import sys; from tracedx.capture import _timing_child_main as m; sys.exit(m())",
        str(script),
        *args,
    ]
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            with open(out) as f:
                result = json.load(f)
        except (OSError, ValueError):
            result = {}
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out)
    timing = result.get("timing")
    if proc.returncode != 0 and not result.get("done"):
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-5:]
        _note(
            messages,
            f"the unprofiled run exited with status {proc.returncode}"
            + (": " + " | ".join(tail) if tail else ""),
            quiet,
        )
    if not timing:
        _note(
            messages,
            f"no unprofiled step time: the script ran {result.get('marks', 0)} "
            f"step markers; timing needs {skip + 2} or more",
            quiet,
        )
        return None
    if timing["n"] < count:
        _note(
            messages,
            f"only {timing['n']} of {count} steps could be timed (the script ran "
            f"{result.get('marks', 0)} steps)",
            quiet,
        )
    _note(
        messages,
        f"unprofiled step time: median {timing['median']:.3f} ms (mean "
        f"{timing['mean']:.3f}, min "
        f"{timing['min']:.3f}, max {timing['max']:.3f}, n={timing['n']}; "
        f"marker: {result.get('source', 'none')})",
        quiet,
    )
    return timing


def _timing_child_main() -> int:
    """Entry point of the unprofiled timing run (``sys.argv[1:]`` = script and its args)."""
    from tracedx.measure import StepTimer, warm_gpu_clocks

    cfg = json.loads(os.environ.pop(_TIMING_ENV))
    script = Path(sys.argv[1])
    args = sys.argv[2:]
    timer = StepTimer(count=int(cfg["count"]), skip=int(cfg["skip"]))
    state = {"done": False}

    def save() -> None:
        s = timer.summary()
        with open(cfg["out"], "w") as f:
            json.dump(
                {
                    "timing": s.as_dict() if s else None,
                    "marks": timer.marks,
                    "source": markers.source,
                    "done": state["done"],
                    "gpu_clock_warmup": state.get("warmed", False),
                },
                f,
            )

    def on_boundary() -> None:
        if timer.marks == 0:
            # The GPU may have idled at low clocks until now: bring them up before any timed
            # step (the profiled run, which follows this one, finds them up too).
            state["warmed"] = warm_gpu_clocks(float(cfg.get("warm_s", 0.3)))
        timer.mark()
        if timer.done:
            state["done"] = True
            save()
            raise _TimingDone()

    markers = _Markers(on_boundary, cfg.get("marker", "auto"))
    with _markers_installed(markers):
        exc = _run_script(script, args)
    if isinstance(exc, _TimingDone):
        return 0
    save()
    if exc is not None:
        _show_script_error(exc, script)
    return _exit_code(exc)


# --------------------------------------------------------------------------------------------
# tracedx.profile(): the same capture around a block of code
# --------------------------------------------------------------------------------------------


class _Profiled:
    """Handle yielded by :func:`profile`; ``path`` is set once the trace is written."""

    def __init__(self):
        self.path: Path | None = None
        self.steps = 0
        self.active_steps = 0

    def __repr__(self) -> str:
        if self.path is None:
            return f"<tracedx.profile: no trace written yet ({self.steps} steps so far)>"
        from tracedx.report.safe import term

        return (
            f"<tracedx.profile: trace {term(self.path)} ({self.active_steps} steps recorded of "
            f"{self.steps})>"
        )


@contextlib.contextmanager
def profile(
    out: str | os.PathLike = "traces",
    name: str = "profile",
    steps: int = 5,
    warmup: int = 1,
    wait: int = 1,
    with_stack: bool = False,
) -> Iterator[_Profiled]:
    """Profile the block with tracedx's schedule; call :func:`step` once per iteration inside.

    Writes ``out/<name>-<YYYYmmdd-HHMMSS>.json.gz`` (same content and metadata as
    ``tracedx capture``, without unprofiled timing) when the active window completes or the
    block ends, whichever comes first, also when the block raises. Optimizer steps count as
    step boundaries as under ``tracedx capture``. Inside ``tracedx capture`` the block is not
    profiled a second time: the handle's ``path`` stays ``None``.

    Raises :class:`CaptureError` when torch is not importable or the counts are invalid.
    """
    from tracedx import __version__

    handle = _Profiled()
    if _active_markers is not None:
        yield handle
        return
    schedule = Schedule(wait=wait, warmup=warmup, active=steps)
    torch = _import_torch()
    dist = _distributed_env()
    final = _unique_path(Path(out), name, dist["rank"] if dist else None)
    box: list[_Markers] = []

    def write(prof, active_steps: int) -> None:
        meta = {
            "version": __version__,
            **_torch_metadata(torch),
            "schedule": schedule.as_dict(),
            "step_marker": box[0].source,
            "script": None,
            "argv": list(sys.argv),
            "active_steps_recorded": active_steps,
        }
        if dist is not None:
            meta["distributed"] = dist
        handle.path = _export(prof, final, meta)

    session = _Session(schedule, with_stack, write)
    markers = _Markers(session.boundary)
    box.append(markers)
    with _markers_installed(markers):
        session.start()
        try:
            yield handle
        finally:
            session.finish()
            handle.steps = markers.count
            handle.active_steps = session.active_done
