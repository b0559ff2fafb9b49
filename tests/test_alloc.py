"""tracedx.alloc: the allocator settings the command line makes (no result depends on them)."""

import os
import subprocess
import sys

import pytest

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


_MMAP = (
    "import ctypes, sys\n"
    "from tracedx import alloc\n"
    "if sys.argv[1] == 'cli':\n"
    "    alloc.release_promptly()\n"
    "libc = ctypes.CDLL('libc.so.6')\n"
    "class MI(ctypes.Structure):\n"
    "    _fields_ = [(n, ctypes.c_size_t) for n in 'a b c hblks e f g h i j'.split()]\n"
    "libc.mallinfo2.restype = MI\n"
    "def mapped(n):\n"
    "    before = libc.mallinfo2().hblks\n"
    "    block = bytearray(n)\n"
    "    return libc.mallinfo2().hblks - before\n"
    "big = bytearray(16 << 20)\n"
    "del big  # freed while mapped: glibc raises its threshold over 16 MB\n"
    "first = mapped(300_000)\n"
    "alloc.trim_heap(int(sys.argv[2]))\n"
    "after = mapped(300_000), mapped(200_000)\n"
    "alloc.trim_heap(int(sys.argv[3]))  # the next trace of the command\n"
    "print(first, *after, mapped(300_000))\n"
)


def _mapped(mode: str, rows: int = 1000, then: int = 1000, **env_extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in alloc._USER_MALLOC_ENV} | env_extra
    out = subprocess.run(
        [sys.executable, "-c", _MMAP, mode, str(rows), str(then)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode or not out.stdout.strip():
        pytest.skip(f"no glibc mallinfo2 here: {out.stderr.strip()[-200:]}")
    return out.stdout.strip()


def test_trim_heap_fixes_the_mmap_threshold_for_the_command_line_only():
    # a 300 KB block comes from the heap while glibc's dynamic threshold is high; after the
    # command line's trim_heap it is mapped on its own (and a 200 KB one still from the heap)
    big = alloc.FIXED_THRESHOLD_MAX_ROWS + 1
    assert _mapped("cli") == "0 1 0 1"
    assert _mapped("library") == "0 0 0 0"  # a notebook's process keeps glibc's own behaviour
    assert _mapped("cli", MALLOC_MMAP_THRESHOLD_="1048576") == "0 0 0 0"  # and a user's setting
    # and tables of millions of rows: their megabyte temporaries would all fault in new pages
    assert _mapped("cli", rows=big, then=big) == "0 0 0 0"
    # decided per trace: a large trace after a small one gets the dynamic threshold's maximum
    assert _mapped("cli", rows=1000, then=big) == "0 1 0 0"
