#!/usr/bin/env bash
# A/B of benchmark binaries on a noisy machine: runs each binary in turn, `rounds` times, with
# 5 repetitions a run, and prints per benchmark the minimum and the median over all of them
# (noise from other tenants only adds time, so the minimum is the steadier figure).
#
#   bash scripts/bench_ab.sh FILTER ROUNDS BINARY...
#   bash scripts/bench_ab.sh "threshold_logits|stream_pass/" 3 old/kvscout_bench_select \
#     build-bench/bench/kvscout_bench_select
set -euo pipefail
filter=$1 rounds=$2
shift 2
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for _ in $(seq "$rounds"); do
  for b in "$@"; do
    "$b" --benchmark_filter="$filter" --benchmark_repetitions=5 --benchmark_min_time=0.05 \
      --benchmark_format=csv 2>/dev/null |
      grep -v '_mean\|_median\|_stddev\|_cv' | tail -n +2 |
      awk -F, -v b="$b" '{print b "," $1 "," $4}'
  done
done >"$raw"
python3 - "$raw" "$@" <<'PY'
import collections, csv, sys
times = collections.defaultdict(list)
for b, name, t in csv.reader(open(sys.argv[1])):
    times[(name.strip('"'), b)].append(float(t))
bins = sys.argv[2:]
for n in sorted({k[0] for k in times}):
    cells = []
    for b in bins:
        v = sorted(times.get((n, b), []))
        if v:
            cells.append(f"{b}: min {v[0]:.1f} med {v[len(v) // 2]:.1f}")
    print(n.ljust(44), "  ".join(cells))
PY
