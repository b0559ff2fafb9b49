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
