#!/usr/bin/env python3
"""Paired bootstrap intervals for the copy task (docs/accuracy_log.md).

Reads a stage-copy CSV of the accuracy harness (one row per prompt and configuration) and, for
every configuration beside `dense`, prints its token accuracy as a share of dense's and its mean
NLL minus dense's over the same prompts, with a 95 % interval from resampling the prompts (the
same resample for the configuration and dense: the prompts differ far more from each other than
the configurations do on one prompt). The 20 tokens of one prompt's span are not independent, so
prompts, not tokens, are what is resampled.

    python3 scripts/copy_intervals.py docs/accuracy_copy_best.csv [--rounds 4000] [--seed 1]
        [--diff A@PCT B@PCT ...]

--diff A@PCT B@PCT (repeatable) prints, instead, configuration B at budget PCT minus A: the
change in correct tokens as a share of dense's and the change in mean NLL, paired over the same
prompts in every resample.
"""
import argparse
import csv
import random
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--rounds", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--diff", nargs=2, action="append", default=[], metavar=("A@PCT", "B@PCT"))
    a = ap.parse_args()
    by = {}
    for r in csv.DictReader(open(a.csv)):
        if r["stage"] != "copy" or r["prompt"] == "all":
            continue
        by.setdefault((r["config"], float(r["budget_pct"])), {})[int(r["prompt"])] = r
    dense = by.get(("dense", 100.0))
    if not dense:
        sys.exit(f"{a.csv}: no per-prompt rows of configuration dense")

    def stat(cfg, idx):
        correct = sum(round(float(cfg[i]["token_accuracy"]) * int(cfg[i]["target_tokens"])) for i in idx)
        correct0 = sum(round(float(dense[i]["token_accuracy"]) * int(dense[i]["target_tokens"])) for i in idx)
        tokens = sum(int(dense[i]["target_tokens"]) for i in idx)
        nll = sum(float(cfg[i]["nll_sum"]) for i in idx) - sum(float(dense[i]["nll_sum"]) for i in idx)
        return (correct / correct0 if correct0 else float("nan")), nll / tokens

    lo, hi = int(0.025 * a.rounds), int(0.975 * a.rounds) - 1

    # One generator per row or pair, seeded by its names: an interval does not depend on which
    # other rows the CSV holds or in which order --diff pairs come.
    def rng_for(*names):
        return random.Random(f"{a.seed}|" + "|".join(names))

    def key(text):
        name, at, pct = text.rpartition("@")
        try:
            k = (name, float(pct))
        except ValueError:
            k = None
        if not at or k not in by:
            sys.exit(f"--diff {text}: expected CONFIG@PCT of a configuration in {a.csv}")
        return k

    if a.diff:
        for x, y in a.diff:
            ca, cb = by[key(x)], by[key(y)]
            prompts = sorted(set(ca) & set(cb) & set(dense))
            if len(prompts) < 2:
                sys.exit(f"--diff {x} {y}: fewer than 2 prompts in common")
            rng = rng_for(x, y)
            diff = lambda idx: tuple(q - p for p, q in zip(stat(ca, idx), stat(cb, idx)))
            acc, nll = diff(prompts)
            boot = [diff([rng.choice(prompts) for _ in prompts]) for _ in range(a.rounds)]
            ba = sorted(b[0] for b in boot)
            bn = sorted(b[1] for b in boot)
            print(f"{y} - {x}: accuracy / dense {acc:+.3f} [{ba[lo]:+.3f}, {ba[hi]:+.3f}]  "
                  f"NLL {nll:+.3f} [{bn[lo]:+.3f}, {bn[hi]:+.3f}]   ({len(prompts)} prompts)")
        return
    print(f"{'configuration':<72} {'budget':>6}  {'accuracy / dense':>24}  {'NLL - dense (nats)':>26}")
    for (name, budget), cfg in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if name == "dense":
            continue
        prompts = sorted(set(cfg) & set(dense))
        if len(prompts) < 2:
            continue
        acc, nll = stat(cfg, prompts)
        rng = rng_for(name, f"{budget:g}")
        boot = [stat(cfg, [rng.choice(prompts) for _ in prompts]) for _ in range(a.rounds)]
        ba = sorted(b[0] for b in boot)
        bn = sorted(b[1] for b in boot)
        print(f"{name:<72} {budget:>5g}%  {acc:.3f} [{ba[lo]:.3f}, {ba[hi]:.3f}]  "
              f"{nll:+.3f} [{bn[lo]:+.3f}, {bn[hi]:+.3f}]   ({len(prompts)} prompts)")


if __name__ == "__main__":
    main()
