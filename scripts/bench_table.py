#!/usr/bin/env python3
"""Turns kvscout's Google Benchmark JSON into tables and target lines.

usage: bench_table.py DIR [--markdown OUT.md]

DIR holds host_gather.json, host_select.json, host_speculation.json and host_kivi.json (any
may be missing).
Prints one table per benchmark family (median over repetitions) with every measurement's ratio
to its anchor from the same run, and ends with one line per target:
    <target-name> <measured> <goal> <met|missed>
"""
import json
import os
import re
import statistics
import sys


def parse_name(name):
    parts = name.split("/")
    fields = {}
    for p in parts[1:]:
        if ":" in p:
            k, v = p.split(":", 1)
            fields[k] = int(v) if re.fullmatch(r"-?\d+", v) else v
    return parts[0], fields


def load(path):
    if not os.path.exists(path):
        return {}, []
    with open(path) as f:
        data = json.load(f)
    runs = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        runs.setdefault(b.get("run_name", b["name"]), []).append(b)
    out = []
    for base, bs in runs.items():
        family, fields = parse_name(base)
        bps = [x["bytes_per_second"] for x in bs if "bytes_per_second" in x]
        ips = [x["items_per_second"] for x in bs if "items_per_second" in x]
        counters = {k: v for k, v in bs[0].items() if isinstance(v, (int, float))}
        out.append({"family": family, "fields": fields,
                    "gbps": statistics.median(bps) / 1e9 if bps else float("nan"),
                    "ips": statistics.median(ips) if ips else float("nan"),
                    "time": statistics.median(x["real_time"] for x in bs),
                    "unit": bs[0].get("time_unit", "ns"), "counters": counters})
    return data.get("context", {}), out


def find(res, family, **fields):
    for r in res:
        if r["family"] == family and all(r["fields"].get(k) == v for k, v in fields.items()):
            return r
    return None


def fastest(res, family, **fields):
    """The fastest run of `family` with these fields (over its other arguments, such as the
    prefetch distance of a stream anchor), or None."""
    runs = [r for r in res if r["family"] == family
            and all(r["fields"].get(k) == v for k, v in fields.items())]
    return max(runs, key=lambda r: r["gbps"]) if runs else None


def gather_section(res):
    lines = ["### Host gather vs memcpy", "",
             "| row bytes | density % | order | threads | gather GB/s | memcpy GB/s | ratio |",
             "|---:|---:|:--|---:|---:|---:|---:|"]
    targets = []
    rows = []
    for r in res:
        if r["family"] != "BM_host_gather":
            continue
        f = r["fields"]
        a = find(res, "BM_memcpy", row=f["row"], density=f["density"], threads=f["threads"])
        ratio = r["gbps"] / a["gbps"] if a else float("nan")
        rows.append((f["row"], f["density"], "HND" if f["hnd"] else "NHD", f["threads"], r["gbps"],
                     a["gbps"] if a else float("nan"), ratio))
    for row, d, order, th, g, m, ratio in sorted(rows):
        lines.append(f"| {row} | {d} | {order} | {th} | {g:.2f} | {m:.2f} | {ratio:.2f} |")
    key = [x for x in rows if x[:4] == (256, 10, "HND", 1)]
    if key:
        targets.append(("host_gather_vs_memcpy", key[0][6], ">=", 0.70))
    return lines, targets


