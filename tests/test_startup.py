"""Start-up stays light: `tracedx --help`, argument errors and `import tracedx` load neither
polars, numpy nor plotly (nor torch); they load with the first command or name that needs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("polars", "numpy", "plotly", "torch", "pyarrow", "rich")

PROBE = """
import json, sys
{setup}
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _loaded(setup: str) -> list[str]:
    code = PROBE.format(setup=setup, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_tracedx_is_light():
    assert _loaded("import tracedx") == []
    assert _loaded("import tracedx, tracedx.cli; dir(tracedx); tracedx.__version__") == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["diagnose", "--help"],
        ["diff", "--help"],
        ["diagnose"],  # missing argument: click's usage error, exit 2
        ["diagnose", "t.json", "--format", "xml"],  # a bad choice: usage error, exit 2
        ["diagnose", "t.json", "--max-step-ms", "-1"],
        ["--version"],
    ],
)
def test_cli_help_and_argument_errors_are_light(argv):
    setup = (
        "from tracedx.cli import main\n"
        "try:\n"
        f"    main({argv!r}, standalone_mode=True)\n"
        "except SystemExit:\n"
        "    pass\n"
    )
    assert _loaded(setup) == []


def test_lazy_names_still_resolve():
    # the lazy table gives the same objects as the modules
    import tracedx
    from tracedx.trace import Trace, load

    assert tracedx.load is load and tracedx.Trace is Trace
    assert _loaded("import tracedx; tracedx.load") == ["numpy", "polars"]


@pytest.mark.parametrize("fmt", ["text", "json", "md"])
@pytest.mark.parametrize("misnamed", [False, True])
def test_cached_diagnose_is_light(tmp_path, monkeypatch, fmt, misnamed):
    # the second diagnose of a trace renders its cached diagnosis: no polars nor numpy (the
    # check that a .gz name holds plain JSON included)
    import gzip
    import os
    from pathlib import Path

    sample = Path(__file__).parent.parent / "sample_traces" / "elementwise-compile.json.gz"
    trace = tmp_path / "t.json.gz"
    trace.write_bytes(gzip.decompress(sample.read_bytes()) if misnamed else sample.read_bytes())
    monkeypatch.setenv("TRACEDX_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["diagnose", "--format", fmt, str(trace)]
    setup = (
        "from tracedx.cli import main\n"
        "try:\n"
        f"    main({argv!r}, standalone_mode=True)\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"  # a failed run loads nothing either
    )
    assert _loaded(setup)[:2] == ["numpy", "polars"]  # the first run reads the trace
    assert os.listdir(tmp_path / "cache")
    assert _loaded(setup) == []
