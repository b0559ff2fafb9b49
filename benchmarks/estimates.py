"""Print the README table of estimates against measurements on the sample pairs.

    python benchmarks/estimates.py            # markdown table on stdout
    python benchmarks/estimates.py --diff     # the `tracedx diff` table (README, Re-measure)

For each pair in sample_traces/pairs.json: `tracedx diagnose BEFORE`'s estimate for the fix
that was applied (1.00x when BEFORE has no finding for it; for a pair that applied several,
``fixes``, the step model's estimate for all of them together), the measured unprofiled
speedup, and their ratio. The same check is asserted by tests/test_samples.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import tracedx
from tracedx.analysis.diagnosis import diagnose
from tracedx.analysis.findings import combined_speedup

ROOT = Path(__file__).resolve().parents[1] / "sample_traces"


def main() -> None:
    pairs = json.loads((ROOT / "pairs.json").read_text())
    print("| pair | fix | estimate | measured (unprofiled) | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for p in pairs:
        d = diagnose(tracedx.load(ROOT / p["before"]))
        found = {x.fix: x for x in d.findings}
        if "fixes" in p:  # several fixes applied at once: the model's estimate for all of them
            got = [found[x] for x in p["fixes"] if x in found]
            est = combined_speedup(d.model, got) if got else 1.0
            label = f"{est:.2f}x (together)"
        else:
            f = found.get(p["fix"])
            est = f.estimated_speedup if f else 1.0
            label = f"{est:.2f}x" + ("" if f is None or f.recommended else " (not worth it)")
        ratio = est / p["measured_speedup"]
        r = f"{ratio:.3f}" if round(ratio, 2) in (0.8, 1.25) else f"{ratio:.2f}"
        r = r if 1 / 1.25 <= ratio <= 1.25 else f"**{r}**"
        print(f"| {p['pair']} | {p['fix']} | {label} | {p['measured_speedup']:.2f}x | {r} |")


def diff_table() -> None:
    pairs = json.loads((ROOT / "pairs.json").read_text())
    print(
        "| pair | fix applied | `diff` names | BEFORE's estimate | achieved, traced "
        "| achieved, unprofiled | estimate / achieved (unprofiled) |"
    )
    print("|---|---|---|---|---|---|---|")
    for p in pairs:
        td = tracedx.diff(tracedx.load(ROOT / p["before"]), tracedx.load(ROOT / p["after"]))
        pr = td.prediction
        est = "-" if pr.estimated_speedup is None else f"{pr.estimated_speedup:.2f}x"
        if pr.finding is not None and not pr.finding.recommended:
            est += " (not worth it)"
        tr = f"{pr.achieved_traced:.2f}x ({pr.before_step_ms:.3f} → {pr.after_step_ms:.3f} ms)"
        un = (
            f"{pr.achieved_unprofiled:.2f}x ({pr.before_unprofiled_ms:.3f} → "
            f"{pr.after_unprofiled_ms:.3f} ms)"
            if pr.achieved_unprofiled
            else "-"
        )
        r = pr.ratio_unprofiled
        if "fixes" in p:  # several fixes at once: BEFORE's estimate for all of them together
            found = {x.fix: x for x in td.before.findings}
            got = [found[x] for x in p["fixes"] if x in found]
            both = combined_speedup(td.before.model, got) if got else 1.0
            est = f"{both:.2f}x (together)"
            r = both / pr.achieved_unprofiled if pr.achieved_unprofiled else None
        # the same test as diff's verdict (unrounded): 1.253 is outside, though it prints 1.25
        rs = "-"
        if r is not None:
            rs = f"{r:.3f}" if round(r, 2) in (0.8, 1.25) else f"{r:.2f}"
            rs = rs if 1 / 1.25 <= r <= 1.25 else f"**{rs}**"
        print(f"| {p['pair']} | `{p['fix']}` | `{td.fix}` | {est} | {tr} | {un} | {rs} |")


if __name__ == "__main__":
    diff_table() if "--diff" in sys.argv[1:] else main()
