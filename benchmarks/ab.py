"""Two checkouts of tracedx side by side on the benchmark traces, interleaved (A B, then B A).

For each case and round it runs, from each tree's root with this interpreter: ``python -m
tracedx diagnose --format json --no-cache -q FILE`` end to end (wall seconds and the ``wait4``
maximum resident set of the main process, MB), or for ``inproc10``, ``benchmarks/inprocess.py``
on the 10 MB trace (one repeat, no HTA: ``tracedx.load`` plus ``tracedx.diagnose`` in a process
whose imports are done). Prints each run, then median (min-max) per case and tree. The traces
are the ones ``bench.py`` makes under ``benchmarks/out/``; compile both trees first
(``python -m compileall -q A/tracedx B/tracedx``) where the environment writes no bytecode.

Usage: ``python benchmarks/ab.py A_TREE B_TREE [--cases inproc10,e2e10,e2e100,e2e100gz,e2e1000]
[--rounds 3]``. Not a test: numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
PREFIX = "resnet_train-bf16-cl-"
FILES = {
    "e2e10": "10MB.json",
    "e2e100": "100MB.json",
    "e2e100gz": "100MB.json.gz",
    "e2e1000": "1000MB.json",
}


def _e2e(tree: str, path: Path) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "tracedx", "diagnose", "--format", "json", "--no-cache", "-q"]
    t = time.perf_counter()
    p = subprocess.Popen([*cmd, str(path)], cwd=tree, stdout=subprocess.DEVNULL)
    _, _, ru = os.wait4(p.pid, 0)
    return time.perf_counter() - t, ru.ru_maxrss / 1024


def _inproc(tree: str) -> tuple[float, float]:
    script = os.path.join(tree, "benchmarks", "inprocess.py")
    args = [sys.executable, script, str(OUT / (PREFIX + "10MB.json")), "--repeats", "1", "--no-hta"]
    out = subprocess.run(args, cwd=tree, capture_output=True, text=True, check=True).stdout
    m = re.search(r"load ([\d.]+) s \+ diagnose ([\d.]+) s", out)
    return float(m.group(1)) + float(m.group(2)), float(m.group(1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--cases", default="inproc10,e2e10,e2e100,e2e100gz,e2e1000")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    trees = {"A": args.a, "B": args.b}
    res: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for case in args.cases.split(","):
            for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
                tree = trees[name]
                v = (
                    _inproc(tree)
                    if case == "inproc10"
                    else _e2e(tree, OUT / (PREFIX + FILES[case]))
                )
                res.setdefault((case, name), []).append(v)
                print(f"{case} {name} {v[0]:.3f} s {v[1]:.1f}", flush=True)
    print()
    for (case, name), vs in sorted(res.items()):
        t, m = [v[0] for v in vs], [v[1] for v in vs]
        what = "load s" if case == "inproc10" else "max RSS MB"
        print(
            f"{case:9} {name} {statistics.median(t):.3f} ({min(t):.3f}-{max(t):.3f}) s, {what} "
            f"{statistics.median(m):.2f} ({min(m):.2f}-{max(m):.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
