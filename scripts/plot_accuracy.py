#!/usr/bin/env python3
"""Plots of the accuracy harness's CSV (tools/accuracy, scripts/accuracy.sh).

  python3 scripts/plot_accuracy.py --csv docs/accuracy.csv --layers docs/accuracy_layers.csv \
      --out docs/img

Writes, for every text in the matrix stage:
  accuracy_<text>_fp16.png      perplexity against bytes fetched per decode step, one line per
                                policy over the budgets (2 .. 50 %), dense as a point
  accuracy_<text>_formats.png   the same for every KV format (fp16, KIVI-4, KIVI-2) of the
                                oracle, kvscout's default, InfiniGen (paper) and streaming,
                                dense per format
and accuracy_recall_layers.png: per-layer attention-mass recall at a 10 % budget (fp16, long text);
with --best docs/accuracy_best.csv, accuracy_best.png: the best configuration's frontier (issue 32).
"""

import argparse
import csv
import os
import re
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter
except ImportError:  # scripts/accuracy.sh installs it
    sys.exit("plot_accuracy.py needs matplotlib: python3 -m pip install matplotlib")

MIB = 1024.0 * 1024.0
STYLE = {
    "oracle": dict(color="black", marker="o"),
    "InfiniGen (paper)": dict(color="tab:brown", marker="*"),
    "kvscout top-k, post-RoPE skew": dict(color="tab:blue", marker="s"),
    "kvscout default: RoPE planes": dict(color="tab:cyan", marker="D"),
    "kvscout top-k, pre-RoPE folded": dict(color="tab:purple", marker="v"),
    "quest": dict(color="tab:green", marker="^"),
    "h2o": dict(color="tab:orange", marker="P"),
    "streaming": dict(color="tab:red", marker="X"),
}
FORMAT_LINE = {"fp16": "-", "kivi4": "--", "kivi2": ":"}


