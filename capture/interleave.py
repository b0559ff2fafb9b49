"""Time several capture scripts unprofiled, interleaved, in rounds: fairer speedups on a host
whose speed drifts between captures.

    python capture/interleave.py OUT.json ROUNDS COUNT -- NAME SCRIPT [ARGS] ::: NAME SCRIPT ...

Each round runs every configuration once, in order, with the same unprofiled timing that
``tracedx capture --time-unprofiled COUNT`` uses (a fresh process, the first 3 steps not timed,
COUNT steps timed between step markers). OUT.json gets each configuration's per-round medians
and each round's timing (median, mean, min, max in ms, and n); the summary printed is the median
over rounds of the per-round medians, with their range.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from tracedx.capture import Schedule, _time_unprofiled


def main(argv: list[str]) -> int:
    out, rounds, count = Path(argv[0]), int(argv[1]), int(argv[2])
    rest = argv[argv.index("--") + 1 :]
    configs, cur = [], []
    for a in [*rest, ":::"]:
        if a == ":::":
            if cur:
                configs.append((cur[0], Path(cur[1]), cur[2:]))
            cur = []
        else:
            cur.append(a)
    schedule = Schedule(wait=2, warmup=1, active=3)
    result = {name: {"round_medians_ms": [], "rounds": []} for name, _, _ in configs}
    for r in range(rounds):
        for name, script, args in configs:
            t = _time_unprofiled(script, args, count, schedule, "auto", [], quiet=True)
            if t:
                result[name]["round_medians_ms"].append(t["median"])
                result[name]["rounds"].append(t)
            print(f"round {r + 1} {name}: {t['median'] if t else None}", flush=True)
            out.write_text(json.dumps(result, indent=1))
    for name, v in result.items():
        m = v["round_medians_ms"]
        if m:
            print(
                f"{name}: median {statistics.median(m):.3f} ms (rounds {min(m):.3f}-{max(m):.3f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
