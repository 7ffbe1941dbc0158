#!/usr/bin/env python3
"""Markdown tables from Google Benchmark JSON files (scripts/gpu_check.sh).

One table per benchmark binary: the benchmark's name, its time per iteration and every user
counter it reports (bandwidths, ratios against the anchor measured in the same run, rates).
Counters are printed as the benchmark computed them; nothing is derived here.

Robust to what a short GPU session leaves behind: a missing file is skipped, and a file cut off
by a benchmark that crashed (Google Benchmark writes the JSON as it goes) still shows the runs
written before the crash, marked as truncated.
"""
import json
import os
import sys

SKIP = {"name", "run_name", "run_type", "repetitions", "repetition_index", "threads",
        "iterations", "real_time", "cpu_time", "time_unit", "family_index",
        "per_family_instance_index", "aggregate_name", "aggregate_unit", "error_occurred",
        "error_message", "label"}


def fmt(x):
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, (int, float)):
        x = float(x)
        if x != x or x in (float("inf"), float("-inf")):
            return str(x)
        if x == 0 or 1e-3 <= abs(x) < 1e6:
            return f"{x:.4g}"
        return f"{x:.3e}"
    return cell(x)


def cell(x):
    """Text that cannot break a Markdown table row."""
    return str(x).replace("|", "\\|").replace("\n", " ")


def salvage(text):
    """The complete benchmark objects of a truncated JSON file (None if there are none)."""
    at = text.find('"benchmarks"')
    if at < 0:
        return None
    at = text.find("[", at)
    if at < 0:
        return None
    dec = json.JSONDecoder()
    rows, i = [], at + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] != "{":
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        rows.append(obj)
    return {"benchmarks": rows}


def load(path):
    """(data, note): data None when nothing can be read."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError as e:
        return None, f"unreadable ({e})"
    try:
        return json.loads(text), ""
    except json.JSONDecodeError as e:
        data = salvage(text)
        if data is None or not data["benchmarks"]:
            return None, f"unreadable ({e})"
        return data, "truncated: the binary stopped early; runs before that point only"


def main(paths):
    shown = 0
    for path in paths:
        if not os.path.isfile(path):
            continue  # e.g. an unmatched shell glob
        data, note = load(path)
        name = os.path.basename(path)
        if name.endswith(".json"):
            name = name[: -len(".json")]
        if data is None:
            print(f"{path}: {note}")
            print()
            continue
        benches = data.get("benchmarks", []) if isinstance(data, dict) else []
        rows = [b for b in benches if isinstance(b, dict) and b.get("run_type") != "aggregate"]
        if not rows:
            continue
        counters = []
        for b in rows:
            for k in b:
                if k not in SKIP and k not in counters:
                    counters.append(k)
        print(f"### {name}")
        print()
        if note:
            print(f"({note})")
            print()
        print("| benchmark | time | " + " | ".join(cell(c) for c in counters) + " |")
        print("|:--|--:|" + "--:|" * len(counters))
        for b in rows:
            bname = cell(b.get("name", "?"))
            if b.get("error_occurred"):
                msg = cell(b.get("error_message", ""))
                print(f"| {bname} | error: {msg} |" + " |" * len(counters))
                continue
            t = b.get("real_time")
            t = f"{t:.4g} {b.get('time_unit', 'ns')}" if isinstance(t, (int, float)) else "?"
            cells = [fmt(b[k]) if k in b else "" for k in counters]
            print(f"| {bname} | {t} | " + " | ".join(cells) + " |")
        print()
        shown += 1
    return 0 if shown else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
