"""tracedx: trace analysis and diagnosis for PyTorch GPU programs.

Public API (torch is never imported by analysis; ``import tracedx`` imports neither torch nor the
analysis, which load on first use):

- ``tracedx.load(path) -> Trace``: read a torch.profiler chrome trace into polars tables.
- ``tracedx.diagnose(trace) -> Diagnosis``: where the time goes, what binds it, what a fix is worth.
- ``tracedx.load_job(paths) -> Job``: a distributed job's traces (files, a directory, a glob),
  one summary per rank; ``tracedx.diagnose(job) -> JobDiagnosis``: the job's verdict.
- ``tracedx.diff(before, after) -> TraceDiff``: re-measure a fix against its estimate.
- ``tracedx.profile(...)`` / ``tracedx.step()``: profile a block of code, mark its steps.
- ``tracedx.measure``: timing helpers (warm-up, synchronisation, median of repeats).

Results (``Diagnosis``, ``TraceDiff``, ``JobDiagnosis``) display as a verdict card in a notebook
and have ``to_text()``, ``to_markdown()``, ``to_html()``, ``write_html(path)``, ``to_dict()``,
``to_json()`` and ``figures()`` (a dict of plotly figures; ``Diagnosis.figures(step=N)`` draws
step N's timeline). ``tracedx.cache.load(path)`` is :func:`load` through the command line's
cache: ``(trace, hit)``, the tables read back from an earlier load of the unchanged file.
"""

__version__ = "0.1.0"

from tracedx.errors import TraceError, TraceFormatError

# name -> (module, attribute or None for the module itself), imported on first use: polars,
# numpy and plotly load with the first name that needs them, so `tracedx --help` stays quick
_LAZY = {
    "load": ("tracedx.trace", "load"),
    "Trace": ("tracedx.trace", "Trace"),
    "load_job": ("tracedx.job.load", "load_job"),
    "Job": ("tracedx.job.diagnosis", "Job"),
    "JobDiagnosis": ("tracedx.job.diagnosis", "JobDiagnosis"),
    "Diagnosis": ("tracedx.analysis.diagnosis", "Diagnosis"),
    "diff": ("tracedx.analysis.diff", "diff"),
    "TraceDiff": ("tracedx.analysis.diff", "TraceDiff"),
    "profile": ("tracedx.capture", "profile"),
    "step": ("tracedx.capture", "step"),
    "CaptureError": ("tracedx.capture", "CaptureError"),
    "measure": ("tracedx.measure", None),
    "cache": ("tracedx.cache", None),
}

__all__ = [
    "CaptureError",
    "Diagnosis",
    "Job",
    "JobDiagnosis",
    "Trace",
    "TraceDiff",
    "TraceError",
    "TraceFormatError",
    "__version__",
    "cache",
    "diagnose",
    "diff",
    "load",
    "load_job",
    "measure",
    "profile",
    "step",
]


def __getattr__(name: str):
    # Lazy imports keep `import tracedx` light and torch-free.
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        return mod if attr is None else getattr(mod, attr)
    raise AttributeError(f"module 'tracedx' has no attribute {name!r}")


def diagnose(target, **options):
    """``diagnose(trace, **options) -> Diagnosis`` for a :class:`Trace`
    (:func:`tracedx.analysis.diagnosis.diagnose`, options ``device``,
    ``peak_tflops``, ``bandwidth_gbs``, ``calibration``, ``steps``);
    ``diagnose(job) -> JobDiagnosis`` for a :class:`tracedx.job.diagnosis.Job` from
    :func:`load_job` (:func:`tracedx.job.diagnosis.diagnose_job`; it takes no options: give them
    to ``load_job``). Raises TypeError for options given with a job, and for a path or anything
    else that is not a loaded trace or job (saying what to call first)."""
    import os
    import sys

    if isinstance(target, (str, os.PathLike)):
        load = "tracedx.load_job" if os.path.isdir(target) else "tracedx.load"
        raise TypeError(
            f"diagnose takes a loaded trace or job, not a path: tracedx.diagnose({load}({str(target)!r}))"
        )
    jobs = sys.modules.get("tracedx.job.diagnosis")  # a Job exists only once it is imported
    if jobs is not None and isinstance(target, jobs.Job):
        if options:
            raise TypeError("diagnose(job) takes no options: give them to load_job")
        return jobs.diagnose_job(target)
    from tracedx.analysis.diagnosis import diagnose as diagnose_trace
    from tracedx.trace import Trace

    if not isinstance(target, Trace):
        raise TypeError(
            f"diagnose takes a Trace (tracedx.load) or a Job (tracedx.load_job), not "
            f"{type(target).__name__}"
        )
    return diagnose_trace(target, **options)


def __dir__() -> list[str]:
    return sorted(set(__all__) | {"__version__"})
