"""tracedx.alloc: the allocator settings the command line makes (no result depends on them)."""

import os
import subprocess
import sys

from tracedx import alloc

_SHOW = (
    "import os, sys\n"
    "{pre}\n"
    "from tracedx import alloc\n"
    "alloc.release_promptly()\n"
    "print(os.environ.get(alloc.JEMALLOC_ENV))\n"
)


def _run(pre: str = "", env_value: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != alloc.JEMALLOC_ENV}
    if env_value is not None:
        env[alloc.JEMALLOC_ENV] = env_value
    out = subprocess.run(
        [sys.executable, "-c", _SHOW.format(pre=pre)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_release_promptly_sets_the_setting_before_polars_loads():
    assert _run() == alloc.JEMALLOC_CONF


def test_release_promptly_keeps_the_users_own_setting():
    assert _run(env_value="narenas:2") == "narenas:2"


def test_capture_leaves_the_users_program_its_allocator(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(f"import os\nprint('VALUE', os.environ.get({alloc.JEMALLOC_ENV!r}))\n")
    env = {k: v for k, v in os.environ.items() if k != alloc.JEMALLOC_ENV}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tracedx",
            "capture",
            "--out",
            str(tmp_path / "traces"),
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert "VALUE None" in out.stdout, out.stdout + out.stderr
