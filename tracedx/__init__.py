"""tracedx: trace analysis and diagnosis for PyTorch GPU programs.

Public API (torch is never imported by analysis):

- ``tracedx.load(path) -> Trace``: read a torch.profiler chrome trace into polars tables.
- ``tracedx.diagnose(trace) -> Diagnosis``: where the time goes, what binds it, what a fix is worth.
- ``tracedx.load_job(paths) -> Job``: a distributed job's traces (files, a directory, a glob),
  one summary per rank; ``tracedx.diagnose(job) -> JobDiagnosis``: the job's verdict.
- ``tracedx.step()`` / ``tracedx.profile(...)``: step markers and profiling for `tracedx capture`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from tracedx.errors import TraceError, TraceFormatError
from tracedx.trace import Trace, load

__all__ = ["Trace", "TraceError", "TraceFormatError", "__version__", "load"]


def __getattr__(name: str):
    # Lazy imports keep `import tracedx` light and torch-free.
    if name == "diagnose":
        return _diagnose
    if name == "load_job":
        from tracedx.job.load import load_job

        return load_job
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


def _diagnose(target, **options):
    """``diagnose(trace, **options) -> Diagnosis`` (:func:`tracedx.analysis.diagnosis.diagnose`);
    ``diagnose(job) -> JobDiagnosis`` for a :class:`tracedx.job.diagnosis.Job` from
    :func:`load_job` (:func:`tracedx.job.diagnosis.diagnose_job`)."""
    import sys

    jobs = sys.modules.get("tracedx.job.diagnosis")  # a Job exists only once it is imported
    if jobs is not None and isinstance(target, jobs.Job):
        if options:
            raise TypeError("diagnose(job) takes no options: give them to load_job")
        return jobs.diagnose_job(target)
    from tracedx.analysis.diagnosis import diagnose

    return diagnose(target, **options)
