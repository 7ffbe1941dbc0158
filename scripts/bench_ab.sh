#!/usr/bin/env bash
# A/B of benchmark binaries on a noisy machine: runs each binary in turn, `rounds` times, with
# 5 repetitions a run, and prints per benchmark the minimum and the median over all of them
# (noise from other tenants only adds time, so the minimum is the steadier figure). Times are
# real time in the benchmark's own unit. Reads JSON (benchmarks with different counters may
# share a filter; the CSV reporter refuses that).
#
#   bash scripts/bench_ab.sh FILTER ROUNDS BINARY...
#   bash scripts/bench_ab.sh "threshold_logits|stream_pass/" 3 old/kvscout_bench_select \
#     build-bench/bench/kvscout_bench_select
set -euo pipefail
filter=$1 rounds=$2
shift 2
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
run=0
for _ in $(seq "$rounds"); do
  i=0
  for b in "$@"; do
    "$b" --benchmark_filter="$filter" --benchmark_repetitions=5 --benchmark_min_time=0.05 \
      --benchmark_out="$raw/$run.$i.json" --benchmark_out_format=json >/dev/null 2>&1 || {
      echo "bench_ab: $b failed (filter '$filter')" >&2
      exit 1
    }
    i=$((i + 1))
  done
  run=$((run + 1))
done
python3 - "$raw" "$@" <<'PY'
import collections, glob, json, os, sys
raw, bins = sys.argv[1], sys.argv[2:]
times = collections.defaultdict(list)
for path in glob.glob(os.path.join(raw, "*.json")):
    b = bins[int(os.path.basename(path).split(".")[1])]
    for run in json.load(open(path))["benchmarks"]:
        if run.get("run_type") == "aggregate":
            continue
        times[(run["run_name"], b)].append(float(run["real_time"]))
for n in sorted({k[0] for k in times}):
    cells = []
    for b in bins:
        v = sorted(times.get((n, b), []))
        if v:
            cells.append(f"{b}: min {v[0]:.1f} med {v[len(v) // 2]:.1f}")
    print(n.ljust(44), "  ".join(cells))
PY
