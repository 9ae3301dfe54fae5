#!/usr/bin/env python3
"""Sums an Nsight Compute CSV (`--metrics gpu__time_duration.sum --csv --page raw`) by kernel
name and grid: a markdown table of launches, total and mean µs and share, longest first.
Usage: ncu_sum.py FILE.csv [ROWS]."""
import csv, re, sys
from collections import defaultdict
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
h = rows[hdr]
ki, gi, ti = h.index("Kernel Name"), h.index("Grid Size"), h.index("gpu__time_duration.sum")
unit = rows[hdr + 1][ti] if hdr + 1 < len(rows) else ""
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, None)
agg = defaultdict(lambda: [0, 0.0])
for r in rows[hdr + 1:]:
    try:
        t = float(r[ti].replace(",", ""))
    except (ValueError, IndexError):
        continue
    if scale is None:
        t *= 1e-3  # ncu's default duration unit is ns
    else:
        t *= scale
    name = re.sub(r"\(.*", "", r[ki])[:60]
    a = agg[(name, r[gi])]
    a[0] += 1
    a[1] += t
total = sum(v[1] for v in agg.values())
print(f"| kernel | grid | launches | total µs | µs each | share |")
print("|---|---|---|---|---|---|")
for (name, grid), (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:int(sys.argv[2]) if len(sys.argv) > 2 else 45]:
    print(f"| {name} | {grid} | {n} | {t:.0f} | {t / n:.1f} | {100 * t / total:.1f}% |")
print(f"all kernels: {total:.0f} µs over {sum(v[0] for v in agg.values())} launches")