def plain_log_axes(ax):
    """Log axes with plain numbers on the ticks (3, 4, 6, 10, 20 instead of 3 x 10^0)."""
    f = FuncFormatter(lambda v, _: f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(f)
        axis.set_minor_formatter(f)


def slug(text):
    """File-name part of a text's name: GPL-3 -> GPL-3, pg19_firstbook.txt -> pg19_firstbook."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", os.path.splitext(text)[0])


# Names of the speculation rows: "infinigen_paper" is presets::infinigen_paper (InfiniGen as its
# authors' code runs it); "infinigen" rows are infinigen_policy_host with kvscout's knobs (top-k, r and
# aggregation from the sweep), rope_planes being presets::kvscout_default.
SPEC_NAMES = {
    "rope_planes": "kvscout default: RoPE planes",
    "post_rope_skew": "kvscout top-k, post-RoPE skew",
    "pre_rope_folded": "kvscout top-k, pre-RoPE folded",
}


def label(row):
    if row["policy"] == "infinigen_paper":
        return "InfiniGen (paper)"
    if row["policy"] == "infinigen":
        return SPEC_NAMES.get(row["rope_mode"], "kvscout top-k, " + row["rope_mode"])
    return row["policy"]


# The matrix stages: "matrix", and "kivi_rest" (the KIVI formats' remaining policies and modes).
MATRIX = ("matrix", "kivi_rest")


def load(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def series(rows, text, fmt):
    """{label: [(bytes MiB, ppl, budget)]} for the matrix rows of one text and format."""
    out = {}
    for r in rows:
        if r["stage"] not in MATRIX or r["text"] != text or r["format"] != fmt or r["policy"] == "dense":
            continue
        out.setdefault(label(r), []).append(
            (float(r["bytes_per_step"]) / MIB, float(r["ppl"]), float(r["budget_pct"])))
    for v in out.values():
        v.sort()
    return out


def dense_point(rows, text, fmt):
    for r in rows:
        if r["text"] == text and r["format"] == fmt and r["policy"] == "dense":
            return float(r["bytes_per_step"]) / MIB, float(r["ppl"])
    return None


def plot_fp16(rows, text, out):
    s = series(rows, text, "fp16")
    if not s:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for name, pts in sorted(s.items()):
        st = STYLE.get(name, {})
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, **st)
    d = dense_point(rows, text, "fp16")
    if d:
        ax.scatter([d[0]], [d[1]], color="gray", marker="*", s=160, zorder=5, label="dense")
        ax.axhline(d[1] * 1.02, color="gray", lw=0.8, ls="--", label="dense + 2 %")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_axes(ax)
    ax.set_xlabel("bytes fetched per decode step, all 30 layers (MiB, log)")
    ax.set_ylabel("perplexity (log)")
    tokens = next(r["tokens"] for r in rows if r["text"] == text)
    ax.set_title(f"SmolLM2-135M, {text} ({tokens} tokens), fp16 KV: budgets 2-50 %")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    path = os.path.join(out, f"accuracy_{slug(text)}_fp16.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_formats(rows, text, out):
    fmts = [f for f in ("fp16", "kivi4", "kivi2") if series(rows, text, f)]
    if len(fmts) < 2:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for fmt in fmts:
        s = series(rows, text, fmt)
        for name in ("oracle", "InfiniGen (paper)", "kvscout default: RoPE planes", "streaming"):
            if name not in s:
                continue
            pts = s[name]
            st = dict(STYLE.get(name, {}))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=FORMAT_LINE[fmt], label=f"{name} {fmt}", **st)
        d = dense_point(rows, text, fmt)
        if d:
            ax.scatter([d[0]], [d[1]], color="gray", marker="*", s=140, zorder=5)
            ax.annotate(f"dense {fmt}", d, textcoords="offset points", xytext=(-40, 8), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_axes(ax)
    ax.set_xlabel("bytes fetched per decode step, all 30 layers (MiB, log)")
    ax.set_ylabel("perplexity (log)")
    ax.set_title(f"{text}: fp16 (solid), KIVI-4 (dashed), KIVI-2 (dotted)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    path = os.path.join(out, f"accuracy_{slug(text)}_formats.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_recall(layer_rows, text, out):
    lines = {}
    for r in layer_rows:
        if (r["stage"] != "matrix" or r["text"] != text or r["format"] != "fp16" or r["budget_pct"] != "10"
                or r["policy"] == "dense" or int(r["samples"]) == 0):
            continue
        lines.setdefault(label(r), []).append((int(r["layer"]), float(r["recall"])))
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, pts in sorted(lines.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, **STYLE.get(name, {}))
    ax.axhline(0.9, color="gray", lw=0.8, ls="--")
    ax.set_xlabel("layer")
    ax.set_ylabel("attention-mass recall")
    ax.set_title(f"{text}, fp16, 10 % budget: share of the true attention mass selected")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    path = os.path.join(out, "accuracy_recall_layers.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fmt_cell(v, ref=None):
    return f"{v:.3f}" if ref is None else f"{v:.3f} ({100 * (v / ref - 1):+.1f} %)"


def markdown(rows, path):
    """Markdown tables of the CSV (pasted into docs/accuracy_log.md)."""
    budgets = ["2", "5", "10", "20", "50"]
    out = []
    for stage, what in (("sweep", "the speculation's knobs"), ("planes", "the rope_planes mode's knobs")):
        sweep = [r for r in rows if r["stage"] == stage]
        if not sweep:
            continue
        d = next((float(r["ppl"]) for r in rows if r["policy"] == "dense" and r["format"] == "fp16"
                  and r["text"] == sweep[0]["text"]), None)
        out.append(f"### Stage {stage}: {what} at a 10 % cap, {sweep[0]['text']}, fp16 (dense ppl {d:.3f})\n")
        out.append("| RoPE mode | r | aggregation | selector | ppl (vs dense) | rows fetched | recall | oracle recall "
                   "| share of oracle mass | overlap |")
        out.append("|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
        for r in sweep:
            if r["policy"] == "dense":
                continue
            mode = r["rope_mode"] if r["policy"] != "infinigen_paper" else f"InfiniGen (paper): {r['rope_mode']}"
            out.append(f"| {mode} | {r['r']} | {r['aggregation']} | {r['selector']} | "
                       f"{fmt_cell(float(r['ppl']), d)} | {float(r['fetch_fraction']):.3f} | {float(r['recall']):.3f} | "
                       f"{float(r['recall_oracle']):.3f} | {float(r['recall_ratio']):.3f} | {float(r['overlap']):.3f} |")
        out.append("")
    texts = []
    for r in rows:
        if r["stage"] == "matrix" and r["text"] not in texts:
            texts.append(r["text"])
    for text in texts:
        for fmt in ("fp16", "kivi4", "kivi2"):
            m = [r for r in rows if r["stage"] in MATRIX and r["text"] == text and r["format"] == fmt]
            if not m:
                continue
            dense = next((r for r in rows if r["text"] == text and r["format"] == fmt and r["policy"] == "dense"), None)
            d16 = next((float(r["ppl"]) for r in rows if r["text"] == text and r["format"] == "fp16"
                        and r["policy"] == "dense"), None)
            d = float(dense["ppl"]) if dense else None
            tok = m[0]["tokens"]
            out.append(f"### {text}, {tok} tokens, {fmt}: perplexity (vs dense {fmt})\n")
            extra = f"; dense fp16 {d16:.3f}" if fmt != "fp16" and d16 else ""
            out.append(f"Dense {fmt}: {d:.3f}{extra}; dense bytes per step "
                       f"{float(dense['bytes_per_step']) / MIB:.2f} MiB.\n" if dense else "")
            out.append("| policy | " + " | ".join(b + " %" for b in budgets) + " |")
            out.append("|---|" + "---:|" * len(budgets))
            names = []
            for r in m:
                if r["policy"] != "dense" and label(r) not in names:
                    names.append(label(r))
            # InfiniGen's own configuration has a row in every table; a CSV from before the
            # harness ran it (stage matrix, or --stages paper --append) says so.
            missing = "not measured" if "InfiniGen (paper)" not in names else ""
            if missing:
                names.append("InfiniGen (paper)")
            for n in names:
                cells = []
                for b in budgets:
                    r = next((r for r in m if label(r) == n and r["budget_pct"] == b), None)
                    cells.append(fmt_cell(float(r["ppl"]), d) if r else missing)
                out.append(f"| {n} | " + " | ".join(cells) + " |")
            out.append("")
            out.append(f"Attention-mass recall (oracle's top-k at the same cap) / overlap with the oracle, {fmt}:\n")
            out.append("| policy | " + " | ".join(b + " %" for b in budgets) + " |")
            out.append("|---|" + "---:|" * len(budgets))
            for n in names:
                cells = []
                for b in budgets:
                    r = next((r for r in m if label(r) == n and r["budget_pct"] == b), None)
                    cells.append(f"{float(r['recall']):.3f} ({float(r['recall_oracle']):.3f}) / {float(r['overlap']):.2f}"
                                 if r else missing)
                out.append(f"| {n} | " + " | ".join(cells) + " |")
            out.append("")
            out.append(f"Rows fetched / rows a full fetch moves (layers 2-29), and bytes per step over all layers, {fmt}:\n")
            out.append("| budget | rows fetched | MiB per step | vs dense fp16 | InfiniGen (paper): rows fetched, "
                       "vs dense fp16 |")
            out.append("|---:|---:|---:|---:|---:|")
            for b in budgets:
                r = next((r for r in m if r["policy"] == "oracle" and r["budget_pct"] == b), None)
                p = next((r for r in m if r["policy"] == "infinigen_paper" and r["budget_pct"] == b), None)
                paper = (f"{float(p['fetch_fraction']):.3f}, {float(p['bytes_vs_dense_fp16']):.3f}" if p
                         else "not measured")
                if r:
                    out.append(f"| {b} % | {float(r['fetch_fraction']):.3f} | {float(r['bytes_per_step']) / MIB:.2f} | "
                               f"{float(r['bytes_vs_dense_fp16']):.3f} | {paper} |")
            out.append("")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return path


# The rows of stage `budgets` run for issue 32 part 4 (docs/accuracy_best.csv): per-layer budgets,
# 2-bit ranking keys in the library's cache, the correction step at share 0.25 over 64 channels.
def best_label(row):
    if row["policy"] == "oracle":
        return "oracle top-k, per-layer budgets"
    if "corrected" in row["selector"]:
        return "kvscout: + correction (64 channels, sum_prob)"
    return "kvscout: speculation, per-layer budgets"


BEST_STYLE = {
    "oracle top-k, per-layer budgets": dict(color="black", marker="o"),
    "kvscout: speculation, per-layer budgets": dict(color="tab:cyan", marker="D"),
    "kvscout: + correction (64 channels, sum_prob)": dict(color="tab:blue", marker="s"),
}


def plot_best(rows, out):
    """accuracy_best.png: perplexity over dense fp16 against the bytes moved per step (share of
    a dense fp16 step's), every format on the long text, fp16 on the short one (model shares)."""
    texts = []
    for r in rows:
        if r["text"] not in texts:
            texts.append(r["text"])
    if not texts:
        return None
    fig, axes = plt.subplots(1, len(texts), figsize=(6.5 * len(texts), 5), squeeze=False)
    for ax, text in zip(axes[0], texts):
        fmts = [f for f in ("fp16", "kivi4", "kivi2") if any(r["text"] == text and r["format"] == f for r in rows)]
        for fmt in fmts:
            s = {}
            for r in rows:
                if r["text"] != text or r["format"] != fmt or r["policy"] == "dense":
                    continue
                if r["selector"].endswith("_own"):
                    continue  # the short text's own shares: in the tables, not the plot
                s.setdefault(best_label(r), []).append(
                    (100 * float(r["bytes_vs_dense_fp16"]), float(r["ppl_vs_dense_fp16"])))
            for name, pts in s.items():
                pts.sort()
                st = dict(BEST_STYLE.get(name, {}))
                ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=FORMAT_LINE[fmt],
                        label=f"{name} ({fmt})", **st)
            for r in rows:
                if r["text"] == text and r["format"] == fmt and r["policy"] == "dense":
                    ax.scatter([100 * float(r["bytes_vs_dense_fp16"])], [float(r["ppl_vs_dense_fp16"])],
                               color="gray", marker="*", s=140, zorder=5)
                    ax.annotate(f"dense {fmt}", (100 * float(r["bytes_vs_dense_fp16"]),
                                                 float(r["ppl_vs_dense_fp16"])), fontsize=7,
                                xytext=(4, 4), textcoords="offset points")
        ax.axhline(1.02, color="gray", lw=0.8, ls="--", label="dense fp16 + 2 %")
        ax.set_xscale("log")
        plain_log_axes(ax)
        ax.set_xlabel("bytes moved per decode step, % of a dense fp16 step (log)")
        ax.set_ylabel("perplexity / dense fp16's")
        tokens = next(r["tokens"] for r in rows if r["text"] == text)
        ax.set_title(f"SmolLM2-135M, {text} ({tokens} tokens): budgets 5, 10, 20 %", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        # KIVI-2's lines sit high and KIVI-4's low: the middle left is empty.
        ax.legend(fontsize=7, loc="center left" if len(fmts) > 1 else "upper right")
    path = os.path.join(out, "accuracy_best.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# The copy task's frontier (docs/accuracy_copy_best.csv, issue 32): the "all" rows of stage copy.
# Bytes per step as the perplexity rows count them for fp16: the model's first COPY_SKIP layers
# move every row, the other COPY_LAYERS - COPY_SKIP layers the fetched share (fetch_fraction).
COPY_LAYERS, COPY_SKIP = 30, 2


def copy_label(row):
    if row["policy"] == "oracle":
        who = "oracle top-k, heads pooled" if "pooled" in row["selector"] else "oracle top-k, per-layer budgets"
    else:
        who = "kvscout + correction (per-layer budgets)"
    return who + (", dense prefill" if row["config"].endswith("+dense_prefill") else ", every token")


COPY_STYLE = {
    "oracle top-k, per-layer budgets, every token": dict(color="black", marker="o", ls="-"),
    "kvscout + correction (per-layer budgets), every token": dict(color="tab:blue", marker="s", ls="-"),
    "oracle top-k, per-layer budgets, dense prefill": dict(color="black", marker="o", ls="--", mfc="white"),
    "kvscout + correction (per-layer budgets), dense prefill": dict(color="tab:blue", marker="s", ls="--", mfc="white"),
    "oracle top-k, heads pooled, every token": dict(color="tab:gray", marker="^", ls=":"),
}


def plot_copy(rows, out):
    """accuracy_copy_frontier.png: the copy task's token accuracy (share of dense's) and mean NLL
    (over dense's) against the bytes moved per step (share of a dense fp16 step's)."""
    # The configurations of the copy frontier only: dense, the oracles, kvscout + correction.
    known = ("dense", "oracle_layers", "oracle_pooled", "kvscout_layers_corrected")
    rows = [r for r in rows if r["stage"] == "copy" and r["prompt"] == "all"
            and r["config"].split("+")[0] in known]
    dense = [r for r in rows if r["policy"] == "dense" and r["config"] == "dense"]
    if not dense:
        return None
    acc0, nll0 = float(dense[0]["token_accuracy"]), float(dense[0]["mean_nll"])
    series = {}
    for r in rows:
        if r["policy"] == "dense":
            continue
        f = float(r["fetch_fraction"])
        b = 100 * (COPY_SKIP + (COPY_LAYERS - COPY_SKIP) * f) / COPY_LAYERS
        series.setdefault(copy_label(r), []).append(
            (b, float(r["token_accuracy"]) / acc0, float(r["mean_nll"]) - nll0, float(r["budget_pct"])))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for name, pts in series.items():
        pts.sort()
        st = COPY_STYLE.get(name, {})
        for ax, k in zip(axes, (1, 2)):
            ax.plot([p[0] for p in pts], [p[k] for p in pts], label=name, **st)
            for p in pts:
                ax.annotate(f"{p[3]:g} %", (p[0], p[k]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    axes[0].axhline(0.97, color="gray", lw=0.8, ls=":", label="goal: 0.97 of dense's (at 5 % of rows)")
    axes[1].axhline(0.03, color="gray", lw=0.8, ls=":", label="goal: dense + 0.03 nats (at 10 % of rows)")
    axes[0].set_ylabel(f"token accuracy / dense's ({acc0:.3f})")
    axes[1].set_ylabel(f"mean NLL of the span - dense's ({nll0:.3f} nats; log)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("bytes moved per decode step, % of a dense fp16 step")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    n = sum(1 for r in rows if r["policy"] == "dense" and r["config"] == "dense")
    fig.suptitle(f"SmolLM2-135M, copy task ({dense[0]['target_tokens']} scored tokens); "
                 "labels: rows per step" + ("" if n == 1 else f" ({n} dense rows)"), fontsize=10)
    path = os.path.join(out, "accuracy_copy_frontier.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", default="docs/accuracy.csv")
    ap.add_argument("--layers", default="docs/accuracy_layers.csv")
    ap.add_argument("--out", default="docs/img")
    ap.add_argument("--markdown", default="", help="also write the tables as markdown here")
    ap.add_argument("--best", default="", help="stage budgets rows of the best configuration "
                    "(docs/accuracy_best.csv): accuracy_best.png")
    ap.add_argument("--copy", default="", help="stage copy rows of the oracle and kvscout + correction "
                    "(docs/accuracy_copy_best.csv): accuracy_copy_frontier.png")
    a = ap.parse_args()
    rows = load(a.csv)
    os.makedirs(a.out, exist_ok=True)
    texts = []
    for r in rows:
        if r["stage"] == "matrix" and r["text"] not in texts:
            texts.append(r["text"])
    made = []
    for t in texts:
        made += [plot_fp16(rows, t, a.out), plot_formats(rows, t, a.out)]
    if texts and os.path.exists(a.layers):
        made.append(plot_recall(load(a.layers), texts[0], a.out))
    if a.markdown:
        made.append(markdown(rows, a.markdown))
    if a.best:
        made.append(plot_best(load(a.best), a.out))
    if a.copy:
        made.append(plot_copy(load(a.copy), a.out))
    for m in made:
        if m:
            print(m)


if __name__ == "__main__":
    main()
