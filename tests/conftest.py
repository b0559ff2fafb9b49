"""Shared test helpers. ../shared is optional: tests that need it skip when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
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
