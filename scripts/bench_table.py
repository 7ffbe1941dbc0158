#!/usr/bin/env python3
"""Turns Google Benchmark JSON from kvscout's benchmarks into tables and target lines.

usage: bench_table.py RESULTS.json [--markdown OUT.md]

Prints a table per benchmark family (median over repetitions), the ratio of every measurement to
its anchor from the same run, and ends with one line per target:
    <target-name> <measured> <goal> <met|missed>
"""
import json
import re
import statistics
import sys


def parse_name(name):
    # BM_host_gather/row:256/density:10/hnd:1/threads:1/real_time
    parts = name.split("/")
    fields = {}
    for p in parts[1:]:
        if ":" in p:
            k, v = p.split(":", 1)
            fields[k] = int(v) if re.fullmatch(r"-?\d+", v) else v
    return parts[0], fields


def load(path):
    with open(path) as f:
        data = json.load(f)
    runs = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        base = b.get("run_name", b["name"])
        runs.setdefault(base, []).append(b)
    out = {}
    for base, bs in runs.items():
        family, fields = parse_name(base)
        bps = statistics.median(x["bytes_per_second"] for x in bs if "bytes_per_second" in x)
        t = statistics.median(x["real_time"] for x in bs)
        out[base] = {"family": family, "fields": fields, "gbps": bps / 1e9, "time": t,
                     "unit": bs[0].get("time_unit", "ns"), "reps": len(bs)}
    return data.get("context", {}), out


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    md_out = None
    if "--markdown" in args:
        i = args.index("--markdown")
        md_out = args[i + 1]
        del args[i:i + 2]
    context, res = load(args[0])

    memcpy = {(r["fields"]["row"], r["fields"]["density"], r["fields"]["threads"]): r
              for r in res.values() if r["family"] == "BM_memcpy"}
    rows = []
    for r in res.values():
        if r["family"] != "BM_host_gather":
            continue
        f = r["fields"]
        anchor = memcpy.get((f["row"], f["density"], f["threads"]))
        ratio = r["gbps"] / anchor["gbps"] if anchor else float("nan")
        rows.append((f["row"], f["density"], "HND" if f["hnd"] else "NHD", f["threads"],
                     r["gbps"], anchor["gbps"] if anchor else float("nan"), ratio))
    rows.sort()
    lines = ["| row bytes | density % | order | threads | gather GB/s | memcpy GB/s | ratio |",
             "|---:|---:|:--|---:|---:|---:|---:|"]
    for row, d, order, th, g, m, ratio in rows:
        lines.append(f"| {row} | {d} | {order} | {th} | {g:.2f} | {m:.2f} | {ratio:.2f} |")
    table = "\n".join(lines)
    print(table)

    targets = []
    key = [x for x in rows if x[0] == 256 and x[1] == 10 and x[2] == "HND" and x[3] == 1]
    if key:
        ratio = key[0][6]
        targets.append(("host_gather_vs_memcpy", ratio, 0.70, ratio >= 0.70, ">="))
    print()
    for name, measured, goal, met, _ in targets:
        print(f"{name} {measured:.3f} {goal:.2f} {'met' if met else 'missed'}")
    if md_out:
        with open(md_out, "w") as f:
            cpu = context.get("num_cpus", "?")
            f.write(f"Machine: {cpu} CPUs, {context.get('mhz_per_cpu', '?')} MHz; "
                    f"date {context.get('date', '?')}\n\n{table}\n\n")
            for name, measured, goal, met, op in targets:
                f.write(f"- `{name}`: {measured:.3f} (goal {op} {goal:.2f}): "
                        f"{'met' if met else 'missed'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
