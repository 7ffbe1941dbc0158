#!/usr/bin/env python3
"""A Markdown table of kvscout's kernels from Nsight Compute's raw CSV (scripts/gpu_check.sh).

One row per kernel name (the first launch ncu profiled of it): grid, block, registers per
thread, duration, DRAM throughput (% of peak) and achieved occupancy (% of peak warps).

  python3 scripts/gpu_ncu_table.py ncu.csv
"""
import csv
import io
import sys

COLS = [("launch__grid_size", "grid"), ("launch__block_size", "block"),
        ("launch__registers_per_thread", "registers"), ("gpu__time_duration.sum", "time"),
        ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM %"),
        ("sm__warps_active.avg.pct_of_peak_sustained_active", "occupancy %")]


def main(path):
    with open(path, errors="replace") as f:
        text = f.read()
    rows, seen, units = [], set(), {}
    # ncu prints one CSV table per run (header, units row, data rows), between program output.
    for block in text.split('"ID",')[1:]:
        reader = csv.DictReader(io.StringIO('"ID",' + block))
        for r in reader:
            name = r.get("Kernel Name", "")
            if not name or not r.get("ID", "").strip().isdigit():
                if name == "" and r.get("gpu__time_duration.sum"):
                    units = r
                continue
            short = name.split("(")[0].split("<")[0].replace("void ", "").strip()
            key = (short, r.get("launch__grid_size"), r.get("launch__block_size"))
            if key in seen:
                continue
            seen.add(key)
            rows.append((short, r))
    if not rows:
        return 1
    tu = units.get("gpu__time_duration.sum", "") if units else ""
    print("| kernel | " + " | ".join(c[1] + (f" ({tu})" if c[0].startswith("gpu__time") and tu else "")
                                     for c in COLS) + " |")
    print("|:--|" + "--:|" * len(COLS))
    for short, r in rows:
        print(f"| {short} | " + " | ".join(r.get(c[0], "") for c in COLS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
