#!/usr/bin/env python3
"""The GPU check's goal table: `target | measured | goal | status` lines, like bench_report.sh.

Reads the Google Benchmark JSON files of one gpu_check run and the PyTorch anchors of the same
run (scripts/gpu_anchors.py), and scores each goal of the GPU kernels issue. Every ratio is
formed from figures of that one run; a figure that is missing (no torch, a benchmark that did
not run) makes its line 'not measured', never met.

  python3 scripts/gpu_goals.py ANCHORS.json BENCH.json...
"""
import json
import os
import sys

UNIT_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def load_runs(paths):
    """name (without /manual_time) -> the run's JSON object."""
    runs = {}
    for p in paths:
        if not os.path.isfile(p):
            continue
        try:
            with open(p, errors="replace") as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError):
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from gpu_table import load  # a truncated file: the runs before the cut
            data, _ = load(p)
            if data is None:
                continue
        for b in data.get("benchmarks", []):
            if b.get("run_type") == "aggregate" or b.get("error_occurred"):
                continue
            name = b.get("name", "")
            if name.endswith("/manual_time"):
                name = name[: -len("/manual_time")]
            runs[name] = b
    return runs


def time_us(runs, name):
    b = runs.get(name)
    if b is None or not isinstance(b.get("real_time"), (int, float)):
        return None
    return b["real_time"] * UNIT_US.get(b.get("time_unit", "ns"), 1e-3)