def select_section(res):
    lines = ["### Selection vs its anchors", "",
             "| n | top-k radix us | nth_element us | speed-up | threshold (flat) us | "
             "threshold (logits) us | InfiniGen rule (logits) us | stream pass us | flat / pass | "
             "logits / pass | InfiniGen rule / pass | compare pass us | compare / pass | "
             "logits, row maxima given us | row maxima given / pass |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    speedups, logit_ratios, hinted_ratios = [], [], []
    for n in sorted({r["fields"].get("n") for r in res if "n" in r["fields"]}):
        rad, nth = find(res, "BM_topk_radix", n=n), find(res, "BM_topk_nth_element", n=n)
        thr, thl = find(res, "BM_threshold", n=n), find(res, "BM_threshold_logits", n=n)
        pas = find(res, "BM_stream_pass", n=n)
        if not (rad and nth and thr and thl and pas):
            continue
        sp = nth["time"] / rad["time"]
        speedups.append(sp)
        logit_ratios.append(thl["time"] / pas["time"])
        ig = find(res, "BM_threshold_infinigen_logits", n=n)
        ig_time = f"{ig['time']:.1f}" if ig else "-"
        ig_ratio = f"{ig['time'] / pas['time']:.1f}x" if ig else "-"
        cmp = find(res, "BM_compare_pass", n=n)
        cmp_time = f"{cmp['time']:.2f}" if cmp else "-"
        cmp_ratio = f"{cmp['time'] / pas['time']:.2f}x" if cmp else "-"
        hin = find(res, "BM_threshold_logits_row_max", n=n)
        hin_time = f"{hin['time']:.1f}" if hin else "-"
        hin_ratio = f"{hin['time'] / pas['time']:.2f}x" if hin else "-"
        if hin:
            hinted_ratios.append(hin["time"] / pas["time"])
        lines.append(f"| {n} | {rad['time']:.1f} | {nth['time']:.1f} | {sp:.1f}x | {thr['time']:.1f} | "
                     f"{thl['time']:.1f} | {ig_time} | {pas['time']:.2f} | "
                     f"{thr['time'] / pas['time']:.1f}x | {thl['time'] / pas['time']:.1f}x | "
                     f"{ig_ratio} | {cmp_time} | {cmp_ratio} | {hin_time} | {hin_ratio} |")
    targets = []
    if speedups:
        targets.append(("host_topk_vs_nth_element", min(speedups), ">=", 3.0))
        targets.append(("host_threshold_vs_pass", max(logit_ratios), "<=", 1.5))
    if hinted_ratios:
        # The same selection with the rows' maxima handed on from scoring (score_view::row_max).
        targets.append(("host_threshold_row_max_vs_pass", max(hinted_ratios), "<=", 1.5))
    return lines, targets


def speculation_section(res):
    lines = ["### Speculation (partial-query GEMV + scoring) vs streaming the partial keys", "",
             "The stream anchor is the fastest of its software-prefetch distances (0 = none) in "
             "this run; the FMA roof is scoring's multiply-adds with every operand in registers.",
             "",
             "| n | post_rope_skew GB/s | rope_planes GB/s | rope_planes, mean_logit GB/s | "
             "stream GB/s (best ahead) | FMA roof GB/s | post_rope / stream | rope_planes / "
             "stream | rope_planes / min(stream, roof) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ratios = []
    for n in sorted({r["fields"].get("n") for r in res if "n" in r["fields"]}):
        m0, m1 = find(res, "BM_speculation", n=n, mode=0), find(res, "BM_speculation", n=n, mode=1)
        st = fastest(res, "BM_stream_partial_keys", n=n)
        roof = find(res, "BM_fma_roof", n=n)
        if not (m0 and m1 and st):
            continue
        ratios.append(m0["gbps"] / st["gbps"])
        attainable = min(st["gbps"], roof["gbps"]) if roof else st["gbps"]
        roof_txt = f"{roof['gbps']:.1f}" if roof else "-"
        mean = find(res, "BM_speculation_mean", n=n)
        mean_txt = f"{mean['gbps']:.1f}" if mean else "-"
        lines.append(f"| {n} | {m0['gbps']:.1f} | {m1['gbps']:.1f} | {mean_txt} | {st['gbps']:.1f} "
                     f"({st['fields'].get('ahead', 0)}) | {roof_txt} | "
                     f"{m0['gbps'] / st['gbps']:.2f} | {m1['gbps'] / st['gbps']:.2f} | "
                     f"{m1['gbps'] / attainable:.2f} |")
    own = [n for n in sorted({r["fields"].get("n") for r in res
                              if r["family"] == "BM_stream_speculation_bytes"})]
    if own:
        lines += ["", "Against a read of every byte score() reads (the mode's partial W_Q rows, "
                  "float, then the partial keys, fastest prefetch distance: "
                  "BM_stream_speculation_bytes). \"ceiling\": "
                  "the key stream's time over that read's, the most the key-only ratio above "
                  "can reach where every byte is read at the stream's rate.", "",
                  "| n | mode | weight MB | key MB | read of all us | speculation us | "
                  "speculation / read of all | ceiling of the key-only ratio |",
                  "|---:|:--|---:|---:|---:|---:|---:|---:|"]
        for n in own:
            st = fastest(res, "BM_stream_partial_keys", n=n)
            if not st:
                continue
            for mode, name in ((0, "post_rope_skew"), (1, "rope_planes")):
                a = fastest(res, "BM_stream_speculation_bytes", n=n, mode=mode)
                m = find(res, "BM_speculation", n=n, mode=mode)
                if not (a and m):
                    continue
                lines.append(f"| {n} | {name} | {a['counters']['weight_bytes'] / 1e6:.2f} | "
                             f"{a['counters']['key_bytes'] / 1e6:.2f} | {a['time']:.1f} | "
                             f"{m['time']:.1f} | {a['time'] / m['time']:.2f} | "
                             f"{st['time'] / a['time']:.2f} |")
    bf16 = [n for n in sorted({r["fields"].get("n") for r in res
                               if r["family"] == "BM_speculation_bf16_weights"})
            if find(res, "BM_speculation_bf16_weights", n=n, mode=0)]
    if bf16:
        lines += ["", "The partial W_Q rows in bfloat16 (`infinigen_policy_host<float, bfloat16>`, the "
                  "model's own type: half the bytes the GEMV reads), against the float rows of "
                  "the table above.", "",
                  "| n | post_rope_skew us, float / bf16 | rope_planes us, float / bf16 | "
                  "post_rope / stream, bf16 | rope_planes / stream, bf16 |",
                  "|---:|---:|---:|---:|---:|"]
        for n in bf16:
            w0 = find(res, "BM_speculation_bf16_weights", n=n, mode=0)
            w1 = find(res, "BM_speculation_bf16_weights", n=n, mode=1)
            m0 = find(res, "BM_speculation", n=n, mode=0)
            m1 = find(res, "BM_speculation", n=n, mode=1)
            st = fastest(res, "BM_stream_partial_keys", n=n)
            if not (w0 and w1 and m0 and m1 and st):
                continue
            lines.append(f"| {n} | {m0['time']:.1f} / {w0['time']:.1f} | "
                         f"{m1['time']:.1f} / {w1['time']:.1f} | {w0['gbps'] / st['gbps']:.2f} | "
                         f"{w1['gbps'] / st['gbps']:.2f} |")
    batch = sorted({r["fields"]["seqs"] for r in res if r["family"] == "BM_speculation_batch"})
    if batch:
        lines += ["", "A decode step over a batch of sequences (one score() call, each head's",
                  "weights brought in once per 8 sequences), against one read of the batch's",
                  "partial keys; the 1-sequence row is the table above at that n; \"8 of 16\": the",
                  "8 rows are every other sequence of 16 the policy holds, named by",
                  "score_context::seq_ids (continuous batching).", "",
                  "| n | sequences | post_rope_skew us | rope_planes us | stream us | "
                  "post_rope / stream | rope_planes / stream |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        for n in sorted({r["fields"]["n"] for r in res if r["family"] == "BM_speculation_batch"}):
            rows = [(1, find(res, "BM_speculation", n=n, mode=0),
                     find(res, "BM_speculation", n=n, mode=1),
                     fastest(res, "BM_stream_partial_keys", n=n))]
            rows += [(b, find(res, "BM_speculation_batch", n=n, seqs=b, mode=0),
                      find(res, "BM_speculation_batch", n=n, seqs=b, mode=1),
                      fastest(res, "BM_stream_batch", n=n, seqs=b))
                     for b in batch]
            # Continuous batching: the same rows named by seq_ids, scattered over 2b sequences.
            rows += [(f"{b} of {2 * b}",
                      find(res, "BM_speculation_batch_scattered", n=n, seqs=b, mode=0),
                      find(res, "BM_speculation_batch_scattered", n=n, seqs=b, mode=1),
                      fastest(res, "BM_stream_batch", n=n, seqs=b))
                     for b in batch]
            for b, m0, m1, st in rows:
                if not (m0 and m1 and st):
                    continue
                lines.append(f"| {n} | {b} | {m0['time']:.1f} | {m1['time']:.1f} | "
                             f"{st['time']:.1f} | "
                             f"{m0['gbps'] / st['gbps']:.2f} | {m1['gbps'] / st['gbps']:.2f} |")
    decode = sorted({r["fields"]["n"] for r in res
                     if r["family"] == "BM_speculation_decode_order"})
    if decode:
        lines += ["", "A decode step's speculation in model order: score() of each of 30",
                  "layers in turn (every layer its own weights and keys, so each layer's bytes",
                  "come from L3 or memory, not L2), against the 30 layers' partial keys read in",
                  "turn (fastest prefetch distance). Microseconds per layer.", "",
                  "| n | weights | post_rope_skew us | rope_planes us | stream us | "
                  "post_rope / stream | rope_planes / stream |",
                  "|---:|:--|---:|---:|---:|---:|---:|"]
        for n in decode:
            st = fastest(res, "BM_stream_decode_order", n=n)
            if not st:
                continue
            layers = st["counters"].get("layers", 30)
            for bf, name in ((0, "float"), (1, "bf16")):
                m0 = find(res, "BM_speculation_decode_order", n=n, mode=0, bf16=bf)
                m1 = find(res, "BM_speculation_decode_order", n=n, mode=1, bf16=bf)
                if not (m0 and m1):
                    continue
                lines.append(f"| {n} | {name} | {m0['time'] / layers:.1f} | "
                             f"{m1['time'] / layers:.1f} | {st['time'] / layers:.1f} | "
                             f"{m0['gbps'] / st['gbps']:.2f} | {m1['gbps'] / st['gbps']:.2f} |")
    targets = [("host_speculation_vs_stream", min(ratios), ">=", 0.7)] if ratios else []
    return lines, targets


def kivi_section(res):
    names = {16: "fp16", 8: "fp8 (e4m3)", 4: "KIVI-4", 2: "KIVI-2"}
    lines = ["### Quantized rows: KIVI and fp8", "",
             "| head_dim | bits | scales | bytes per row (K + V) | vs fp16 |", "|---:|---:|:--|---:|---:|"]
    for r in sorted((r for r in res if r["family"] == "BM_kivi_bytes_per_row"),
                    key=lambda r: (r["fields"]["head_dim"], r["fields"]["bits"], r["fields"]["scale"])):
        f, c = r["fields"], r["counters"]
        lines.append(f"| {f['head_dim']} | {f['bits']} | fp{f['scale']} | {c['bytes_per_row']:.0f} | "
                     f"{c['ratio']:.3f} |")
    lines += ["", "| rows | bytes per row (K + V) | threads | gather GB/s | M rows/s |",
              "|:--|---:|---:|---:|---:|"]
    for r in sorted((r for r in res if r["family"] == "BM_gather"),
                    key=lambda r: (-r["fields"]["bits"], r["fields"]["threads"])):
        f = r["fields"]
        row_bytes = r["counters"].get("bytes_per_row")
        row_txt = f"{row_bytes:.0f}" if row_bytes is not None else "-"
        lines.append(f"| {names.get(f['bits'], f['bits'])} | {row_txt} | {f['threads']} | "
                     f"{r['gbps']:.2f} | {r['ips'] / 1e6:.1f} |")
    lines += ["", "| rows (4096 per KV head, 8 KV heads, 32 query heads) | threads | "
              "sparse attention time | vs 1 thread |", "|:--|---:|---:|---:|"]
    for r in (r for r in res if r["family"] == "BM_sparse_attention"):
        f = r["fields"]
        what = (names[f["bits"]] if f["bits"] in (16, 8)
                else f"{names.get(f['bits'], f['bits'])}, fp{f['scale']} scales")
        threads = f.get("threads", 1)
        one = find(res, "BM_sparse_attention", bits=f["bits"], scale=f["scale"], threads=1)
        speedup = f"{one['time'] / r['time']:.2f}x" if one and threads != 1 else "-"
        lines.append(f"| {what} | {threads} | {r['time']:.0f} {r['unit']} | {speedup} |")
    targets = []
    k2 = find(res, "kivi2_bytes_per_row_vs_fp16")
    if k2:
        targets.append(("kivi2_bytes_per_row_vs_fp16", k2["counters"]["ratio"], "<=", 0.25))
    return lines, targets


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
    root = args[0]
    sections, targets, context = [], [], {}
    for fname, fn in (("host_gather.json", gather_section), ("host_select.json", select_section),
                      ("host_speculation.json", speculation_section), ("host_kivi.json", kivi_section)):
        ctx, res = load(os.path.join(root, fname))
        if not res:
            continue
        context = context or ctx
        lines, t = fn(res)
        sections.append("\n".join(lines))
        targets += t
    text = "\n\n".join(sections)
    print(text)
    print()
    target_lines = []
    for name, measured, op, goal in targets:
        met = measured >= goal if op == ">=" else measured <= goal
        target_lines.append(f"{name} {measured:.3f} {goal:.2f} {'met' if met else 'missed'}")
    print("\n".join(target_lines))
    if md_out:
        with open(md_out, "w") as f:
            f.write(f"Machine: {context.get('num_cpus', '?')} CPUs at {context.get('mhz_per_cpu', '?')} MHz; "
                    f"run {context.get('date', '?')}\n\n{text}\n\n")
            f.write("| target | measured | goal | status |\n|---|---:|---:|:--|\n")
            for name, measured, op, goal in targets:
                met = measured >= goal if op == ">=" else measured <= goal
                f.write(f"| `{name}` | {measured:.3f} | {op} {goal:.2f} | {'met' if met else 'missed'} |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
