"""Shared test helpers. ../shared is optional: tests that need it skip when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# ../shared beside the checkout; TRACEDX_SHARED points elsewhere (a git worktree's parent has none)
SHARED = Path(os.environ.get("TRACEDX_SHARED") or ROOT.parent / "shared")
CASES = SHARED / "cases"
PUBLIC = SHARED / "public_traces"
SAMPLES = ROOT / "sample_traces"


_DIAGNOSES: dict = {}


def sample_diagnosis(name: str, **kw):
    """The diagnosis of the sample trace ``name`` (diagnose's keyword arguments ``kw``), made
    once per test session and shared by the test modules that read the samples (each takes
    0.1 to 1 s; several modules diagnose every sample). Skips when the trace is missing."""
    p = SAMPLES / name
    if not p.exists():
        pytest.skip(f"{p} missing")
    key = (name, tuple(sorted(kw.items())))
    if key not in _DIAGNOSES:
        import tracedx
        from tracedx.analysis.diagnosis import diagnose

        _DIAGNOSES[key] = diagnose(tracedx.load(p), **kw)
    return _DIAGNOSES[key]


DATA = Path(__file__).resolve().parent / "data"


def case(name: str) -> Path:
    p = CASES / name
    if not p.exists():
        pytest.skip(
            f"../shared/cases/{name} is not present (it exists only beside the developers' checkout)"
        )
    return p


@pytest.fixture(scope="session", autouse=True)
def _session_cache_dir(tmp_path_factory):
    """A cache folder of the test session's own for what runs before a test's own folder is set
    (module-scoped fixtures, such as test_hostile's measured bombs), so nothing reaches the
    user's ~/.cache/tracedx."""
    import os

    old = os.environ.get("TRACEDX_CACHE_DIR")
    os.environ["TRACEDX_CACHE_DIR"] = str(tmp_path_factory.mktemp("tracedx-session-cache"))
    yield
    if old is None:
        os.environ.pop("TRACEDX_CACHE_DIR", None)
    else:
        os.environ["TRACEDX_CACHE_DIR"] = old


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path_factory, monkeypatch):
    """Each test gets an empty cache of loaded traces (never the user's ~/.cache/tracedx), so
    no test sees another's entries."""
    monkeypatch.setenv("TRACEDX_CACHE_DIR", str(tmp_path_factory.mktemp("tracedx-cache")))


@pytest.fixture(scope="session", autouse=True)
def _numpy_2_5_where():
    """``np.where(cond, unsigned_array, -1)`` raises OverflowError from NumPy 2.5 on (a Python
    int beside an array takes the array's dtype, NEP 50), and NumPy 2.4, which CI installs,
    silently gives 4294967295 for a uint32 instead: every test runs with ``np.where`` refusing
    that mix, so such code fails here too (a uint32 polars count reached it once: only the
    device's NumPy 2.5.2 found it)."""
    import numpy as np

    where = np.where

    def checked(*args):
        if len(args) == 3:
            for a, b in ((args[1], args[2]), (args[2], args[1])):
                kind = getattr(getattr(a, "dtype", None), "kind", None)
                if type(b) is int and b < 0 and kind == "u":
                    raise OverflowError(f"Python integer {b} out of bounds for {a.dtype}")
        return where(*args)

    np.where = checked
    yield
    np.where = where