def counter(runs, name, key):
    b = runs.get(name)
    v = None if b is None else b.get(key)
    return v if isinstance(v, (int, float)) else None


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    anchors = {}
    try:
        with open(argv[1]) as f:
            anchors = json.load(f).get("anchors", {})
    except (OSError, json.JSONDecodeError):
        pass
    runs = load_runs(argv[2:])
    lines = []

    def line(target, value, goal, ok, fmt="{:.3g}"):
        if value is None:
            lines.append(f"| {target} | not measured | {goal} | not measured |")
        else:
            lines.append(f"| {target} | {fmt.format(value)} | {goal} | "
                         f"{'met' if ok(value) else 'missed'} |")

    def ratio(a, b):
        return None if a is None or b is None or b == 0 else a / b

    # Attention (bench_attention.cu; kind 0 = fp16 rows).
    for tokens, rows in ((16384, 1638), (32768, 3276)):
        ours = time_us(runs, f"BM_attention/tokens:{tokens}/density_pct:10/kind:0")
        line(f"attention fp16, 10 % of {tokens // 1024}k: torch SDPA / kvscout time",
             ratio(anchors.get(f"sdpa/rows:{rows}"), ours), ">= 1.0", lambda v: v >= 1.0)
    line("attention fp16, 25 % of 128k: K+V bytes / time vs D2D copy",
         counter(runs, "BM_attention/tokens:131072/density_pct:25/kind:0", "vs_d2d"), ">= 0.7",
         lambda v: v >= 0.7)
    fp16 = time_us(runs, "BM_attention/tokens:32768/density_pct:10/kind:0")
    for kind, label in ((3, "KIVI-2"), (4, "KIVI-4"), (2, "fp8")):
        line(f"attention {label} rows vs fp16 rows, 10 % of 32k: time",
             ratio(time_us(runs, f"BM_attention/tokens:32768/density_pct:10/kind:{kind}"), fp16),
             "<= 1.2x", lambda v: v <= 1.2, "{:.3g}x")

    # Speculation and selection (bench_spec_select.cu).
    d2d = counter(runs, "BM_attention/tokens:131072/density_pct:25/kind:0", "d2d_GBps")
    for n in (8192, 32768, 131072):
        line(f"speculation, Llama-7B layer, {n // 1024}k: torch / kvscout time",
             ratio(anchors.get(f"spec/tokens:{n}"), time_us(runs, f"spec/{n}")), ">= 1.0",
             lambda v: v >= 1.0)
    for n in (32768, 131072):
        bps = counter(runs, f"spec/{n}", "bytes_per_s")
        line(f"speculation bytes / time vs D2D rate, {n // 1024}k",
             None if bps is None or d2d is None else bps / (d2d * 1e9), ">= 0.6",
             lambda v: v >= 0.6)
    # Quantised partial keys (issue 32): a quarter (2 bits) or three eighths (4 bits) of fp16's
    # key bytes, plus the same GEMV. Provisional goal (no issue sets one): no slower than fp16.
    for bits in (2, 4):
        for n in (32768, 131072):
            line(f"speculation over {bits}-bit partial keys / fp16 keys, {n // 1024}k: time",
                 ratio(time_us(runs, f"spec_q{bits}/{n}"), time_us(runs, f"spec/{n}")),
                 "<= 1.0x (provisional)", lambda v: v <= 1.0, "{:.3g}x")
    for sel in ("topk", "threshold"):
        for n in (8192, 32768, 131072):
            line(f"{sel}, 32 rows of {n // 1024}k: torch.topk / kvscout time",
                 ratio(anchors.get(f"topk/tokens:{n}"), time_us(runs, f"{sel}/{n}")), ">= 1.5",
                 lambda v: v >= 1.5)

    # Fetch (bench_fetch_attention.cu): the default SM budget (8 blocks).
    line("zero-copy gather, 256-B rows, 10 %, 8 SMs (default): vs contiguous H2D",
         counter(runs, "bm_zero_copy<kvscout::half>/density_pct:10/blocks:0", "vs_h2d"),
         ">= 0.9", lambda v: v >= 0.9)

    # One decode step end to end (bench_decode_step.cu, issue 30): Llama-3-8B-shaped layers, the
    # KV cache in host memory, 10 % budget.
    def step(layout, ctx, batch, way):
        return f"decode_step/{layout}/ctx:{ctx}/batch:{batch}/way:{way}"
    ours32 = time_us(runs, step("contiguous", 32768, 1, "kvscout"))
    line("decode step fp16, 32k, batch 1: FlexGen-style full fetch / kvscout time",
         ratio(time_us(runs, step("contiguous", 32768, 1, "flexgen")), ours32), ">= 8x",
         lambda v: v >= 8, "{:.3g}x")
    line("decode step fp16, 32k, batch 1: InfiniGen's staged path / kvscout time",
         ratio(time_us(runs, step("contiguous", 32768, 1, "infinigen")), ours32), ">= 2x",
         lambda v: v >= 2, "{:.3g}x")
    line("decode step fp16, 32k, batch 1: kvscout time / max(fetch-bound, compute-only)",
         counter(runs, step("contiguous", 32768, 1, "kvscout"), "vs_bound"), "<= 1.25x",
         lambda v: v <= 1.25, "{:.3g}x")
    # The correction step (issue 32): a quarter more rows, fetched on the critical path. The goal
    # is provisional (no issue sets one): the added rows' bytes (x1.25) and their unhidden fetch.
    line("decode step fp16, 32k, batch 1: kvscout_corrected / kvscout time",
         ratio(time_us(runs, step("contiguous", 32768, 1, "kvscout_corrected")), ours32),
         "<= 1.5x (provisional)", lambda v: v <= 1.5, "{:.3g}x")
    line("decode step at 128k, batch 1: fp16 rows / KIVI-2 rows, kvscout time",
         ratio(time_us(runs, step("contiguous", 131072, 1, "kvscout")),
               time_us(runs, step("kivi2", 131072, 1, "kvscout"))), ">= 3x",
         lambda v: v >= 3, "{:.3g}x")
    for batch in (1, 8):
        line(f"a layer's GEMMs (batch {batch}) beside the default fetch (zero-copy, 8 SMs, rows) "
             "vs alone",
             counter(runs, f"gemm_under_fetch/zero_copy_blocks:8/rows/batch:{batch}", "gemm_slowdown"),
             "<= 1.1x", lambda v: v <= 1.1, "{:.3g}x")
    line("decode step in one CUDA graph, replayed: host time per layer (us)",
         counter(runs, step("contiguous", 32768, 1, "kvscout"), "host_us_per_layer"), "<= 20",
         lambda v: v <= 20)

    print("| target | measured | goal | status |")
    print("|:--|--:|--:|:--|")
    for l_ in lines:
        print(l_)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
