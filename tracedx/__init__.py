"""tracedx: trace analysis and diagnosis for PyTorch GPU programs.

Public API (torch is never imported by analysis):

- ``tracedx.load(path) -> Trace``: read a torch.profiler chrome trace into polars tables.
- ``tracedx.diagnose(trace) -> Diagnosis``: where the time goes, what binds it, what a fix is worth;
  ``tracedx.diagnose(job) -> JobDiagnosis`` for a multi-rank :class:`tracedx.job.diagnosis.Job`.
- ``tracedx.step()`` / ``tracedx.profile(...)``: step markers and profiling for `tracedx capture`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from tracedx.errors import TraceError, TraceFormatError
from tracedx.trace import Trace, load

__all__ = ["Trace", "TraceError", "TraceFormatError", "__version__", "load"]


def _diagnose(obj, **options):
    """Diagnose a :class:`Trace` (one rank: ``Diagnosis``) or a :class:`tracedx.job.diagnosis.Job`
    (several ranks' summaries: ``JobDiagnosis``). Options go to the single-rank diagnosis."""
    from tracedx.job.diagnosis import Job, diagnose_job

    if isinstance(obj, Job):
        return diagnose_job(obj)
    from tracedx.analysis.diagnosis import diagnose

    return diagnose(obj, **options)


def __getattr__(name: str):
    # Lazy imports keep `import tracedx` light and torch-free.
    if name == "diagnose":
        return _diagnose
    if name == "diff":
        from tracedx.analysis.diff import diff

        return diff
    if name in ("step", "profile"):
        from tracedx import capture

        return getattr(capture, name)
    if name == "measure":
        import importlib

        return importlib.import_module("tracedx.measure")
    raise AttributeError(f"module 'tracedx' has no attribute {name!r}")
