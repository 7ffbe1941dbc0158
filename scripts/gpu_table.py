#!/usr/bin/env python3
"""Markdown tables from Google Benchmark JSON files (scripts/gpu_check.sh).

One table per benchmark binary: the benchmark's name, its time per iteration and every user
counter it reports (bandwidths, ratios against the anchor measured in the same run, rates).
Counters are printed as the benchmark computed them; nothing is derived here.
"""
import json
import os
import sys


def fmt(x):
    if isinstance(x, float):
        if x == 0 or 1e-3 <= abs(x) < 1e6:
            return f"{x:.4g}"
        return f"{x:.3e}"
    return str(x)


def main(paths):
    shown = 0
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            print(f"{path}: unreadable ({e})")
            continue
        rows = [b for b in data.get("benchmarks", []) if b.get("run_type") != "aggregate"]
        if not rows:
            continue
        skip = {"name", "run_name", "run_type", "repetitions", "repetition_index", "threads",
                "iterations", "real_time", "cpu_time", "time_unit", "family_index",
                "per_family_instance_index", "aggregate_name", "aggregate_unit", "error_occurred",
                "error_message", "label"}
        counters = []
        for b in rows:
            for k in b:
                if k not in skip and k not in counters:
                    counters.append(k)
        print(f"### {os.path.basename(path).removesuffix('.json')}")
        print()
        print("| benchmark | time | " + " | ".join(counters) + " |")
        print("|:--|--:|" + "--:|" * len(counters))
        for b in rows:
            if b.get("error_occurred"):
                print(f"| {b['name']} | error: {b.get('error_message', '')} |" + " |" * len(counters))
                continue
            t = f"{b['real_time']:.4g} {b.get('time_unit', 'ns')}"
            cells = [fmt(b[k]) if k in b else "" for k in counters]
            print(f"| {b['name']} | {t} | " + " | ".join(cells) + " |")
        print()
        shown += 1
    return 0 if shown else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
